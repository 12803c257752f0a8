/* LSQ against PyTorch 1.13's _fake_quantize_learnable_per_{tensor,channel}_affine:
 * - the forward is plain fake quant, bit for bit;
 * - the input gradient is bit for bit up to the sign of zero. PyTorch's AVX2 build rounds
 *   fma(x, 1/s, zp), so its mask can differ from the forward's on near-ties (the inputs hold
 *   ties and their float neighbours);
 * - the scale and zero-point gradients are sums: PyTorch sums float32 terms, we sum the same
 *   float32 terms in double, so the tolerance is 2e-6 * sum |term| per channel (sum |term| in
 *   float64 from make_ref_quant.py); a wrong branch or sign moves a sum by O(sum |term|).
 *   A case with one element in each of 400 channels pins the per-element terms bit for bit
 *   (including the fused xfq - x = fma(xq - zp, s, -x) of PyTorch's AVX2 build).
 * Cases: per tensor 8/4/3-bit, per channel on OIHW weights, NHWC and NCHW; grad_factor 1 and
 * others. Also checks accumulation and a NULL dzero_point. */
#include "tests/quant/quant_testutil.h"

static void check_sum(const char *what, const float *got, const float *want, const float *mag, int C) {
  for (int c = 0; c < C; c++) {
    double tol = 2e-6 * mag[c] + 1e-30;
    double d = fabs((double)got[c] - (double)want[c]);
    if (!(d <= tol))
      qt_test_fail("%s: channel %d: got %.9g want %.9g (|diff| %.3g > tol %.3g)", what, c, got[c], want[c], d, tol);
  }
}

static void test_case(int i) {
  char what[128];
  int64_t n;
  int32_t *meta = quant_load_i32("lsq", i, "meta", NULL);
  const int64_t outer = meta[0], inner = meta[2];
  const int C = meta[1], qmin = meta[3], qmax = meta[4];
  float *scale = quant_load_f32("lsq", i, "scale", NULL);
  int32_t *zp = quant_load_i32("lsq", i, "zp", NULL);
  float *gf = quant_load_f32("lsq", i, "gf", NULL);
  float *x = quant_load_f32("lsq", i, "x", &n);
  float *dy = quant_load_f32("lsq", i, "dy", NULL);
  float *y = quant_load_f32("lsq", i, "y", NULL);
  float *dx = quant_load_f32("lsq", i, "dx", NULL);
  float *ds = quant_load_f32("lsq", i, "dscale", NULL);
  float *dz = quant_load_f32("lsq", i, "dzp", NULL);
  float *mag_s = quant_load_f32("lsq", i, "mag_scale", NULL);
  float *mag_z = quant_load_f32("lsq", i, "mag_zp", NULL);
  QT_CHECK(n == outer * C * inner);

  float *out = malloc((size_t)n * sizeof(float));
  qt_fake_quant_forward(out, NULL, x, outer, C, inner, scale, zp, qmin, qmax);
  snprintf(what, sizeof what, "lsq%d forward", i);
  quant_check_bits(what, out, y, n);

  for (int ref = 0; ref < 2; ref++) {
    float *din = calloc((size_t)n, sizeof(float));
    float *gs = calloc((size_t)C, sizeof(float)), *gz = calloc((size_t)C, sizeof(float));
    (ref ? qt_fake_quant_lsq_backward_ref : qt_fake_quant_lsq_backward)(din, gs, gz, dy, x, outer, C, inner, scale,
                                                                       zp, qmin, qmax, gf[0]);
    snprintf(what, sizeof what, "lsq%d%s dx", i, ref ? " ref" : "");
    quant_check_grad(what, din, dx, n);
    snprintf(what, sizeof what, "lsq%d%s dscale", i, ref ? " ref" : "");
    check_sum(what, gs, ds, mag_s, C);
    snprintf(what, sizeof what, "lsq%d%s dzero_point", i, ref ? " ref" : "");
    check_sum(what, gz, dz, mag_z, C);
    if (outer * inner == 1) { /* one term per channel: the per-element formula, bit for bit */
      snprintf(what, sizeof what, "lsq%d%s dscale (single terms)", i, ref ? " ref" : "");
      quant_check_grad(what, gs, ds, C);
      snprintf(what, sizeof what, "lsq%d%s dzero_point (single terms)", i, ref ? " ref" : "");
      quant_check_grad(what, gz, dz, C);
    }

    /* accumulation, and dzero_point may be NULL */
    for (int64_t j = 0; j < n; j++) din[j] = 0.5f;
    float *want_dx = malloc((size_t)n * sizeof(float)), *want_s = malloc((size_t)C * sizeof(float));
    for (int64_t j = 0; j < n; j++) want_dx[j] = 0.5f + dx[j];
    for (int c = 0; c < C; c++) {
      want_s[c] = gs[c] + ds[c];
    }
    (ref ? qt_fake_quant_lsq_backward_ref : qt_fake_quant_lsq_backward)(din, gs, NULL, dy, x, outer, C, inner, scale,
                                                                       zp, qmin, qmax, gf[0]);
    snprintf(what, sizeof what, "lsq%d%s dx accumulates", i, ref ? " ref" : "");
    quant_check_bits(what, din, want_dx, n);
    snprintf(what, sizeof what, "lsq%d%s dscale accumulates", i, ref ? " ref" : "");
    float *mag2 = malloc((size_t)C * sizeof(float));
    for (int c = 0; c < C; c++) mag2[c] = 2.0f * mag_s[c] + fabsf(want_s[c]);
    check_sum(what, gs, want_s, mag2, C);
    free(din), free(gs), free(gz), free(want_dx), free(want_s), free(mag2);
  }
  free(meta), free(scale), free(zp), free(gf), free(x), free(dy), free(y), free(dx), free(ds), free(dz);
  free(mag_s), free(mag_z), free(out);
}

int main(void) {
  int count = quant_load_count("lsq_count");
  QT_CHECK(count >= 8);
  for (int i = 0; i < count; i++) test_case(i);
  return qt_test_finish();
}
