/* Optimized quantization kernels against their reference twins on odd shapes: views with one
 * element, one channel, channel last (inner 1), channel in the middle, long single rows, and
 * sizes crossing the parallel threshold (with ragged thread chunks); inputs hold ties,
 * clamp edges, NaN, +-Inf and huge values. Forward output and mask, backward, LSQ input
 * gradient: bit for bit. LSQ scale / zero-point sums: both sum the same float32 terms in double,
 * in different orders: 1e-9 * sum |dy| * (qmax - qmin) per channel. Quantize: the integers
 * the reference's forward implies, dequantize(quantize(x)) == forward. Determinism: the LSQ
 * sums and everything else are identical across two runs with the same thread count, and the
 * kernels give the same results on 1 and 2 threads (sums within the tolerance). */
#include <omp.h>

#include "tests/quant/quant_testutil.h"

typedef struct {
  int64_t outer;
  int C;
  int64_t inner;
  int bits, is_signed;
} shape;

static void make_input(float *x, int64_t n, const shape *sh, const float *scale, const int32_t *zp, int qmin, int qmax,
                       uint64_t seed) {
  qt_test_fill_uniform(x, n, -1.0f, 1.0f, seed);
  for (int64_t i = 0; i < n; i++) {
    int c = (int)((i / sh->inner) % sh->C);
    float u = x[i];
    int k = (int)floorf((u + 1.0f) * 0.5f * (float)(qmax - qmin + 6)) + qmin - 3 - zp[c];
    switch (i % 7) {
    case 0: x[i] = ((float)k + 0.5f) * scale[c]; break;                                  /* tie */
    case 1: x[i] = nextafterf(((float)k + 0.5f) * scale[c], u > 0 ? INFINITY : -INFINITY); break;
    case 2: x[i] = (float)k * scale[c]; break;                                           /* grid */
    default: x[i] = u * 0.6f * (float)(qmax - qmin) * scale[c]; break;                   /* spread */
    }
  }
  const float special[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 0x1p70f, -0.0f};
  for (int k = 0; k < 7 && n > 50; k++) x[(k * 7919 + 13) % n] = special[k];
}

static void run(const shape *sh, uint64_t seed) {
  char what[160];
  int qmin, qmax;
  QT_CHECK(qt_qrange(sh->bits, sh->is_signed, &qmin, &qmax) == 0);
  const int C = sh->C;
  const int64_t n = sh->outer * C * sh->inner;
  float *scale = malloc((size_t)C * sizeof(float));
  int32_t *zp = malloc((size_t)C * sizeof(int32_t));
  float u[2];
  for (int c = 0; c < C; c++) {
    qt_test_fill_uniform(u, 2, 0.0f, 1.0f, seed * 31 + (uint64_t)c);
    scale[c] = (0.002f + u[0]) / (float)(qmax - qmin);
    zp[c] = sh->is_signed ? 0 : qmin + (int32_t)(u[1] * (float)(qmax - qmin));
  }
  float *x = malloc((size_t)n * sizeof(float));
  make_input(x, n, sh, scale, zp, qmin, qmax, seed);
  float *dy = malloc((size_t)n * sizeof(float));
  qt_test_fill_uniform(dy, n, -1.0f, 1.0f, seed + 5);

  float *y = malloc((size_t)n * sizeof(float)), *y_ref = malloc((size_t)n * sizeof(float));
  uint8_t *m = malloc((size_t)n), *m_ref = malloc((size_t)n);
  snprintf(what, sizeof what, "(%lld, %d, %lld) %d-bit %s", (long long)sh->outer, C, (long long)sh->inner, sh->bits,
           sh->is_signed ? "signed" : "unsigned");
  char w2[220];

  qt_fake_quant_forward(y, m, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax);
  qt_fake_quant_forward_ref(y_ref, m_ref, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax);
  snprintf(w2, sizeof w2, "%s forward", what);
  quant_check_bits(w2, y, y_ref, n);
  if (memcmp(m, m_ref, (size_t)n) != 0) qt_test_fail("%s mask differs", what);

  float *g = calloc((size_t)n, sizeof(float)), *g_ref = calloc((size_t)n, sizeof(float));
  qt_fake_quant_backward(g, dy, m, n);
  qt_fake_quant_backward_ref(g_ref, dy, m_ref, n);
  snprintf(w2, sizeof w2, "%s backward", what);
  quant_check_bits(w2, g, g_ref, n);

  /* quantize: the integers the reference forward implies */
  int32_t *q = malloc((size_t)n * sizeof(int32_t));
  qt_quantize(q, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    int c = (int)((i / sh->inner) % C);
    bad += q[i] < qmin || q[i] > qmax || (float)(q[i] - zp[c]) * scale[c] != y_ref[i];
  }
  if (bad) qt_test_fail("%s quantize: %lld integers disagree with the reference forward", what, (long long)bad);
  float *dq = malloc((size_t)n * sizeof(float));
  qt_dequantize(dq, q, sh->outer, C, sh->inner, scale, zp);
  snprintf(w2, sizeof w2, "%s dequantize(quantize(x))", what);
  quant_check_bits(w2, dq, y_ref, n);

  /* LSQ */
  float *ds = calloc((size_t)C, sizeof(float)), *dz = calloc((size_t)C, sizeof(float));
  float *ds_ref = calloc((size_t)C, sizeof(float)), *dz_ref = calloc((size_t)C, sizeof(float));
  float *ds2 = calloc((size_t)C, sizeof(float)), *dz2 = calloc((size_t)C, sizeof(float));
  memset(g, 0, (size_t)n * sizeof(float));
  memset(g_ref, 0, (size_t)n * sizeof(float));
  const float gf = 0.37f;
  qt_fake_quant_lsq_backward(g, ds, dz, dy, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax, gf);
  qt_fake_quant_lsq_backward_ref(g_ref, ds_ref, dz_ref, dy, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax, gf);
  snprintf(w2, sizeof w2, "%s lsq dx", what);
  quant_check_bits(w2, g, g_ref, n);
  double *mag = calloc((size_t)C, sizeof(double));
  for (int64_t i = 0; i < n; i++) mag[(i / sh->inner) % C] += fabs(dy[i]) * (qmax - qmin) * gf * 2;
  for (int c = 0; c < C; c++) {
    double tol = 1e-9 * mag[c] + 1e-30;
    if (!(fabs((double)ds[c] - ds_ref[c]) <= tol + 1e-7 * fabs(ds_ref[c])) ||
        !(fabs((double)dz[c] - dz_ref[c]) <= tol + 1e-7 * fabs(dz_ref[c])))
      qt_test_fail("%s lsq channel %d: dscale %.9g vs ref %.9g, dzp %.9g vs ref %.9g", what, c, ds[c], ds_ref[c], dz[c],
                   dz_ref[c]);
  }
  /* determinism: same thread count, same bits */
  float *g2 = calloc((size_t)n, sizeof(float));
  qt_fake_quant_lsq_backward(g2, ds2, dz2, dy, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax, gf);
  if (memcmp(ds, ds2, (size_t)C * sizeof(float)) || memcmp(dz, dz2, (size_t)C * sizeof(float)))
    qt_test_fail("%s lsq sums differ between two identical runs", what);
  /* without a zero-point gradient (symmetric LSQ, a separate loop): the same dx and dscale bits */
  memset(g2, 0, (size_t)n * sizeof(float));
  memset(ds2, 0, (size_t)C * sizeof(float));
  qt_fake_quant_lsq_backward(g2, ds2, NULL, dy, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax, gf);
  if (memcmp(ds, ds2, (size_t)C * sizeof(float)) || memcmp(g, g2, (size_t)n * sizeof(float)))
    qt_test_fail("%s lsq without dzero_point: dx or dscale differ from the run with it", what);
  /* dx written in place over dout (the autograd op's path when the input has no gradient yet),
   * with and without the zero-point sums: the bits of accumulating into zeros */
  for (int with_dz = 0; with_dz < 2; with_dz++) {
    float *inplace = malloc((size_t)n * sizeof(float));
    memcpy(inplace, dy, (size_t)n * sizeof(float));
    memset(ds2, 0, (size_t)C * sizeof(float));
    memset(dz2, 0, (size_t)C * sizeof(float));
    qt_fake_quant_lsq_backward_ex(inplace, 1, ds2, with_dz ? dz2 : NULL, inplace, x, sh->outer, C, sh->inner, scale,
                                  zp, qmin, qmax, gf);
    if (memcmp(inplace, g, (size_t)n * sizeof(float)) || memcmp(ds, ds2, (size_t)C * sizeof(float)))
      qt_test_fail("%s lsq dx written in place over dout (dz %d): differs from accumulating into zeros", what, with_dz);
    free(inplace);
  }

  /* one thread gives the same elementwise results */
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  float *y1 = malloc((size_t)n * sizeof(float));
  uint8_t *m1 = malloc((size_t)n);
  qt_fake_quant_forward(y1, m1, x, sh->outer, C, sh->inner, scale, zp, qmin, qmax);
  snprintf(w2, sizeof w2, "%s forward on 1 thread", what);
  quant_check_bits(w2, y1, y, n);
  if (memcmp(m1, m, (size_t)n) != 0) qt_test_fail("%s mask on 1 thread differs", what);
  omp_set_num_threads(threads);

  free(scale), free(zp), free(x), free(dy), free(y), free(y_ref), free(m), free(m_ref), free(g), free(g_ref);
  free(q), free(dq), free(ds), free(dz), free(ds_ref), free(dz_ref), free(ds2), free(dz2), free(mag), free(g2);
  free(y1), free(m1);
}

int main(void) {
  const shape shapes[] = {
      {1, 1, 1, 8, 0},      {1, 1, 7, 2, 1},       {13, 1, 1, 4, 0},     {3, 1, 5, 7, 1},
      {1, 5, 1, 8, 1},      {7, 3, 1, 4, 1},       {2, 3, 5, 8, 0},      {1, 17, 9, 4, 1},
      {1, 1, 100003, 8, 0}, {100003, 1, 1, 4, 1},  {997, 37, 1, 8, 0},   {1, 61, 1031, 4, 1},
      {5, 3, 2711, 2, 0},   {4099, 8, 1, 7, 0},    {3, 11, 3001, 8, 1},  {1, 2, 16411, 8, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run(&shapes[i], 17 + i);
  return qt_test_finish();
}
