/* The fused per-tensor fake quant + tiling max pool (qt_fake_quant_max_pool_forward, and the
 * backwards qt_fake_quant_lsq_max_pool_backward (LSQ) and qt_fake_quant_max_pool_backward (fixed
 * qparams, clipped STE)) against the two ops they replace, run one after the other
 * (qt_fake_quant_forward then qt_max_pool2d_forward; qt_max_pool2d_backward_ex then
 * qt_fake_quant_lsq_backward_ex or the STE, as the autograd ops chain them):
 * - forward output and argmax: bit for bit; the STE mask byte per output: the argmax input's;
 * - STE input gradient, written and added: bit for bit (argmax inputs both inside and outside
 *   the clamp range);
 * - input gradient, written (a fresh buffer) or added to an existing one: bit for bit;
 * - scale gradient: the same float terms summed in double in another order, so within
 *   1e-9 * sum |dy| * (qmax - qmin) (the bound test_quant_vs_ref uses for the LSQ sums), and
 *   not zero; without an input gradient it is the same value as with one;
 * - 1 and 2 threads: identical input gradients, scale gradients within the same bound.
 * Shapes: FashionCNN's two pools (2x2 windows, the kernel's own 2x2 path, past the parallel
 * threshold), odd channel counts, 3x3 and 2x1 windows (the general path), a single window.
 * Inputs sit on rounding ties, on the grid, past both clamp edges, and many windows hold equal
 * quantized values (the first maximum must win, as max pool over the fake-quantized tensor). */
#include <omp.h>

#include "autograd/kernels.h"
#include "tests/quant/quant_testutil.h"

typedef struct {
  int N, H, W, C, KH, KW, qmin, qmax, zp;
} pool_case;

static void make_input(float *x, int64_t n, float s, int zp, int qmin, int qmax, uint64_t seed) {
  qt_test_fill_uniform(x, n, 0.0f, 1.0f, seed);
  for (int64_t i = 0; i < n; i++) {
    const float u = x[i];
    const int k = qmin - 2 - zp + (int)(u * (float)(qmax - qmin + 4)); /* a grid point, edges included */
    switch (i % 5) {
      case 0: x[i] = ((float)k + 0.5f) * s; break; /* a rounding tie */
      case 1: x[i] = (float)k * s; break;          /* on the grid */
      case 2: x[i] = ((float)k + 0.25f) * s; break; /* equal to its grid neighbours once quantized */
      default: x[i] = (u * 1.4f - 0.2f) * (float)(qmax - qmin) * s; break;
    }
  }
}

/* The composition's backward: the pool's gradient into a fresh buffer, then LSQ over it (in
 * place when dinp_write, else added to dinp, as fake_quant_lsq_backward does). */
static void composition_backward(float *dinp, int dinp_write, float *ds, const float *dout, const int32_t *argmax,
                                 const float *x, const pool_case *k, float s, int32_t zp, float gf) {
  const int64_t n = (int64_t)k->N * k->H * k->W * k->C;
  qt_pool2d_shape ps = {.N = k->N, .H = k->H, .W = k->W, .C = k->C, .KH = k->KH, .KW = k->KW,
                        .stride_h = k->KH, .stride_w = k->KW, .pad_h = 0, .pad_w = 0};
  QT_ASSERT(qt_pool2d_shape_init(&ps) == 0, "pool shape");
  float *g = malloc((size_t)n * sizeof(float));
  qt_max_pool2d_backward_ex(g, 1, dout, argmax, &ps);
  if (dinp_write) {
    qt_fake_quant_lsq_backward_ex(g, 1, ds, NULL, g, x, n, 1, 1, &s, &zp, k->qmin, k->qmax, gf);
    memcpy(dinp, g, (size_t)n * sizeof(float));
  } else {
    qt_fake_quant_lsq_backward_ex(dinp, 0, ds, NULL, g, x, n, 1, 1, &s, &zp, k->qmin, k->qmax, gf);
  }
  free(g);
}

static void run(const pool_case *k, uint64_t seed) {
  char what[200];
  const int OH = k->H / k->KH, OW = k->W / k->KW;
  const int64_t n = (int64_t)k->N * k->H * k->W * k->C, m = (int64_t)k->N * OH * OW * k->C;
  const float s = 0.0625f * (1.0f + (float)(seed % 7) / 8.0f), gf = 1.0f / sqrtf((float)(n / k->N) * k->qmax);
  const int32_t zp = k->zp;
  float *x = malloc((size_t)n * sizeof(float)), *fq = malloc((size_t)n * sizeof(float));
  make_input(x, n, s, zp, k->qmin, k->qmax, seed);
  snprintf(what, sizeof what, "N%d %dx%d C%d pool %dx%d q[%d,%d] zp %d", k->N, k->H, k->W, k->C, k->KH, k->KW,
           k->qmin, k->qmax, k->zp);

  /* forward */
  float *want = malloc((size_t)m * sizeof(float)), *got = malloc((size_t)m * sizeof(float));
  int32_t *am_want = malloc((size_t)m * sizeof(int32_t)), *am = malloc((size_t)m * sizeof(int32_t));
  qt_fake_quant_forward(fq, NULL, x, n, 1, 1, &s, &zp, k->qmin, k->qmax);
  qt_pool2d_shape ps = {.N = k->N, .H = k->H, .W = k->W, .C = k->C, .KH = k->KH, .KW = k->KW,
                        .stride_h = k->KH, .stride_w = k->KW, .pad_h = 0, .pad_w = 0};
  QT_ASSERT(qt_pool2d_shape_init(&ps) == 0, "pool shape");
  qt_max_pool2d_forward(want, am_want, fq, &ps);
  uint8_t *mask = malloc((size_t)m), *fq_mask = malloc((size_t)n);
  qt_fake_quant_max_pool_forward(got, am, mask, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp, k->qmin, k->qmax);
  char w2[260];
  snprintf(w2, sizeof w2, "%s: forward", what);
  quant_check_same(w2, got, want, m, 0);
  int64_t am_bad = 0, ties = 0;
  for (int64_t i = 0; i < m; i++) am_bad += am[i] != am_want[i];
  if (am_bad) qt_test_fail("%s: %lld argmax indices differ", what, (long long)am_bad);
  /* the inputs must exercise the first-maximum rule: windows whose maximum occurs twice */
  for (int64_t i = 0; i < n; i++) {
    const int64_t c = i % k->C, pix = (i / k->C) % ((int64_t)k->H * k->W), img = i / ((int64_t)k->H * k->W * k->C);
    const int ih = (int)(pix / k->W), iw = (int)(pix % k->W);
    const int64_t o = ((img * OH + ih / k->KH) * OW + iw / k->KW) * k->C + c;
    ties += fq[i] == want[o] && am_want[o] != pix;
  }
  if (m >= 64 && ties == 0) qt_test_fail("%s: no window has a tied maximum; the test inputs are too tame", what);

  /* backward, written */
  float *dy = qt_test_uniform(m, seed + 1);
  float *d_want = malloc((size_t)n * sizeof(float)), *d_got = malloc((size_t)n * sizeof(float));
  float ds_want = 0.25f, ds_got = 0.25f, ds_nodx = 0.25f;
  composition_backward(d_want, 1, &ds_want, dy, am_want, x, k, s, zp, gf);
  for (int64_t i = 0; i < n; i++) d_got[i] = NAN; /* written, not read */
  qt_fake_quant_lsq_max_pool_backward(d_got, 1, &ds_got, dy, am, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp,
                                      k->qmin, k->qmax, gf);
  snprintf(w2, sizeof w2, "%s: input gradient (written)", what);
  quant_check_same(w2, d_got, d_want, n, 0);
  double sum_abs = 0;
  for (int64_t i = 0; i < m; i++) sum_abs += fabs(dy[i]);
  const double tol = 1e-9 * sum_abs * (k->qmax - k->qmin) + 1e-30;
  if (!(fabs((double)ds_got - ds_want) <= tol))
    qt_test_fail("%s: scale gradient %.9g, composition %.9g (tolerance %.3g)", what, ds_got, ds_want, tol);
  if (ds_want == 0.25f) qt_test_fail("%s: the scale gradient is zero; the case tests nothing", what);
  qt_fake_quant_lsq_max_pool_backward(NULL, 1, &ds_nodx, dy, am, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp,
                                      k->qmin, k->qmax, gf);
  if (memcmp(&ds_nodx, &ds_got, sizeof ds_got) != 0)
    qt_test_fail("%s: scale gradient %.9g without the input gradient, %.9g with it", what, ds_nodx, ds_got);

  /* backward, added to an existing gradient */
  float *acc_want = qt_test_uniform(n, seed + 2), *acc_got = qt_test_copy_f32(acc_want, n);
  float ds1 = 0, ds2 = 0;
  composition_backward(acc_want, 0, &ds1, dy, am_want, x, k, s, zp, gf);
  qt_fake_quant_lsq_max_pool_backward(acc_got, 0, &ds2, dy, am, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp,
                                      k->qmin, k->qmax, gf);
  snprintf(w2, sizeof w2, "%s: input gradient (added)", what);
  quant_check_same(w2, acc_got, acc_want, n, 0);

  /* fixed qparams (the clipped STE): the mask is the argmax input's, the gradient the
   * composition's (max_pool2d's backward into a fresh buffer, then fake quant's: masked in place
   * when the input has no gradient yet, as fake_quant_backward does, else added times the mask) */
  qt_fake_quant_forward(fq, fq_mask, x, n, 1, 1, &s, &zp, k->qmin, k->qmax);
  int64_t mask_bad = 0;
  for (int64_t i = 0; i < m; i++) {
    const int64_t img = i / ((int64_t)OH * OW * k->C), c = i % k->C;
    mask_bad += mask[i] != fq_mask[(img * k->H * k->W + am_want[i]) * k->C + c];
  }
  if (mask_bad) qt_test_fail("%s: %lld STE mask bytes differ from the argmax input's", what, (long long)mask_bad);
  float *ste_want = malloc((size_t)n * sizeof(float)), *ste_got = malloc((size_t)n * sizeof(float));
  qt_max_pool2d_backward_ex(ste_want, 1, dy, am_want, &ps);
  for (int64_t i = 0; i < n; i++) ste_want[i] = fq_mask[i] ? ste_want[i] : 0.0f;
  for (int64_t i = 0; i < n; i++) ste_got[i] = NAN;
  qt_fake_quant_max_pool_backward(ste_got, 1, dy, am, mask, k->N, k->H, k->W, k->C, k->KH, k->KW);
  snprintf(w2, sizeof w2, "%s: STE input gradient (written)", what);
  quant_check_same(w2, ste_got, ste_want, n, 0);
  float *ste_acc_want = qt_test_uniform(n, seed + 3), *ste_acc_got = qt_test_copy_f32(ste_acc_want, n);
  float *g = malloc((size_t)n * sizeof(float));
  qt_max_pool2d_backward_ex(g, 1, dy, am_want, &ps);
  qt_fake_quant_backward(ste_acc_want, g, fq_mask, n);
  qt_fake_quant_max_pool_backward(ste_acc_got, 0, dy, am, mask, k->N, k->H, k->W, k->C, k->KH, k->KW);
  snprintf(w2, sizeof w2, "%s: STE input gradient (added)", what);
  quant_check_same(w2, ste_acc_got, ste_acc_want, n, 0);
  int64_t clipped = 0;
  for (int64_t i = 0; i < m; i++) clipped += !mask[i];
  if (m >= 64 && (clipped == 0 || clipped == m)) qt_test_fail("%s: every argmax input %s the clamp range", what,
                                                              clipped ? "outside" : "inside");
  free(ste_want), free(ste_got), free(ste_acc_want), free(ste_acc_got), free(g), free(mask), free(fq_mask);

  /* threads: one against two */
  const int saved = omp_get_max_threads();
  float *d1 = malloc((size_t)n * sizeof(float)), *d2 = malloc((size_t)n * sizeof(float)), s1 = 0, s2 = 0;
  omp_set_num_threads(1);
  qt_fake_quant_lsq_max_pool_backward(d1, 1, &s1, dy, am, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp, k->qmin,
                                      k->qmax, gf);
  omp_set_num_threads(2);
  qt_fake_quant_lsq_max_pool_backward(d2, 1, &s2, dy, am, x, k->N, k->H, k->W, k->C, k->KH, k->KW, s, zp, k->qmin,
                                      k->qmax, gf);
  omp_set_num_threads(saved);
  snprintf(w2, sizeof w2, "%s: input gradient, 1 vs 2 threads", what);
  quant_check_same(w2, d1, d2, n, 0);
  if (!(fabs((double)s1 - s2) <= tol)) qt_test_fail("%s: scale gradient %.9g on 1 thread, %.9g on 2", what, s1, s2);

  free(x), free(fq), free(want), free(got), free(am_want), free(am), free(dy), free(d_want), free(d_got);
  free(acc_want), free(acc_got), free(d1), free(d2);
}

int main(void) {
  const pool_case cases[] = {
      /* N   H   W   C  KH KW qmin qmax zp */
      {128, 28, 28, 32, 2, 2, 0, 15, 0},   /* FashionCNN conv1's pool, 4-bit unsigned */
      {128, 14, 14, 64, 2, 2, 0, 255, 0},  /* conv2's, 8-bit */
      {3, 4, 6, 5, 2, 2, -8, 7, 0},        /* signed 4-bit, odd channel count */
      {2, 6, 8, 17, 2, 2, 0, 15, 3},       /* a zero point */
      {2, 6, 9, 17, 3, 3, 0, 15, 0},       /* the general path */
      {3, 8, 5, 33, 2, 1, -128, 127, -5},  /* a 2x1 window, 8-bit signed */
      {1, 2, 2, 1, 2, 2, 0, 3, 0},         /* one window, one channel, 2 bits */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i], 100 + 10 * i);
  return qt_test_finish();
}
