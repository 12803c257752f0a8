/* Graph IR: builder errors name the node and the problem; presets have PyTorch's parameter
 * counts; the dot dump names every node and edge; the executor's gradients (through in-place
 * ReLU, flatten views, residual adds, BN in train and eval mode) match central finite
 * differences of the whole graph's loss; eval mode leaves BN running stats untouched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "tests/common/testutil.h"

static void expect_build_error(const char *what, qt_graph *g, int out, const char *needle) {
  char err[QT_ERR_LEN] = "";
  int rc = qt_graph_finalize(g, out < 0 ? 0 : out, err);
  if (rc == 0) qt_test_fail("%s: finalize succeeded, want an error mentioning '%s'", what, needle);
  else if (!strstr(err, needle)) qt_test_fail("%s: error '%s' lacks '%s'", what, err, needle);
  qt_graph_free(g);
}

static void builder_errors(void) {
  qt_graph *g = qt_graph_create("bad");
  int x = qt_graph_input(g, "input", 8, 8, 3);
  int f = qt_graph_flatten(g, "flat", x);
  expect_build_error("conv on flat", g, qt_graph_conv2d(g, "conv", f, 4, 3, 1, 1, 1, 0), "conv");

  g = qt_graph_create("bad");
  x = qt_graph_input(g, "input", 8, 8, 3);
  expect_build_error("linear on image", g, qt_graph_linear(g, "fc", x, 4, 1), "insert a flatten");

  g = qt_graph_create("bad");
  x = qt_graph_input(g, "input", 8, 8, 3);
  int a = qt_graph_conv2d(g, "c1", x, 4, 3, 1, 1, 1, 0), b = qt_graph_conv2d(g, "c2", x, 5, 3, 1, 1, 1, 0);
  expect_build_error("add shape mismatch", g, qt_graph_add(g, "add", a, b), "differ in shape");

  g = qt_graph_create("bad");
  x = qt_graph_input(g, "input", 8, 8, 3);
  qt_graph_relu(g, "r", x);
  expect_build_error("duplicate name", g, qt_graph_relu(g, "r", x), "two nodes named 'r'");

  g = qt_graph_create("bad");
  x = qt_graph_input(g, "input", 8, 8, 3);
  expect_build_error("groups", g, qt_graph_conv2d(g, "c", x, 4, 3, 1, 1, 2, 0), "groups 2");

  char err[QT_ERR_LEN];
  QT_CHECK(qt_model_build("resnet999", err) == NULL && strstr(err, "resnet999") && strstr(err, "fashion_cnn"));
}

static void presets(void) {
  char err[QT_ERR_LEN];
  /* PyTorch: sum(p.numel() for p in model.parameters()) */
  struct { const char *name; int64_t params; } want[] = {{"fashion_cnn", 421738}, {"fashion_mlp", 203530}};
  for (int i = 0; i < 2; i++) {
    qt_graph *g = qt_model_build(want[i].name, err);
    QT_CHECK(g != NULL);
    if (!g) continue;
    if (qt_graph_param_count(g) != want[i].params)
      qt_test_fail("%s: %lld parameters, want %lld", want[i].name, (long long)qt_graph_param_count(g),
                   (long long)want[i].params);
    FILE *f = tmpfile();
    QT_CHECK(qt_graph_write_dot(g, f) == 0);
    long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    QT_CHECK(fread(text, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    QT_CHECK(strncmp(text, "digraph", 7) == 0);
    int edges = 0, want_edges = 0;
    for (const char *p = text; (p = strstr(p, " -> ")); p++) edges++;
    for (int k = 0; k < g->n_nodes; k++) {
      want_edges += g->nodes[k].n_inputs;
      if (!strstr(text, g->nodes[k].name)) qt_test_fail("dot lacks node %s", g->nodes[k].name);
    }
    if (edges != want_edges) qt_test_fail("%s dot: %d edges, want %d", want[i].name, edges, want_edges);
    free(text);
    qt_graph_free(g);
  }
}

static double loss_of(qt_graph *g, qt_ctx *ctx, float *x, const int64_t *shape, const int32_t *labels) {
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, 0);
  /* BN's running stats move on every training forward: keep them fixed while probing. */
  float *saved = malloc((size_t)g->n_buffers * sizeof(float));
  memcpy(saved, g->buffers, (size_t)g->n_buffers * sizeof(float));
  qt_tensor *in = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
  double l = qt_f32(qt_cross_entropy(ctx, qt_graph_forward(g, ctx, in), labels, NULL))[0];
  memcpy(g->buffers, saved, (size_t)g->n_buffers * sizeof(float));
  free(saved);
  return l;
}

/* Central differences on sampled elements of every parameter tensor, float32 forward, h = 5e-4:
 * |analytic - numeric| <= 1e-3 + 3e-2 |numeric|. ReLU and max-pool make the loss piecewise
 * smooth: where the differences with h and h/2 disagree, a kink lies within h and the element
 * is skipped (at most a quarter of the samples may be). Near-ties in max-pool windows of random
 * inputs still put float32 differences off now and then (such an element was checked against
 * PyTorch's float64 autograd and our backward was right to 1e-7), so one mismatch per model
 * and mode is tolerated; a wiring error in the tape shows on most samples. FashionCNN's
 * gradients are also compared with PyTorch's directly in test_fashion_cnn_steps. */
static void gradcheck(const char *model, int training) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  qt_graph_init_params(g, 7);
  qt_graph_set_training(g, training);
  if (!training) /* non-trivial running stats */
    for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.5f + 0.25f * (float)(i % 5);
  enum { N = 4 };
  int64_t shape[4] = {N, 28, 28, 1};
  float *x = malloc(sizeof(float) * N * 784);
  qt_test_fill_uniform(x, N * 784, -1.5f, 1.5f, 3);
  int32_t labels[N] = {1, 7, 3, 9};
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *saved = malloc((size_t)g->n_buffers * sizeof(float));
  memcpy(saved, g->buffers, (size_t)g->n_buffers * sizeof(float));
  qt_tensor *in = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
  qt_tensor *loss = qt_cross_entropy(ctx, qt_graph_forward(g, ctx, in), labels, NULL);
  qt_graph_zero_grad(g);
  qt_backward(ctx, loss);
  memcpy(g->buffers, saved, (size_t)g->n_buffers * sizeof(float));
  float *grads = malloc((size_t)g->n_params * sizeof(float));
  memcpy(grads, g->grads, (size_t)g->n_params * sizeof(float));
  int bad = 0, skipped = 0, total = 0;
  for (int t = 0; t < g->n_tensors; t++) {
    qt_param *p = &g->tensors[t];
    if (p->is_buffer) continue;
    for (int k = 0; k < 6; k++) {
      int64_t i = p->offset + (int64_t)((k * 7919 + t * 31) % p->numel);
      float orig = g->params[i];
      double nums[2];
      for (int r = 0; r < 2; r++) {
        const float h = r ? 2.5e-4f : 5e-4f;
        g->params[i] = orig + h;
        double lp = loss_of(g, ctx, x, shape, labels);
        g->params[i] = orig - h;
        double lm = loss_of(g, ctx, x, shape, labels);
        g->params[i] = orig;
        nums[r] = (lp - lm) / (double)((orig + h) - (orig - h));
      }
      double num = nums[0], ana = grads[i];
      total++;
      if (fabs(nums[0] - nums[1]) > 1e-3 + 3e-2 * fabs(nums[0])) {
        skipped++;
        continue;
      }
      if (fabs(num - ana) > 1e-3 + 3e-2 * fabs(num) && ++bad > 1)
        qt_test_fail("%s (%s mode): d loss / d %s[%lld]: backward %.6g, finite difference %.6g", model,
                     training ? "train" : "eval", p->name, (long long)(i - p->offset), ana, num);
    }
  }
  if (skipped * 4 > total) qt_test_fail("%s: %d of %d samples sit on kinks", model, skipped, total);
  /* Eval mode must not move BN running statistics. */
  if (!training) {
    loss_of(g, ctx, x, shape, labels);
    qt_ctx_reset(ctx);
    qt_ctx_set_grad(ctx, 0);
    memcpy(saved, g->buffers, (size_t)g->n_buffers * sizeof(float));
    qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
    QT_CHECK(memcmp(saved, g->buffers, (size_t)g->n_buffers * sizeof(float)) == 0);
  }
  free(saved);
  free(grads);
  free(x);
  qt_ctx_free(ctx);
  qt_graph_free(g);
}

int main(void) {
  builder_errors();
  presets();
  gradcheck("fashion_cnn", 1);
  gradcheck("fashion_cnn", 0);
  gradcheck("res_cnn", 1);
  gradcheck("res_cnn", 0);
  gradcheck("fashion_mlp", 1);
  return qt_test_finish();
}
