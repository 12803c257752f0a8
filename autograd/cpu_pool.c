/* Pooling over NHWC activations on the CPU (max, average, global average) and the plain
 * reference twins. Inner loops run over the C contiguous channels of one pixel, so they
 * vectorize; forward passes parallelize over output rows, backward passes over images (each
 * image's gradient is written by one thread in a fixed order: deterministic, race-free even
 * when windows overlap). Semantics follow PyTorch: floor-mode or ceil-mode output size (windows
 * clipped to the input; an average divides by the window clipped to the padded input), max pool argmax is
 * h*W+w of the chosen input with ties going to the first in row-major window order and a NaN
 * always taken (the last NaN of a window wins, as PyTorch's CPU kernel), average pool divides
 * by the window size counting padding (count_include_pad=True). */
#include "autograd/autograd.h"
#include "autograd/kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define POOL_PARALLEL_MIN 16384
/* Channels per register block in the max pool forward (two AVX2 or one AVX-512 register). */
#define MAXPOOL_BLOCK 16

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t qt_pool_output_size(int64_t in, int kernel, int stride, int pad, int ceil_mode) {
  if (kernel < 1 || stride < 1 || pad < 0 || in + 2 * (int64_t)pad < kernel) return -1;
  int64_t out = floor_div(in + 2 * (int64_t)pad - kernel + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) out--;
  return out;
}

/* PyTorch's pooling_output_shape and pool2d_shape_check. */
int qt_pool2d_shape_init(qt_pool2d_shape *s) {
  if (s->N <= 0 || s->H <= 0 || s->W <= 0 || s->C <= 0) return -1;
  if (s->KH <= 0 || s->KW <= 0 || s->stride_h <= 0 || s->stride_w <= 0) return -1;
  if (s->pad_h < 0 || s->pad_w < 0 || s->pad_h > s->KH / 2 || s->pad_w > s->KW / 2) return -1;
  if ((int64_t)s->H * s->W > INT32_MAX) return -1; /* argmax is int32 h*W+w */
  const int64_t oh = qt_pool_output_size(s->H, s->KH, s->stride_h, s->pad_h, s->ceil_mode);
  const int64_t ow = qt_pool_output_size(s->W, s->KW, s->stride_w, s->pad_w, s->ceil_mode);
  if (oh < 1 || ow < 1) return -1;
  s->OH = (int)oh;
  s->OW = (int)ow;
  return 0;
}

/* Window of output (oh, ow) clipped to the input: rows [h0, h1), columns [w0, w1). */
typedef struct {
  int h0, h1, w0, w1;
} pool_window;

static pool_window window_of(const qt_pool2d_shape *s, int oh, int ow) {
  pool_window w;
  w.h0 = oh * s->stride_h - s->pad_h;
  w.w0 = ow * s->stride_w - s->pad_w;
  w.h1 = w.h0 + s->KH < s->H ? w.h0 + s->KH : s->H;
  w.w1 = w.w0 + s->KW < s->W ? w.w0 + s->KW : s->W;
  if (w.h0 < 0) w.h0 = 0;
  if (w.w0 < 0) w.w0 = 0;
  return w;
}

/* count_include_pad divisor: the window clipped to the padded input, as PyTorch. */
static int avg_divisor(const qt_pool2d_shape *s, int oh, int ow) {
  int h0 = oh * s->stride_h - s->pad_h, w0 = ow * s->stride_w - s->pad_w;
  int h1 = h0 + s->KH < s->H + s->pad_h ? h0 + s->KH : s->H + s->pad_h;
  int w1 = w0 + s->KW < s->W + s->pad_w ? w0 + s->KW : s->W + s->pad_w;
  return (h1 - h0) * (w1 - w0);
}

static int64_t numel_in(const qt_pool2d_shape *s) { return (int64_t)s->N * s->H * s->W * s->C; }

/* ---- max pool ----------------------------------------------------------------------------- */

void qt_max_pool2d_forward(float *out, int32_t *argmax, const float *inp, const qt_pool2d_shape *s) {
  const int C = s->C, W = s->W;
#pragma omp parallel for collapse(2) schedule(static) if (numel_in(s) >= POOL_PARALLEL_MIN)
  for (int n = 0; n < s->N; n++)
    for (int oh = 0; oh < s->OH; oh++) {
      const float *img = inp + (int64_t)n * s->H * W * C;
      for (int ow = 0; ow < s->OW; ow++) {
        const int64_t o = (((int64_t)n * s->OH + oh) * s->OW + ow) * C;
        float *restrict mv = out + o;
        int32_t *restrict mi = argmax + o;
        const pool_window w = window_of(s, oh, ow);
        const int32_t first = w.h0 * W + w.w0;
        int c0 = 0;
        /* Blocks of MAXPOOL_BLOCK channels keep the running max and index in registers. */
        for (; c0 + MAXPOOL_BLOCK <= C; c0 += MAXPOOL_BLOCK) {
          float bv[MAXPOOL_BLOCK];
          int32_t bi[MAXPOOL_BLOCK];
          const float *p0 = img + (int64_t)first * C + c0;
          for (int c = 0; c < MAXPOOL_BLOCK; c++) {
            bv[c] = p0[c];
            bi[c] = first;
          }
          for (int ih = w.h0; ih < w.h1; ih++)
            for (int iw = ih == w.h0 ? w.w0 + 1 : w.w0; iw < w.w1; iw++) {
              const int32_t idx = ih * W + iw;
              const float *p = img + (int64_t)idx * C + c0;
              for (int c = 0; c < MAXPOOL_BLOCK; c++) {
                const float v = p[c];
                const int take = (v > bv[c]) | (v != v);
                bv[c] = take ? v : bv[c];
                bi[c] = take ? idx : bi[c];
              }
            }
          for (int c = 0; c < MAXPOOL_BLOCK; c++) {
            mv[c0 + c] = bv[c];
            mi[c0 + c] = bi[c];
          }
        }
        if (c0 == C) continue;
        const float *restrict p0 = img + (int64_t)first * C;
#pragma omp simd
        for (int c = c0; c < C; c++) {
          mv[c] = p0[c];
          mi[c] = first;
        }
        for (int ih = w.h0; ih < w.h1; ih++)
          for (int iw = ih == w.h0 ? w.w0 + 1 : w.w0; iw < w.w1; iw++) {
            const int32_t idx = ih * W + iw;
            const float *restrict p = img + (int64_t)idx * C;
#pragma omp simd
            for (int c = c0; c < C; c++) {
              const float v = p[c];
              const int take = (v > mv[c]) | (v != v);
              mv[c] = take ? v : mv[c];
              mi[c] = take ? idx : mi[c];
            }
          }
      }
    }
}

void qt_max_pool2d_forward_ref(float *out, int32_t *argmax, const float *inp, const qt_pool2d_shape *s) {
  for (int n = 0; n < s->N; n++)
    for (int c = 0; c < s->C; c++)
      for (int oh = 0; oh < s->OH; oh++)
        for (int ow = 0; ow < s->OW; ow++) {
          float best = -INFINITY;
          int32_t at = -1;
          for (int kh = 0; kh < s->KH; kh++)
            for (int kw = 0; kw < s->KW; kw++) {
              int ih = oh * s->stride_h - s->pad_h + kh, iw = ow * s->stride_w - s->pad_w + kw;
              if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
              float v = inp[(((int64_t)n * s->H + ih) * s->W + iw) * s->C + c];
              if (at < 0 || v > best || isnan(v)) {
                best = v;
                at = ih * s->W + iw;
              }
            }
          int64_t o = (((int64_t)n * s->OH + oh) * s->OW + ow) * s->C + c;
          out[o] = best;
          argmax[o] = at;
        }
}

void qt_max_pool2d_backward(float *dinp, const float *dout, const int32_t *argmax, const qt_pool2d_shape *s) {
  qt_max_pool2d_backward_ex(dinp, 0, dout, argmax, s);
}

void qt_max_pool2d_backward_ex(float *dinp, int dinp_write, const float *dout, const int32_t *argmax,
                               const qt_pool2d_shape *s) {
  if (!dinp) return;
  const int C = s->C, W = s->W;
  /* windows tiling the input exactly (no overlap, gap, padding or leftover) visit every input
   * once, so a fresh dinp is written as 0 + v (the bits of adding to zeros); otherwise each
   * image's part is zeroed first, while it is in cache */
  const int tiles = s->stride_h == s->KH && s->stride_w == s->KW && s->pad_h == 0 && s->pad_w == 0 &&
                    s->OH * s->KH == s->H && s->OW * s->KW == W;
#pragma omp parallel for schedule(static) if (numel_in(s) >= POOL_PARALLEL_MIN)
  for (int n = 0; n < s->N; n++) {
    float *img = dinp + (int64_t)n * s->H * W * C;
    if (dinp_write && tiles) {
      for (int oh = 0; oh < s->OH; oh++)
        for (int ow = 0; ow < s->OW; ow++) {
          const int64_t o = (((int64_t)n * s->OH + oh) * s->OW + ow) * C;
          const float *restrict d = dout + o;
          const int32_t *restrict am = argmax + o;
          for (int ih = oh * s->KH; ih < (oh + 1) * s->KH; ih++)
            for (int iw = ow * s->KW; iw < (ow + 1) * s->KW; iw++) {
              const int32_t idx = ih * W + iw;
              float *restrict g = img + (int64_t)idx * C;
#pragma omp simd
              for (int c = 0; c < C; c++) g[c] = 0.0f + (am[c] == idx ? d[c] : 0.0f);
            }
        }
      continue;
    }
    if (dinp_write) memset(img, 0, (size_t)s->H * W * C * sizeof *img);
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++) {
        const int64_t o = (((int64_t)n * s->OH + oh) * s->OW + ow) * C;
        const float *restrict d = dout + o;
        const int32_t *restrict am = argmax + o;
        const pool_window w = window_of(s, oh, ow);
        /* Visit the window rather than scatter: unit-stride and vectorized. */
        for (int ih = w.h0; ih < w.h1; ih++)
          for (int iw = w.w0; iw < w.w1; iw++) {
            const int32_t idx = ih * W + iw;
            float *restrict g = img + (int64_t)idx * C;
#pragma omp simd
            for (int c = 0; c < C; c++) g[c] += am[c] == idx ? d[c] : 0.0f;
          }
      }
  }
}

void qt_max_pool2d_backward_ref(float *dinp, const float *dout, const int32_t *argmax, const qt_pool2d_shape *s) {
  if (!dinp) return;
  for (int n = 0; n < s->N; n++)
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow = 0; ow < s->OW; ow++)
        for (int c = 0; c < s->C; c++) {
          int64_t o = (((int64_t)n * s->OH + oh) * s->OW + ow) * s->C + c;
          QT_ASSERT(argmax[o] >= 0 && argmax[o] < s->H * s->W, "max_pool2d_backward_ref: argmax %d out of range",
                    argmax[o]);
          dinp[((int64_t)n * s->H * s->W + argmax[o]) * s->C + c] += dout[o];
        }
}

/* ---- average pool ------------------------------------------------------------------------- */

void qt_avg_pool2d_forward(float *out, const float *inp, const qt_pool2d_shape *s) {
  const int C = s->C, W = s->W;
#pragma omp parallel for collapse(2) schedule(static) if (numel_in(s) >= POOL_PARALLEL_MIN)
  for (int n = 0; n < s->N; n++)
    for (int oh = 0; oh < s->OH; oh++) {
      const float *img = inp + (int64_t)n * s->H * W * C;
      for (int ow = 0; ow < s->OW; ow++) {
        float *restrict acc = out + (((int64_t)n * s->OH + oh) * s->OW + ow) * C;
        const pool_window w = window_of(s, oh, ow);
        const float div = (float)avg_divisor(s, oh, ow);
#pragma omp simd
        for (int c = 0; c < C; c++) acc[c] = 0.0f;
        for (int ih = w.h0; ih < w.h1; ih++)
          for (int iw = w.w0; iw < w.w1; iw++) {
            const float *restrict p = img + ((int64_t)ih * W + iw) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) acc[c] += p[c];
          }
#pragma omp simd
        for (int c = 0; c < C; c++) acc[c] /= div;
      }
    }
}

void qt_avg_pool2d_forward_ref(float *out, const float *inp, const qt_pool2d_shape *s) {
  for (int n = 0; n < s->N; n++)
    for (int c = 0; c < s->C; c++)
      for (int oh = 0; oh < s->OH; oh++)
        for (int ow = 0; ow < s->OW; ow++) {
          double sum = 0;
          int count = 0;
          for (int kh = 0; kh < s->KH; kh++)
            for (int kw = 0; kw < s->KW; kw++) {
              int ih = oh * s->stride_h - s->pad_h + kh, iw = ow * s->stride_w - s->pad_w + kw;
              if (ih < -s->pad_h || ih >= s->H + s->pad_h || iw < -s->pad_w || iw >= s->W + s->pad_w) continue;
              count++; /* padding counts */
              if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
              sum += inp[(((int64_t)n * s->H + ih) * s->W + iw) * s->C + c];
            }
          out[(((int64_t)n * s->OH + oh) * s->OW + ow) * s->C + c] = (float)(sum / count);
        }
}

void qt_avg_pool2d_backward(float *dinp, const float *dout, const qt_pool2d_shape *s) {
  if (!dinp) return;
  const int C = s->C, W = s->W;
#pragma omp parallel if (numel_in(s) >= POOL_PARALLEL_MIN)
  {
    float *g = malloc((size_t)C * sizeof *g);
    QT_ASSERT(g, "avg_pool2d_backward: out of memory for %d floats", C);
#pragma omp for schedule(static)
    for (int n = 0; n < s->N; n++) {
      float *img = dinp + (int64_t)n * s->H * W * C;
      for (int oh = 0; oh < s->OH; oh++)
        for (int ow = 0; ow < s->OW; ow++) {
          const float *restrict d = dout + (((int64_t)n * s->OH + oh) * s->OW + ow) * C;
          const pool_window w = window_of(s, oh, ow);
          const float div = (float)avg_divisor(s, oh, ow);
#pragma omp simd
          for (int c = 0; c < C; c++) g[c] = d[c] / div;
          for (int ih = w.h0; ih < w.h1; ih++)
            for (int iw = w.w0; iw < w.w1; iw++) {
              float *restrict q = img + ((int64_t)ih * W + iw) * C;
#pragma omp simd
              for (int c = 0; c < C; c++) q[c] += g[c];
            }
        }
    }
    free(g);
  }
}

void qt_avg_pool2d_backward_ref(float *dinp, const float *dout, const qt_pool2d_shape *s) {
  if (!dinp) return;
  for (int n = 0; n < s->N; n++)
    for (int c = 0; c < s->C; c++)
      for (int oh = 0; oh < s->OH; oh++)
        for (int ow = 0; ow < s->OW; ow++) {
          int count = 0;
          for (int kh = 0; kh < s->KH; kh++)
            for (int kw = 0; kw < s->KW; kw++) {
              int ih = oh * s->stride_h - s->pad_h + kh, iw = ow * s->stride_w - s->pad_w + kw;
              if (ih >= -s->pad_h && ih < s->H + s->pad_h && iw >= -s->pad_w && iw < s->W + s->pad_w) count++;
            }
          float g = dout[(((int64_t)n * s->OH + oh) * s->OW + ow) * s->C + c] / (float)count;
          for (int kh = 0; kh < s->KH; kh++)
            for (int kw = 0; kw < s->KW; kw++) {
              int ih = oh * s->stride_h - s->pad_h + kh, iw = ow * s->stride_w - s->pad_w + kw;
              if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W) continue;
              dinp[(((int64_t)n * s->H + ih) * s->W + iw) * s->C + c] += g;
            }
        }
}

/* ---- global average pool ------------------------------------------------------------------ */

void qt_global_avg_pool_forward(float *out, const float *inp, int N, int HW, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)N * HW * C >= POOL_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    float *restrict acc = out + (int64_t)n * C;
    const float *img = inp + (int64_t)n * HW * C;
#pragma omp simd
    for (int c = 0; c < C; c++) acc[c] = 0.0f;
    for (int i = 0; i < HW; i++) {
      const float *restrict p = img + (int64_t)i * C;
#pragma omp simd
      for (int c = 0; c < C; c++) acc[c] += p[c];
    }
#pragma omp simd
    for (int c = 0; c < C; c++) acc[c] /= (float)HW;
  }
}

void qt_global_avg_pool_forward_ref(float *out, const float *inp, int N, int HW, int C) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      double sum = 0;
      for (int i = 0; i < HW; i++) sum += inp[((int64_t)n * HW + i) * C + c];
      out[(int64_t)n * C + c] = (float)(sum / HW);
    }
}

void qt_global_avg_pool_backward(float *dinp, int write, const float *dout, int N, int HW, int C) {
  if (!dinp) return;
#pragma omp parallel if ((int64_t)N * HW * C >= POOL_PARALLEL_MIN)
  {
    float *g = malloc((size_t)C * sizeof *g);
    QT_ASSERT(g, "global_avg_pool_backward: out of memory for %d floats", C);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
#pragma omp simd
      for (int c = 0; c < C; c++) g[c] = dout[(int64_t)n * C + c] / (float)HW;
      float *img = dinp + (int64_t)n * HW * C;
      for (int i = 0; i < HW; i++) {
        float *restrict q = img + (int64_t)i * C;
        if (write) {
#pragma omp simd
          for (int c = 0; c < C; c++) q[c] = g[c];
        } else {
#pragma omp simd
          for (int c = 0; c < C; c++) q[c] += g[c];
        }
      }
    }
    free(g);
  }
}

void qt_global_avg_pool_backward_ref(float *dinp, int write, const float *dout, int N, int HW, int C) {
  if (!dinp) return;
  for (int n = 0; n < N; n++)
    for (int i = 0; i < HW; i++)
      for (int c = 0; c < C; c++) {
        float *q = &dinp[((int64_t)n * HW + i) * C + c];
        *q = (write ? 0.0f : *q) + dout[(int64_t)n * C + c] / (float)HW;
      }
}
