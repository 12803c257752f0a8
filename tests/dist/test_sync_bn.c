/* SyncBN under mpirun (2 or more processes) against single-process batch norm on the same global
 * batch. Every process makes the whole batch (seeded) and computes the single-process result
 * itself; it then computes its slice of the batch synchronized with the others and compares.
 *
 * 1. The kernels (qt_batch_norm_forward_train_sync / _backward_sync): slices of unequal sizes,
 *    channel means far from 0 (the merge of the processes' statistics must not cancel them),
 *    C = 5 and 64: outputs, batch mean and invstd, running mean and variance, dinp, and dgamma and
 *    dbeta summed over the processes. The same for the image's convolution, batch norm, relu and
 *    pool as one kernel pair (kernels_conv1).
 * 2. One training step of FashionCNN (batch_norm nodes, through the ctx's batch sync) and of its
 *    QAT-prepared graph (conv_bn nodes with fake-quantized weights and activations): each process
 *    runs its slice and seeds backward with its share of the batch, the gradient slabs are summed;
 *    the gradients, the loss and the running statistics against the one-process step.
 *
 * Tolerances (2 processes, AVX2): kernels 1e-5 relative to each tensor's largest value (measured
 * at most 2.2e-7); one step's gradients 1e-4 of each tensor's largest gradient (measured at most
 * 6.8e-6), loss 1e-6 relative (measured at most 5e-8), running statistics 1e-5 (measured at most
 * 6e-7): float reordering of the sums only, where a BN that is not synchronized
 * is off by 1e-2 and more. QAT with fake quant on is looser, for the reason given in graphs(). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "dist/dist.h"
#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/dist_util.h"
#include "tests/common/testutil.h"

static int R, me;
static const qt_batch_sync *sync;
static int verbose;

/* max|got - want| <= tol * max|want| over n values; prints the relative difference when verbose. */
static void close_scaled(const char *what, const float *got, const float *want, int64_t n, double tol) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)got[i] - (double)want[i]);
    d = e > d || isnan(e) ? e : d;
    m = fabs((double)want[i]) > m ? fabs((double)want[i]) : m;
  }
  const double rel = m > 0 ? d / m : d;
  if (verbose && me == 0) printf("%-40s relative %.3g\n", what, rel);
  if (!(rel <= tol)) qt_test_fail("process %d: %s: max difference %.3g, %.3g of the largest value %.3g (tolerance %g)",
                                  me, what, d, rel, m, tol);
}

/* ---- 1. kernels ------------------------------------------------------------------------------ */
static void kernels(int C) {
  /* process r holds 37 + 27 r rows */
  int64_t Mt = 0, first = 0;
  for (int r = 0; r < R; r++) {
    if (r == me) first = Mt;
    Mt += 37 + 27 * r;
  }
  const int M = 37 + 27 * me;
  float *x = qt_test_uniform(Mt * C, 7), *dy = qt_test_uniform(Mt * C, 8);
  float *gamma = qt_test_uniform(C, 9), *beta = qt_test_uniform(C, 10);
  for (int64_t i = 0; i < Mt * C; i++) x[i] = x[i] * (1.0f + (float)(i % C)) + 100.0f * (float)(i % C);
  float *y = qt_test_zeros(Mt * C), *mean = qt_test_zeros(C), *invstd = qt_test_zeros(C);
  float *rm = qt_test_uniform(C, 11), *rv = qt_test_zeros(C), *dx = qt_test_zeros(Mt * C);
  float *dg = qt_test_zeros(C), *db = qt_test_zeros(C);
  for (int c = 0; c < C; c++) rv[c] = 1.0f + 0.5f * (float)c;
  float *rm_s = qt_test_copy_f32(rm, C), *rv_s = qt_test_copy_f32(rv, C);
  qt_batch_norm_forward_train(y, mean, invstd, x, gamma, beta, rm, rv, 0.1f, 1e-5f, (int)Mt, C);
  qt_batch_norm_backward(dx, dg, db, dy, x, mean, invstd, gamma, (int)Mt, C);

  float *ys = qt_test_zeros((int64_t)M * C), *mean_s = qt_test_zeros(C), *invstd_s = qt_test_zeros(C);
  float *dxs = qt_test_zeros((int64_t)M * C), *dgs = qt_test_zeros(C), *dbs = qt_test_zeros(C);
  int64_t total = 0;
  qt_batch_norm_forward_train_sync(ys, mean_s, invstd_s, x + first * C, gamma, beta, rm_s, rv_s, 0.1f, 1e-5f, M, C,
                                   sync, &total);
  QT_CHECK(total == Mt);
  qt_batch_norm_backward_sync(dxs, 0, dgs, dbs, dy + first * C, x + first * C, mean_s, invstd_s, gamma, M, C, sync,
                              total);
  qt_dist_sum_f32(dgs, C);
  qt_dist_sum_f32(dbs, C);
  char what[96];
#define CLOSE(name, got, want, n)                                \
  do {                                                           \
    snprintf(what, sizeof what, "kernels C=%d: %s", C, name);    \
    close_scaled(what, got, want, n, 1e-5);                      \
  } while (0)
  CLOSE("output", ys, y + first * C, (int64_t)M * C);
  CLOSE("batch mean", mean_s, mean, C);
  CLOSE("invstd", invstd_s, invstd, C);
  CLOSE("running_mean", rm_s, rm, C);
  CLOSE("running_var", rv_s, rv, C);
  CLOSE("dinp", dxs, dx + first * C, (int64_t)M * C);
  CLOSE("dgamma (summed)", dgs, dg, C);
  CLOSE("dbeta (summed)", dbs, db, C);
#undef CLOSE
  float *bufs[] = {x, dy, gamma, beta, y, mean, invstd, rm, rv, dx, dg, db, rm_s, rv_s, ys, mean_s, invstd_s, dxs, dgs, dbs};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* 1b. The image's convolution, batch norm, relu and pool as one kernel pair
 * (qt_conv1_bn_relu_pool_forward_train / _backward): process r holds 3 + 2 r images of 12 x 12
 * (mean 2.5: the batch's centring must not cancel), 16 channels, 3 x 3 taps, 2 x 2 pools, the
 * gradient values g given and a coefficient image for the image's LSQ scale; the pooled output,
 * the running statistics, and dw, dgamma, dbeta and the scale's gradient summed over the
 * processes against one process's whole batch. */
static void kernels_conv1(void) {
  int Nt = 0, first = 0;
  for (int r = 0; r < R; r++) {
    if (r == me) first = Nt;
    Nt += 3 + 2 * r;
  }
  const int N = 3 + 2 * me, OC = 16, K = 9;
  qt_conv1_pool_shape all = {Nt, 12, 12, OC, 3, 3, 1, 1, 2, 1, 0, 0, 0}, mine = all;
  mine.N = N;
  QT_CHECK(qt_conv1_pool_shape_init(&all) == 0 && qt_conv1_pool_shape_init(&mine) == 0);
  const int64_t img_px = 144, out_px = 36 * OC;
  float *img = qt_test_uniform_range(Nt * img_px, 1.0f, 4.0f, 21), *coef = qt_test_uniform_range(Nt * img_px, -0.5f, 0.5f, 22);
  float *w = qt_test_uniform_range(OC * K, -0.5f, 0.5f, 23), *g = qt_test_uniform_range(Nt * out_px, -1.0f, 1.0f, 24);
  float *gamma = qt_test_uniform_range(OC, 0.5f, 1.5f, 25), *beta = qt_test_uniform_range(OC, -0.3f, 0.3f, 26);
  float *out = qt_test_zeros(Nt * out_px), *outs = qt_test_zeros(N * out_px);
  uint8_t *am = malloc((size_t)(Nt * out_px)), *ams = malloc((size_t)(N * out_px));
  float *rm = qt_test_zeros(OC), *rv = qt_test_zeros(OC), *rms = qt_test_zeros(OC), *rvs = qt_test_zeros(OC);
  double *st = malloc(qt_conv1_pool_stats_len(&all) * sizeof(double)), *sts = malloc(qt_conv1_pool_stats_len(&mine) * sizeof(double));
  double *dw = calloc(OC * K, sizeof(double)), *dws = calloc(OC * K, sizeof(double)), dsc = 0, dscs = 0;
  float *dg = qt_test_zeros(OC), *db = qt_test_zeros(OC), *dgs = qt_test_zeros(OC), *dbs = qt_test_zeros(OC);
  QT_ASSERT(am && ams && st && sts && dw && dws, "out of memory");
  qt_conv1_bn_relu_pool_forward_train(out, am, NULL, NULL, st, img, w, NULL, gamma, beta, rm, rv, 0.1f, 1e-5f, NULL, NULL,
                                      &all);
  qt_conv1_bn_relu_pool_forward_train(outs, ams, NULL, NULL, sts, img + first * img_px, w, NULL, gamma, beta, rms, rvs,
                                      0.1f, 1e-5f, NULL, sync, &mine);
  const qt_conv1_pool_grad ga = {.g = g}, gm = {.g = g + first * out_px};
  qt_conv1_bn_relu_pool_backward(dw, dg, db, &dsc, &ga, am, st, img, w, gamma, coef, NULL, &all);
  qt_conv1_bn_relu_pool_backward(dws, dgs, dbs, &dscs, &gm, ams, sts, img + first * img_px, w, gamma,
                                 coef + first * img_px, sync, &mine);
  qt_dist_sum_f64(dws, OC * K);
  qt_dist_sum_f64(&dscs, 1);
  qt_dist_sum_f32(dgs, OC);
  qt_dist_sum_f32(dbs, OC);
  float *dwf = qt_test_zeros(OC * K), *dwsf = qt_test_zeros(OC * K);
  for (int i = 0; i < OC * K; i++) dwf[i] = (float)dw[i], dwsf[i] = (float)dws[i];
  const float sc = (float)dsc, scs = (float)dscs;
  QT_CHECK(memcmp(ams, am + first * out_px, (size_t)(N * out_px)) == 0);
  close_scaled("conv1 kernels: pooled output", outs, out + first * out_px, N * out_px, 1e-5);
  close_scaled("conv1 kernels: running_mean", rms, rm, OC, 1e-5);
  close_scaled("conv1 kernels: running_var", rvs, rv, OC, 1e-5);
  close_scaled("conv1 kernels: dw (summed)", dwsf, dwf, OC * K, 1e-5);
  close_scaled("conv1 kernels: dgamma (summed)", dgs, dg, OC, 1e-5);
  close_scaled("conv1 kernels: dbeta (summed)", dbs, db, OC, 1e-5);
  close_scaled("conv1 kernels: image scale gradient (summed)", &scs, &sc, 1, 1e-5);
  float *bufs[] = {img, coef, w, g, gamma, beta, out, outs, rm, rv, rms, rvs, dg, db, dgs, dbs, dwf, dwsf};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  QT_FREE_ALL(am, ams, st, sts, dw, dws);
}

/* ---- 2. one training step of a graph ---------------------------------------------------------- */
#define BATCH 32

/* One step of g on rows [first, first + n) of the batch (seeded n / BATCH when synced); returns
 * the loss times n. g's gradient slab holds the step's gradients; *conv1 gets the calls of the
 * image's convolution, batch norm, relu and pool as one op (qt_conv1_bn_relu_max_pool2d). */
static double step(qt_graph *g, const float *images, const int32_t *labels, int first, int n, int synced,
                   int64_t *conv1) {
  qt_ctx *ctx = qt_ctx_create();
  qt_profile prof;
  qt_profile_clear(&prof);
  qt_ctx_set_profile(ctx, &prof);
  if (synced) qt_ctx_set_batch_sync(ctx, sync);
  const int64_t shape[4] = {n, 28, 28, 1};
  qt_tensor *logits = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)(images + first * 784)));
  QT_ASSERT(logits, "%s", g->error);
  qt_tensor *loss = qt_cross_entropy(ctx, logits, labels + first, NULL);
  const double lv = qt_f32(loss)[0];
  qt_graph_zero_grad(g);
  if (synced) {
    qt_backward_seeded(ctx, loss, (float)n / (float)BATCH);
    qt_dist_sum_f32(g->grads, g->n_params);
  } else {
    qt_backward(ctx, loss);
  }
  *conv1 = prof.forward[QT_PROFILE_CONV1_BN_MAX_POOL2D].calls;
  qt_ctx_free(ctx);
  return lv * n;
}

/* ref and dist hold the same state; ref steps on the whole batch alone, dist on this process's
 * slice with the others; then their gradients, losses and buffers are compared. */
static void graph_step(const char *name, qt_graph *ref, qt_graph *dist, const float *images, const int32_t *labels,
                       int fake_quant, int conv1, double grad_tol, double loss_tol) {
  const int first = BATCH * me / R, n = BATCH * (me + 1) / R - first;
  qt_graph_set_mode(ref, QT_MODE_TRAIN);
  qt_graph_set_mode(dist, QT_MODE_TRAIN);
  qt_set_observers(ref, 0);
  qt_set_observers(dist, 0);
  qt_set_fake_quant(ref, fake_quant);
  qt_set_fake_quant(dist, fake_quant);
  int64_t conv1_ref, conv1_dist;
  const double want = step(ref, images, labels, 0, BATCH, 0, &conv1_ref) / BATCH;
  double got = step(dist, images, labels, first, n, 1, &conv1_dist);
  /* conv1: the image's layer runs as one op on both sides, SyncBN's statistics and sums inside it */
  if (conv1_ref != conv1 || conv1_dist != conv1)
    qt_test_fail("%s: conv1_bn_relu_max_pool2d ran %lld times alone and %lld times synchronized, want %d", name,
                 (long long)conv1_ref, (long long)conv1_dist, conv1);
  qt_dist_sum_f64(&got, 1);
  got /= BATCH;
  if (verbose && me == 0) printf("%s: loss %.9g vs %.9g\n", name, got, want);
  if (!(fabs(got - want) <= loss_tol * fabs(want)))
    qt_test_fail("%s: loss of the synchronized step %.9g, of the one-process step %.9g", name, got, want);
  char what[160];
  for (int i = 0; i < ref->n_tensors; i++) {
    const qt_param *p = &ref->tensors[i];
    snprintf(what, sizeof what, "%s: %s %s", name, p->name, p->is_buffer ? "after the step" : "gradient");
    if (p->is_buffer) close_scaled(what, dist->buffers + p->offset, ref->buffers + p->offset, p->numel, 1e-5);
    else close_scaled(what, dist->grads + p->offset, ref->grads + p->offset, p->numel, grad_tol);
  }
}

static qt_graph *qat_prepared(const qt_graph *fp32, const float *images, int lsq) {
  qt_quantizer_config qc = qt_test_quantizer_config(4, 8);
  qc.learnable_scale = lsq;
  qt_graph *p = qt_test_prepare_onednn(fp32, &qc, QT_PREPARE_QAT);
  /* qparams from the same batch on every process (observers are not synchronized yet), once */
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  const int64_t shape[4] = {BATCH, 28, 28, 1};
  QT_ASSERT(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images)), "%s", p->error);
  qt_ctx_free(ctx);
  return p;
}

static void graphs(void) {
  char err[QT_ERR_LEN];
  float *images = qt_test_zeros(BATCH * 784);
  qt_test_fill_uniform(images, BATCH * 784, -0.8f, 2.0f, 77);
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 7 + 3) % 10;
  qt_graph *ref = qt_model_build("fashion_cnn", err), *dist = qt_model_build("fashion_cnn", err);
  QT_ASSERT(ref && dist, "%s", err);
  QT_CHECK(ref->n_params == dist->n_params && memcmp(ref->params, dist->params, (size_t)ref->n_params * 4) == 0);
  qt_graph *qref = qat_prepared(ref, images, 0), *qdist = qat_prepared(dist, images, 0);
  qt_graph *lref = qat_prepared(ref, images, 1), *ldist = qat_prepared(dist, images, 1);
  int conv_bn = 0;
  for (int i = 0; i < qref->n_nodes; i++) conv_bn += qref->nodes[i].op == QT_OP_CONV_BN;
  if (conv_bn != 2) qt_test_fail("the QAT-prepared FashionCNN has %d conv_bn nodes, want 2", conv_bn);
  graph_step("fashion_cnn fp32", ref, dist, images, labels, 1, 1, 1e-4, 1e-6);
  /* With fake quant on, the synchronized BN's output, different from the one-process output by
   * float rounding, now and then lands in the neighbouring quantization bin (measured: 3 of 401408
   * elements after conv1's conv_bn + ReLU, 38 of 200704 after conv2's), and the flips propagate:
   * measured 1.3e-5 on the loss, 2.6e-3 on fc2's gradient. Then, with the same state, fake quant
   * off: conv_bn's scaling and SyncBN alone, as tight as fp32. */
  graph_step("fashion_cnn QAT W4A8", qref, qdist, images, labels, 1, 1, 1e-2, 1e-4);
  graph_step("fashion_cnn QAT, fake quant off", qref, qdist, images, labels, 0, 0, 1e-4, 1e-6);
  /* LSQ: the image's and the activations' learned scales, their gradients among the compared */
  graph_step("fashion_cnn QAT W4A8 LSQ", lref, ldist, images, labels, 1, 1, 1e-2, 1e-4);
  qt_graph_free(lref);
  qt_graph_free(ldist);
  qt_graph_free(ref);
  qt_graph_free(dist);
  qt_graph_free(qref);
  qt_graph_free(qdist);
  free(images);
}

int main(int argc, char **argv) {
  if (qt_test_dist_begin(&argc, &argv, "test_sync_bn", 0)) return 1;
  R = qt_dist_size();
  me = qt_dist_rank();
  verbose = getenv("QT_TEST_VERBOSE") != NULL;
  sync = qt_dist_batch_sync();
  kernels(5);
  kernels(64);
  kernels_conv1();
  graphs();
  return qt_test_dist_finish();
}
