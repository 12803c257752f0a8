/* The XNNPACK backend's runtime (xnnpack_int.h): runs a lowered model's steps, the boundaries
 * (quantize, dequantize) on XNNPACK's pthreadpool, its operators, and fallback partitions with
 * the framework's own fp32 node forward; and the lowered model's partition queries and report. */
#ifdef QT_HAVE_XNNPACK
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/xnnpack_int.h"

const char *qt_xnn_status_name(enum xnn_status s) {
  switch (s) {
    case xnn_status_success: return "success";
    case xnn_status_uninitialized: return "uninitialized";
    case xnn_status_invalid_parameter: return "invalid parameter";
    case xnn_status_invalid_state: return "invalid state";
    case xnn_status_unsupported_parameter: return "unsupported parameter";
    case xnn_status_unsupported_hardware: return "unsupported hardware";
    case xnn_status_out_of_memory: return "out of memory";
    default: return "unknown status";
  }
}

/* ---- runtime ------------------------------------------------------------------------------ */

/* The boundaries run on XNNPACK's pthreadpool, in tiles small enough for the reference kernels
 * to stay serial (qt_quantize goes parallel with OpenMP from 32768 elements): with OpenMP workers
 * woken here, their spin-waiting took the second core from the pool's worker (FashionCNN W8A8 at
 * batch 256, 2 threads: 16.8k images/s with libgomp's default spin, 11.9k with
 * OMP_WAIT_POLICY=ACTIVE, 35.2k with PASSIVE, against 19.1k on one thread). */
enum { BOUNDARY_TILE = 16384 };

typedef struct {
  const qt_step *s;
  void *out;
  const void *in;
} boundary_task;

/* elements [start, start + count): per tensor, or a tile of whole rows of channels, through
 * qt_quantize at once; otherwise element by element with each one's channel */
static void quantize_tile(void *ctx, size_t start, size_t count) {
  const boundary_task *t = ctx;
  const qt_step *s = t->s;
  const float *in = (const float *)t->in + start;
  const int C = s->channels;
  if (C == 1 || (start % (size_t)C == 0 && count % (size_t)C == 0)) {
    int32_t tmp[BOUNDARY_TILE];
    int32_t *q = s->int8 ? tmp : (int32_t *)t->out + start;
    qt_quantize(q, in, (int64_t)(count / (size_t)C), C, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    if (s->int8) { /* the reference kernel narrowed: bit-identical by construction */
      int8_t *o = (int8_t *)t->out + start;
      for (size_t i = 0; i < count; i++) o[i] = (int8_t)tmp[i];
    }
    return;
  }
  for (size_t i = 0; i < count; i++) { /* a tile that cuts a row of channels */
    const int c = (int)((start + i) % (size_t)C);
    int32_t q;
    qt_quantize(&q, in + i, 1, 1, 1, &s->scale[c], &s->zero_point[c], s->qmin, s->qmax);
    if (s->int8)
      ((int8_t *)t->out)[start + i] = (int8_t)q;
    else
      ((int32_t *)t->out)[start + i] = q;
  }
}

static void dequantize_tile(void *ctx, size_t start, size_t count) {
  const boundary_task *t = ctx;
  const qt_step *s = t->s;
  const int C = s->channels;
  float *out = (float *)t->out + start;
  for (size_t i = 0; i < count; i++) {
    const int c = (int)((start + i) % (size_t)C);
    const int32_t q = s->int8 ? (int32_t)((const int8_t *)t->in)[start + i] : ((const int32_t *)t->in)[start + i];
    out[i] = (float)(q - s->zero_point[c]) * s->scale[c]; /* qt_dequantize's formula */
  }
}

static void run_quantize(const qt_step *s, void *out, const float *in, int64_t n, pthreadpool_t pool) {
  boundary_task t = {s, out, in};
  pthreadpool_parallelize_1d_tile_1d(pool, quantize_tile, &t, (size_t)n, BOUNDARY_TILE, 0);
}

static void run_dequantize(const qt_step *s, float *out, const void *in, int64_t n, pthreadpool_t pool) {
  boundary_task t = {s, out, in};
  pthreadpool_parallelize_1d_tile_1d(pool, dequantize_tile, &t, (size_t)n, BOUNDARY_TILE, 0);
}

/* XK_CONCAT on N images: rows of the output (in_numel / Y per image), each from every input. */
static void run_concat(const qt_step *s, int8_t *out, void *const *bufs, int N) {
  const xnn_concat *c = s->aux;
  const int64_t rows = s->in_numel / c->Y * N;
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < c->n; k++)
      memcpy(out + r * c->Y + c->off[k], (const int8_t *)bufs[s->in[k]] + r * c->C[k], (size_t)c->C[k]);
}

static enum xnn_status run_xnn(const qt_step *s, void *o, const void *in, const void *in2, int N, pthreadpool_t pool) {
  enum xnn_status st = xnn_status_invalid_state;
  const size_t n = (size_t)N;
  switch ((xnn_kind)s->op_kind) {
    case XK_CONV: st = xnn_setup_convolution2d_nhwc_qc8(s->op, n, (size_t)s->H, (size_t)s->W, in, o, pool); break;
    case XK_FC: st = xnn_setup_fully_connected_nc_qs8(s->op, n, in, o, pool); break;
    case XK_MAX_POOL: st = xnn_setup_max_pooling2d_nhwc_s8(s->op, n, (size_t)s->H, (size_t)s->W, in, o, pool); break;
    case XK_GAVG_POOL:
      st = xnn_setup_global_average_pooling_nwc_qs8(s->op, n, (size_t)s->H * (size_t)s->W, in, o, pool);
      break;
    case XK_ADD: {
      const size_t shape[1] = {n * (size_t)s->in_numel};
      st = xnn_setup_add_nd_qs8(s->op, 1, shape, 1, shape, in, in2, o, pool);
      break;
    }
    case XK_CLAMP: st = xnn_setup_clamp_nc_s8(s->op, n, in, o, pool); break;
    case XK_SIGMOID: st = xnn_setup_sigmoid_nc_qs8(s->op, n * (size_t)s->H, in, o, pool); break;
    case XK_TANH: st = xnn_setup_tanh_nc_qs8(s->op, n * (size_t)s->H, in, o, pool); break;
    case XK_ELU: st = xnn_setup_elu_nc_qs8(s->op, n * (size_t)s->H, in, o, pool); break;
    case XK_MUL: { /* a: (N, P, C), b: (N, 1, C), broadcast over a's P pixels */
      const size_t a[3] = {n, (size_t)s->H, (size_t)s->W}, b[3] = {n, 1, (size_t)s->W};
      st = xnn_setup_multiply_nd_qs8(s->op, 3, a, 3, b, in, in2, o, pool);
      break;
    }
    case XK_SHUFFLE: st = xnn_setup_channel_shuffle_nc_x8(s->op, n * (size_t)s->H, in, o, pool); break;
    case XK_COPY:
      st = xnn_setup_copy_nc_x8(s->op, n * (size_t)(s->in_numel / s->W), (const int8_t *)in + s->H, o, pool);
      break;
    case XK_LEAKY_RELU_U8: st = xnn_setup_leaky_relu_nc_qu8(s->op, n * (size_t)s->H, in, o, pool); break;
    case XK_AVG_POOL_U8:
      st = xnn_setup_average_pooling2d_nhwc_qu8(s->op, n, (size_t)s->H, (size_t)s->W, in, o, pool);
      break;
    case XK_RESIZE_BILINEAR:
      st = xnn_setup_resize_bilinear2d_nhwc_s8(s->op, n, (size_t)s->H, (size_t)s->W, 2 * (size_t)s->H, 2 * (size_t)s->W,
                                               in, o, pool);
      break;
    case XK_CONCAT:
    case XK_RESIZE: break; /* ours */
  }
  return st == xnn_status_success ? xnn_run_operator(s->op, pool) : st;
}

static void flip_top_bits(uint8_t *out, const uint8_t *in, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = in[i] ^ 0x80;
}

/* A qu8 operator on int8 data (xnnpack_int.h): the input flipped into scratch, the operator, the
 * output flipped in place. */
static enum xnn_status run_xnn_u8(qt_program *p, const qt_step *s, void *o, const void *in, int N, pthreadpool_t pool) {
  uint8_t *u = qt_arena_alloc(p->ctx, (size_t)(s->in_numel * N) + XNN_EXTRA_BYTES);
  flip_top_bits(u, in, s->in_numel * N);
  const enum xnn_status st = run_xnn(s, o, u, NULL, N, pool);
  if (st == xnn_status_success) flip_top_bits(o, o, (int64_t)p->slot_bytes[s->out] * N);
  return st;
}

static void nothing(void *ctx, size_t i) {
  (void)ctx;
  (void)i;
}

/* Sends the pool's workers to sleep now instead of after their spin-wait (which would take a
 * core from the OpenMP threads of the fallback that follows): an empty job with
 * PTHREADPOOL_FLAG_YIELD_WORKERS, one item per thread so that the workers take it. */
static void pool_yield(pthreadpool_t pool) {
  if (pool)
    pthreadpool_parallelize_1d(pool, nothing, NULL, pthreadpool_get_threads_count(pool),
                               PTHREADPOOL_FLAG_YIELD_WORKERS);
}

/* A fallback step: the node's own fp32 forward, on m->fallback_threads OpenMP threads. */
static void *run_fallback(qt_xnnpack *m, const qt_step *s, int n, char *err) {
  const qt_node *node = &m->prog.g->nodes[s->node];
  qt_tensor *ins[QT_MAX_INPUTS] = {NULL};
  qt_fallback_inputs(&m->prog, s, n, ins);
  const int threads = omp_get_max_threads();
  if (m->fallback_threads) omp_set_num_threads(m->fallback_threads);
  qt_tensor *y = qt_node_forward((qt_graph *)m->prog.g, m->prog.ctx, s->node, ins, 0, err);
  if (m->fallback_threads) omp_set_num_threads(threads);
  if (!y) qt_err(err, "run %s on xnnpack: fallback %s (%s) failed", m->prog.name, node->name, qt_op_name(node->op));
  return y ? y->data : NULL;
}

int qt_xnnpack_run(qt_xnnpack *m, float *out, const float *input, int n, char *err) {
  qt_program *p = &m->prog;
  if (n <= 0) return qt_err(err, "run %s on xnnpack: batch of %d images", p->name, n);
  qt_ctx_reset(p->ctx);
  p->bufs[p->input_slot] = (void *)input; /* read only: no step writes its input */
  int pool_busy = 1;                      /* the pool ran last (here or at the end of the previous run) */
  for (int i = 0; i < p->n_steps; i++) {
    const qt_step *s = &p->steps[i];
    void *in = s->in[0] >= 0 ? p->bufs[s->in[0]] : NULL;
    const int64_t numel = s->in_numel * n;
    if (s->kind == QT_STEP_FALLBACK) {
      if (pool_busy) pool_yield(m->pool);
      pool_busy = 0;
      if (!(p->bufs[s->out] = run_fallback(m, s, n, err))) return -1;
      continue;
    }
    pool_busy = 1;
    /* XNNPACK's kernels may read XNN_EXTRA_BYTES past the end of an input */
    void *o = qt_arena_alloc(p->ctx, p->slot_bytes[s->out] * (size_t)n + XNN_EXTRA_BYTES);
    p->bufs[s->out] = o;
    switch (s->kind) {
      case QT_STEP_QUANTIZE: run_quantize(s, o, in, numel, m->pool); break;
      case QT_STEP_DEQUANTIZE: run_dequantize(s, o, in, numel, m->pool); break;
      case QT_STEP_KERNEL: {
        if (s->op_kind == XK_CONCAT) {
          run_concat(s, o, p->bufs, n);
          break;
        }
        if (s->op_kind == XK_RESIZE) {
          qt_resize_nearest_rows(s, o, in, 0, 2 * (int64_t)s->H * n);
          break;
        }
        const int u8 = s->op_kind == XK_LEAKY_RELU_U8 || s->op_kind == XK_AVG_POOL_U8;
        const enum xnn_status st = u8 ? run_xnn_u8(p, s, o, in, n, m->pool)
                                      : run_xnn(s, o, in, s->in[1] >= 0 ? p->bufs[s->in[1]] : NULL, n, m->pool);
        if (st != xnn_status_success)
          return qt_err(err, "run %s on xnnpack: step %d (partition operator) failed: %s", p->name, i,
                        qt_xnn_status_name(st));
        break;
      }
      case QT_STEP_FALLBACK: break;
    }
  }
  memcpy(out, p->bufs[p->output_slot], (size_t)(p->out_numel * n) * sizeof(float));
  return 0;
}

int qt_xnnpack_partition_count(const qt_xnnpack *m) { return m->prog.parts.n; }

qt_partition_kind qt_xnnpack_partition(const qt_xnnpack *m, int i, const char **nodes, const char **detail) {
  return qt_part_get(&m->prog.parts, i, nodes, detail);
}

void qt_xnnpack_report(const qt_xnnpack *m, FILE *f) {
  const int fallbacks = qt_part_count(&m->prog.parts, QT_PART_FALLBACK);
  fprintf(f, "partitions of %s on xnnpack (%d threads): %d int8, %d fallback, %d boundary%s\n", m->prog.name,
          m->pool ? (int)pthreadpool_get_threads_count(m->pool) : 1, qt_part_count(&m->prog.parts, QT_PART_INT8),
          fallbacks, qt_part_count(&m->prog.parts, QT_PART_BOUNDARY),
          fallbacks && m->fallback_threads ? " (fallbacks on 1 OpenMP thread: its workers would spin-wait, "
                                             "OMP_WAIT_POLICY is not PASSIVE)"
                                           : "");
  qt_part_print(&m->prog.parts, f);
}

#else
typedef int qt_xnnpack_run_needs_xnnpack; /* a translation unit may not be empty */
#endif
