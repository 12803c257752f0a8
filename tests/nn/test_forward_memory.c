/* Memory reuse in the arena: qt_arena_free's ranges are reused (smallest fit, neighbours merged,
 * the block's top returned to the bump pointer); the no-grad planner (qt_graph_forward) keeps
 * FashionCNN's forward at batch 256 well below the sum of its values and below the executor
 * that keeps every value, with bit-identical outputs there and on ResCNN (residual adds,
 * in-place BN and ReLU) and the imported MobileNet-style model (depthwise convs, ReLU6); and
 * backward with qt_ctx_set_backward_frees gives bit-identical parameter gradients in less
 * memory; a training step gives bit-identical gradients and running statistics whether every value
 * is kept, batch norm runs fused with its relu (and, under QAT, LSQ with the max pool after it
 * and the input's LSQ with the first convolution), or dead values and gradients are handed back;
 * the exceptions are the input quantizer's scale gradient and FashionCNN's first layer as one op
 * (qt_conv1_bn_relu_max_pool2d), within the tolerances same_step states; and with Winograd
 * convolutions, activations handed to them blocked or NHWC give the same bits (blocked_handoff). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "nn/nn.h"
#include "onnx/onnx_import.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

static void arena_reuse(void) {
  qt_ctx *ctx = qt_ctx_create();
  /* sizes round up to 64 bytes: 10048, 50048, 5056 */
  unsigned char *a = qt_arena_alloc(ctx, 10000), *b = qt_arena_alloc(ctx, 50000), *c = qt_arena_alloc(ctx, 5000);
  QT_CHECK(b == a + 10048 && c == b + 50048 && qt_ctx_peak_bytes(ctx) == 65152);
  qt_arena_free(ctx, a, 10000);
  qt_arena_free(ctx, b, 50000); /* merges with a's range: 60096 bytes */
  QT_CHECK(qt_arena_alloc(ctx, 60000) == a);
  qt_arena_free(ctx, a, 60000);
  QT_CHECK(qt_arena_alloc(ctx, 5000) == a); /* the smallest range that fits, from its start */
  /* c merges with the range below it, which then ends at the top: all of it goes back to the
   * bump pointer, which now stands after the 5056 bytes still in use */
  qt_arena_free(ctx, c, 5000);
  unsigned char *d = qt_arena_alloc(ctx, 100000);
  QT_CHECK(d == a + 5056 && qt_ctx_peak_bytes(ctx) == 5056 + 100032);
  /* small allocations (headers) come from blocks of their own: the next large one follows d */
  unsigned char *e = qt_arena_alloc(ctx, 100), *f = qt_arena_alloc(ctx, 5000);
  QT_CHECK(f == d + 100032 && (e < a || e >= f + 5056));
  QT_CHECK(qt_ctx_peak_bytes(ctx) == 5056 + 100032 + 128 + 5056);
  QT_CHECK(qt_arena_owns(ctx, d) && qt_arena_owns(ctx, e) && !qt_arena_owns(ctx, &d));
  qt_ctx_reset(ctx);
  QT_CHECK(qt_arena_alloc(ctx, 5000) == a); /* reset forgets the ranges and rewinds */
  qt_ctx_free(ctx);
}

static qt_graph *model(const char *name) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(name, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 11);
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.5f + 0.25f * (float)(i % 5); /* running stats */
  qt_graph_set_training(g, 0);
  return g;
}

/* The output of g on x (N images) in a fresh no-grad arena: every value kept (keep_all) or the
 * planner; the arena's peak in *peak. */
static float *forward(qt_graph *g, const float *x, int N, int keep_all, size_t *peak) {
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {N, in->shape[0], in->shape[1], in->shape[2]};
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_tensor **vals;
  qt_tensor *input = qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x);
  qt_tensor *y = keep_all ? qt_graph_forward_values(g, ctx, input, &vals) : qt_graph_forward(g, ctx, input);
  QT_ASSERT(y, "%s: %s", g->name, g->error);
  float *out = qt_test_copy_f32(qt_f32(y), qt_tensor_numel(y));
  *peak = qt_ctx_peak_bytes(ctx);
  qt_ctx_free(ctx);
  return out;
}

static void same_output(qt_graph *g, int N, size_t *peak_all, size_t *peak_planned) {
  const qt_value *in = &g->values[g->input];
  const int64_t n_in = N * qt_value_numel(in), n_out = N * qt_value_numel(&g->values[g->output]);
  float *x = malloc((size_t)n_in * sizeof(float));
  qt_test_fill_uniform(x, n_in, -2.0f, 2.0f, 5);
  float *a = forward(g, x, N, 1, peak_all), *b = forward(g, x, N, 0, peak_planned);
  if (memcmp(a, b, (size_t)n_out * sizeof(float)) != 0) {
    int64_t k = 0;
    while (memcmp(&a[k], &b[k], sizeof(float)) == 0) k++;
    qt_test_fail("%s at batch %d: the planned forward differs from the one keeping every value (first at %lld: %.9g "
                 "vs %.9g)", g->name, N, (long long)k, b[k], a[k]);
  }
  free(a), free(b), free(x);
}

/* FashionCNN at batch 256: its values (conv1, bn1, relu1 28x28x32; pool1 14x14x32; conv2, bn2,
 * relu2 14x14x64; pool2 = flatten 3136; 128, 128, 10) sum to 125,706 floats per image, 122.8 MiB.
 * Keeping every value spans 46.9 MiB (in-place BN and ReLU and the flatten view share memory);
 * the planner 31.6 MiB: conv1's output and pool1's at once, and pool1's 1 MiB of index scratch
 * (25.7% of the sum). Without reuse it would span at least what keeping every value does. */
static void fashion_cnn(void) {
  qt_graph *g = model("fashion_cnn");
  enum { N = 256 };
  double sum = 0;
  for (int v = 0; v < g->n_values; v++)
    if (v != g->input) sum += (double)N * (double)qt_value_numel(&g->values[v]) * sizeof(float);
  size_t all, planned;
  same_output(g, N, &all, &planned);
  if ((double)planned > 0.27 * sum || (double)planned > 0.75 * (double)all)
    qt_test_fail("fashion_cnn at batch %d: the planned forward spans %.1f MiB, want <= 27%% of the values' %.1f MiB "
                 "and <= 75%% of the %.1f MiB that keeping every value spans",
                 N, planned / 1048576.0, sum / 1048576.0, all / 1048576.0);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "fashion_cnn batch %d: values %.1f MiB, all kept %.1f MiB, planned %.1f MiB\n", N,
            sum / 1048576.0, all / 1048576.0, planned / 1048576.0);
  qt_graph_free(g);
}

static void res_cnn_and_mobilenet(void) {
  size_t all, planned;
  qt_graph *g = model("res_cnn");
  same_output(g, 64, &all, &planned);
  if (planned >= all) qt_test_fail("res_cnn: planned %zu bytes, all kept %zu", planned, all);
  qt_graph_free(g);
  char err[QT_ERR_LEN];
  g = qt_onnx_import(qt_test_path("tests/onnx/models/mobilenet.onnx"), NULL, NULL, err);
  if (!g) {
    qt_test_fail("mobilenet: %s", err);
    return;
  }
  qt_graph_set_training(g, 0);
  same_output(g, 32, &all, &planned);
  if (planned >= all) qt_test_fail("mobilenet: planned %zu bytes, all kept %zu", planned, all);
  qt_graph_free(g);
}

/* One training step on g: the parameter gradients followed by the updated running statistics,
 * and the arena's peak. mode 0: every value kept (qt_graph_forward_values: no batch norm + relu
 * fusion, nothing freed), frees off; 1: qt_graph_forward (training-mode batch norm fused with
 * its relu), frees off; 2: the same with frees on (values no tape entry saved go back once
 * their consumers ran; backward hands gradients back and writes some in place), as the trainer
 * runs. */
static float *step_grads(qt_graph *g, const float *x, const int32_t *labels, int N, int mode, size_t *peak) {
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {N, in->shape[0], in->shape[1], in->shape[2]};
  float *saved = qt_test_copy_f32(g->buffers, g->n_buffers);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_backward_frees(ctx, mode >= 2);
  /* 3, 4: mode 2 on Winograd convolutions (as the trainer runs by default), activations handed
   * to them blocked (3) or NHWC (4) */
  qt_ctx_set_conv_winograd(ctx, mode >= 3);
  qt_ctx_set_blocked_handoff(ctx, mode == 3);
  qt_graph_set_training(g, 1);
  qt_tensor **vals;
  qt_tensor *input = qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x);
  qt_tensor *logits = mode == 0 ? qt_graph_forward_values(g, ctx, input, &vals) : qt_graph_forward(g, ctx, input);
  QT_ASSERT(logits, "%s: %s", g->name, g->error);
  qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, NULL);
  qt_graph_zero_grad(g);
  qt_backward(ctx, loss);
  *peak = qt_ctx_peak_bytes(ctx);
  qt_ctx_free(ctx);
  float *out = malloc((size_t)(g->n_params + g->n_buffers) * sizeof(float));
  memcpy(out, g->grads, (size_t)g->n_params * sizeof(float));
  memcpy(out + g->n_params, g->buffers, (size_t)g->n_buffers * sizeof(float));
  memcpy(g->buffers, saved, (size_t)g->n_buffers * sizeof(float));
  free(saved);
  return out;
}

/* Whether two steps' gradients and running statistics (step_grads) are identical, except the
 * parameter named `loose` (may be NULL): the fused training forward computes the input
 * quantizer's LSQ scale gradient as another sum of the same terms (qt_conv2d_lsq_input; checked
 * tightly in test_conv_lsq_input), so there it may differ by 1e-3 of its value (seen: 2e-5).
 * With tol > 0 every tensor may differ by tol times its largest magnitude instead, and LSQ
 * scales (names ending in ".fq.scale") only need to be finite: FashionCNN's first layer (fp32, and
 * QAT's conv_bn with its fake quants) runs as qt_conv1_bn_relu_max_pool2d in the fused modes,
 * whose statistics and gradients are sums in another order (checked against the ops in turn in
 * test_conv1_pool_ops), and every value after it moves by rounding: fp32 1e-4 (seen 2e-6); QAT
 * 1e-2, as a fake quant's rounding may flip: an activation one step apart moves fc1's weight
 * gradient by that step times an output gradient (seen 1.8e-3 there, 1.3e-4 on conv1's weight).
 * An LSQ scale's gradient is a small sum of terms of both signs that jump where a value crosses
 * a rounding boundary, so flips upstream move it by any factor (seen: relu2's by 4.5e-2, relu3's
 * by 5.7 times its value); test_conv1_pool_ops pins the op's scale gradients (1e-3, same inputs)
 * and the fused modes here agree bit for bit (training_step: frees off vs on). */
static int lsq_scale_name(const char *name) {
  const size_t n = strlen(name), k = strlen(".fq.scale");
  return n >= k && strcmp(name + n - k, ".fq.scale") == 0;
}

static int same_step(const qt_graph *g, const float *a, const float *b, const char *loose, float tol) {
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *pt = &g->tensors[t];
    const int64_t at = (pt->is_buffer ? g->n_params : 0) + pt->offset;
    if (memcmp(a + at, b + at, (size_t)pt->numel * sizeof(float)) == 0) continue;
    if (tol > 0) {
      float mag = 0, err = 0;
      for (int64_t i = 0; i < pt->numel; i++) {
        mag = fabsf(a[at + i]) > mag ? fabsf(a[at + i]) : mag;
        err = fabsf(a[at + i] - b[at + i]) > err ? fabsf(a[at + i] - b[at + i]) : err;
      }
      if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "  %s: differs by %.3g of %.3g\n", pt->name, err, mag);
      if (lsq_scale_name(pt->name) ? !isfinite(err) : !(err <= tol * mag)) return 0;
      continue;
    }
    if (!loose || strcmp(pt->name, loose) != 0) return 0;
    for (int64_t i = 0; i < pt->numel; i++)
      if (!(fabsf(a[at + i] - b[at + i]) <= 1e-3f * fabsf(a[at + i]))) return 0;
  }
  return 1;
}

/* The three modes give bit-identical gradients and running statistics (same_step: but for
 * `loose`); the trainer's (2) spans at most max_ratio of keeping everything (0). FashionCNN:
 * BN -> ReLU -> max pool, whose ReLU outputs go back after the pool; ResCNN: residual adds;
 * MobileNet-style: ReLU6, depthwise. */
static void training_step(qt_graph *g, int N, double max_ratio, const char *loose, float tol) {
  const qt_value *in = &g->values[g->input];
  const int64_t n_in = N * qt_value_numel(in);
  float *x = malloc((size_t)n_in * sizeof(float));
  qt_test_fill_uniform(x, n_in, -2.0f, 2.0f, 9);
  int32_t labels[64];
  QT_ASSERT(N <= 64, "batch %d", N);
  for (int i = 0; i < N; i++) labels[i] = (i * 7) % 10;
  size_t peak[3];
  float *r[3];
  for (int m = 0; m < 3; m++) r[m] = step_grads(g, x, labels, N, m, &peak[m]);
  const size_t n = (size_t)(g->n_params + g->n_buffers) * sizeof(float);
  if (!same_step(g, r[0], r[1], loose, tol))
    qt_test_fail("%s: gradients or running statistics differ with batch norm fused with its relu", g->name);
  if (!same_step(g, r[0], r[2], loose, tol))
    qt_test_fail("%s: gradients or running statistics differ when values and gradients are handed back", g->name);
  if (memcmp(r[1], r[2], n) != 0)
    qt_test_fail("%s: gradients or running statistics differ between the fused steps, frees off and on", g->name);
  if ((double)peak[2] > max_ratio * (double)peak[0])
    qt_test_fail("%s step at batch %d: %.2f MiB with frees, want <= %.0f%% of the %.2f MiB keeping everything",
                 g->name, N, peak[2] / 1048576.0, 100 * max_ratio, peak[0] / 1048576.0);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s step batch %d: %.2f MiB all kept, %.2f MiB fused, %.2f MiB with frees\n", g->name, N,
            peak[0] / 1048576.0, peak[1] / 1048576.0, peak[2] / 1048576.0);
  for (int m = 0; m < 3; m++) free(r[m]);
  free(x);
}

/* Activations handed to Winograd convolutions blocked or NHWC (qt_ctx_set_blocked_handoff, modes 3
 * and 4 of step_grads): the same gradients and running statistics, bit for bit, but for the LSQ
 * scale of a blocked value's fake quant (its gradient's terms summed in another order: 1e-5 of its
 * value). Where Winograd runs (AVX-512, ONEDNN_MAX_CPU_ISA unset) FashionCNN's conv2 must take its
 * input blocked and hand its output to batch norm blocked: no NHWC-to-blocked buffer, source- or
 * destination-shaped, is mapped then. */
static void blocked_handoff(qt_graph *g, int N) {
  const qt_value *in = &g->values[g->input];
  const int64_t n_in = N * qt_value_numel(in);
  float *x = malloc((size_t)n_in * sizeof(float));
  qt_test_fill_uniform(x, n_in, -2.0f, 2.0f, 19);
  int32_t labels[64];
  for (int i = 0; i < N; i++) labels[i] = (i * 7) % 10;
  size_t peak, src[2], dst[2], pad;
  float *r[2];
  for (int m = 0; m < 2; m++) {
    qt_conv2d_release_scratch();
    r[m] = step_grads(g, x, labels, N, 3 + m, &peak);
    qt_conv2d_scratch_bytes(&src[m], &dst[m], &pad);
  }
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *pt = &g->tensors[t];
    const int64_t at = (pt->is_buffer ? g->n_params : 0) + pt->offset;
    if (memcmp(r[0] + at, r[1] + at, (size_t)pt->numel * sizeof(float)) == 0) continue;
    int ok = lsq_scale_name(pt->name);
    for (int64_t i = 0; ok && i < pt->numel; i++) ok = fabsf(r[0][at + i] - r[1][at + i]) <= 1e-5f * fabsf(r[1][at + i]);
    if (!ok) qt_test_fail("%s: %s differs with activations handed over blocked", g->name, pt->name);
  }
  const int64_t xs[4] = {N, 14, 14, 32}, ws[4] = {64, 32, 3, 3};
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_conv_winograd(ctx, 1);
  const int takes = qt_conv2d_takes_blocked(ctx, xs, ws, 1, 1, 1, 1, 1);
  qt_ctx_set_blocked_handoff(ctx, 0);
  QT_CHECK(!qt_conv2d_takes_blocked(ctx, xs, ws, 1, 1, 1, 1, 1));
  qt_ctx_free(ctx);
  const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && !getenv("ONEDNN_MAX_CPU_ISA")) QT_CHECK(takes);
  if (takes) QT_CHECK(src[0] == 0 && src[1] > 0); /* blocked: conv2's input never reordered */
  /* and its output neither (batch norm + relu + pool takes it blocked) */
  if (takes && qt_batch_norm_relu_max_pool2d_takes_blocked(64)) QT_CHECK(dst[0] == 0 && dst[1] > 0);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: conv2 takes blocked %d, NHWC-to-blocked buffers %zu / %zu (source), %zu / %zu bytes\n",
            g->name, takes, src[0], src[1], dst[0], dst[1]);
  free(r[0]), free(r[1]), free(x);
}

static void backward_frees(void) {
  qt_graph *g = model("fashion_cnn");
  training_step(g, 32, 0.60, NULL, 1e-4f);
  blocked_handoff(g, 32);
  qt_graph_free(g);
  g = model("res_cnn");
  training_step(g, 32, 0.60, NULL, 0);
  qt_graph_free(g);
  char err[QT_ERR_LEN];
  g = qt_onnx_import(qt_test_path("tests/onnx/models/mobilenet.onnx"), NULL, NULL, err);
  if (!g) {
    qt_test_fail("mobilenet: %s", err);
    return;
  }
  training_step(g, 16, 0.70, NULL, 0);
  qt_graph_free(g);
}

/* FashionCNN prepared for QAT W4A8 with LSQ (lsq) or observers and the clipped STE: conv1's
 * conv_bn with the input's and its activations' fake quants and its max pool runs as
 * qt_conv1_bn_relu_max_pool2d; conv2's normalizes conv / sf without the quotient in memory, fused
 * with its relu, fake quant and max pool (qt_batch_norm_relu_max_pool2d); then with BN frozen
 * (running statistics, relu apart: the ops in turn, bit for bit but the input's LSQ scale). One observed step first; then
 * observers off, so that the three modes start from the same qparams and learned scales. */
static void qat_training_step(int lsq) {
  qt_graph *g = model("fashion_cnn");
  qt_quantizer_config qc = qt_test_quantizer_config(4, 8);
  qc.learnable_scale = lsq;
  qt_graph *p = qt_test_prepare_onednn(g, &qc, QT_PREPARE_QAT);
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  enum { N = 32 };
  float *x = malloc(N * 784 * sizeof(float));
  qt_test_fill_uniform(x, N * 784, -2.0f, 2.0f, 3);
  int32_t labels[N];
  for (int i = 0; i < N; i++) labels[i] = (i * 3) % 10;
  size_t peak;
  free(step_grads(p, x, labels, N, 2, &peak)); /* observes: qparams, LSQ scales from the observers */
  int conv_bn = 0;
  for (int i = 0; i < p->n_nodes; i++) {
    if (p->nodes[i].q) p->nodes[i].q->observe = 0;
    if (p->nodes[i].wq) p->nodes[i].wq->observe = 0;
    conv_bn += p->nodes[i].op == QT_OP_CONV_BN;
  }
  QT_CHECK(conv_bn == 2);
  training_step(p, N, 0.60, NULL, 1e-2f); /* conv1: qt_conv1_bn_relu_max_pool2d */
  blocked_handoff(p, N);
  for (int i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].op == QT_OP_CONV_BN) p->nodes[i].bn_frozen = 1;
  training_step(p, N, 0.60, lsq ? "input.fq.scale" : NULL, 0);
  free(x);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  arena_reuse();
  fashion_cnn();
  res_cnn_and_mobilenet();
  backward_frees();
  qat_training_step(1);
  qat_training_step(0);
  return qt_test_finish();
}
