/* Batch norm over NHWC activations (M = N*H*W rows of C contiguous channels) on the CPU, and
 * its plain reference twins. Semantics are PyTorch's BatchNorm2d: normalize with the biased
 * batch variance, update running stats with the unbiased one (M/(M-1)).
 *
 * Determinism: every reduction cuts the rows into fixed chunks (a function of M and C only,
 * never of the thread count or timing), keeps one double partial per chunk and channel, and
 * one thread combines the partials in chunk order. Results are bit-identical run to run and
 * for any OMP_NUM_THREADS.
 *
 * Vectorization for any C: a chunk is walked as groups of k rows, a "pattern" of L = k*C
 * floats with L a multiple of 16, so the inner loops run over L unit-stride lanes whatever C
 * is; per-channel constants are replicated into patterns of L floats. A float accumulator
 * lane sums only chunk_rows/k values before it is folded into double.
 *
 * Statistics are two-pass inside a chunk (mean, then squares around that mean, the chunk still
 * in cache) and chunks are merged with the exact parallel-variance identity, so a large mean
 * does not cancel the variance.
 *
 * gamma and beta may be NULL (PyTorch's affine=False: 1 and 0). Training with M == 1 aborts:
 * PyTorch refuses it too ("Expected more than 1 value per channel when training"; its native
 * kernel would store a NaN running_var, the unbiased variance being 0/0). */
#include "autograd/cpu_batch_norm_int.h"

/* ---- training forward ------------------------------------------------------------------- */

/* One pattern of rows: og = ((x - mhi) - mlo) * a + b (mlo NULL: 0). Called with a literal D
 * from inside the parallel loops below (OpenMP outlines a parallel region before inlining, so the
 * loops are written out per D rather than in an always-inline body taking D). */
BN_INLINE void bn_apply_rows(float *og, const float *xg, const float *restrict mhi, const float *restrict mlo,
                             const float *restrict arep, const float *restrict brep, int L, const float *restrict drep,
                             const int D) {
  if (mlo) {
#pragma omp simd
    for (int j = 0; j < L; j++) og[j] = ((BN_X(xg, j, j) - mhi[j]) - mlo[j]) * arep[j] + brep[j];
  } else {
#pragma omp simd
    for (int j = 0; j < L; j++) og[j] = (BN_X(xg, j, j) - mhi[j]) * arep[j] + brep[j];
  }
}

/* out = ((x - mhi) - mlo) * a + b over all M rows, per-channel constants given as patterns (x
 * divided on the fly by drep when not NULL), then the relu and its mask when relu_mask. mhi + mlo
 * is the batch mean split into two floats (mlo NULL: 0), so a mean much larger than the spread
 * still yields outputs exact to float rounding. out may equal x (in-place eval BN), so neither
 * is restrict-qualified. */
static void bn_apply(float *out, const float *x, const float *mhi, const float *mlo, const float *arep,
                     const float *brep, const bn_plan *p, uint8_t *relu_mask, int six, const float *drep) {
  const int L = p->L, C = p->C;
  const int64_t groups = p->M / p->k, tail = p->M - groups * p->k;
  /* L is a multiple of 16: a pattern's relu mask bytes are its own */
  if (drep) {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      bn_apply_rows(out + g * L, x + g * L, mhi, mlo, arep, brep, L, drep, 1);
      if (relu_mask) qt_relu_mask_span(out, relu_mask, out, g * L, (g + 1) * L, six);
    }
  } else {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      bn_apply_rows(out + g * L, x + g * L, mhi, mlo, arep, brep, L, NULL, 0);
      if (relu_mask) qt_relu_mask_span(out, relu_mask, out, g * L, (g + 1) * L, six);
    }
  }
  for (int64_t t = 0; t < tail; t++) {
    const float *xt = x + (groups * p->k + t) * C;
    float *ot = out + (groups * p->k + t) * C;
    for (int c = 0; c < C; c++)
      ot[c] = (((drep ? xt[c] / drep[c] : xt[c]) - mhi[c]) - (mlo ? mlo[c] : 0.0f)) * arep[c] + brep[c];
  }
  if (relu_mask && tail) qt_relu_mask_span(out, relu_mask, out, groups * L, p->M * C, six);
}

void qt_batch_norm_forward_train(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                 const float *beta, float *running_mean, float *running_var, float momentum, float eps,
                                 int M, int C) {
  int64_t total;
  qt_batch_norm_forward_train_sync(out, mean, invstd, inp, gamma, beta, running_mean, running_var, momentum, eps, M, C,
                                   NULL, &total);
}

void qt_batch_norm_forward_train_sync(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                      const float *beta, float *running_mean, float *running_var, float momentum,
                                      float eps, int M, int C, const qt_batch_sync *sync, int64_t *M_total) {
  qt_batch_norm_relu_forward_train(out, NULL, 0, mean, invstd, inp, NULL, gamma, beta, running_mean, running_var,
                                   momentum, eps, M, C, sync, M_total);
}

void qt_batch_norm_relu_forward_train(float *out, uint8_t *relu_mask, int six, float *mean, float *invstd,
                                      const float *inp, const float *in_div, const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum, float eps, int M, int C,
                                      const qt_batch_sync *sync, int64_t *M_total) {
  const bn_plan p = bn_plan_make(M > 0 ? M : 1, C > 0 ? C : 1);
  const size_t ps = pattern_stride(&p);
  /* the apply pass's patterns, then the per-channel constants they replicate */
  float *ws = xmalloc((5 * ps + 3 * (size_t)(C > 0 ? C : 1)) * sizeof(float));
  float *mhi = ws, *mlo = ws + ps, *arep = ws + 2 * ps, *brep = ws + 3 * ps, *drep = in_div ? ws + 4 * ps : NULL;
  float *chi = ws + 5 * ps, *clo = chi + C, *ca = clo + C;
  qt_bn_train_stats(mean, invstd, chi, clo, ca, inp, in_div, gamma, running_mean, running_var, momentum, eps, M, C, 0,
                    sync, M_total);
  pattern_fill(mhi, chi, 0, &p);
  pattern_fill(mlo, clo, 0, &p);
  pattern_fill(arep, ca, 0, &p);
  pattern_fill(brep, beta, 0, &p);
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  bn_apply(out, inp, mhi, mlo, arep, brep, &p, relu_mask, six, drep);
  free(ws);
}

void qt_batch_norm_forward_train_ref(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                     const float *beta, float *running_mean, float *running_var, float momentum,
                                     float eps, int M, int C) {
  QT_ASSERT(M > 1 && C > 0, "batch_norm_forward_train_ref: needs more than one value per channel (M=%d, C=%d)", M, C);
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int64_t r = 0; r < M; r++) s += inp[r * C + c];
    const double m = s / M;
    double q = 0;
    for (int64_t r = 0; r < M; r++) {
      const double d = inp[r * C + c] - m;
      q += d * d;
    }
    const double is = 1.0 / sqrt(q / M + (double)eps);
    const double g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    for (int64_t r = 0; r < M; r++) out[r * C + c] = (float)((inp[r * C + c] - m) * is * g + b);
    mean[c] = (float)m;
    invstd[c] = (float)is;
    if (running_mean) running_mean[c] = (float)(momentum * m + (1.0 - momentum) * running_mean[c]);
    if (running_var) running_var[c] = (float)(momentum * (q / (M - 1)) + (1.0 - momentum) * running_var[c]);
  }
}

/* ---- eval forward ----------------------------------------------------------------------- */

void qt_batch_norm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                                const float *running_mean, const float *running_var, float eps, int M, int C) {
  qt_batch_norm_forward_eval_div(out, inp, NULL, gamma, beta, running_mean, running_var, eps, M, C);
}

void qt_batch_norm_forward_eval_div(float *out, const float *inp, const float *in_div, const float *gamma,
                                    const float *beta, const float *running_mean, const float *running_var, float eps,
                                    int M, int C) {
  QT_ASSERT(M > 0 && C > 0, "batch_norm_forward_eval: empty input (M=%d, C=%d)", M, C);
  const bn_plan p = bn_plan_make(M, C);
  float *ws = xmalloc(6 * (size_t)p.L * sizeof(float));
  float *drep = in_div ? ws + 5 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  float *mrep = ws, *arep = ws + p.L, *brep = ws + 2 * p.L, *ca = ws + 3 * p.L;
  for (int c = 0; c < C; c++)
    ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) / sqrt((double)running_var[c] + (double)eps));
  pattern_fill(mrep, running_mean, 0, &p);
  pattern_fill(arep, ca, 0, &p);
  pattern_fill(brep, beta, 0, &p);
  bn_apply(out, inp, mrep, NULL, arep, brep, &p, NULL, 0, drep);
  free(ws);
}

void qt_batch_norm_forward_eval_ref(float *out, const float *inp, const float *gamma, const float *beta,
                                    const float *running_mean, const float *running_var, float eps, int M, int C) {
  for (int c = 0; c < C; c++) {
    const double is = 1.0 / sqrt((double)running_var[c] + (double)eps);
    const double g = gamma ? gamma[c] : 1.0, b = beta ? beta[c] : 0.0;
    for (int64_t r = 0; r < M; r++) out[r * C + c] = (float)((inp[r * C + c] - running_mean[c]) * is * g + b);
  }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Per-chunk sums of dout and of dout*(x - mean), one double per chunk and channel; for the
 * eval backward (dx_scale != NULL) the chunk also does dinp += dout * dx_scale in the same pass. */
BN_INLINE void chunk_grad_sums_impl(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout,
                                    const float *restrict x, int64_t rows, const bn_plan *p, const float *restrict mrep,
                                    const float *restrict dx_scale, float *restrict acc_s, float *restrict acc_p,
                                    const float *restrict drep, const int D) {
  const int L = p->L, C = p->C;
  const int64_t groups = rows / p->k, tail = rows - groups * p->k;
  memset(acc_s, 0, (size_t)L * sizeof *acc_s);
  memset(acc_p, 0, (size_t)L * sizeof *acc_p);
  if (dinp && dx_scale && dinp_write) { /* a fresh dinp: written as 0 + v, the bits of adding to zeros */
    for (int64_t g = 0; g < groups; g++) {
      /* dinp may be dout (written in place): each element is read before it is written */
      const float *restrict xg = x + g * L, *dg = dout + g * L;
      float *ig = dinp + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
        ig[j] = 0.0f + dg[j] * dx_scale[j];
      }
    }
  } else if (dinp && dx_scale) {
    for (int64_t g = 0; g < groups; g++) {
      const float *restrict xg = x + g * L, *restrict dg = dout + g * L;
      float *restrict ig = dinp + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
        ig[j] += dg[j] * dx_scale[j];
      }
    }
  } else {
    for (int64_t g = 0; g < groups; g++) {
      const float *restrict xg = x + g * L, *restrict dg = dout + g * L;
#pragma omp simd
      for (int j = 0; j < L; j++) {
        acc_s[j] += dg[j];
        acc_p[j] += dg[j] * (BN_X(xg, j, j) - mrep[j]);
      }
    }
  }
  for (int64_t t = 0; t < tail; t++) {
    const int64_t o = groups * L + t * C;
    for (int c = 0; c < C; c++) {
      acc_s[c] += dout[o + c];
      acc_p[c] += dout[o + c] * (BN_X(x, o + c, c) - mrep[c]);
      if (dinp && dx_scale) dinp[o + c] = (dinp_write ? 0.0f : dinp[o + c]) + dout[o + c] * dx_scale[c];
    }
  }
  pattern_fold(sdy, acc_s, p);
  pattern_fold(sdyx, acc_p, p);
}

static void chunk_grad_sums(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout, const float *x,
                            int64_t rows, const bn_plan *p, const float *mrep, const float *dx_scale, float *acc_s,
                            float *acc_p, const float *drep) {
  if (drep)
    chunk_grad_sums_impl(sdy, sdyx, dinp, dinp_write, dout, x, rows, p, mrep, dx_scale, acc_s, acc_p, drep, 1);
  else
    chunk_grad_sums_impl(sdy, sdyx, dinp, dinp_write, dout, x, rows, p, mrep, dx_scale, acc_s, acc_p, NULL, 0);
}

/* Reduces sum(dout) and sum(dout*(x-mean)) per channel into sdy/sdyx (C doubles each),
 * deterministically; with dx_scale also applies the eval dinp update in the same pass. */
static void bn_grad_sums(double *sdy, double *sdyx, float *dinp, int dinp_write, const float *dout, const float *inp,
                         const float *mrep, const float *dx_scale, const bn_plan *p, float *relu_dout,
                         const uint8_t *relu_mask, const float *drep, const qt_pool_grad *pg) {
  const int C = p->C;
  const int nthreads = omp_get_max_threads();
  const size_t npart = (size_t)p->nchunks * (size_t)C;
  double *part = xmalloc(2 * npart * sizeof(double));
  /* per thread: the two accumulator patterns, then (pg) a chunk of the expanded gradient */
  const size_t per_thread = 2 * pattern_stride(p) + (pg && !POOLED512(C) ? (size_t)p->chunk_rows * (size_t)C : 0);
  float *ws = xmalloc((size_t)nthreads * per_thread * sizeof(float));
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p->nchunks; i++) {
    float *scratch = ws + (size_t)omp_get_thread_num() * per_thread;
    int64_t r0 = i * p->chunk_rows, rows = p->M - r0 < p->chunk_rows ? p->M - r0 : p->chunk_rows;
    const float *dchunk = dout ? dout + r0 * C : NULL;
    if (pg && POOLED512(C)) {
#if defined(__AVX512F__)
      qt_bn_chunk_grad_sums_pooled(part + i * C, part + npart + i * C, pg, relu_mask, inp, r0, rows, p, mrep, scratch,
                                   scratch + pattern_stride(p), drep);
#endif
      continue;
    }
    if (pg) { /* the chunk's gradient expanded (and masked) into scratch */
      float *dy = scratch + 2 * pattern_stride(p);
      qt_bn_pool_grad_rows(dy, pg, relu_mask, r0, rows, C);
      dchunk = dy;
    } else if (relu_mask) {
      /* fused relu backward: the chunk's gradient masked in place just before it is summed
       * (chunks are whole patterns, so their mask bytes are their own) */
      qt_relu_grad_span(relu_dout, 1, relu_dout, relu_mask, r0 * C, (r0 + rows) * C);
    }
    chunk_grad_sums(part + i * C, part + npart + i * C, dinp ? dinp + r0 * C : NULL, dinp_write, dchunk, inp + r0 * C,
                    rows, p, mrep, dx_scale, scratch, scratch + pattern_stride(p), drep);
  }
  for (int c = 0; c < C; c++) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < p->nchunks; i++) {
      s += part[i * C + c];
      q += part[npart + i * C + c];
    }
    sdy[c] = s;
    sdyx[c] = q;
  }
  free(ws);
  free(part);
}

void qt_batch_norm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                            const float *mean, const float *invstd, const float *gamma, int M, int C) {
  qt_batch_norm_backward_sync(dinp, 0, dgamma, dbeta, dout, inp, mean, invstd, gamma, M, C, NULL, M);
}

static void bn_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout, const float *inp,
                        const float *in_div, const float *mean, const float *invstd, const float *gamma, int M, int C,
                        const qt_batch_sync *sync, int64_t M_total, float *relu_dout, const uint8_t *relu_mask,
                        const qt_pool_grad *pg, double *div_sums);

void qt_batch_norm_backward_sync(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                 const float *inp, const float *mean, const float *invstd, const float *gamma, int M,
                                 int C, const qt_batch_sync *sync, int64_t M_total) {
  bn_backward(dinp, dinp_write, dgamma, dbeta, dout, inp, NULL, mean, invstd, gamma, M, C, sync, M_total, NULL, NULL,
              NULL, NULL);
}

void qt_batch_norm_relu_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, float *dout,
                                 const uint8_t *relu_mask, const float *inp, const float *in_div, const float *mean,
                                 const float *invstd, const float *gamma, int M, int C, const qt_batch_sync *sync,
                                 int64_t M_total) {
  bn_backward(dinp, dinp_write, dgamma, dbeta, dout, inp, in_div, mean, invstd, gamma, M, C, sync, M_total, dout,
              relu_mask, NULL, NULL);
}

void qt_batch_norm_relu_backward_pooled(float *dinp, int dinp_write, float *dgamma, float *dbeta,
                                        const qt_pool_grad *pg, const uint8_t *relu_mask, const float *inp,
                                        const float *in_div, double *div_sums, const float *mean, const float *invstd,
                                        const float *gamma, int M, int C, const qt_batch_sync *sync, int64_t M_total) {
  QT_ASSERT(pg && pg->KH >= 1 && pg->KW >= 1 && pg->H % pg->KH == 0 && pg->W % pg->KW == 0 &&
                (int64_t)pg->N * pg->H * pg->W == M,
            "batch_norm_backward_pooled: %dx%dx%d input not tiled by %dx%d windows or not %d rows", pg ? pg->N : 0,
            pg ? pg->H : 0, pg ? pg->W : 0, pg ? pg->KH : 0, pg ? pg->KW : 0, M);
  QT_ASSERT(!div_sums || (in_div && dinp), "batch_norm_backward_pooled: the divisor's sums need a divisor and dinp");
  bn_backward(dinp, dinp_write, dgamma, dbeta, NULL, inp, in_div, mean, invstd, gamma, M, C, sync, M_total, NULL,
              relu_mask, pg, div_sums);
}

/* dinp (=, or += without dinp_write) from dout and the per-channel patterns, over all rows. */
static void bn_dinp(float *dinp, int dinp_write, const float *dout, const float *inp, const bn_plan *p,
                    const float *mrep, const float *gmrep, const float *psrep, const float *arep, const float *drep) {
  const int L = p->L, C = p->C;
  const int64_t groups = p->M / p->k, tail = p->M - groups * p->k;
  if (drep) {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++)
      bn_dinp_rows(dinp + g * L, dout + g * L, inp + g * L, mrep, gmrep, psrep, arep, L, dinp_write, drep, 1);
  } else {
#pragma omp parallel for schedule(static) if (p->M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++)
      bn_dinp_rows(dinp + g * L, dout + g * L, inp + g * L, mrep, gmrep, psrep, arep, L, dinp_write, NULL, 0);
  }
  for (int64_t t = 0; t < tail; t++) {
    const int64_t o = (groups * p->k + t) * C;
    for (int c = 0; c < C; c++)
      dinp[o + c] =
          (dinp_write ? 0.0f : dinp[o + c]) +
          (dout[o + c] - gmrep[c] - ((drep ? inp[o + c] / drep[c] : inp[o + c]) - mrep[c]) * psrep[c]) * arep[c];
  }
}

/* relu_mask: dout (== relu_dout) is masked in place, chunk by chunk, in the sums pass; pg (dout
 * NULL): the gradient is expanded from a pool's, chunk by chunk, in both passes. */
static void bn_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout, const float *inp,
                        const float *in_div, const float *mean, const float *invstd, const float *gamma, int M, int C,
                        const qt_batch_sync *sync, int64_t M_total, float *relu_dout, const uint8_t *relu_mask,
                        const qt_pool_grad *pg, double *div_sums) {
  const int synced = sync && sync->size > 1;
  /* every process takes part in the sums' reduction, whatever gradients it wants */
  if (!dinp && !dgamma && !dbeta && !synced) return;
  QT_ASSERT(M > 0 && C > 0, "batch_norm_backward: empty input (M=%d, C=%d)", M, C);
  QT_ASSERT(!pg || !pg->blocked || qt_batch_norm_pool_takes_blocked(C),
            "batch_norm_backward_pooled: a blocked input with %d channels, which this build's kernels do not take", C);
  const bn_plan p = bn_plan_make(M, C);
  double *sums = xmalloc(4 * (size_t)C * sizeof(double));
  float *ws = xmalloc(8 * (size_t)p.L * sizeof(float));
  float *mrep = ws, *gmrep = ws + p.L, *psrep = ws + 2 * p.L, *arep = ws + 3 * p.L;
  float *cg = ws + 4 * p.L, *cp = ws + 5 * p.L, *ca = ws + 6 * p.L;
  float *drep = in_div ? ws + 7 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  pattern_fill(mrep, mean, 0, &p);
  bn_grad_sums(sums, sums + C, NULL, 0, dout, inp, mrep, NULL, &p, relu_dout, relu_mask, drep, pg);
  /* dgamma/dbeta from this process's sums; dinp from the whole batch's */
  double *all = sums + 2 * C;
  memcpy(all, sums, 2 * (size_t)C * sizeof(double));
  if (synced) sync->sum_f64(all, 2 * (int64_t)C);
  if (!synced) M_total = M;
  for (int c = 0; c < C; c++) {
    const double sdy = sums[c], sdyx = sums[C + c], is = invstd[c];
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
    cg[c] = (float)(all[c] / M_total);
    cp[c] = (float)(is * is * all[C + c] / M_total);
    ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * is);
  }
  if (dinp) {
    pattern_fill(gmrep, cg, 0, &p);
    pattern_fill(psrep, cp, 0, &p);
    pattern_fill(arep, ca, 0, &p);
    if (pg)
      qt_bn_dinp_pooled(dinp, dinp_write, pg, relu_mask, inp, &p, mrep, gmrep, psrep, arep, drep, div_sums);
    else
      bn_dinp(dinp, dinp_write, dout, inp, &p, mrep, gmrep, psrep, arep, drep);
  }
  free(ws);
  free(sums);
}

void qt_batch_norm_backward_ref(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                const float *mean, const float *invstd, const float *gamma, int M, int C) {
  for (int c = 0; c < C; c++) {
    double sdy = 0, sdyx = 0;
    for (int64_t r = 0; r < M; r++) {
      sdy += dout[r * C + c];
      sdyx += (double)dout[r * C + c] * ((double)inp[r * C + c] - mean[c]);
    }
    const double is = invstd[c], g = gamma ? gamma[c] : 1.0;
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
    if (dinp)
      for (int64_t r = 0; r < M; r++)
        dinp[r * C + c] +=
            (float)(g * is * (dout[r * C + c] - sdy / M - ((double)inp[r * C + c] - mean[c]) * is * is * sdyx / M));
  }
}

void qt_batch_norm_backward_eval(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                 const float *mean, const float *invstd, const float *gamma, int M, int C) {
  qt_batch_norm_backward_eval_ex(dinp, 0, dgamma, dbeta, dout, inp, NULL, mean, invstd, gamma, M, C);
}

void qt_batch_norm_backward_eval_ex(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                    const float *inp, const float *in_div, const float *mean, const float *invstd,
                                    const float *gamma, int M, int C) {
  if (!dinp && !dgamma && !dbeta) return;
  QT_ASSERT(M > 0 && C > 0, "batch_norm_backward_eval: empty input (M=%d, C=%d)", M, C);
  const bn_plan p = bn_plan_make(M, C);
  float *ws = xmalloc(4 * (size_t)p.L * sizeof(float));
  float *mrep = ws, *arep = ws + p.L, *ca = ws + 2 * p.L;
  float *drep = in_div ? ws + 3 * p.L : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);
  for (int c = 0; c < C; c++) ca[c] = (float)((gamma ? (double)gamma[c] : 1.0) * (double)invstd[c]);
  pattern_fill(arep, ca, 0, &p);
  if (dgamma || dbeta) {
    double *sums = xmalloc(2 * (size_t)C * sizeof(double));
    pattern_fill(mrep, mean, 0, &p);
    bn_grad_sums(sums, sums + C, dinp, dinp_write, dout, inp, mrep, arep, &p, NULL, NULL, drep, NULL);
    for (int c = 0; c < C; c++) {
      if (dbeta) dbeta[c] += (float)sums[c];
      if (dgamma) dgamma[c] += (float)(sums[C + c] * (double)invstd[c]);
    }
    free(sums);
  } else {
    const int L = p.L;
    const int64_t groups = p.M / p.k, tail = p.M - groups * p.k;
#pragma omp parallel for schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
      const float *dg = dout + g * L; /* dinp may be dout when written */
      float *ig = dinp + g * L;
      if (dinp_write) {
#pragma omp simd
        for (int j = 0; j < L; j++) ig[j] = 0.0f + dg[j] * arep[j];
      } else {
#pragma omp simd
        for (int j = 0; j < L; j++) ig[j] += dg[j] * arep[j];
      }
    }
    for (int64_t t = 0; t < tail; t++) {
      const int64_t o = (groups * p.k + t) * C;
      for (int c = 0; c < C; c++) dinp[o + c] = (dinp_write ? 0.0f : dinp[o + c]) + dout[o + c] * arep[c];
    }
  }
  free(ws);
}

void qt_batch_norm_backward_eval_ref(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                     const float *mean, const float *invstd, const float *gamma, int M, int C) {
  for (int c = 0; c < C; c++) {
    double sdy = 0, sdyx = 0;
    const double is = invstd[c], g = gamma ? gamma[c] : 1.0;
    for (int64_t r = 0; r < M; r++) {
      sdy += dout[r * C + c];
      sdyx += (double)dout[r * C + c] * ((double)inp[r * C + c] - mean[c]);
      if (dinp) dinp[r * C + c] += (float)(dout[r * C + c] * g * is);
    }
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)(sdyx * is);
  }
}
