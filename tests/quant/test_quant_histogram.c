/* Histogram observer against brute force on known distributions.
 * - MSE, Gaussian N(0, 1) with outliers at +-40 (10 in 50k samples at 4 bits, 2 in 2M at 8
 *   bits, where rounding noise is small enough that more outliers are worth keeping): the
 *   chosen clip range lies well inside the min-max range (within half of it), and the real
 *   quantization MSE of the data (fake quant with the chosen qparams) is below min-max's and
 *   within 2% of the best of a brute-force sweep that fake-quantizes the data for every
 *   candidate (affine 4-bit: (lo, hi) on a 41 x 41 grid; otherwise [-c, c] for 200 values of
 *   c; symmetric signed and unsigned, affine 8-bit).
 * - Percentile 99.99 on uniform [-1, 3] is the range within 0.01 (0.25% of the span); percentile 99
 *   is the exact 1% / 99% quantiles of the sorted data within 0.3 bin widths (counts are
 *   interpolated inside a bin).
 * - Growth: batches that widen the range both ways (and a point-mass first batch) keep every
 *   count, cover the data, equal binning all the data on the final grid (re-binning is exact),
 *   and give quantiles within 1.5 current bin widths of the sorted data.
 * - A constant stream gives [v, v]; all zeros give scale FLT_EPSILON, zero point qmin. */
#include "tests/quant/quant_testutil.h"

static double gaussian(uint64_t *state) {
  /* Box-Muller on a splitmix stream */
  double u[2];
  for (int k = 0; k < 2; k++) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    u[k] = ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Mean squared error of fake-quantizing x with the qparams of [lo, hi]. */
static double quant_mse(const float *x, int64_t n, float lo, float hi, int qmin, int qmax, int symmetric, float *buf) {
  float s;
  int32_t z;
  if (qt_qparams_from_range(lo, hi, qmin, qmax, symmetric, &s, &z)) return INFINITY;
  qt_fake_quant_forward(buf, NULL, x, n, 1, 1, &s, &z, qmin, qmax);
  double e = 0;
  for (int64_t i = 0; i < n; i++) e += ((double)buf[i] - x[i]) * ((double)buf[i] - x[i]);
  return e / n;
}

/* grid2d: affine (lo, hi) on a 41 x 41 grid; otherwise clip values c in (0, max|x|] (200 of
 * them) with the range [-c, c] and the test's qparams flavour. */
static void mse_gaussian(int qmin, int qmax, int symmetric, int64_t n, int outliers, int grid2d) {
  char err[QT_ERR_LEN];
  float *x = malloc((size_t)n * sizeof(float)), *buf = malloc((size_t)n * sizeof(float));
  uint64_t st = 99;
  for (int64_t i = 0; i < n; i++) x[i] = (float)gaussian(&st);
  for (int k = 0; k < outliers; k++) x[k * (n / outliers)] = k % 2 ? 40.0f : -40.0f + (float)k;
  qt_observer o;
  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 1, err) == 0);
  o.method = QT_RANGE_MSE;
  /* two batches, so the MSE sees a grown histogram */
  QT_CHECK(qt_observer_update(&o, x, 1, n / 2, err) == 0);
  QT_CHECK(qt_observer_update(&o, x + n / 2, n - n / 2, 1, err) == 0);
  float s, mn = o.min[0], mx = o.max[0];
  int32_t z;
  QT_CHECK(qt_observer_qparams(&o, qmin, qmax, symmetric, &s, &z, err) == 0);
  /* the chosen clip range */
  float clo = (float)(qmin - z) * s, chi = (float)(qmax - z) * s;
  qt_fake_quant_forward(buf, NULL, x, 1, 1, n, &s, &z, qmin, qmax);
  double e_ours = 0;
  for (int64_t i = 0; i < n; i++) e_ours += ((double)buf[i] - x[i]) * ((double)buf[i] - x[i]);
  e_ours /= n;
  double e_minmax = quant_mse(x, n, mn, mx, qmin, qmax, symmetric, buf);

  double best = INFINITY;
  float blo = 0, bhi = 0;
  if (grid2d) {
    for (int a = 0; a <= 40; a++)
      for (int b = 1; b <= 40; b++) {
        float lo = mn * (float)a / 40.0f, hi = mx * (float)b / 40.0f;
        double e = quant_mse(x, n, lo, hi, qmin, qmax, symmetric, buf);
        if (e < best) best = e, blo = lo, bhi = hi;
      }
  } else {
    float m = fmaxf(-mn, mx);
    for (int t = 1; t <= 200; t++) {
      float c = m * (float)t / 200.0f;
      double e = quant_mse(x, n, -c, c, qmin, qmax, symmetric, buf);
      if (e < best) best = e, blo = -c, bhi = c;
    }
  }
  if (!symmetric) {
    float r_lo, r_hi;
    QT_CHECK(qt_observer_range(&o, qmin, qmax, &r_lo, &r_hi) == 0);
    QT_CHECK(r_lo > 0.5f * mn && r_hi < 0.5f * mx); /* well inside [-40, 40] */
  }
  if (!(clo > 0.5f * fminf(mn, -mx) && chi < 0.5f * fmaxf(mx, -mn)))
    qt_test_fail("mse [%d, %d]%s: clip range [%g, %g] not well inside [%g, %g]", qmin, qmax, symmetric ? " sym" : "",
                 clo, chi, mn, mx);
  if (!(e_ours < e_minmax)) qt_test_fail("mse [%d, %d]: %g not below min-max %g", qmin, qmax, e_ours, e_minmax);
  if (!(e_ours <= 1.02 * best))
    qt_test_fail("mse [%d, %d]%s: quantization MSE %.6g vs brute force best %.6g at [%g, %g] (ours clips [%g, %g])",
                 qmin, qmax, symmetric ? " sym" : "", e_ours, best, blo, bhi, clo, chi);
  qt_observer_free(&o);
  free(x), free(buf);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static void percentile_uniform(void) {
  char err[QT_ERR_LEN];
  const int64_t n = 400000;
  float *x = malloc((size_t)n * sizeof(float));
  qt_test_fill_uniform(x, n, -1.0f, 3.0f, 11);
  qt_observer o;
  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 1, err) == 0);
  o.method = QT_RANGE_PERCENTILE;
  o.percentile = 99.99f;
  for (int b = 0; b < 4; b++) QT_CHECK(qt_observer_update(&o, x + b * (n / 4), 1, n / 4, err) == 0);
  float lo, hi;
  QT_CHECK(qt_observer_range(&o, 0, 255, &lo, &hi) == 0);
  if (!(fabsf(lo + 1.0f) < 1e-2f && fabsf(hi - 3.0f) < 1e-2f))
    qt_test_fail("percentile 99.99 of uniform [-1, 3]: [%g, %g]", lo, hi);
  QT_CHECK(lo >= o.min[0] && hi <= o.max[0]);

  o.percentile = 99.0f;
  QT_CHECK(qt_observer_range(&o, 0, 255, &lo, &hi) == 0);
  qsort(x, (size_t)n, sizeof(float), cmp_float);
  float q01 = x[(int64_t)(0.01 * n)], q99 = x[(int64_t)(0.99 * n)];
  double w = ((double)o.hist_max - o.hist_min) / o.bins;
  if (!(fabs(lo - q01) <= 0.3 * w && fabs(hi - q99) <= 0.3 * w))
    qt_test_fail("percentile 99: [%g, %g], sorted quantiles [%g, %g], bin width %g", lo, hi, q01, q99, w);
  qt_observer_free(&o);
  free(x);
}

/* quantile of the histogram (uniform inside bins), for the growth check */
static double hist_quantile(const qt_observer *o, double p) {
  double total = 0, cum = 0, w = ((double)o->hist_max - o->hist_min) / o->bins;
  for (int i = 0; i < o->bins; i++) total += (double)o->hist[i];
  double target = p * total;
  for (int i = 0; i < o->bins; i++) {
    double c = (double)o->hist[i];
    if (c > 0 && cum + c >= target) return o->hist_min + (i + (target - cum) / c) * w;
    cum += c;
  }
  return o->hist_max;
}

static void growth(void) {
  char err[QT_ERR_LEN];
  const int nb = 5;
  const int64_t per = 20000;
  float *all = malloc((size_t)(nb * per) * sizeof(float));
  const float lo[5] = {0.0f, 0.0f, -3.0f, 0.2f, -0.5f}, hi[5] = {0.0f, 1.0f, 0.5f, 10.0f, 0.5f};
  for (int b = 0; b < nb; b++) qt_test_fill_uniform(all + b * per, per, lo[b], hi[b], 100 + (uint64_t)b);
  qt_observer o;
  QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 1, err) == 0);
  o.bins = 1024;
  for (int b = 0; b < nb; b++) {
    QT_CHECK(qt_observer_update(&o, all + b * per, per, 1, err) == 0);
    int64_t total = 0;
    for (int i = 0; i < o.bins; i++) total += o.hist[i];
    if (total != (b + 1) * per) qt_test_fail("growth: %lld counts after batch %d, want %lld", (long long)total, b,
                                             (long long)((b + 1) * per));
    QT_CHECK(o.hist_min <= o.min[0] && o.hist_max >= o.max[0]);
  }
  QT_CHECK(o.min[0] >= -3.0f && o.min[0] < -2.99f && o.max[0] <= 10.0f && o.max[0] > 9.99f);
  qsort(all, (size_t)(nb * per), sizeof(float), cmp_float);
  double w = ((double)o.hist_max - o.hist_min) / o.bins;
  for (int k = 1; k < 10; k++) {
    double p = k / 10.0, want = all[(int64_t)(p * nb * per)], got = hist_quantile(&o, p);
    if (!(fabs(got - want) <= 1.5 * w)) qt_test_fail("growth: quantile %.1f: %g, sorted %g (bin %g)", p, got, want, w);
  }
  /* re-binning is exact: the histogram equals binning all the data directly on the final grid
   * (up to values within float rounding of a bin edge) */
  int64_t *direct = calloc((size_t)o.bins, sizeof(int64_t)), moved = 0;
  for (int64_t i = 0; i < nb * per; i++) {
    double u = ((double)all[i] - o.hist_min) / ((double)o.hist_max - o.hist_min) * o.bins;
    direct[u <= 0 ? 0 : u >= o.bins ? o.bins - 1 : (int)u]++;
  }
  for (int i = 0; i < o.bins; i++) moved += llabs(direct[i] - o.hist[i]);
  if (moved > 4) qt_test_fail("growth: %lld counts differ from binning the data on the final grid", (long long)moved);
  free(direct);
  /* the point mass of the first batch sits at 0 */
  int zero_bin = (int)((0.0 - o.hist_min) / w);
  QT_CHECK(zero_bin >= 0 && zero_bin < o.bins && o.hist[zero_bin] >= per);
  qt_observer_free(&o);
  free(all);
}

static void constants(void) {
  char err[QT_ERR_LEN];
  qt_observer o;
  float x[300], lo, hi, s;
  int32_t z;
  for (int m = 0; m < QT_RANGE_COUNT; m++) {
    QT_CHECK(qt_observer_init(&o, QT_OBSERVER_HISTOGRAM, 1, err) == 0);
    o.method = (qt_range_method)m;
    for (int i = 0; i < 300; i++) x[i] = 2.5f;
    QT_CHECK(qt_observer_update(&o, x, 1, 300, err) == 0);
    QT_CHECK(qt_observer_update(&o, x, 300, 1, err) == 0);
    QT_CHECK(qt_observer_range(&o, 0, 255, &lo, &hi) == 0 && lo == 2.5f && hi == 2.5f);
    qt_observer_reset(&o);
    for (int i = 0; i < 300; i++) x[i] = 0.0f;
    QT_CHECK(qt_observer_update(&o, x, 1, 300, err) == 0);
    QT_CHECK(qt_observer_qparams(&o, 0, 255, 0, &s, &z, err) == 0 && s == 1.1920929e-07f && z == 0);
    QT_CHECK(qt_observer_qparams(&o, -8, 7, 0, &s, &z, err) == 0 && s == 1.1920929e-07f && z == -8);
    qt_observer_free(&o);
  }
}

int main(void) {
  /* 4 bits: 10 outliers in 50k samples are worth clipping */
  mse_gaussian(0, 15, 0, 50000, 10, 1);
  mse_gaussian(-8, 7, 1, 50000, 10, 0);
  mse_gaussian(0, 15, 1, 50000, 10, 0);
  /* 8 bits: rounding noise is ~250x smaller, so clipping pays only for rarer outliers (the
   * brute force agrees: with 10 in 50k the best 8-bit range keeps them) */
  mse_gaussian(0, 255, 0, 2000000, 2, 0);
  mse_gaussian(-128, 127, 1, 2000000, 2, 0);
  percentile_uniform();
  growth();
  constants();
  return qt_test_finish();
}
