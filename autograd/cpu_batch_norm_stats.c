/* Batch norm's training statistics on the CPU (cpu_batch_norm_int.h): the per-channel mean and
 * variance of a batch, two-pass inside each fixed chunk and merged across chunks (and across
 * processes, SyncBN) with the parallel-variance identity; the running statistics' update. Used by
 * the plain training forward (cpu_batch_norm.c) and the pooled one (cpu_batch_norm_pooled.c). */
#include "autograd/cpu_batch_norm_int.h"
#include "base/base.h"

/* A chunk's mean from its first pass (dev: the sum of x - rep, rep the chunk's first row): mu, the
 * mean rounded to float, dev then the sum of x - mu; rep becomes mu's pattern for the second pass. */
static void chunk_mean(double *mu, double *dev, float *rep, int64_t rows, const bn_plan *p) {
  const int C = p->C;
  for (int c = 0; c < C; c++) {
    const double shift = rep[c];
    mu[c] = (float)(shift + dev[c] / (double)rows);
    dev[c] += (double)rows * (shift - mu[c]);
  }
  for (int t = 0; t < p->k; t++)
    for (int c = 0; c < C; c++) rep[t * C + c] = (float)mu[c];
}

/* Statistics of one chunk of `rows` rows, per channel: its mean rounded to float (mu), the sum
 * of deviations from that mean (dev, ~0 up to the rounding of mu) and of their squares (sq).
 * The first pass sums x - x[first row] so float lanes hold deviations, not the (possibly large)
 * mean itself; the second pass re-reads the chunk from cache. */
BN_INLINE void chunk_stats_impl(double *mu, double *dev, double *sq, const float *restrict x, int64_t rows,
                                const bn_plan *p, float *restrict acc, float *restrict rep, const float *restrict drep,
                                const int D) {
  const int L = p->L, C = p->C;
  const int64_t groups = rows / p->k, tail = rows - groups * p->k;
  const float *xt = x + groups * L;
  for (int t = 0; t < p->k; t++) /* shift: the chunk's first row */
    for (int c = 0; c < C; c++) rep[t * C + c] = BN_X(x, c, c);
  memset(acc, 0, (size_t)L * sizeof *acc);
  for (int64_t g = 0; g < groups; g++) {
    const float *restrict xg = x + g * L;
#pragma omp simd
    for (int j = 0; j < L; j++) acc[j] += BN_X(xg, j, j) - rep[j];
  }
  for (int64_t t = 0; t < tail; t++)
    for (int c = 0; c < C; c++) acc[c] += BN_X(xt, t * C + c, c) - rep[c];
  pattern_fold(dev, acc, p);
  chunk_mean(mu, dev, rep, rows, p);

  memset(acc, 0, (size_t)L * sizeof *acc);
  for (int64_t g = 0; g < groups; g++) {
    const float *restrict xg = x + g * L;
#pragma omp simd
    for (int j = 0; j < L; j++) {
      float d = BN_X(xg, j, j) - rep[j];
      acc[j] += d * d;
    }
  }
  for (int64_t t = 0; t < tail; t++)
    for (int c = 0; c < C; c++) {
      float d = BN_X(xt, t * C + c, c) - rep[c];
      acc[c] += d * d;
    }
  pattern_fold(sq, acc, p);
}

static void chunk_stats(double *mu, double *dev, double *sq, const float *x, int64_t rows, const bn_plan *p, float *acc,
                        float *rep, const float *drep) {
  if (drep)
    chunk_stats_impl(mu, dev, sq, x, rows, p, acc, rep, drep, 1);
  else
    chunk_stats_impl(mu, dev, sq, x, rows, p, acc, rep, NULL, 0);
}

/* Blocked activations (kernels.h; C % 16 == 0, hw pixels per image): row r's 16-channel block b at
 * blocked_row(r) + b * hw * 16. */
static inline int64_t blocked_row(int64_t r, int64_t hw, int C) { return r / hw * C * hw + r % hw * 16; }

/* One pass of chunk_stats_blocked_impl over 16-channel block b: into acc, per row slot and
 * channel, the sum over rows r0 .. r0 + rows of (x - rep), squared when SQ: chunk_stats_impl's
 * passes lane by lane (slot t of a pattern of KS = p->k rows gets the pattern's row t, the rows
 * after the last whole pattern slot 0, in row order). A block's rows are 16 floats apart within an
 * image; KS is a literal, so the slots' sums stay in registers. */
BN_INLINE void blocked_stats_block(float *restrict acc, const float *restrict x, int64_t r0, int64_t rows, int64_t hw,
                                   int C, int b, const float *restrict rep, const float *restrict drep, const int D,
                                   const int SQ, const int KS) {
  const float *restrict rp = rep + b * 16, *restrict dp = D ? drep + b * 16 : NULL;
  int64_t px = r0 % hw;
  const float *base = x + r0 / hw * C * hw + (int64_t)b * hw * 16; /* the image's block */
  const int64_t groups = rows / KS;
#if defined(__AVX512F__)
  /* the same operations, the slots' sums in registers (GCC keeps them in memory otherwise) */
  __m512 v[8]; /* KS <= 8: C % 16 == 0 makes bn_plan_make's k at most 128 / 16 */
  for (int t = 0; t < KS; t++) v[t] = _mm512_setzero_ps();
  const __m512 rv = _mm512_loadu_ps(rp), dv = D ? _mm512_loadu_ps(dp) : rv;
#define BN_BLOCKED_ROW(T)                                     \
  do {                                                        \
    __m512 xv = _mm512_loadu_ps(base + px * 16);              \
    if (D) xv = _mm512_div_ps(xv, dv);                        \
    const __m512 d = _mm512_sub_ps(xv, rv);                   \
    v[T] = _mm512_add_ps(v[T], SQ ? _mm512_mul_ps(d, d) : d); \
  } while (0)
#else
  for (int t = 0; t < KS; t++)
    for (int j = 0; j < 16; j++) acc[t * C + b * 16 + j] = 0.0f;
#define BN_BLOCKED_ROW(T)                                  \
  do {                                                     \
    const float *restrict xr = base + px * 16;             \
    float *restrict at = acc + (T)*C + b * 16;             \
    _Pragma("omp simd") for (int j = 0; j < 16; j++) {     \
      const float d = (D ? xr[j] / dp[j] : xr[j]) - rp[j]; \
      at[j] += SQ ? d * d : d;                             \
    }                                                      \
  } while (0)
#endif
  for (int64_t g = 0; g < groups; g++)
    for (int t = 0; t < KS; t++) {
      BN_BLOCKED_ROW(t);
      if (++px == hw) px = 0, base += (int64_t)C * hw;
    }
  for (int64_t r = groups * KS; r < rows; r++) { /* the tail rows: slot 0 */
    BN_BLOCKED_ROW(0);
    if (++px == hw) px = 0, base += (int64_t)C * hw;
  }
#undef BN_BLOCKED_ROW
#if defined(__AVX512F__)
  for (int t = 0; t < KS; t++) _mm512_storeu_ps(acc + t * C + b * 16, v[t]);
#endif
}

/* The pass over every block (acc: the pattern of p->k row slots). */
BN_INLINE void blocked_stats_pass(float *restrict acc, const float *restrict x, int64_t r0, int64_t rows, int64_t hw,
                                  const bn_plan *p, const float *restrict rep, const float *restrict drep, const int D,
                                  const int SQ) {
  for (int b = 0; b < p->C / 16; b++) switch (p->k) {
      case 1: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 1); break;
      case 2: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 2); break;
      case 4: blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 4); break;
      default:
        QT_ASSERT(p->k == 8, "batch norm: %d rows per pattern of %d channels", p->k, p->C);
        blocked_stats_block(acc, x, r0, rows, hw, p->C, b, rep, drep, D, SQ, 8);
        break;
    }
}

/* chunk_stats_impl of rows r0 .. r0 + rows of a blocked input x (the whole tensor): the same
 * operations on the same values in the same order, so the same bits. */
BN_INLINE void chunk_stats_blocked_impl(double *mu, double *dev, double *sq, const float *restrict x, int64_t r0,
                                        int64_t rows, int64_t hw, const bn_plan *p, float *restrict acc,
                                        float *restrict rep, const float *restrict drep, const int D) {
  const int C = p->C;
  const float *x0 = x + blocked_row(r0, hw, C);
  for (int t = 0; t < p->k; t++) /* shift: the chunk's first row */
    for (int c = 0; c < C; c++) rep[t * C + c] = BN_X(x0, c / 16 * hw * 16 + c % 16, c);
  blocked_stats_pass(acc, x, r0, rows, hw, p, rep, drep, D, 0);
  pattern_fold(dev, acc, p);
  chunk_mean(mu, dev, rep, rows, p);
  blocked_stats_pass(acc, x, r0, rows, hw, p, rep, drep, D, 1);
  pattern_fold(sq, acc, p);
}

static void chunk_stats_blocked(double *mu, double *dev, double *sq, const float *x, int64_t r0, int64_t rows,
                                int64_t hw, const bn_plan *p, float *acc, float *rep, const float *drep) {
  if (drep)
    chunk_stats_blocked_impl(mu, dev, sq, x, r0, rows, hw, p, acc, rep, drep, 1);
  else
    chunk_stats_blocked_impl(mu, dev, sq, x, r0, rows, hw, p, acc, rep, NULL, 0);
}

/* SyncBN: replaces this process's per-channel (mean m, centred sum of squares m2) over M rows by
 * the whole batch's, merging every process's in process order; returns the total rows. */
static int64_t bn_merge_processes(double *m, double *m2, int64_t M, int C, const qt_batch_sync *sync) {
  const int R = sync->size;
  const int64_t n = 1 + 2 * (int64_t)C;
  double *send = xmalloc((size_t)(R + 1) * (size_t)n * sizeof(double)), *all = send + n;
  send[0] = (double)M;
  memcpy(send + 1, m, (size_t)C * sizeof(double));
  memcpy(send + 1 + C, m2, (size_t)C * sizeof(double));
  sync->allgather_f64(send, n, all);
  double total = 0;
  for (int r = 0; r < R; r++) total += all[r * n];
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int r = 0; r < R; r++) s += all[r * n] * all[r * n + 1 + c];
    const double mean = s / total;
    double q = 0;
    for (int r = 0; r < R; r++) {
      const double d = all[r * n + 1 + c] - mean;
      q += all[r * n + 1 + C + c] + all[r * n] * d * d;
    }
    m[c] = mean;
    m2[c] = q;
  }
  free(send);
  return (int64_t)total;
}

/* The training statistics of inp (or inp / in_div): mean, invstd, the running statistics'
 * update, and the apply pass's per-channel constants: chi + clo, the mean as two floats, and ca,
 * gamma * invstd. inp NHWC (hw 0) or blocked with hw pixels per image: the same bits. */
void qt_bn_train_stats(float *mean, float *invstd, float *chi, float *clo, float *ca, const float *inp,
                       const float *in_div, const float *gamma, float *running_mean, float *running_var, float momentum,
                       float eps, int M, int C, int64_t hw, const qt_batch_sync *sync, int64_t *M_total) {
  const int synced = sync && sync->size > 1;
  QT_ASSERT((synced ? M > 0 : M > 1) && C > 0,
            "batch_norm_forward_train: needs more than one value per channel (M=%d, C=%d), as PyTorch", M, C);
  const bn_plan p = bn_plan_make(M, C);
  const int nthreads = omp_get_max_threads();
  const size_t npart = (size_t)p.nchunks * (size_t)C;
  double *part = xmalloc(3 * npart * sizeof(double));
  double *pmu = part, *pdev = part + npart, *psq = part + 2 * npart;
  float *ws = xmalloc(((size_t)nthreads * 2 + 1) * pattern_stride(&p) * sizeof(float));
  /* the divisors' pattern, read by every thread, after the threads' scratch */
  float *drep = in_div ? ws + (size_t)nthreads * 2 * pattern_stride(&p) : NULL;
  if (drep) pattern_fill(drep, in_div, 1.0f, &p);

#pragma omp parallel for schedule(static) if ((int64_t)M * C >= BN_PARALLEL_MIN)
  for (int64_t i = 0; i < p.nchunks; i++) {
    float *scratch = thread_scratch(ws, 2, &p);
    int64_t r0 = i * p.chunk_rows, rows = p.M - r0 < p.chunk_rows ? p.M - r0 : p.chunk_rows;
    if (hw)
      chunk_stats_blocked(pmu + i * C, pdev + i * C, psq + i * C, inp, r0, rows, hw, &p, scratch,
                          scratch + pattern_stride(&p), drep);
    else
      chunk_stats(pmu + i * C, pdev + i * C, psq + i * C, inp + r0 * C, rows, &p, scratch, scratch + pattern_stride(&p),
                  drep);
  }

  /* Merge the chunks in order (exact parallel-variance identity). */
  double *stat_m = xmalloc(2 * (size_t)C * sizeof(double)), *stat_m2 = stat_m + C; /* per channel */
  for (int c = 0; c < C; c++) {
    double s = 0;
    for (int64_t i = 0; i < p.nchunks; i++) {
      const double n = (double)(p.M - i * p.chunk_rows < p.chunk_rows ? p.M - i * p.chunk_rows : p.chunk_rows);
      s += n * pmu[i * C + c] + pdev[i * C + c];
    }
    const double m = s / (double)M;
    double m2 = 0;
    for (int64_t i = 0; i < p.nchunks; i++) {
      const double n = (double)(p.M - i * p.chunk_rows < p.chunk_rows ? p.M - i * p.chunk_rows : p.chunk_rows);
      const double dm = pmu[i * C + c] - m;
      m2 += psq[i * C + c] + 2.0 * dm * pdev[i * C + c] + n * dm * dm;
    }
    if (m2 < 0) m2 = 0;
    stat_m[c] = m;
    stat_m2[c] = m2;
  }
  int64_t Mt = M;
  if (synced) {
    Mt = bn_merge_processes(stat_m, stat_m2, M, C, sync);
    QT_ASSERT(Mt > 1, "batch_norm_forward_train: needs more than one value per channel over all processes (%lld)",
              (long long)Mt);
  }
  *M_total = Mt;
  for (int c = 0; c < C; c++) {
    const double m = stat_m[c], m2 = stat_m2[c];
    const double var = m2 / (double)Mt;
    const double is = 1.0 / sqrt(var + (double)eps);
    mean[c] = (float)m;
    invstd[c] = (float)is;
    bn_channel_finish(c, m, m2, Mt, is, momentum, gamma, running_mean, running_var, chi, clo, ca);
  }
  QT_FREE_ALL(stat_m, ws, part);
}
