/* Fake quant (forward with the clipped-STE mask, backward), the LSQ backward, quantize and
 * dequantize: each optimized kernel (one fused OpenMP + SIMD pass) next to its plain `_ref`
 * twin, which transcribes PyTorch 1.13's scalar CPU kernels (QuantizedOpKernels.cpp).
 *
 * PyTorch computes q = static_cast<int64_t>(zp + nearbyint(x * inv_s)) with the sum in float
 * and the mask on that int64. x86 turns NaN, +-Inf and anything outside int64 into INT64_MIN,
 * so such inputs land on quant_min with mask 0 (yes, +Inf becomes quant_min). The optimized
 * kernels reproduce it in float: q >= 2^63 or NaN becomes -Inf before the clamp.
 *
 * Relies on the C11 (non-GNU) default -ffp-contract=off; the LSQ kernel calls fmaf() where
 * PyTorch's AVX2 build contracts (see qt_fake_quant_lsq_backward in quant.h). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/quant_assert.h"
#include "quant/quant_elem.h"

static void check_view(int64_t outer, int channels, int64_t inner, const float *scale, const int32_t *zero_point,
                       int qmin, int qmax) {
  QUANT_ASSERT(outer >= 0 && inner >= 0 && channels >= 1, "fake quant: bad (outer, channels, inner) view");
  QUANT_ASSERT(scale && zero_point, "fake quant: scale and zero_point are required");
  QUANT_ASSERT(qmin < qmax, "fake quant: quant_min must be below quant_max");
}

/* ---- fake quant forward ---------------------------------------------------------------- */

/* One run of n elements sharing one scale/zero point. */
static inline void fq_run(float *out, uint8_t *mask, const float *inp, int64_t n, float s, int32_t zp, float lo,
                          float hi) {
  const float inv_s = 1.0f / s, zpf = (float)zp;
  if (mask) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float q = quant_round(inp[i], inv_s, zpf);
      mask[i] = (uint8_t)((q >= lo) & (q <= hi));
      out[i] = (quant_clamp(q, lo, hi) - zpf) * s;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = quant_fake(inp[i], s, inv_s, zpf, lo, hi);
  }
}

void qt_fake_quant_forward(float *out, uint8_t *mask, const float *inp, int64_t outer, int channels, int64_t inner,
                           const float *scale, const int32_t *zero_point, int qmin, int qmax) {
  check_view(outer, channels, inner, scale, zero_point, qmin, qmax);
  const int64_t n = outer * channels * inner;
  const float lo = (float)qmin, hi = (float)qmax;
  if (channels == 1) {
    /* per tensor: one flat run split into equal static chunks */
#pragma omp parallel if (n >= QUANT_PARALLEL_MIN)
    {
      int nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t per = (n + nt - 1) / nt, b = t * per, e = b + per < n ? b + per : n;
      if (b < e) fq_run(out + b, mask ? mask + b : NULL, inp + b, e - b, scale[0], zero_point[0], lo, hi);
    }
  } else if (inner == 1) {
    /* channels last (NHWC activations): vectorize across channels, split the rows; the
     * per-channel 1/s and float zero points are computed once, not per row */
    const int C = channels;
    float *inv = malloc(2 * (size_t)C * sizeof(float));
    QUANT_ASSERT(inv, "out of memory");
    float *zpf = inv + C;
    for (int c = 0; c < C; c++) {
      inv[c] = 1.0f / scale[c];
      zpf[c] = (float)zero_point[c];
    }
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t o = 0; o < outer; o++) {
      const float *x = inp + o * C;
      float *y = out + o * C;
      uint8_t *m = mask ? mask + o * C : NULL;
      if (m) {
#pragma omp simd
        for (int c = 0; c < C; c++) {
          float q = quant_round(x[c], inv[c], zpf[c]);
          m[c] = (uint8_t)((q >= lo) & (q <= hi));
          y[c] = (quant_clamp(q, lo, hi) - zpf[c]) * scale[c];
        }
      } else {
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = quant_fake(x[c], scale[c], inv[c], zpf[c], lo, hi);
      }
    }
    free(inv);
  } else {
    /* channel in the middle (OIHW weights: outer 1): one run per (outer, channel) row */
    const int64_t rows = outer * channels;
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
      int c = (int)(r % channels);
      fq_run(out + r * inner, mask ? mask + r * inner : NULL, inp + r * inner, inner, scale[c], zero_point[c], lo, hi);
    }
  }
}

/* PyTorch's scalar code, transcribed: int64 arithmetic, the cast's x86 result spelled out. */
static int64_t torch_cast_int64(float v) {
  if (isnan(v) || v >= QUANT_INT64_LIMIT || v < -QUANT_INT64_LIMIT) return INT64_MIN;
  return (int64_t)v;
}

void qt_fake_quant_forward_ref(float *out, uint8_t *mask, const float *inp, int64_t outer, int channels, int64_t inner,
                               const float *scale, const int32_t *zero_point, int qmin, int qmax) {
  check_view(outer, channels, inner, scale, zero_point, qmin, qmax);
  for (int64_t o = 0; o < outer; o++) {
    for (int c = 0; c < channels; c++) {
      const float sc = scale[c], inv_scale = 1.0f / sc;
      const int64_t zp = zero_point[c];
      for (int64_t i = 0; i < inner; i++) {
        int64_t idx = (o * channels + c) * inner + i;
        int64_t qval = torch_cast_int64((float)zp + nearbyintf(inp[idx] * inv_scale));
        int64_t clamped = qval < qmin ? qmin : qval > qmax ? qmax : qval;
        if (mask) mask[idx] = (uint8_t)(qmin <= qval && qval <= qmax);
        out[idx] = (float)(clamped - zp) * sc;
      }
    }
  }
}

/* ---- fake quant backward (clipped STE) ------------------------------------------------- */

void qt_fake_quant_backward(float *dinp, const float *dout, const uint8_t *mask, int64_t n) {
  /* dY * mask as PyTorch multiplies it (a NaN/Inf gradient stays NaN where masked) */
#pragma omp parallel for simd schedule(static) if (n >= QUANT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) dinp[i] += dout[i] * (float)mask[i];
}

void qt_fake_quant_backward_ref(float *dinp, const float *dout, const uint8_t *mask, int64_t n) {
  for (int64_t i = 0; i < n; i++) dinp[i] += dout[i] * (mask[i] ? 1.0f : 0.0f);
}

/* ---- LSQ backward ---------------------------------------------------------------------- */

void qt_fake_quant_lsq_backward(float *dinp, float *dscale, float *dzero_point, const float *dout, const float *inp,
                                int64_t outer, int channels, int64_t inner, const float *scale,
                                const int32_t *zero_point, int qmin, int qmax, float grad_factor) {
  qt_fake_quant_lsq_backward_ex(dinp, 0, dscale, dzero_point, dout, inp, outer, channels, inner, scale, zero_point,
                                qmin, qmax, grad_factor);
}

void qt_fake_quant_lsq_backward_ex(float *dinp, int dinp_write, float *dscale, float *dzero_point, const float *dout,
                                   const float *inp, int64_t outer, int channels, int64_t inner, const float *scale,
                                   const int32_t *zero_point, int qmin, int qmax, float grad_factor) {
  check_view(outer, channels, inner, scale, zero_point, qmin, qmax);
  const int64_t n = outer * channels * inner;
  if (channels == 1) outer = 1, inner = n; /* per tensor: one flat row whatever the view */
  const float lo = (float)qmin, hi = (float)qmax;
  const int C = channels;
  int nt = n >= QUANT_PARALLEL_MIN ? omp_get_max_threads() : 1;
  /* per-thread partial sums, combined in thread order: deterministic for a thread count */
  double *part = calloc((size_t)nt * 2 * (size_t)C, sizeof(double));
  QUANT_ASSERT(part, "out of memory");
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    double *ps = part + (size_t)t * 2 * C, *pz = ps + C;
    if (inner == 1 && C > 1) {
      int64_t per = (outer + T - 1) / T, b = t * per, e = b + per < outer ? b + per : outer;
      for (int64_t o = b; o < e; o++) {
#pragma omp simd
        for (int c = 0; c < C; c++) {
          int64_t i = o * C + c;
          float s = scale[c], dx, ds, dz;
          LSQ_ELEMENT(inp[i], dout[i], s, 1.0f / s, (float)zero_point[c], lo, hi, grad_factor, dx, ds, dz);
          dinp[i] = select_bits(dinp_write, 0.0f, dinp[i]) + dx;
          ps[c] += ds;
          pz[c] += dz;
        }
      }
    } else {
      /* rows of `inner`; a single long row (per tensor) is split across threads too */
      int64_t per = (n + T - 1) / T, b = t * per, e = b + per < n ? b + per : n;
      for (int64_t start = b; start < e;) {
        int64_t r = start / inner, stop = (r + 1) * inner < e ? (r + 1) * inner : e;
        int c = (int)(r % C);
        const float s = scale[c], inv_s = 1.0f / s, zpf = (float)zero_point[c];
        double as = 0, az = 0;
        if (dzero_point) {
#pragma omp simd reduction(+ : as, az)
          for (int64_t i = start; i < stop; i++) {
            float dx, ds, dz;
            LSQ_ELEMENT(inp[i], dout[i], s, inv_s, zpf, lo, hi, grad_factor, dx, ds, dz);
            dinp[i] = select_bits(dinp_write, 0.0f, dinp[i]) + dx;
            as += ds;
            az += dz;
          }
        } else { /* the zero point is not learned (symmetric LSQ): no dz sum to carry */
#pragma omp simd reduction(+ : as)
          for (int64_t i = start; i < stop; i++) {
            float dx, ds, dz;
            LSQ_ELEMENT(inp[i], dout[i], s, inv_s, zpf, lo, hi, grad_factor, dx, ds, dz);
            (void)dz;
            dinp[i] = select_bits(dinp_write, 0.0f, dinp[i]) + dx;
            as += ds;
          }
        }
        ps[c] += as;
        pz[c] += az;
        start = stop;
      }
    }
  }
  for (int c = 0; c < C; c++) {
    double s = 0, z = 0;
    for (int t = 0; t < nt; t++) {
      s += part[(size_t)t * 2 * C + c];
      z += part[(size_t)t * 2 * C + C + c];
    }
    dscale[c] += (float)s;
    if (dzero_point) dzero_point[c] += (float)z;
  }
  free(part);
}

void qt_fake_quant_lsq_backward_ref(float *dinp, float *dscale, float *dzero_point, const float *dout, const float *inp,
                                    int64_t outer, int channels, int64_t inner, const float *scale,
                                    const int32_t *zero_point, int qmin, int qmax, float grad_factor) {
  check_view(outer, channels, inner, scale, zero_point, qmin, qmax);
  for (int c = 0; c < channels; c++) {
    const float sc = scale[c], inv_scale = 1.0f / sc;
    const int64_t zp = zero_point[c];
    const float dscale_small = (float)(qmin - zp), dscale_big = (float)(qmax - zp);
    double sum_s = 0, sum_z = 0;
    for (int64_t o = 0; o < outer; o++) {
      for (int64_t i = 0; i < inner; i++) {
        int64_t idx = (o * channels + c) * inner + i;
        float x = inp[idx], dy = dout[idx];
        int64_t xqi = torch_cast_int64(nearbyintf(fmaf(x, inv_scale, (float)zp)));
        dinp[idx] += dy * (float)(xqi >= qmin && xqi <= qmax);
        int64_t clamped = xqi > qmax ? qmax : xqi < qmin ? qmin : xqi;
        if (xqi < qmin || xqi > qmax) {
          sum_z += (dy * -1.0f * sc) * grad_factor;
          sum_s += (xqi < qmin ? dy * dscale_small : dy * dscale_big) * grad_factor;
        } else {
          sum_s += dy * fmaf((float)(clamped - zp), sc, -x) * inv_scale * grad_factor;
        }
      }
    }
    dscale[c] += (float)sum_s;
    if (dzero_point) dzero_point[c] += (float)sum_z;
  }
}

/* ---- LSQ scale coefficients ------------------------------------------------------------ */

void qt_fake_quant_lsq_scale_coef(float *coef, const float *inp, int64_t n, float scale, int32_t zero_point, int qmin,
                                  int qmax) {
  QUANT_ASSERT(n >= 0 && qmin < qmax, "LSQ scale coefficients: bad arguments");
  const float s = scale, inv_s = 1.0f / s, zpf = (float)zero_point, lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for simd schedule(static) if (n >= QUANT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) {
    float dx, ds, dz; /* LSQ_ELEMENT with dy = 1 and grad_factor 1: in range ((1 * f) * inv_s) * 1 */
    LSQ_ELEMENT(inp[i], 1.0f, s, inv_s, zpf, lo, hi, 1.0f, dx, ds, dz);
    (void)dx, (void)dz;
    coef[i] = ds;
  }
}

/* ---- per-tensor fake quant (LSQ) followed by a tiling max pool ------------------------- */

/* Windows tile the (N, H, W, C) input exactly (stride = kernel, no padding): OH = H / KH. */
static void check_pool_tiles(int N, int H, int W, int C, int KH, int KW) {
  QUANT_ASSERT(N >= 0 && C >= 1 && KH >= 1 && KW >= 1 && H >= KH && W >= KW && H % KH == 0 && W % KW == 0,
               "fake quant + max pool: windows must tile the input");
}

void qt_fake_quant_max_pool_forward(float *out, int32_t *argmax, uint8_t *mask, const float *inp, int N, int H, int W,
                                    int C, int KH, int KW, float scale, int32_t zero_point, int qmin, int qmax) {
  check_pool_tiles(N, H, W, C, KH, KW);
  QUANT_ASSERT(qmin < qmax, "fake quant: quant_min must be below quant_max");
  const int OH = H / KH, OW = W / KW;
  const float s = scale, inv_s = 1.0f / s, zpf = (float)zero_point, lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)N * H * W * C >= QUANT_PARALLEL_MIN)
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < OH; oh++) {
      const float *img = inp + (int64_t)n * H * W * C;
      for (int ow = 0; ow < OW; ow++) {
        const int64_t o = (((int64_t)n * OH + oh) * OW + ow) * C;
        float *restrict mv = out + o;
        int32_t *restrict mi = argmax + o;
        const int32_t first = oh * KH * W + ow * KW;
        const float *restrict p0 = img + (int64_t)first * C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
          mv[c] = quant_fake(p0[c], s, inv_s, zpf, lo, hi);
          mi[c] = first;
        }
        /* the window after its first element, in max_pool2d's order and with its comparison */
        for (int ih = oh * KH; ih < (oh + 1) * KH; ih++)
          for (int iw = ih == oh * KH ? ow * KW + 1 : ow * KW; iw < (ow + 1) * KW; iw++) {
            const int32_t idx = ih * W + iw;
            const float *restrict p = img + (int64_t)idx * C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
              const float v = quant_fake(p[c], s, inv_s, zpf, lo, hi);
              const int take = (v > mv[c]) | (v != v);
              mv[c] = take ? v : mv[c];
              mi[c] = take ? idx : mi[c];
            }
          }
        if (mask) { /* the clipped STE's mask of each window's argmax input */
          uint8_t *restrict mm = mask + o;
          for (int c = 0; c < C; c++) {
            const float q = quant_round(img[(int64_t)mi[c] * C + c], inv_s, zpf);
            mm[c] = (uint8_t)((q >= lo) & (q <= hi));
          }
        }
      }
    }
}

void qt_fake_quant_max_pool_backward(float *dinp, int dinp_write, const float *dout, const int32_t *argmax,
                                     const uint8_t *mask, int N, int H, int W, int C, int KH, int KW) {
  check_pool_tiles(N, H, W, C, KH, KW);
  const int OH = H / KH, OW = W / KW;
#pragma omp parallel for schedule(static) if ((int64_t)N * H * W * C >= QUANT_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    float *dimg = dinp + (int64_t)n * H * W * C;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const int64_t o = (((int64_t)n * OH + oh) * OW + ow) * C;
        const float *restrict d = dout + o;
        const int32_t *restrict am = argmax + o;
        const uint8_t *restrict m = mask + o;
        for (int ih = oh * KH; ih < (oh + 1) * KH; ih++)
          for (int iw = ow * KW; iw < (ow + 1) * KW; iw++) {
            const int32_t idx = ih * W + iw;
            float *restrict g = dimg + (int64_t)idx * C;
            /* max_pool2d's gradient (0 + d at the argmax, + 0 elsewhere), then the fake quant's:
             * masked in place (a fresh gradient) or added times the mask */
            if (dinp_write) {
#pragma omp simd
              for (int c = 0; c < C; c++) g[c] = (m[c] & (am[c] == idx)) ? 0.0f + d[c] : 0.0f;
            } else {
#pragma omp simd
              for (int c = 0; c < C; c++) g[c] += (0.0f + (am[c] == idx ? d[c] : 0.0f)) * (float)m[c];
            }
          }
      }
  }
}

/* Per-channel double sums for one thread, zeroed, on whole cache lines: each row's sums are stored
 * and reloaded by the next row, and a 64-byte store split across two lines does not forward to
 * that load (perf over a QAT W4A8 bench_profile run: qt_fake_quant_lsq_pool_val_backward 4.5% of
 * the samples with calloc's 16-byte alignment, 1.7% aligned; the same operations, the same bits). */
static double *channel_sums(int C) {
  const size_t bytes = ((size_t)C * sizeof(double) + 63) & ~(size_t)63;
  double *acc = aligned_alloc(64, bytes);
  if (acc) memset(acc, 0, bytes);
  return acc;
}

/* Both LSQ + max pool backwards: into dinp (the input-sized gradient) or, dval not NULL, each
 * window's argmax input's value alone (dinp NULL then). */
static void lsq_max_pool_backward(float *dinp, int dinp_write, float *dval, float *dscale, const float *dout,
                                  const int32_t *argmax, const float *inp, int N, int H, int W, int C, int KH, int KW,
                                  float scale, int32_t zero_point, int qmin, int qmax, float grad_factor) {
  check_pool_tiles(N, H, W, C, KH, KW);
  QUANT_ASSERT(qmin < qmax, "fake quant: quant_min must be below quant_max");
  const int OH = H / KH, OW = W / KW;
  const float s = scale, inv_s = 1.0f / s, zpf = (float)zero_point, lo = (float)qmin, hi = (float)qmax;
  const int nt = (int64_t)N * H * W * C >= QUANT_PARALLEL_MIN ? omp_get_max_threads() : 1;
  double *part = calloc((size_t)nt, sizeof(double)); /* per-thread sums, combined in thread order */
  QUANT_ASSERT(part, "out of memory");
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int per = (N + T - 1) / T, nb = t * per, ne = nb + per < N ? nb + per : N;
    /* per channel sums (vertical adds; a horizontal sum per output position would cost more
     * than the LSQ terms), added up in channel order at the end */
    double *acc = channel_sums(C);
    float *xa = calloc(2 * (size_t)C, sizeof(float)), *dxa = xa + C; /* per output position */
    QUANT_ASSERT(xa && acc, "out of memory");
    for (int n = nb; n < ne; n++) {
      const float *img = inp + (int64_t)n * H * W * C;
      float *dimg = dinp ? dinp + (int64_t)n * H * W * C : NULL;
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          const int64_t o = (((int64_t)n * OH + oh) * OW + ow) * C;
          const float *restrict d = dout + o;
          const int32_t *restrict am = argmax + o;
          if (KH == 2 && KW == 2 && dimg) { /* FashionCNN's pools: one pass, the window in registers */
            const int32_t i00 = 2 * oh * W + 2 * ow, i01 = i00 + 1, i10 = i00 + W, i11 = i10 + 1;
            const float *restrict x00 = img + (int64_t)i00 * C, *restrict x01 = x00 + C;
            const float *restrict x10 = img + (int64_t)i10 * C, *restrict x11 = x10 + C;
            float *g00 = dimg + (int64_t)i00 * C, *g01 = g00 + C, *g10 = dimg + (int64_t)i10 * C, *g11 = g10 + C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
              const int32_t a = am[c];
              const float xs =
                  select_bits(a == i00, x00[c], select_bits(a == i01, x01[c], select_bits(a == i10, x10[c], x11[c])));
              float dx, ds, dz;
              LSQ_ELEMENT(xs, 0.0f + d[c], s, inv_s, zpf, lo, hi, grad_factor, dx, ds, dz);
              (void)dz;
              acc[c] += ds;
              g00[c] = select_bits(dinp_write, 0.0f, g00[c]) + select_bits(a == i00, dx, 0.0f);
              g01[c] = select_bits(dinp_write, 0.0f, g01[c]) + select_bits(a == i01, dx, 0.0f);
              g10[c] = select_bits(dinp_write, 0.0f, g10[c]) + select_bits(a == i10, dx, 0.0f);
              g11[c] = select_bits(dinp_write, 0.0f, g11[c]) + select_bits(a == i11, dx, 0.0f);
            }
            continue;
          }
          /* the general path (and the scale's gradient alone or the argmax inputs' values, dinp
           * NULL: the same sums in the same per-channel order) */
          /* each channel's argmax input: the only one of the window whose gradient is not zero */
          for (int ih = oh * KH; ih < (oh + 1) * KH; ih++)
            for (int iw = ow * KW; iw < (ow + 1) * KW; iw++) {
              const int32_t idx = ih * W + iw;
              const float *restrict p = img + (int64_t)idx * C;
#pragma omp simd
              for (int c = 0; c < C; c++) xa[c] = select_bits(am[c] == idx, p[c], xa[c]);
            }
#pragma omp simd
          for (int c = 0; c < C; c++) {
            float dx, ds, dz;
            LSQ_ELEMENT(xa[c], 0.0f + d[c], s, inv_s, zpf, lo, hi, grad_factor, dx, ds, dz);
            (void)dz;
            dxa[c] = dx;
            acc[c] += ds;
          }
          if (dval) { /* what the other path's 0 + dx writes at the argmax input */
            float *restrict dv = dval + o;
#pragma omp simd
            for (int c = 0; c < C; c++) dv[c] = 0.0f + dxa[c];
          }
          if (!dimg) continue;
          /* the other inputs get + 0.0f: the bits of max_pool2d's zeros through fake quant */
          for (int ih = oh * KH; ih < (oh + 1) * KH; ih++)
            for (int iw = ow * KW; iw < (ow + 1) * KW; iw++) {
              const int32_t idx = ih * W + iw;
              float *restrict g = dimg + (int64_t)idx * C;
#pragma omp simd
              for (int c = 0; c < C; c++)
                g[c] = select_bits(dinp_write, 0.0f, g[c]) + select_bits(am[c] == idx, dxa[c], 0.0f);
            }
        }
    }
    double as = 0;
    for (int c = 0; c < C; c++) as += acc[c];
    free(xa);
    free(acc);
    part[t] = as;
  }
  double sum = 0;
  for (int t = 0; t < nt; t++) sum += part[t];
  if (dscale) *dscale += (float)sum;
  free(part);
}

void qt_fake_quant_lsq_max_pool_backward(float *dinp, int dinp_write, float *dscale, const float *dout,
                                         const int32_t *argmax, const float *inp, int N, int H, int W, int C, int KH,
                                         int KW, float scale, int32_t zero_point, int qmin, int qmax,
                                         float grad_factor) {
  lsq_max_pool_backward(dinp, dinp_write, NULL, dscale, dout, argmax, inp, N, H, W, C, KH, KW, scale, zero_point, qmin,
                        qmax, grad_factor);
}

void qt_fake_quant_lsq_max_pool_backward_val(float *dval, float *dscale, const float *dout, const int32_t *argmax,
                                             const float *inp, int N, int H, int W, int C, int KH, int KW, float scale,
                                             int32_t zero_point, int qmin, int qmax, float grad_factor) {
  lsq_max_pool_backward(NULL, 0, dval, dscale, dout, argmax, inp, N, H, W, C, KH, KW, scale, zero_point, qmin, qmax,
                        grad_factor);
}

/* qt_fake_quant_lsq_pool_val_backward's rows [o0, o1) of C channels: each channel's double sum
 * of the scale terms into acc (row after row, as lsq_max_pool_backward), val 0 + the input's
 * gradient where the relu passed the argmax input, else 0 (pool_grad_values' select, in this
 * pass). Inlined with a literal C of at most 64 the sums live in registers, not in memory that
 * every row stores and reloads; the same operations in the same order either way. */
static inline __attribute__((always_inline)) void lsq_val_rows(double *restrict acc, float *restrict val,
                                                               const float *restrict dout, const float *restrict xarg,
                                                               int64_t o0, int64_t o1, const int C, float s,
                                                               float inv_s, float zpf, float lo, float hi,
                                                               float grad_factor, int relu) {
  for (int64_t o = o0; o < o1; o += C) {
    const float *restrict d = dout + o, *restrict xa = xarg + o;
    float *restrict v = val + o;
#pragma omp simd
    for (int c = 0; c < C; c++) {
      float dx, ds, dz;
      LSQ_ELEMENT(xa[c], 0.0f + d[c], s, inv_s, zpf, lo, hi, grad_factor, dx, ds, dz);
      (void)dz;
      acc[c] += ds;
      v[c] = select_bits(quant_relu_pass(xa[c], relu), 0.0f + dx, 0.0f);
    }
  }
}

void qt_fake_quant_lsq_pool_val_backward(float *val, float *dscale, const float *dout, const float *xarg, int N,
                                         int per_image, int C, int64_t inputs, float scale, int32_t zero_point,
                                         int qmin, int qmax, float grad_factor, int relu) {
  QUANT_ASSERT(N >= 0 && per_image >= 0 && C >= 1 && qmin < qmax && relu >= 0 && relu <= 2,
               "fake quant + max pool: bad shape, range or relu");
  const float s = scale, inv_s = 1.0f / s, zpf = (float)zero_point, lo = (float)qmin, hi = (float)qmax;
  /* lsq_max_pool_backward's threads and per-channel sums, in its order */
  const int nt = inputs >= QUANT_PARALLEL_MIN ? omp_get_max_threads() : 1;
  double *part = calloc((size_t)nt, sizeof(double));
  QUANT_ASSERT(part, "out of memory");
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int per = (N + T - 1) / T, nb = t * per, ne = nb + per < N ? nb + per : N;
    const int64_t o0 = (int64_t)nb * per_image * C, o1 = (int64_t)(ne > nb ? ne : nb) * per_image * C;
    double reg[64] = {0}, *acc = C <= 64 ? reg : channel_sums(C);
    QUANT_ASSERT(acc, "out of memory");
    if (C == 16)
      lsq_val_rows(acc, val, dout, xarg, o0, o1, 16, s, inv_s, zpf, lo, hi, grad_factor, relu);
    else if (C == 32)
      lsq_val_rows(acc, val, dout, xarg, o0, o1, 32, s, inv_s, zpf, lo, hi, grad_factor, relu);
    else if (C == 64)
      lsq_val_rows(acc, val, dout, xarg, o0, o1, 64, s, inv_s, zpf, lo, hi, grad_factor, relu);
    else
      lsq_val_rows(acc, val, dout, xarg, o0, o1, C, s, inv_s, zpf, lo, hi, grad_factor, relu);
    double as = 0;
    for (int c = 0; c < C; c++) as += acc[c];
    if (acc != reg) free(acc);
    part[t] = as;
  }
  double sum = 0;
  for (int t = 0; t < nt; t++) sum += part[t];
  if (dscale) *dscale += (float)sum;
  free(part);
}

/* ---- quantize / dequantize ------------------------------------------------------------- */

void qt_quantize(int32_t *q, const float *inp, int64_t outer, int channels, int64_t inner, const float *scale,
                 const int32_t *zero_point, int qmin, int qmax) {
  check_view(outer, channels, inner, scale, zero_point, qmin, qmax);
  const int64_t rows = outer * channels, n = rows * inner;
  const float lo = (float)qmin, hi = (float)qmax;
  if (channels == 1) { /* per tensor: flat, whatever the view */
    const float s = scale[0], inv_s = 1.0f / s, zpf = (float)zero_point[0];
#pragma omp parallel for simd schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) q[i] = (int32_t)quant_clamp(quant_round(inp[i], inv_s, zpf), lo, hi);
  } else if (inner == 1) {
    const int C = channels;
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t o = 0; o < outer; o++) {
#pragma omp simd
      for (int c = 0; c < C; c++) {
        float s = scale[c], zpf = (float)zero_point[c];
        q[o * C + c] = (int32_t)quant_clamp(quant_round(inp[o * C + c], 1.0f / s, zpf), lo, hi);
      }
    }
  } else {
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
      int c = (int)(r % channels);
      const float s = scale[c], inv_s = 1.0f / s, zpf = (float)zero_point[c];
      const float *x = inp + r * inner;
      int32_t *y = q + r * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; i++) y[i] = (int32_t)quant_clamp(quant_round(x[i], inv_s, zpf), lo, hi);
    }
  }
}

void qt_dequantize(float *out, const int32_t *q, int64_t outer, int channels, int64_t inner, const float *scale,
                   const int32_t *zero_point) {
  QUANT_ASSERT(outer >= 0 && inner >= 0 && channels >= 1, "dequantize: bad (outer, channels, inner) view");
  const int64_t rows = outer * channels, n = rows * inner;
  if (channels == 1) { /* per tensor: flat, whatever the view */
    const float s = scale[0];
    const int32_t zp = zero_point[0];
#pragma omp parallel for simd schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = (float)(q[i] - zp) * s;
  } else if (inner == 1) {
    const int C = channels;
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t o = 0; o < outer; o++) {
#pragma omp simd
      for (int c = 0; c < C; c++) out[o * C + c] = (float)(q[o * C + c] - zero_point[c]) * scale[c];
    }
  } else {
#pragma omp parallel for schedule(static) if (n >= QUANT_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
      int c = (int)(r % channels);
      const float s = scale[c];
      const int32_t zp = zero_point[c];
#pragma omp simd
      for (int64_t i = 0; i < inner; i++) out[r * inner + i] = (float)(q[r * inner + i] - zp) * s;
    }
  }
}
