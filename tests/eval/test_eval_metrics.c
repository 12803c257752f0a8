/* SQNR and the output-LSB histogram (eval/report.h) on cases with known answers:
 * - by hand: x = (1, 2, 3, 4), y = (1, 2, 3, 5): 10 log10(30 / 1) dB; identical tensors +inf,
 *   a zero reference -inf, no elements NaN; sums over two halves = the whole;
 * - uniform quantization noise: x uniform in [-a, a] quantized with scale s (round half even
 *   through qt_quantize / qt_dequantize, no clipping) has noise variance s^2/12 and signal
 *   power a^2/3, so SQNR = 10 log10(4 a^2 / s^2): an 8-bit (48.13 dB) and a 4-bit (22.92 dB)
 *   case, 2^20 samples, within 0.02 dB (the estimate's standard deviation is about 0.004 dB);
 * - the histogram bins differences of 0..5 LSB (either sign) into 0, 1, 2, >2 and keeps the max. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "eval/report.h"
#include "quant/quant.h"
#include "tests/common/testutil.h"

static void check_db(const char *what, double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) qt_test_fail("%s: SQNR %.6f dB, want %.6f dB (tolerance %g)", what, got, want, tol);
}

/* SQNR of x uniform in [-a, a) after quantization with scale s, against the formula. */
static void uniform_case(const char *what, float a, float s) {
  const int64_t n = 1 << 20;
  float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
  int32_t *q = malloc((size_t)n * sizeof(int32_t));
  QT_CHECK(x && y && q);
  qt_test_fill_uniform(x, n, -a, a, 42);
  const float scale = s;
  const int32_t zp = 0;
  qt_quantize(q, x, 1, 1, n, &scale, &zp, -100000, 100000);
  qt_dequantize(y, q, 1, 1, n, &scale, &zp);
  const double want = 10.0 * log10(((double)a * a / 3.0) / ((double)s * s / 12.0));
  check_db(what, qt_sqnr_db(x, y, n), want, 0.02);
  free(x);
  free(y);
  free(q);
}

int main(void) {
  const float x[4] = {1, 2, 3, 4}, y[4] = {1, 2, 3, 5}, z[4] = {0, 0, 0, 0};
  check_db("by hand", qt_sqnr_db(x, y, 4), 10.0 * log10(30.0), 1e-12);
  QT_CHECK(isinf(qt_sqnr_db(x, x, 4)) && qt_sqnr_db(x, x, 4) > 0);
  QT_CHECK(isinf(qt_sqnr_db(z, y, 4)) && qt_sqnr_db(z, y, 4) < 0);
  QT_CHECK(isnan(qt_sqnr_db(x, y, 0)));
  qt_sqnr_sum s = {0, 0, 0};
  qt_sqnr_add(&s, x, y, 2);
  qt_sqnr_add(&s, x + 2, y + 2, 2);
  QT_CHECK(s.n == 4 && s.signal == 30.0 && s.noise == 1.0);
  check_db("accumulated", qt_sqnr_sum_db(&s), 10.0 * log10(30.0), 1e-12);

  /* 8-bit: a = 0.9, s = 2 * 0.9 / 255 (u8 affine-like range): 10 log10(4 * 255^2 / 4) = 48.13 dB. */
  uniform_case("8-bit uniform", 0.9f, 2 * 0.9f / 255);
  /* 4-bit symmetric: a = 0.9, s = 0.9 / 7: 10 log10(4 * 49) = 22.92 dB. */
  uniform_case("4-bit uniform", 0.9f, 0.9f / 7);

  /* LSB histogram: scale 0.1, differences of k LSB for k = 0..5 with both signs. */
  const float lsb = 0.1f;
  float a[12], b[12];
  for (int i = 0; i < 12; i++) {
    const int k = i % 6, sign = i < 6 ? 1 : -1;
    a[i] = 1.3f;
    b[i] = a[i] + (float)(sign * k) * lsb;
  }
  qt_lsb_histogram h = {{0}, 0, 0};
  qt_lsb_histogram_add(&h, a, b, 12, lsb);
  QT_CHECK(h.n == 12);
  QT_CHECK(h.count[0] == 2 && h.count[1] == 2 && h.count[2] == 2 && h.count[3] == 6);
  if (!(fabs(h.max_lsb - 5.0) < 1e-4)) qt_test_fail("max LSB %.6f, want 5", h.max_lsb);
  return qt_test_finish();
}
