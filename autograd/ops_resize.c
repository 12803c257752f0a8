/* Upsampling of an NHWC image by 2 in H and W (autograd.h qt_resize2x), as PyTorch's
 * F.interpolate(scale_factor=2) computes it: 'nearest' (output (oh, ow) reads input (oh / 2,
 * ow / 2)) and 'bilinear' with align_corners=False (source coordinate 0.5 (o + 0.5) - 0.5, clamped
 * at 0: weights 0.25 and 0.75, exact in float; the last row and column repeat the edge), each
 * output (x00 ww0 + x01 ww1) wh0 + (x10 ww0 + x11 ww1) wh1 as PyTorch's separable kernel orders
 * it. The backwards add each output's gradient to its sources in the output's row-major order, as
 * PyTorch's CPU kernels do, the bilinear one as (wh wv) dy. */
#include "autograd/ops_int.h"

#include <string.h>

#define RESIZE_PARALLEL_MIN 16384

/* Output index o's sources i0, i1 in an axis of n inputs and their weights. */
static void sources(int64_t o, int64_t n, int bilinear, int64_t *i0, int64_t *i1, float *w0, float *w1) {
  if (!bilinear) {
    *i0 = *i1 = o / 2;
    *w0 = 1.0f, *w1 = 0.0f;
    return;
  }
  float real = 0.5f * ((float)o + 0.5f) - 0.5f;
  if (real < 0.0f) real = 0.0f;
  const int64_t i = (int64_t)real;
  *i0 = i;
  *i1 = i + (i < n - 1 ? 1 : 0);
  *w1 = real - (float)i;
  *w0 = 1.0f - *w1;
}

void qt_resize2x_forward(float *y, const float *x, int64_t N, int64_t H, int64_t W, int64_t C, int bilinear) {
  const int64_t OH = 2 * H, OW = 2 * W;
#pragma omp parallel for collapse(2) schedule(static) if (N * OH * OW * C >= RESIZE_PARALLEL_MIN)
  for (int64_t b = 0; b < N; b++)
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t h0, h1;
      float a0, a1;
      sources(oh, H, bilinear, &h0, &h1, &a0, &a1);
      const float *xb = x + b * H * W * C;
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t v0, v1;
        float b0, b1;
        sources(ow, W, bilinear, &v0, &v1, &b0, &b1);
        float *yo = y + ((b * OH + oh) * OW + ow) * C;
        const float *p00 = xb + (h0 * W + v0) * C;
        if (!bilinear) {
          memcpy(yo, p00, (size_t)C * sizeof *yo);
          continue;
        }
        const float *p01 = xb + (h0 * W + v1) * C, *p10 = xb + (h1 * W + v0) * C, *p11 = xb + (h1 * W + v1) * C;
        for (int64_t c = 0; c < C; c++) {
          const float t0 = p00[c] * b0 + p01[c] * b1, t1 = p10[c] * b0 + p11[c] * b1;
          yo[c] = t0 * a0 + t1 * a1;
        }
      }
    }
}

void qt_resize2x_backward(float *dx, const float *dy, int64_t N, int64_t H, int64_t W, int64_t C, int bilinear) {
  const int64_t OH = 2 * H, OW = 2 * W;
#pragma omp parallel for schedule(static) if (N * OH * OW * C >= RESIZE_PARALLEL_MIN)
  for (int64_t b = 0; b < N; b++)
    for (int64_t oh = 0; oh < OH; oh++) {
      int64_t h0, h1;
      float a0, a1;
      sources(oh, H, bilinear, &h0, &h1, &a0, &a1);
      float *db = dx + b * H * W * C;
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t v0, v1;
        float b0, b1;
        sources(ow, W, bilinear, &v0, &v1, &b0, &b1);
        const float *g = dy + ((b * OH + oh) * OW + ow) * C;
        float *q00 = db + (h0 * W + v0) * C;
        if (!bilinear) {
          for (int64_t c = 0; c < C; c++) q00[c] += g[c];
          continue;
        }
        float *q01 = db + (h0 * W + v1) * C, *q10 = db + (h1 * W + v0) * C, *q11 = db + (h1 * W + v1) * C;
        const float w00 = a0 * b0, w01 = a0 * b1, w10 = a1 * b0, w11 = a1 * b1;
        for (int64_t c = 0; c < C; c++) {
          q00[c] += w00 * g[c];
          q01[c] += w01 * g[c];
          q10[c] += w10 * g[c];
          q11[c] += w11 * g[c];
        }
      }
    }
}

typedef struct {
  qt_tensor *x, *y;
  int bilinear;
} resize_saved;

static void resize_backward(qt_ctx *ctx, void *p) {
  resize_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t *d = s->x->shape;
  qt_resize2x_backward(qt_tensor_grad(ctx, s->x), s->y->grad, d[0], d[1], d[2], d[3], s->bilinear);
}

static qt_tensor *resize_op(qt_ctx *ctx, qt_tensor *x, int bilinear) {
  check_f32(x, 4, "resize", "input");
  const int64_t shape[4] = {x->shape[0], 2 * x->shape[1], 2 * x->shape[2], x->shape[3]};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  qt_resize2x_forward(qt_f32(y), qt_f32(x), x->shape[0], x->shape[1], x->shape[2], x->shape[3], bilinear);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    resize_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNELS, resize_backward, sizeof *sv, y);
    *sv = (resize_saved){x, y, bilinear};
  }
  return y;
}

qt_tensor *qt_resize2x(qt_ctx *ctx, qt_tensor *x, int bilinear) {
  PROFILED(ctx, QT_PROFILE_CHANNELS, resize_op(ctx, x, bilinear));
}
