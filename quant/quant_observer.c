/* Observers: running min-max and moving-average min-max (per tensor or per channel, bit-exact
 * with PyTorch 1.13's MinMaxObserver / MovingAverageMinMaxObserver and their per-channel
 * variants), and a per-tensor histogram observer with percentile and MSE range selection.
 *
 * The histogram (our own design, not PyTorch's HistogramObserver):
 * - `bins` equal bins over [hist_min, hist_max]; the first batch sets the range to its own
 *   [min, max]. A later batch outside the range grows it on the old grid: the new range starts
 *   j old bins lower and its bins are k old bins wide (j, k integers), so every old bin falls
 *   whole into one new bin and re-binning moves counts without interpolation. The span at least
 *   doubles with each growth, so a run of growths stays logarithmic and at least half the bins
 *   stay in use. A batch of one repeated value is a point mass (hist_min == hist_max, bin 0).
 * - percentile p clips both tails: the range is [quantile(1 - p/100), quantile(p/100)], counts
 *   spread uniformly inside a bin, then clipped to the observed [min, max].
 * - MSE models the error of fake quant with the qparams a candidate range yields, over the
 *   histogram (uniform density inside each bin): clipped mass costs its exact squared distance
 *   to the clip point, in-range mass the rounding noise s^2/12. Affine grids search (lo, hi)
 *   on a 129 x 129 grid over [min, 0] x [0, max], then refine twice around the best; symmetric
 *   grids search max|x| in one dimension the same way. Each candidate costs O(1) with prefix
 *   sums of the bin moments.
 *
 * Relies on the C11 (non-GNU) default -ffp-contract=off: the moving average
 * min + c * (batch_min - min) must round twice as PyTorch's two tensor ops do. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "base/base.h"
#include "quant/quant_assert.h"

#define QUANT_PARALLEL_MIN 32768
#define HIST_MIN_BINS 8
#define HIST_MAX_BINS (1 << 24)

/* ---- lifecycle ------------------------------------------------------------------------- */

int qt_observer_init(qt_observer *o, qt_observer_kind kind, int channels, char *err) {
  memset(o, 0, sizeof *o);
  if ((unsigned)kind >= QT_OBSERVER_COUNT) {
    qt_err(err, "observer: unknown kind %d", (int)kind);
    return -1;
  }
  if (channels < 1) {
    qt_err(err, "observer: %d channels (expected at least 1)", channels);
    return -1;
  }
  if (kind == QT_OBSERVER_HISTOGRAM && channels != 1) {
    qt_err(err, "observer: the histogram observer is per tensor only (asked for %d channels)", channels);
    return -1;
  }
  o->kind = kind;
  o->channels = channels;
  o->averaging_constant = 0.01f;
  o->method = kind == QT_OBSERVER_HISTOGRAM ? QT_RANGE_MSE : QT_RANGE_MINMAX;
  o->percentile = 99.99f;
  o->bins = 2048;
  o->min = malloc((size_t)channels * sizeof(float));
  o->max = malloc((size_t)channels * sizeof(float));
  QUANT_ASSERT(o->min && o->max, "out of memory");
  qt_observer_reset(o);
  return 0;
}

void qt_observer_free(qt_observer *o) {
  QT_FREE_ALL(o->min, o->max, o->hist);
  o->min = o->max = NULL;
  o->hist = NULL;
  o->initialized = 0;
}

void qt_observer_reset(qt_observer *o) {
  o->initialized = 0;
  for (int c = 0; c < o->channels; c++) {
    o->min[c] = INFINITY;
    o->max[c] = -INFINITY;
  }
  free(o->hist); /* reallocated by the next update, so `bins` may change after a reset */
  o->hist = NULL;
  o->hist_min = o->hist_max = 0.0f;
}

int qt_observer_copy(qt_observer *dst, const qt_observer *src, char *err) {
  (void)err;
  float *mn = malloc((size_t)src->channels * sizeof(float));
  float *mx = malloc((size_t)src->channels * sizeof(float));
  int64_t *h = src->hist ? malloc((size_t)src->bins * sizeof(int64_t)) : NULL;
  QUANT_ASSERT(mn && mx && (h || !src->hist), "out of memory");
  memcpy(mn, src->min, (size_t)src->channels * sizeof(float));
  memcpy(mx, src->max, (size_t)src->channels * sizeof(float));
  if (h) memcpy(h, src->hist, (size_t)src->bins * sizeof(int64_t));
  QT_FREE_ALL(dst->min, dst->max, dst->hist);
  *dst = *src;
  dst->min = mn;
  dst->max = mx;
  dst->hist = h;
  return 0;
}

/* ---- batch statistics ------------------------------------------------------------------ */

static int64_t first_non_finite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return i;
  return -1;
}

/* Per-channel min and max of x (outer, C, inner), n > 0. Returns the index of the first NaN
 * or Inf, or -1 when every value is finite. */
static int64_t batch_minmax(const float *x, int64_t outer, int C, int64_t inner, float *bmin, float *bmax) {
  const int64_t n = outer * C * inner;
  if (C == 1) outer = 1, inner = n; /* per tensor: one flat row whatever the view */
  int nt = n >= QUANT_PARALLEL_MIN ? omp_get_max_threads() : 1;
  float *part = malloc((size_t)nt * 3 * (size_t)C * sizeof(float));
  QUANT_ASSERT(part, "out of memory");
  for (int64_t i = 0; i < (int64_t)nt * C; i++) {
    part[3 * i] = INFINITY;
    part[3 * i + 1] = -INFINITY;
    part[3 * i + 2] = 0.0f;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    float *p = part + (size_t)t * 3 * C; /* (min, max, nan-probe) per channel */
    if (inner == 1 && C > 1) {
      int64_t per = (outer + T - 1) / T, b = t * per, e = b + per < outer ? b + per : outer;
      float *mn = malloc(3 * (size_t)C * sizeof(float));
      QUANT_ASSERT(mn, "out of memory");
      float *mx = mn + C, *probe = mx + C;
      for (int c = 0; c < C; c++) {
        mn[c] = INFINITY;
        mx[c] = -INFINITY;
        probe[c] = 0.0f;
      }
      for (int64_t o = b; o < e; o++) {
        const float *row = x + o * C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
          float v = row[c];
          mn[c] = v < mn[c] ? v : mn[c];
          mx[c] = v > mx[c] ? v : mx[c];
          probe[c] += v * 0.0f; /* NaN iff some v is NaN or Inf */
        }
      }
      for (int c = 0; c < C; c++) {
        p[3 * c] = mn[c];
        p[3 * c + 1] = mx[c];
        p[3 * c + 2] = probe[c];
      }
      free(mn);
    } else {
      int64_t per = (n + T - 1) / T, b = t * per, e = b + per < n ? b + per : n;
      for (int64_t start = b; start < e;) {
        int64_t r = start / inner, stop = (r + 1) * inner < e ? (r + 1) * inner : e;
        int c = (int)(r % C);
        float mn = INFINITY, mx = -INFINITY, probe = 0.0f;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : probe)
        for (int64_t i = start; i < stop; i++) {
          float v = x[i];
          mn = v < mn ? v : mn;
          mx = v > mx ? v : mx;
          probe += v * 0.0f;
        }
        p[3 * c] = mn < p[3 * c] ? mn : p[3 * c];
        p[3 * c + 1] = mx > p[3 * c + 1] ? mx : p[3 * c + 1];
        p[3 * c + 2] += probe;
        start = stop;
      }
    }
  }
  int bad = 0;
  for (int c = 0; c < C; c++) {
    bmin[c] = INFINITY;
    bmax[c] = -INFINITY;
    for (int t = 0; t < nt; t++) {
      const float *p = part + ((size_t)t * C + c) * 3;
      bmin[c] = p[0] < bmin[c] ? p[0] : bmin[c];
      bmax[c] = p[1] > bmax[c] ? p[1] : bmax[c];
      if (p[2] != 0.0f) bad = 1;
    }
  }
  free(part);
  return bad ? first_non_finite(x, n) : -1;
}

/* ---- histogram ------------------------------------------------------------------------- */

static int64_t hist_total(const qt_observer *o) {
  int64_t t = 0;
  for (int i = 0; i < o->bins; i++) t += o->hist[i];
  return t;
}

static int hist_bin(const qt_observer *o, double v) {
  double span = (double)o->hist_max - (double)o->hist_min;
  if (!(span > 0)) return 0;
  double u = (v - (double)o->hist_min) / span * o->bins;
  int i = u <= 0 ? 0 : u >= o->bins ? o->bins - 1 : (int)u;
  return i;
}

/* Widens [hist_min, hist_max] to cover [lo, hi] on the old grid (see the file comment). */
static void hist_grow(qt_observer *o, double lo, double hi) {
  const int B = o->bins;
  int64_t *old = malloc((size_t)B * sizeof(int64_t));
  QUANT_ASSERT(old, "out of memory");
  memcpy(old, o->hist, (size_t)B * sizeof(int64_t));
  memset(o->hist, 0, (size_t)B * sizeof(int64_t));
  double omin = o->hist_min, omax = o->hist_max;
  if (omax == omin) {
    /* a point mass: re-histogram it as one value in the new range */
    o->hist_min = (float)lo;
    o->hist_max = (float)hi;
    o->hist[hist_bin(o, omin)] += old[0];
  } else {
    double w = (omax - omin) / B;
    double j = ceil((omin - lo) / w);
    if (j < 0) j = 0;
    double nmin = omin - j * w;
    double k = ceil((hi - nmin) / (B * w));
    if (k < 1) k = 1;
    while (nmin + B * k * w < hi) k += 1;
    double nmax = nmin + B * k * w;
    for (int i = 0; i < B; i++) {
      if (!old[i]) continue;
      double ni = floor((i + j) / k);
      o->hist[ni < 0 ? 0 : ni >= B ? B - 1 : (int)ni] += old[i];
    }
    o->hist_min = (float)nmin;
    o->hist_max = nmax > FLT_MAX ? FLT_MAX : (float)nmax;
  }
  free(old);
}

/* Adds the counts of x's values on o's grid to counts (B). */
static void hist_count(const qt_observer *o, const float *x, int64_t n, int64_t *counts) {
  const int B = o->bins;
  if (o->hist_max == o->hist_min) {
    counts[0] += n; /* every value equals hist_min (the batch lay inside a point range) */
    return;
  }
  const double hmin = o->hist_min, f = B / ((double)o->hist_max - hmin);
  int nt = n >= QUANT_PARALLEL_MIN ? omp_get_max_threads() : 1;
  int64_t *part = calloc((size_t)nt * B, sizeof(int64_t));
  QUANT_ASSERT(part, "out of memory");
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t per = (n + T - 1) / T, b = t * per, e = b + per < n ? b + per : n;
    int64_t *h = part + (size_t)t * B;
    for (int64_t i = b; i < e; i++) {
      double u = ((double)x[i] - hmin) * f;
      int bin = u <= 0 ? 0 : u >= B ? B - 1 : (int)u;
      h[bin]++;
    }
  }
  for (int t = 0; t < nt; t++)
    for (int i = 0; i < B; i++) counts[i] += part[(size_t)t * B + i];
  free(part);
}

static void hist_add(qt_observer *o, const float *x, int64_t n) { hist_count(o, x, n, o->hist); }

/* Synchronized: every process's counts of its slice on the same grid, summed (exactly: integer
 * counts below 2^53 in double), added to every process's histogram. */
static void hist_add_sync(qt_observer *o, const float *x, int64_t n, const qt_batch_sync *sync) {
  const int B = o->bins;
  int64_t *counts = calloc((size_t)B, sizeof *counts);
  double *sum = malloc((size_t)B * sizeof *sum);
  QUANT_ASSERT(counts && sum, "out of memory");
  if (n > 0) hist_count(o, x, n, counts);
  for (int i = 0; i < B; i++) sum[i] = (double)counts[i];
  sync->sum_f64(sum, B);
  for (int i = 0; i < B; i++) o->hist[i] += (int64_t)sum[i];
  free(sum);
  free(counts);
}

/* ---- update ---------------------------------------------------------------------------- */

static const char *non_finite_name(float v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

/* Synchronized observers: every process's batch min/max (and the first non-finite element, if
 * any) gathered; bmin and bmax become the whole batch's (min and max do not depend on the order),
 * *total its element count. 0, or -1 with err naming the first process whose slice holds a NaN
 * or Inf (the same error on every process). */
static int minmax_sync(float *bmin, float *bmax, int64_t bad, float bad_value, int64_t n, int C,
                       const qt_batch_sync *sync, int64_t *total, char *err) {
  const int R = sync->size;
  const int64_t k = 3 + 2 * (int64_t)C;
  double *send = malloc((size_t)(R + 1) * (size_t)k * sizeof(double)), *all = send + k;
  QUANT_ASSERT(send, "out of memory");
  send[0] = (double)bad;
  send[1] = bad >= 0 ? (double)bad_value : 0.0;
  send[2] = (double)n;
  for (int c = 0; c < C; c++) {
    send[3 + c] = bmin[c];
    send[3 + C + c] = bmax[c];
  }
  sync->allgather_f64(send, k, all);
  int rc = 0;
  *total = 0;
  for (int r = 0; r < R; r++) {
    const double *p = all + (size_t)r * (size_t)k;
    if (p[0] >= 0 && !rc)
      rc = qt_err(err, "observer: input of process %d holds %s at element %lld of its slice", r,
                  non_finite_name((float)p[1]), (long long)p[0]);
    *total += (int64_t)p[2];
    for (int c = 0; c < C; c++) {
      if (r == 0 || (float)p[3 + c] < bmin[c]) bmin[c] = (float)p[3 + c];
      if (r == 0 || (float)p[3 + C + c] > bmax[c]) bmax[c] = (float)p[3 + C + c];
    }
  }
  free(send);
  return rc;
}

int qt_observer_update(qt_observer *o, const float *x, int64_t outer, int64_t inner, char *err) {
  return qt_observer_update_sync(o, x, outer, inner, NULL, err);
}

int qt_observer_update_sync(qt_observer *o, const float *x, int64_t outer, int64_t inner, const qt_batch_sync *sync,
                            char *err) {
  const int C = o->channels;
  QUANT_ASSERT(o->min && o->max, "observer: update before init");
  QUANT_ASSERT(outer >= 0 && inner >= 0, "observer: negative view size");
  const int synced = sync && sync->size > 1;
  const int64_t n = outer * C * inner;
  if (n == 0 && !synced) return 0; /* PyTorch returns early on an empty tensor */
  if (o->kind == QT_OBSERVER_HISTOGRAM && !o->hist && (o->bins < HIST_MIN_BINS || o->bins > HIST_MAX_BINS)) {
    qt_err(err, "observer: histogram with %d bins (expected %d..%d)", o->bins, HIST_MIN_BINS, HIST_MAX_BINS);
    return -1;
  }
  float *bmin = malloc(2 * (size_t)C * sizeof(float));
  QUANT_ASSERT(bmin, "out of memory");
  float *bmax = bmin + C;
  int64_t bad = -1;
  if (n > 0) {
    bad = batch_minmax(x, outer, C, inner, bmin, bmax);
  } else {
    for (int c = 0; c < C; c++) {
      bmin[c] = INFINITY;
      bmax[c] = -INFINITY;
    }
  }
  if (synced) {
    int64_t total;
    if (minmax_sync(bmin, bmax, bad, bad >= 0 ? x[bad] : 0.0f, n, C, sync, &total, err)) {
      free(bmin);
      return -1;
    }
    if (total == 0) {
      free(bmin);
      return 0;
    }
  } else if (bad >= 0) {
    qt_err(err, "observer: input holds %s at element %lld", non_finite_name(x[bad]), (long long)bad);
    free(bmin);
    return -1;
  }
  switch (o->kind) {
    case QT_OBSERVER_MINMAX:
    case QT_OBSERVER_HISTOGRAM:
      for (int c = 0; c < C; c++) {
        o->min[c] = o->initialized && o->min[c] < bmin[c] ? o->min[c] : bmin[c];
        o->max[c] = o->initialized && o->max[c] > bmax[c] ? o->max[c] : bmax[c];
      }
      break;
    case QT_OBSERVER_MOVING_AVERAGE: {
      const float a = o->averaging_constant;
      for (int c = 0; c < C; c++) {
        if (!o->initialized) {
          o->min[c] = bmin[c];
          o->max[c] = bmax[c];
        } else {
          float dmin = bmin[c] - o->min[c], dmax = bmax[c] - o->max[c];
          float tmin = a * dmin, tmax = a * dmax;
          o->min[c] = o->min[c] + tmin;
          o->max[c] = o->max[c] + tmax;
        }
      }
      break;
    }
    default: QUANT_ASSERT(0, "observer: unknown kind");
  }
  if (o->kind == QT_OBSERVER_HISTOGRAM) {
    if (!o->hist) {
      o->hist = calloc((size_t)o->bins, sizeof(int64_t));
      QUANT_ASSERT(o->hist, "out of memory");
    }
    if (!o->initialized) {
      o->hist_min = bmin[0];
      o->hist_max = bmax[0];
    } else if (bmin[0] < o->hist_min || bmax[0] > o->hist_max) {
      hist_grow(o, fmin(bmin[0], o->hist_min), fmax(bmax[0], o->hist_max));
    }
    if (synced)
      hist_add_sync(o, x, n, sync);
    else
      hist_add(o, x, n);
  }
  o->initialized = 1;
  free(bmin);
  return 0;
}

/* ---- histogram range selection --------------------------------------------------------- */

typedef struct {
  const qt_observer *o;
  int B;
  double hmin, w; /* bin positions: x = hmin + p * w, p in [0, B] */
  double total;
  double *cnt, *m1, *m2; /* prefix sums over bins < k (B + 1 each), moments in bin units */
} hist_moments;

static void moments_init(hist_moments *h, const qt_observer *o) {
  const int B = o->bins;
  h->o = o;
  h->B = B;
  h->hmin = o->hist_min;
  h->w = ((double)o->hist_max - (double)o->hist_min) / B;
  h->cnt = malloc(3 * (size_t)(B + 1) * sizeof(double));
  QUANT_ASSERT(h->cnt, "out of memory");
  h->m1 = h->cnt + B + 1;
  h->m2 = h->m1 + B + 1;
  h->cnt[0] = h->m1[0] = h->m2[0] = 0;
  for (int i = 0; i < B; i++) {
    double c = (double)o->hist[i], m = i + 0.5;
    h->cnt[i + 1] = h->cnt[i] + c;
    h->m1[i + 1] = h->m1[i] + c * m;
    h->m2[i + 1] = h->m2[i] + c * (m * m + 1.0 / 12.0); /* E[p^2] over a uniform bin */
  }
  h->total = h->cnt[B];
}

static void moments_free(hist_moments *h) { free(h->cnt); }

/* Mass below position t and its squared distance to t (bin units). */
static void below(const hist_moments *h, double t, double *mass, double *sq) {
  if (t <= 0) {
    *mass = *sq = 0;
    return;
  }
  int k = t >= h->B ? h->B : (int)t;
  double fr = t - k, ck = k < h->B ? (double)h->o->hist[k] : 0;
  *mass = h->cnt[k] + ck * fr;
  *sq = t * t * h->cnt[k] - 2 * t * h->m1[k] + h->m2[k] + ck * fr * fr * fr / 3.0;
  if (*sq < 0) *sq = 0;
}

/* Mass above position t and its squared distance to t. */
static void above(const hist_moments *h, double t, double *mass, double *sq) {
  const int B = h->B;
  if (t >= B) {
    *mass = *sq = 0;
    return;
  }
  if (t < 0) t = 0; /* only reached for clip points at or below the first bin: never clips */
  int k = (int)t;
  double fr = k + 1 - t, ck = (double)h->o->hist[k];
  double c = h->cnt[B] - h->cnt[k + 1], m1 = h->m1[B] - h->m1[k + 1], m2 = h->m2[B] - h->m2[k + 1];
  *mass = c + ck * fr;
  *sq = t * t * c - 2 * t * m1 + m2 + ck * fr * fr * fr / 3.0;
  if (*sq < 0) *sq = 0;
}

/* Expected squared error (bin units, summed over the histogram) of fake quant with the qparams
 * the range [lo, hi] yields. +Inf when the range yields no qparams. */
static double range_error(const hist_moments *h, double lo, double hi, int qmin, int qmax, int symmetric) {
  float s;
  int32_t zp;
  if (qt_qparams_from_range((float)lo, (float)hi, qmin, qmax, symmetric, &s, &zp)) return INFINITY;
  double clip_lo = ((double)(qmin - zp) * s - h->hmin) / h->w;
  double clip_hi = ((double)(qmax - zp) * s - h->hmin) / h->w;
  double mb, sb, ma, sa;
  below(h, clip_lo, &mb, &sb);
  above(h, clip_hi, &ma, &sa);
  double step = s / h->w, inside = h->total - mb - ma;
  if (inside < 0) inside = 0;
  return sb + sa + inside * step * step / 12.0;
}

/* Affine: search (lo, hi) in [min, 0] x [0, max]; symmetric: m = max|x| candidate in (0, M]. */
static void mse_range(const qt_observer *o, int qmin, int qmax, int symmetric, float *lo_out, float *hi_out) {
  hist_moments h;
  moments_init(&h, o);
  const double mn = o->min[0], mx = o->max[0];
  const int G = 128, R = 16;
  if (symmetric) {
    const double M = fmax(-mn, mx);
    double best = INFINITY, bm = M, a = 0, b = M;
    for (int pass = 0; pass < 3; pass++) {
      int steps = pass == 0 ? 4 * G : 2 * R;
      double d = (b - a) / steps, start = a;
      for (int i = 0; i <= steps; i++) {
        double m = start + i * d;
        if (!(m > 0)) continue;
        double e = range_error(&h, -m, m, qmin, qmax, 1);
        if (e < best) {
          best = e;
          bm = m;
        }
      }
      a = fmax(0, bm - d);
      b = fmin(M, bm + d);
    }
    *lo_out = (float)fmax(-bm, mn);
    *hi_out = (float)fmin(bm, mx);
  } else {
    const double lo_a0 = fmin(mn, 0), hi_b0 = fmax(mx, 0);
    double la = lo_a0, lb = fmin(0, mx), ha = fmax(0, mn), hb = hi_b0;
    double best = INFINITY, bl = lo_a0, bh = hi_b0;
    for (int pass = 0; pass < 3; pass++) {
      int steps = pass == 0 ? G : 2 * R;
      double dl = (lb - la) / steps, dh = (hb - ha) / steps;
      for (int i = 0; i <= steps; i++) {
        double lo = la + i * dl;
        for (int j = 0; j <= steps; j++) {
          double hi = ha + j * dh;
          if (!(hi > lo)) continue;
          double e = range_error(&h, lo, hi, qmin, qmax, 0);
          if (e < best) {
            best = e;
            bl = lo;
            bh = hi;
          }
        }
      }
      la = fmax(lo_a0, bl - dl);
      lb = fmin(fmin(0, mx), bl + dl);
      ha = fmax(fmax(0, mn), bh - dh);
      hb = fmin(hi_b0, bh + dh);
    }
    /* [min, 0] x [0, max] holds zero only when the data does: report within the data */
    *lo_out = (float)fmax(bl, mn);
    *hi_out = (float)fmin(bh, mx);
    if (*lo_out > *hi_out) *lo_out = *hi_out;
  }
  moments_free(&h);
}

static void percentile_range(const qt_observer *o, float *lo_out, float *hi_out) {
  const int B = o->bins;
  const double total = (double)hist_total(o), tail = total * (100.0 - o->percentile) / 100.0;
  const double hmin = o->hist_min, w = ((double)o->hist_max - hmin) / B;
  double lo = o->min[0], hi = o->max[0];
  if (tail > 0) {
    double cum = 0;
    for (int i = 0; i < B; i++) {
      double c = (double)o->hist[i];
      if (c > 0 && cum + c >= tail) {
        lo = hmin + (i + (tail - cum) / c) * w;
        break;
      }
      cum += c;
    }
    cum = 0;
    for (int i = B - 1; i >= 0; i--) {
      double c = (double)o->hist[i];
      if (c > 0 && cum + c >= tail) {
        hi = hmin + (i + 1 - (tail - cum) / c) * w;
        break;
      }
      cum += c;
    }
  }
  lo = fmin(fmax(lo, o->min[0]), o->max[0]);
  hi = fmin(fmax(hi, o->min[0]), o->max[0]);
  if (lo > hi) lo = hi = 0.5 * (lo + hi);
  *lo_out = (float)lo;
  *hi_out = (float)hi;
}

/* The range per channel; for a histogram, by its method for the given grid. */
static int observer_range(const qt_observer *o, int qmin, int qmax, int symmetric, float *min, float *max, char *err) {
  if (!o->initialized) {
    qt_err(err, "observer: nothing observed yet");
    return -1;
  }
  if (o->kind != QT_OBSERVER_HISTOGRAM || o->method == QT_RANGE_MINMAX || o->hist_min == o->hist_max) {
    memcpy(min, o->min, (size_t)o->channels * sizeof(float));
    memcpy(max, o->max, (size_t)o->channels * sizeof(float));
    return 0;
  }
  switch (o->method) {
    case QT_RANGE_PERCENTILE:
      if (!(o->percentile > 50.0f && o->percentile <= 100.0f)) {
        qt_err(err, "observer: percentile %g outside (50, 100]", o->percentile);
        return -1;
      }
      percentile_range(o, min, max);
      return 0;
    case QT_RANGE_MSE:
      QUANT_ASSERT(qmin < qmax, "observer: quant_min must be below quant_max");
      mse_range(o, qmin, qmax, symmetric, min, max);
      return 0;
    default: qt_err(err, "observer: unknown range method %d", (int)o->method); return -1;
  }
}

int qt_observer_range(const qt_observer *o, int qmin, int qmax, float *min, float *max) {
  return observer_range(o, qmin, qmax, 0, min, max, NULL);
}

int qt_observer_qparams(const qt_observer *o, int qmin, int qmax, int symmetric, float *scale, int32_t *zp, char *err) {
  const int C = o->channels;
  float *mn = malloc(2 * (size_t)C * sizeof(float));
  QUANT_ASSERT(mn, "out of memory");
  float *mx = mn + C;
  int rc = observer_range(o, qmin, qmax, symmetric, mn, mx, err);
  for (int c = 0; rc == 0 && c < C; c++) {
    if (qt_qparams_from_range(mn[c], mx[c], qmin, qmax, symmetric, &scale[c], &zp[c])) {
      qt_err(err, "observer: channel %d range [%g, %g] gives no qparams", c, mn[c], mx[c]);
      rc = -1;
    }
  }
  free(mn);
  return rc;
}
