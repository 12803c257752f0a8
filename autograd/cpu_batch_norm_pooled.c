/* Batch norm fused with the max pool after it (cpu_batch_norm_int.h): the training forward of
 * batch norm + relu (+ fake quant) + max pool in one pass over the input, and the backward of a
 * batch norm whose max pool handed it its gradient as each window's argmax value. Same
 * determinism and the same bits as the plain passes (cpu_batch_norm.c). */
#include "autograd/cpu_batch_norm_int.h"

/* ---- training forward ------------------------------------------------------------------- */

/* One normalized, relu'd value (bn_pool_band's, before the fake quant): selects on the bits, so
 * the loops around it vectorize (select_bits, quant/quant_elem.h). */
BN_INLINE float bn_pool_value(float x, float div, float chi, float clo, float ca, float bb, const int RELU,
                              const int D) {
  float v = (((D ? x / div : x) - chi) - clo) * ca + bb;
  if (RELU) v = select_bits(0.0f > v, 0.0f, v);
  if (RELU == 2) v = select_bits(6.0f < v, 6.0f, v);
  return v;
}

/* One row of windows (output row oh of an image) of qt_batch_norm_relu_pool_forward_train, with
 * literal RELU, FQ, D (a divisor) and BLK (img blocked, hw pixels: kernels.h; else NHWC): each
 * input normalized as bn_apply_rows does, clamped as relu_mask_block does (max(0, v) and min(6, v)
 * as x86 computes them: NaN and -0 kept), quantized as qt_fake_quant_forward does, and pooled with
 * max pool's comparison in its window order; with FQ, ya tracks the relu's output at the argmax.
 * The outputs are NHWC either way. */
BN_INLINE void bn_pool_band(float *out, int32_t *argmax, float *yarg, uint8_t *qmask, const float *img, int64_t o_row,
                            int oh, int W, int OW, int C, int64_t hw, int K, const float *restrict chi,
                            const float *restrict clo, const float *restrict ca, const float *restrict bb,
                            const float *restrict div, const qt_fq_params *fq, float *ya_scratch, const int RELU,
                            const int FQ, const int D, const int BLK) {
  const float s = FQ ? fq->scale : 1.0f, inv_s = 1.0f / s, zpf = FQ ? (float)fq->zero_point : 0.0f;
  const float lo = FQ ? (float)fq->qmin : 0.0f, hi = FQ ? (float)fq->qmax : 0.0f;
  /* lanes: NHWC all C channels of a pixel at once; blocked 16 at a time, blocks hw * 16 apart */
  const int NB = BLK ? C / 16 : 1, LW = BLK ? 16 : C, XS = BLK ? 16 : C;
  const int64_t BS = BLK ? hw * 16 : 0;
  for (int ow = 0; ow < OW; ow++) {
    const int64_t o = o_row + (int64_t)ow * C;
    const int32_t first = oh * K * W + ow * K;
    for (int b = 0; b < NB; b++) {
      const int c0 = b * LW;
      float *restrict mv = out + o + c0;
      int32_t *restrict mi = argmax + o + c0;
      float *restrict ya = (yarg ? yarg + o : ya_scratch) + c0;
      const float *restrict ch = chi + c0, *restrict cl = clo + c0, *restrict cs = ca + c0, *restrict cb = bb + c0;
      const float *restrict dv = D ? div + c0 : NULL;
      const float *restrict p0 = img + (int64_t)first * XS + b * BS;
      if (K == 2) {
        /* the 2x2 window written out inside the lanes' loop, so the running max stays in
         * registers: the same operations in the same order as the loops below */
        const int64_t o1 = XS, o2 = (int64_t)W * XS, o3 = (int64_t)(W + 1) * XS;
#pragma omp simd
        for (int c = 0; c < LW; c++) {
          const float d = D ? dv[c] : 1.0f;
          const float v0 = bn_pool_value(p0[c], d, ch[c], cl[c], cs[c], cb[c], RELU, D);
          float m = FQ ? quant_fake(v0, s, inv_s, zpf, lo, hi) : v0, y = v0;
          int32_t at = first;
#define BN_POOL_TAKE(OFF, IDX)                                                            \
  do {                                                                                    \
    const float v = bn_pool_value(p0[(OFF) + c], d, ch[c], cl[c], cs[c], cb[c], RELU, D); \
    const float q = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;                        \
    const int take = (q > m) | (q != q);                                                  \
    m = select_bits(take, q, m);                                                          \
    at = take ? (IDX) : at;                                                               \
    if (FQ) y = select_bits(take, v, y);                                                  \
  } while (0)
          BN_POOL_TAKE(o1, first + 1);
          BN_POOL_TAKE(o2, first + W);
          BN_POOL_TAKE(o3, first + W + 1);
#undef BN_POOL_TAKE
          mv[c] = m;
          mi[c] = at;
          if (FQ) ya[c] = y;
        }
        continue;
      }
#pragma omp simd
      for (int c = 0; c < LW; c++) {
        const float v = bn_pool_value(p0[c], D ? dv[c] : 1.0f, ch[c], cl[c], cs[c], cb[c], RELU, D);
        mv[c] = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;
        mi[c] = first;
        if (FQ) ya[c] = v;
      }
      /* the window after its first element, in max pool's order and with its comparison */
      for (int kh = 0; kh < K; kh++)
        for (int kw = kh == 0 ? 1 : 0; kw < K; kw++) {
          const int32_t idx = first + kh * W + kw;
          const float *restrict p = img + (int64_t)idx * XS + b * BS;
#pragma omp simd
          for (int c = 0; c < LW; c++) {
            const float v = bn_pool_value(p[c], D ? dv[c] : 1.0f, ch[c], cl[c], cs[c], cb[c], RELU, D);
            const float q = FQ ? quant_fake(v, s, inv_s, zpf, lo, hi) : v;
            const int take = (q > mv[c]) | (q != q);
            mv[c] = select_bits(take, q, mv[c]);
            mi[c] = take ? idx : mi[c];
            if (FQ) ya[c] = select_bits(take, v, ya[c]);
          }
        }
    }
    float *restrict ya = yarg ? yarg + o : ya_scratch;
    if (FQ && qmask)
      for (int c = 0; c < C; c++) {
        const float q = quant_round(ya[c], inv_s, zpf);
        qmask[o + c] = (uint8_t)((q >= lo) & (q <= hi) & qt_relu_passes(ya[c], RELU));
      }
  }
}

void qt_batch_norm_relu_pool_forward_train(float *out, int32_t *argmax, float *yarg, uint8_t *qmask, float *mean,
                                           float *invstd, const float *inp, const float *in_div, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var, float momentum,
                                           float eps, int N, int H, int W, int C, int blocked, int K, int relu,
                                           const qt_fq_params *fq, const qt_batch_sync *sync, int64_t *M_total) {
  QT_ASSERT(N >= 1 && C >= 1 && K >= 1 && H >= K && W >= K && H % K == 0 && W % K == 0 && relu >= 0 && relu <= 2 &&
                (fq || (!qmask && !yarg)) && (!fq || fq->qmin < fq->qmax) && (!blocked || C % 16 == 0),
            "batch_norm_relu_pool_forward_train: %dx%dx%dx%d input not tiled by %dx%d windows, relu %d, a mask "
            "or argmax values without a fake quant, or blocked (%d) without C %% 16 == 0",
            N, H, W, C, K, K, relu, blocked);
  const int M = N * H * W, OH = H / K, OW = W / K;
  const int nthreads = omp_get_max_threads();
  /* per channel: the mean as two floats, gamma * invstd, beta (0 without), then ya per thread */
  float *ws = xmalloc((4 + (size_t)nthreads) * (size_t)C * sizeof(float));
  float *chi = ws, *clo = ws + C, *ca = ws + 2 * C, *bb = ws + 3 * C;
  const int64_t hw = (int64_t)H * W;
  qt_bn_train_stats(mean, invstd, chi, clo, ca, inp, in_div, gamma, running_mean, running_var, momentum, eps, M, C,
                    blocked ? hw : 0, sync, M_total);
  for (int c = 0; c < C; c++) bb[c] = beta ? beta[c] : 0.0f;
  const int variant = ((relu * 2 + (fq != NULL)) * 2 + (in_div != NULL)) * 2 + (blocked != 0);
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < OH; oh++) {
      const float *img = inp + (int64_t)n * H * W * C;
      const int64_t o_row = ((int64_t)n * OH + oh) * OW * C;
      float *ya = ws + (4 + (size_t)omp_get_thread_num()) * (size_t)C;
#define BN_POOL_BAND(R, F, D, B) \
  bn_pool_band(out, argmax, yarg, qmask, img, o_row, oh, W, OW, C, hw, K, chi, clo, ca, bb, in_div, fq, ya, R, F, D, B)
      switch (variant) {
        case 0: BN_POOL_BAND(0, 0, 0, 0); break;
        case 1: BN_POOL_BAND(0, 0, 0, 1); break;
        case 2: BN_POOL_BAND(0, 0, 1, 0); break;
        case 3: BN_POOL_BAND(0, 0, 1, 1); break;
        case 4: BN_POOL_BAND(0, 1, 0, 0); break;
        case 5: BN_POOL_BAND(0, 1, 0, 1); break;
        case 6: BN_POOL_BAND(0, 1, 1, 0); break;
        case 7: BN_POOL_BAND(0, 1, 1, 1); break;
        case 8: BN_POOL_BAND(1, 0, 0, 0); break;
        case 9: BN_POOL_BAND(1, 0, 0, 1); break;
        case 10: BN_POOL_BAND(1, 0, 1, 0); break;
        case 11: BN_POOL_BAND(1, 0, 1, 1); break;
        case 12: BN_POOL_BAND(1, 1, 0, 0); break;
        case 13: BN_POOL_BAND(1, 1, 0, 1); break;
        case 14: BN_POOL_BAND(1, 1, 1, 0); break;
        case 15: BN_POOL_BAND(1, 1, 1, 1); break;
        case 16: BN_POOL_BAND(2, 0, 0, 0); break;
        case 17: BN_POOL_BAND(2, 0, 0, 1); break;
        case 18: BN_POOL_BAND(2, 0, 1, 0); break;
        case 19: BN_POOL_BAND(2, 0, 1, 1); break;
        case 20: BN_POOL_BAND(2, 1, 0, 0); break;
        case 21: BN_POOL_BAND(2, 1, 0, 1); break;
        case 22: BN_POOL_BAND(2, 1, 1, 0); break;
        default: BN_POOL_BAND(2, 1, 1, 1); break;
      }
#undef BN_POOL_BAND
    }
  free(ws);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Where a row's gradient comes from in a pooled backward: the row's window and position, advanced
 * one row at a time (qt_bn_pool_grad_rows' walk, for the fused loops below). */
typedef struct {
  int64_t n;
  int h, w, oh, kh, ow, kw;
} pool_walk;

static pool_walk pool_walk_at(const qt_pool_grad *pg, int64_t r0) {
  const int64_t HW = (int64_t)pg->H * pg->W;
  pool_walk q = {.n = r0 / HW};
  q.h = (int)((r0 - q.n * HW) / pg->W);
  q.w = (int)(r0 - q.n * HW - (int64_t)q.h * pg->W);
  q.oh = q.h / pg->KH, q.kh = q.h - q.oh * pg->KH, q.ow = q.w / pg->KW, q.kw = q.w - q.ow * pg->KW;
  return q;
}

static inline void pool_walk_next(pool_walk *q, const qt_pool_grad *pg) {
  if (++q->kw == pg->KW) q->kw = 0, q->ow++;
  if (++q->w == pg->W) {
    q->w = q->ow = q->kw = 0;
    if (++q->kh == pg->KH) q->kh = 0, q->oh++;
    if (++q->h == pg->H) q->h = q->oh = q->kh = 0, q->n++;
  }
}

/* The row's output offset (its window's, times C). */
static inline int64_t pool_walk_out(const pool_walk *q, const qt_pool_grad *pg, int C) {
  return ((q->n * (pg->H / pg->KH) + q->oh) * (pg->W / pg->KW) + q->ow) * C;
}

/* Rows [r0, r0 + rows) of the gradient pg expands to, relu-masked (mask NULL: none), into dy:
 * (pass && argmax) ? val : +0, the bits of the pool's backward into a fresh buffer (argmax ? 0 +
 * d : 0 + 0) then the relu's mask (a select of that or +0). r0 * C is a multiple of 8 (chunks
 * are whole patterns). The row's image, position and window advance one row at a time. */
void qt_bn_pool_grad_rows(float *restrict dy, const qt_pool_grad *pg, const uint8_t *mask, int64_t r0, int64_t rows,
                          int C) {
  pool_walk q = pool_walk_at(pg, r0);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const float *restrict v = pg->val + o;
    const int32_t *restrict am = pg->argmax + o;
    float *restrict d = dy + r * C;
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] = am[c] == idx ? v[c] : 0.0f;
    pool_walk_next(&q, pg);
  }
  if (mask) qt_relu_grad_span_at(dy, mask, r0 * C, rows * C);
}

#if defined(__AVX512F__)
/* For C a multiple of 16 with AVX-512: the pooled passes with each row's gradient selected in
 * registers (argmax == position, and the relu mask's 16 bits, as one lane mask over val), never
 * stored. The sums and dinp are the expressions of chunk_grad_sums_impl and bn_dinp_rows, lane by
 * lane, in the same order per accumulator (row t of a pattern adds to slot t; tail rows to slot
 * 0), so the bits are those of the expanded path. */
static inline __mmask16 pooled_select(const int32_t *am, int32_t idx, const uint8_t *mask, int64_t bit) {
  __mmask16 sel = _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(am), _mm512_set1_epi32(idx));
  if (mask) {
    uint16_t bits;
    memcpy(&bits, mask + bit / 8, 2);
    sel &= (__mmask16)bits;
  }
  return sel;
}

/* Where row r (at image q->n's pixel idx) has its channels (NHWC) or its first 16-channel block
 * (pg->blocked) in x, the whole tensor. */
static inline const float *pooled_row(const float *x, const pool_walk *q, int32_t idx, int64_t r,
                                      const qt_pool_grad *pg, int C) {
  return pg->blocked ? x + q->n * C * pg->H * pg->W + (int64_t)idx * 16 : x + r * C;
}

/* x: the whole tensor. */
void qt_bn_chunk_grad_sums_pooled(double *sdy, double *sdyx, const qt_pool_grad *pg, const uint8_t *mask,
                                  const float *x, int64_t r0, int64_t rows, const bn_plan *p, const float *mrep,
                                  float *acc_s, float *acc_p, const float *drep) {
  const int C = p->C, k = p->k;
  const int64_t bs = pg->blocked ? (int64_t)pg->H * pg->W * 16 : 16;
  const int64_t grouped = rows / k * k;
  memset(acc_s, 0, (size_t)p->L * sizeof *acc_s);
  memset(acc_p, 0, (size_t)p->L * sizeof *acc_p);
  pool_walk q = pool_walk_at(pg, r0);
  int t = 0;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const int slot = r < grouped ? t : 0;
    const float *xr = pooled_row(x, &q, idx, r0 + r, pg, C);
    for (int c = 0; c < C; c += 16) {
      const __m512 dy =
          _mm512_maskz_loadu_ps(pooled_select(pg->argmax + o + c, idx, mask, (r0 + r) * C + c), pg->val + o + c);
      __m512 xv = _mm512_loadu_ps(xr + c / 16 * bs); /* this 16-channel block's */
      if (drep) xv = _mm512_div_ps(xv, _mm512_loadu_ps(drep + c));
      const __m512 d = _mm512_sub_ps(xv, _mm512_loadu_ps(mrep + c));
      float *as = acc_s + slot * C + c, *ap = acc_p + slot * C + c;
      _mm512_storeu_ps(as, _mm512_add_ps(_mm512_loadu_ps(as), dy));
      _mm512_storeu_ps(ap, _mm512_add_ps(_mm512_loadu_ps(ap), _mm512_mul_ps(dy, d)));
    }
    if (++t == k) t = 0;
    pool_walk_next(&q, pg);
  }
  pattern_fold(sdy, acc_s, p);
  pattern_fold(sdyx, acc_p, p);
}

/* x and dinp: the whole tensors. */
static void chunk_dinp_pooled(float *dinp, int dinp_write, const qt_pool_grad *pg, const uint8_t *mask, const float *x,
                              int64_t r0, int64_t rows, int C, const float *mrep, const float *gmrep,
                              const float *psrep, const float *arep, const float *drep, float *qx) {
  const int64_t bs = pg->blocked ? (int64_t)pg->H * pg->W * 16 : 16;
  pool_walk q = pool_walk_at(pg, r0);
  if (qx) memset(qx, 0, (size_t)((rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS) * (size_t)C * sizeof *qx);
  for (int64_t r = 0; r < rows; r++) {
    float *qs = qx ? qx + r / QT_CHANNEL_SUM_ROWS * C : NULL; /* the row's segment's partials */
    const int64_t o = pool_walk_out(&q, pg, C);
    const int32_t idx = q.h * pg->W + q.w;
    const float *xr = pooled_row(x, &q, idx, r0 + r, pg, C);
    float *ir = dinp + (xr - x); /* the same layout */
    for (int c = 0; c < C; c += 16) {
      const float *xb = xr + c / 16 * bs; /* this 16-channel block's */
      float *ib = ir + c / 16 * bs;
      const __m512 dy =
          _mm512_maskz_loadu_ps(pooled_select(pg->argmax + o + c, idx, mask, (r0 + r) * C + c), pg->val + o + c);
      __m512 xv = _mm512_loadu_ps(xb);
      if (drep) xv = _mm512_div_ps(xv, _mm512_loadu_ps(drep + c));
      const __m512 xm = _mm512_mul_ps(_mm512_sub_ps(xv, _mm512_loadu_ps(mrep + c)), _mm512_loadu_ps(psrep + c));
      const __m512 v =
          _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(dy, _mm512_loadu_ps(gmrep + c)), xm), _mm512_loadu_ps(arep + c));
      if (qx) { /* v is the quotient's gradient (0 + v, a fresh buffer's bits): divided into dinp, and its
                 * products with x summed */
        const __m512 dq = _mm512_add_ps(_mm512_setzero_ps(), v);
        _mm512_storeu_ps(qs + c, _mm512_add_ps(_mm512_loadu_ps(qs + c), _mm512_mul_ps(dq, _mm512_loadu_ps(xb))));
        const __m512 dx = _mm512_div_ps(dq, _mm512_loadu_ps(drep + c));
        _mm512_storeu_ps(ib, dinp_write ? dx : _mm512_add_ps(_mm512_loadu_ps(ib), dx));
        continue;
      }
      const __m512 base = dinp_write ? _mm512_setzero_ps() : _mm512_loadu_ps(ib);
      _mm512_storeu_ps(ib, _mm512_add_ps(base, v));
    }
    pool_walk_next(&q, pg);
  }
}
#endif

int qt_batch_norm_pool_takes_blocked(int C) { return C % 16 == 0 && POOLED512(C); }

/* bn_dinp of the gradient pg expands to (masked by relu_mask when not NULL), a reduction chunk at
 * a time into thread scratch: the same per-element expressions as bn_dinp, so the same bits. With
 * div_sums (and drep): the quotient's gradient dq (as bn_dinp writes it into a fresh buffer) is
 * divided by the divisor into dinp (written, or added to) and div_sums gets per channel the sum of
 * dq * x (float over QT_CHANNEL_SUM_ROWS rows from each chunk's start, then double in order),
 * channel_scale's backward of x / div in the same pass. */
void qt_bn_dinp_pooled(float *dinp, int dinp_write, const qt_pool_grad *pg, const uint8_t *relu_mask, const float *inp,
                       const bn_plan *p, const float *mrep, const float *gmrep, const float *psrep, const float *arep,
                       const float *drep, double *div_sums) {
  const int L = p->L, C = p->C;
  const size_t per_thread = POOLED512(C) ? 1 : (size_t)p->chunk_rows * (size_t)C;
  float *ws = xmalloc((size_t)omp_get_max_threads() * per_thread * sizeof(float));
  const int64_t spc = (p->chunk_rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS; /* segments per chunk */
  float *part = div_sums ? xmalloc((size_t)(p->nchunks * spc) * (size_t)C * sizeof(float)) : NULL;
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p->nchunks; i++) {
    float *dy = ws + (size_t)omp_get_thread_num() * per_thread;
    const int64_t r0 = i * p->chunk_rows, rows = p->M - r0 < p->chunk_rows ? p->M - r0 : p->chunk_rows;
    float *qx = part ? part + i * spc * C : NULL;
    if (POOLED512(C)) {
#if defined(__AVX512F__)
      chunk_dinp_pooled(dinp, dinp_write, pg, relu_mask, inp, r0, rows, C, mrep, gmrep, psrep, arep, drep, qx);
#endif
      continue;
    }
    qt_bn_pool_grad_rows(dy, pg, relu_mask, r0, rows, C);
    const int64_t groups = rows / p->k, tail = rows - groups * p->k;
    /* with div_sums: the quotient's gradient into dy itself (bn_dinp_rows allows that), then below */
    float *di = qx ? dy : dinp + r0 * C;
    const int write = qx ? 1 : dinp_write;
    const float *xi = inp + r0 * C;
    for (int64_t g = 0; g < groups; g++) {
      if (drep)
        bn_dinp_rows(di + g * L, dy + g * L, xi + g * L, mrep, gmrep, psrep, arep, L, write, drep, 1);
      else
        bn_dinp_rows(di + g * L, dy + g * L, xi + g * L, mrep, gmrep, psrep, arep, L, write, NULL, 0);
    }
    for (int64_t t = 0; t < tail; t++) { /* bn_dinp's tail rows: only the last chunk has any */
      const int64_t o = (groups * p->k + t) * C;
      for (int c = 0; c < C; c++)
        di[o + c] = (write ? 0.0f : di[o + c]) +
                    (dy[o + c] - gmrep[c] - ((drep ? xi[o + c] / drep[c] : xi[o + c]) - mrep[c]) * psrep[c]) * arep[c];
    }
    if (qx) {
      float *out = dinp + r0 * C;
      for (int64_t r = 0; r < rows; r++) {
        float *qs = qx + r / QT_CHANNEL_SUM_ROWS * C;
        if (r % QT_CHANNEL_SUM_ROWS == 0)
          for (int c = 0; c < C; c++) qs[c] = 0.0f;
        for (int c = 0; c < C; c++) {
          const float dq = dy[r * C + c];
          qs[c] += dq * xi[r * C + c];
          out[r * C + c] = dinp_write ? dq / drep[c] : out[r * C + c] + dq / drep[c];
        }
      }
    }
  }
  if (part) { /* every chunk's segments in order (the last chunk's past its rows unused) */
    for (int c = 0; c < C; c++) div_sums[c] = 0;
    for (int64_t i = 0; i < p->nchunks; i++) {
      const int64_t rows = p->M - i * p->chunk_rows < p->chunk_rows ? p->M - i * p->chunk_rows : p->chunk_rows;
      for (int64_t j = 0; j < (rows + QT_CHANNEL_SUM_ROWS - 1) / QT_CHANNEL_SUM_ROWS; j++)
        for (int c = 0; c < C; c++) div_sums[c] += part[(i * spc + j) * C + c];
    }
    free(part);
  }
  free(ws);
}
