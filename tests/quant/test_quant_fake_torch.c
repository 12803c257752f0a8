/* Fake quant against PyTorch 1.13, bit for bit: torch.fake_quantize_per_{tensor,channel}_affine
 * outputs, the cachemask masks and the autograd input gradients, for the optimized kernels and
 * their reference twins, in place and out of place, with and without a mask. Cases (see
 * tests/ref/make_ref_quant.py): bits 2, 4, 7, 8 signed and unsigned, exact .5 ties and their
 * float neighbours, values rounding just inside / outside the range, NaN, +-Inf, +-1e30 and
 * +-2^63 * s (PyTorch sends all of these but finite in-range values to quant_min, mask 0),
 * a scale of FLT_EPSILON, per channel on OIHW weights (axis 0), NHWC (channel last) and NCHW.
 * Also: qt_quantize against torch.quantize_per_{tensor,channel}(...).int_repr() for the 8-bit
 * cases, and dequantize(quantize(x)) == fake_quant(x) bit for bit. Tolerance: none (input
 * gradients bit for bit up to the sign of zero: they accumulate into +0). */
#include "tests/quant/quant_testutil.h"

static void test_case(int i) {
  char what[128];
  int64_t n, nc;
  int32_t *meta = quant_load_i32("fq", i, "meta", NULL);
  const int64_t outer = meta[0], inner = meta[2];
  const int C = meta[1], qmin = meta[3], qmax = meta[4];
  float *scale = quant_load_f32("fq", i, "scale", &nc);
  int32_t *zp = quant_load_i32("fq", i, "zp", NULL);
  float *x = quant_load_f32("fq", i, "x", &n);
  float *y = quant_load_f32("fq", i, "y", NULL);
  float *dx = quant_load_f32("fq", i, "dx", NULL);
  int32_t *mask = quant_load_i32("fq", i, "mask", NULL);
  if (nc != C || n != outer * C * inner || n <= 0) {
    qt_test_fail("fq%d: reference view (%lld, %d, %lld) does not match its %lld elements", i, (long long)outer, C,
                 (long long)inner, (long long)n);
    return;
  }

  float *out = malloc((size_t)n * sizeof(float));
  uint8_t *m = malloc((size_t)n);
  float *dy = quant_upstream(n);
  float *din = calloc((size_t)n, sizeof(float));

  /* optimized, out of place */
  snprintf(what, sizeof what, "fq%d (bits %d..%d, view %lld x %d x %lld) forward", i, qmin, qmax,
           (long long)outer, C, (long long)inner);
  qt_fake_quant_forward(out, m, x, outer, C, inner, scale, zp, qmin, qmax);
  quant_check_bits(what, out, y, n);
  snprintf(what, sizeof what, "fq%d mask", i);
  quant_check_mask(what, m, mask, n);
  snprintf(what, sizeof what, "fq%d backward", i);
  qt_fake_quant_backward(din, dy, m, n);
  quant_check_grad(what, din, dx, n);

  /* reference twin */
  memset(m, 0xAB, (size_t)n);
  snprintf(what, sizeof what, "fq%d forward_ref", i);
  qt_fake_quant_forward_ref(out, m, x, outer, C, inner, scale, zp, qmin, qmax);
  quant_check_bits(what, out, y, n);
  snprintf(what, sizeof what, "fq%d mask_ref", i);
  quant_check_mask(what, m, mask, n);
  memset(din, 0, (size_t)n * sizeof(float));
  snprintf(what, sizeof what, "fq%d backward_ref", i);
  qt_fake_quant_backward_ref(din, dy, m, n);
  quant_check_grad(what, din, dx, n);

  /* backward accumulates */
  for (int64_t j = 0; j < n; j++) din[j] = 1.0f;
  qt_fake_quant_backward(din, dy, m, n);
  float *want = malloc((size_t)n * sizeof(float));
  for (int64_t j = 0; j < n; j++) want[j] = 1.0f + dx[j];
  snprintf(what, sizeof what, "fq%d backward accumulates", i);
  quant_check_bits(what, din, want, n);

  /* in place, no mask */
  float *inplace = qt_test_copy_f32(x, n);
  qt_fake_quant_forward(inplace, NULL, inplace, outer, C, inner, scale, zp, qmin, qmax);
  snprintf(what, sizeof what, "fq%d forward in place without mask", i);
  quant_check_bits(what, inplace, y, n);

  /* quantize / dequantize: the round trip is the fake quant */
  int32_t *q = malloc((size_t)n * sizeof(int32_t));
  qt_quantize(q, x, outer, C, inner, scale, zp, qmin, qmax);
  int in_range = 1;
  for (int64_t j = 0; j < n; j++) in_range &= q[j] >= qmin && q[j] <= qmax;
  QT_CHECK(in_range);
  qt_dequantize(out, q, outer, C, inner, scale, zp);
  snprintf(what, sizeof what, "fq%d dequantize(quantize(x))", i);
  quant_check_bits(what, out, y, n);
  if (qmax - qmin == 255) {
    int32_t *tq = quant_load_i32("fq", i, "qint", NULL);
    int64_t bad = 0, compared = 0;
    for (int64_t j = 0; j < n; j++) {
      int c = (int)((j / inner) % C);
      if (!isfinite(x[j]) || fabsf(x[j] / scale[c]) >= 1e6f) continue;
      compared++;
      if (q[j] != tq[j]) {
        if (bad < 5) fprintf(stderr, "fq%d quantize: element %lld (x %.9g): got %d, torch %d\n", i, (long long)j, x[j],
                             q[j], tq[j]);
        bad++;
      }
    }
    if (bad) qt_test_fail("fq%d: qt_quantize differs from torch.quantize_per_* on %lld of %lld", i, (long long)bad,
                          (long long)compared);
    QT_CHECK(compared > n / 2);
    free(tq);
  }

  free(meta), free(scale), free(zp), free(x), free(y), free(dx), free(mask);
  free(out), free(m), free(dy), free(din), free(want), free(inplace), free(q);
}

int main(void) {
  int count = quant_load_count("fq_count");
  QT_CHECK(count >= 16);
  for (int i = 0; i < count; i++) test_case(i);
  return qt_test_finish();
}
