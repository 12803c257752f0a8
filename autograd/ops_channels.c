/* The ops that move channels of an activation (autograd.h): qt_channel_shuffle, ShuffleNet's
 * interleaving of channel groups, and qt_channel_slice, a contiguous range of channels
 * (ShuffleNet's chunk, ONNX's Split and Slice). Both copy, along the last dim of a tensor of
 * any rank (the channels of an NHWC image), and their backwards add the gradient back where each
 * value came from: exact, as PyTorch's. */
#include "autograd/ops_int.h"

#include <string.h>

#define CHANNELS_PARALLEL_MIN 16384

int64_t qt_channel_shuffle_src(int64_t c, int64_t C, int groups) {
  const int64_t per = C / groups;
  return (c % groups) * per + c / groups;
}

void qt_channel_shuffle_forward(float *y, const float *x, int64_t rows, int64_t C, int groups) {
#pragma omp parallel for schedule(static) if (rows * C >= CHANNELS_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < C; c++) y[r * C + c] = x[r * C + qt_channel_shuffle_src(c, C, groups)];
}

void qt_channel_shuffle_backward(float *dx, const float *dy, int64_t rows, int64_t C, int groups) {
#pragma omp parallel for schedule(static) if (rows * C >= CHANNELS_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < C; c++) dx[r * C + qt_channel_shuffle_src(c, C, groups)] += dy[r * C + c];
}

typedef struct {
  qt_tensor *x, *y;
  int a, b; /* shuffle: groups; slice: begin, end */
} channels_saved;

static int64_t rows_of(const qt_tensor *t) {
  const int64_t C = t->shape[t->ndim - 1];
  return C ? qt_tensor_numel(t) / C : 0;
}

static void shuffle_backward(qt_ctx *ctx, void *p) {
  channels_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  qt_channel_shuffle_backward(qt_tensor_grad(ctx, s->x), s->y->grad, rows_of(s->x), s->x->shape[s->x->ndim - 1], s->a);
}

static qt_tensor *shuffle_op(qt_ctx *ctx, qt_tensor *x, int groups) {
  check_f32(x, -1, "channel_shuffle", "input");
  const int64_t C = x->shape[x->ndim - 1];
  QT_ASSERT(groups >= 1 && C % groups == 0, "channel_shuffle: %d groups of %lld channels", groups, (long long)C);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  qt_channel_shuffle_forward(qt_f32(y), qt_f32(x), rows_of(x), C, groups);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    channels_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNELS, shuffle_backward, sizeof *sv, y);
    *sv = (channels_saved){x, y, groups, 0};
  }
  return y;
}

qt_tensor *qt_channel_shuffle(qt_ctx *ctx, qt_tensor *x, int groups) {
  PROFILED(ctx, QT_PROFILE_CHANNELS, shuffle_op(ctx, x, groups));
}

static void slice_backward(qt_ctx *ctx, void *p) {
  channels_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t C = s->x->shape[s->x->ndim - 1], K = s->b - s->a, rows = rows_of(s->x);
  float *dx = qt_tensor_grad(ctx, s->x);
  const float *dy = s->y->grad;
#pragma omp parallel for schedule(static) if (rows * K >= CHANNELS_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < K; k++) dx[r * C + s->a + k] += dy[r * K + k];
}

static qt_tensor *slice_op(qt_ctx *ctx, qt_tensor *x, int begin, int end) {
  check_f32(x, -1, "channel_slice", "input");
  const int64_t C = x->shape[x->ndim - 1], rows = rows_of(x);
  QT_ASSERT(begin >= 0 && begin < end && end <= C, "channel_slice: [%d, %d) of %lld channels", begin, end,
            (long long)C);
  int64_t shape[8];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
  shape[x->ndim - 1] = end - begin;
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, shape);
  const int64_t K = end - begin;
  float *yd = qt_f32(y);
  const float *xd = qt_f32(x);
#pragma omp parallel for schedule(static) if (rows * K >= CHANNELS_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) memcpy(yd + r * K, xd + r * C + begin, (size_t)K * sizeof *yd);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    channels_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNELS, slice_backward, sizeof *sv, y);
    *sv = (channels_saved){x, y, begin, end};
  }
  return y;
}

qt_tensor *qt_channel_slice(qt_ctx *ctx, qt_tensor *x, int begin, int end) {
  PROFILED(ctx, QT_PROFILE_CHANNELS, slice_op(ctx, x, begin, end));
}
