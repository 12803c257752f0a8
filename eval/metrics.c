/* Numeric comparisons behind the reports: SQNR and output differences in LSB. */
#include <math.h>

#include "eval/report.h"

void qt_sqnr_add(qt_sqnr_sum *s, const float *x, const float *y, int64_t n) {
  double signal = 0, noise = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = x[i], d = (double)x[i] - (double)y[i];
    signal += a * a;
    noise += d * d;
  }
  s->signal += signal;
  s->noise += noise;
  s->n += n;
}

double qt_sqnr_sum_db(const qt_sqnr_sum *s) {
  if (s->n == 0) return NAN;
  if (s->noise == 0) return INFINITY; /* identical, zeros included */
  if (s->signal == 0) return -INFINITY;
  return 10.0 * log10(s->signal / s->noise);
}

double qt_sqnr_db(const float *x, const float *y, int64_t n) {
  qt_sqnr_sum s = {0, 0, 0};
  qt_sqnr_add(&s, x, y, n);
  return qt_sqnr_sum_db(&s);
}

void qt_lsb_histogram_add(qt_lsb_histogram *h, const float *a, const float *b, int64_t n, float lsb) {
  QT_ASSERT(lsb > 0, "LSB histogram with an output scale of %g", (double)lsb);
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]) / (double)lsb;
    /* NaN lands in the last bin: never silently counted as agreement. */
    const int bin = d < 0.5 ? 0 : d < 1.5 ? 1 : d < 2.5 ? 2 : 3;
    h->count[bin]++;
    if (d > h->max_lsb || d != d) h->max_lsb = d;
  }
  h->n += n;
}
