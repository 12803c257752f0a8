/* ONNX import against PyTorch (references from tests/onnx/make_onnx_models.py, no torch needed):
 * for every committed model (the three presets' twins, the MobileNet-style model in its training
 * and eval exports, the tiny model of the remaining ops, the activations' models, ViTs with
 * nn.MultiheadAttention, torch 2.x's exports) the imported graph computes PyTorch's
 * eval-mode logits, and where BN remains its train-mode logits (batch statistics), the loss, the
 * gradient of every parameter (the permuted fc weights compared in PyTorch's column order) and
 * the running statistics after that step. The twins import as the presets themselves: the same
 * nodes, names, attributes, shapes and tensors, and with the imported parameters loaded the
 * preset computes bit for bit what the import computes.
 *
 * Tolerances, relative to the largest reference value of each tensor: logits and loss 1e-5 (eval
 * and train mode), running statistics 1e-5, gradients 1e-4 (the reference gradients are stored
 * rounded to 14 mantissa bits, 3e-5; a gradient's scale is at least 1e-3 of the model's largest
 * gradient, for those that are 0 but for rounding). QT_TEST_VERBOSE=1 prints the figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_import.h"
#include "tests/common/testutil.h"

#define TOL_OUT 1e-5
#define TOL_GRAD 1e-4

/* The reference file of the models being checked: onnx_ref.h5 (torch 1.13's exports), act_ref.h5
 * (torch 1.13's export of the activations) or onnx2_ref.h5 (torch 2.x's, the opset-forms models and
 * the external-data model). */
static const char *ref_name = "onnx_ref.h5";

static const char *ref_file(void) {
  static char path[4096];
  snprintf(path, sizeof path, "%s%s", qt_test_path("tests/onnx/ref/"), ref_name);
  return path;
}

static float *load(const char *model, const char *what, int64_t *n) {
  char name[256];
  snprintf(name, sizeof name, "%s/%s", model, what);
  return qt_test_load_f32_n(ref_file(), name, n);
}

/* max |got - want| / max(max |want|, floor) */
static double rel_err(const float *got, const float *want, int64_t n, double floor) {
  double d = 0, m = floor;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)got[i] - (double)want[i]);
    d = isnan(e) || e > d ? (isnan(e) ? INFINITY : e) : d;
    m = fmax(m, fabs((double)want[i]));
  }
  return m > 0 ? d / m : d;
}

static double expect_rel_floor(const char *what, const float *got, const float *want, int64_t n, double tol,
                               double floor) {
  const double r = rel_err(got, want, n, floor);
  if (!(r <= tol)) qt_test_fail("%s: relative error %.3g > %.0e", what, r, tol);
  return r;
}

static double expect_rel(const char *what, const float *got, const float *want, int64_t n, double tol) {
  const double r = rel_err(got, want, n, 0);
  if (!(r <= tol)) qt_test_fail("%s: relative error %.3g > %.0e", what, r, tol);
  return r;
}

/* The weight gradient of a linear layer reading a flattened H x W x C image, taken back from the
 * graph's (h, w, c) column order to PyTorch's (c, h, w); NULL for any other tensor. */
static float *unpermuted(const qt_graph *g, int tensor, const float *grad) {
  const qt_node *n = &g->nodes[g->tensors[tensor].node];
  if (n->op != QT_OP_LINEAR || n->param[QT_P_WEIGHT] != tensor) return NULL;
  const qt_node *f = &g->nodes[g->values[n->inputs[0]].producer];
  if (f->op != QT_OP_FLATTEN) return NULL;
  const qt_value *img = &g->values[f->inputs[0]];
  if (img->ndim != 3) return NULL;
  const int64_t H = img->shape[0], W = img->shape[1], C = img->shape[2], IN = H * W * C;
  if (H * W == 1 || C == 1) return NULL;
  const int64_t OUT = g->tensors[tensor].numel / IN;
  float *out = malloc((size_t)(OUT * IN) * sizeof(float));
  for (int64_t o = 0; o < OUT; o++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++)
        for (int64_t c = 0; c < C; c++) out[o * IN + c * H * W + h * W + w] = grad[o * IN + (h * W + w) * C + c];
  return out;
}

static qt_tensor *input_of(qt_ctx *ctx, const qt_graph *g, float *x, int64_t n_x) {
  const qt_value *in = &g->values[g->input];
  const int64_t per = in->shape[0] * in->shape[1] * in->shape[2];
  const int64_t shape[4] = {n_x / per, in->shape[0], in->shape[1], in->shape[2]};
  return qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
}

typedef struct {
  double eval, train, loss, grad, stats;
  int n_grads;
} figures;

static void train_step(const char *model, qt_graph *g, qt_ctx *ctx, float *x, int64_t n_x, figures *fig) {
  char what[256];
  int64_t n;
  int32_t *labels = NULL;
  {
    char name[256];
    snprintf(name, sizeof name, "%s/labels", model);
    labels = qt_test_load_i32_n(ref_file(), name, &n);
  }
  float *want = load(model, "y_train", &n), *want_loss = load(model, "loss", &n);
  qt_graph_set_training(g, 1);
  qt_graph_zero_grad(g);
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, 1);
  qt_tensor *y = qt_graph_forward(g, ctx, input_of(ctx, g, x, n_x));
  if (!y) {
    qt_test_fail("%s: train forward: %s", model, g->error);
    return;
  }
  snprintf(what, sizeof what, "%s train-mode logits", model);
  fig->train = expect_rel(what, qt_f32(y), want, qt_tensor_numel(y), TOL_OUT);
  qt_tensor *loss = qt_cross_entropy(ctx, y, labels, NULL);
  snprintf(what, sizeof what, "%s loss", model);
  fig->loss = expect_rel(what, qt_f32(loss), want_loss, 1, TOL_OUT);
  qt_backward(ctx, loss);
  /* A gradient that is 0 in exact arithmetic (the shift of a BN whose output reaches the next
   * training-mode BN through convolutions alone: ShuffleNet's depthwise convs) is rounding noise
   * in both, so each gradient is compared on at least 1e-3 of the model's largest gradient. */
  double grad_floor = 0;
  for (int t = 0; t < g->n_tensors; t++) {
    if (g->tensors[t].is_buffer) continue;
    char name[300];
    snprintf(name, sizeof name, "grad/%s", g->tensors[t].name);
    int64_t nr;
    float *ref = load(model, name, &nr);
    for (int64_t i = 0; i < nr; i++) grad_floor = fmax(grad_floor, 1e-3 * fabs((double)ref[i]));
    free(ref);
  }
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    char name[300];
    snprintf(name, sizeof name, "%s/%s", p->is_buffer ? "after" : "grad", p->name);
    int64_t nr;
    float *ref = load(model, name, &nr);
    if (nr != p->numel) {
      qt_test_fail("%s: %s has %lld values, the reference %lld", model, name, (long long)p->numel, (long long)nr);
      free(ref);
      continue;
    }
    const float *got = p->is_buffer ? g->buffers + p->offset : g->grads + p->offset;
    float *back = p->is_buffer ? NULL : unpermuted(g, t, got);
    snprintf(what, sizeof what, "%s %s%s", model, name, back ? " (columns permuted back)" : "");
    const double r = p->is_buffer ? expect_rel(what, got, ref, nr, TOL_OUT)
                                  : expect_rel_floor(what, back ? back : got, ref, nr, TOL_GRAD, grad_floor);
    if (p->is_buffer)
      fig->stats = fmax(fig->stats, r);
    else
      fig->grad = fmax(fig->grad, r), fig->n_grads++;
    free(back);
    free(ref);
  }
  qt_ctx_set_grad(ctx, 0);
  free(labels), free(want), free(want_loss);
}

/* The preset with the imported model's parameters computes the same logits, bit for bit. */
static void same_as_preset(const char *model, qt_graph *g, qt_ctx *ctx, float *x, int64_t n_x, const float *y_import) {
  char err[QT_ERR_LEN];
  qt_graph *p = qt_model_build(model, err);
  QT_ASSERT(p, "%s", err);
  int same = p->n_nodes == g->n_nodes && p->n_tensors == g->n_tensors && p->n_values == g->n_values;
  for (int i = 0; same && i < p->n_nodes; i++) {
    const qt_node *a = &p->nodes[i], *b = &g->nodes[i];
    same = a->op == b->op && strcmp(a->name, b->name) == 0 && memcmp(&a->attr, &b->attr, sizeof a->attr) == 0 &&
           a->n_inputs == b->n_inputs && memcmp(a->inputs, b->inputs, sizeof a->inputs) == 0 &&
           memcmp(a->param, b->param, sizeof a->param) == 0 && memcmp(a->buffer, b->buffer, sizeof a->buffer) == 0;
    if (!same)
      qt_test_fail("%s: node %d is %s '%s' in the preset, %s '%s' imported (or their attributes differ)", model, i,
                   qt_op_name(a->op), a->name, qt_op_name(b->op), b->name);
  }
  for (int v = 0; same && v < p->n_values; v++)
    same = p->values[v].ndim == g->values[v].ndim &&
           memcmp(p->values[v].shape, g->values[v].shape, sizeof p->values[v].shape) == 0;
  for (int t = 0; same && t < p->n_tensors; t++)
    same = strcmp(p->tensors[t].name, g->tensors[t].name) == 0 && p->tensors[t].numel == g->tensors[t].numel &&
           p->tensors[t].ndim == g->tensors[t].ndim;
  if (!same) {
    qt_test_fail("%s: the imported graph is not the preset's", model);
    qt_graph_print(p, stderr);
    qt_graph_print(g, stderr);
  } else {
    memcpy(p->params, g->params, (size_t)g->n_params * sizeof(float));
    memcpy(p->buffers, g->buffers, (size_t)g->n_buffers * sizeof(float));
    qt_graph_set_training(p, 0);
    qt_ctx_reset(ctx);
    qt_tensor *y = qt_graph_forward(p, ctx, input_of(ctx, p, x, n_x));
    QT_ASSERT(y, "%s", p->error);
    if (memcmp(qt_f32(y), y_import, (size_t)qt_tensor_numel(y) * sizeof(float)) != 0)
      qt_test_fail("%s: the preset with the imported parameters computes other logits", model);
  }
  qt_graph_free(p);
}

static qt_graph *import_model(const char *dir, const char *model, qt_onnx_info *info) {
  char path[4096], err[QT_ERR_LEN];
  snprintf(path, sizeof path, "%s", qt_test_path(dir));
  snprintf(path + strlen(path), sizeof path - strlen(path), "%s.onnx", model);
  qt_graph *g = qt_onnx_import(path, NULL, info, err);
  if (!g) qt_test_fail("%s: %s", model, err);
  return g;
}

/* A torch 2.x export imports as torch 1.13's export of the same module: the same ops, node names
 * (torch 2.x's from the module paths in its node metadata), attributes, value shapes, and
 * parameters by name, size and value (bit for bit: both files hold the twin's weights; only BN
 * buffers differ, which torch 1.13's training export moved). */
static void same_graph_as(const char *model, const qt_graph *g, const char *twin) {
  qt_onnx_info info;
  const char *saved = ref_name;
  qt_graph *o = import_model("tests/onnx/models/", twin, &info);
  ref_name = saved;
  if (!o) return;
  int same = o->n_nodes == g->n_nodes && o->n_tensors == g->n_tensors && o->n_values == g->n_values &&
             o->n_params == g->n_params;
  for (int i = 0; same && i < o->n_nodes; i++) {
    const qt_node *a = &o->nodes[i], *b = &g->nodes[i];
    same = a->op == b->op && strcmp(a->name, b->name) == 0 && memcmp(&a->attr, &b->attr, sizeof a->attr) == 0 &&
           a->n_inputs == b->n_inputs && memcmp(a->inputs, b->inputs, sizeof a->inputs) == 0;
    if (!same)
      qt_test_fail("%s: node %d is %s '%s', %s '%s' in %s", model, i, qt_op_name(b->op), b->name, qt_op_name(a->op),
                   a->name, twin);
  }
  for (int v = 0; same && v < o->n_values; v++)
    same = o->values[v].ndim == g->values[v].ndim &&
           memcmp(o->values[v].shape, g->values[v].shape, sizeof o->values[v].shape) == 0;
  for (int k = 0; same && k < o->n_tensors; k++) {
    const qt_param *a = &o->tensors[k], *b = &g->tensors[k];
    same =
        strcmp(a->name, b->name) == 0 && a->numel == b->numel && a->is_buffer == b->is_buffer &&
        (a->is_buffer || memcmp(o->params + a->offset, g->params + b->offset, (size_t)a->numel * sizeof(float)) == 0);
    if (!same)
      qt_test_fail("%s: tensor %d '%s' differs from %s's '%s' (name, size or values)", model, k, b->name, twin,
                   a->name);
  }
  if (!same) {
    qt_test_fail("%s: the imported graph is not %s's", model, twin);
    qt_graph_print(g, stderr);
  }
  qt_graph_free(o);
}

static void check_model_in(const char *dir, const char *model, int preset, const char *want_name, int train,
                           const char *twin) {
  char what[256];
  qt_onnx_info info;
  qt_graph *g = import_model(dir, model, &info);
  if (!g) return;
  if (twin) same_graph_as(model, g, twin);
  if (strcmp(g->name, model) != 0) qt_test_fail("%s: graph named '%s'", model, g->name);
  if (want_name && qt_graph_find_node(g, want_name) < 0) {
    qt_test_fail("%s: no node named '%s' (names come from the PyTorch modules)", model, want_name);
    qt_graph_print(g, stderr);
  }
  int64_t n_x, n;
  float *x = load(model, "x", &n_x), *want = load(model, "y_eval", &n);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_training(g, 0);
  figures fig = {0};
  qt_tensor *y = qt_graph_forward(g, ctx, input_of(ctx, g, x, n_x));
  if (!y) {
    qt_test_fail("%s: eval forward: %s", model, g->error);
  } else {
    snprintf(what, sizeof what, "%s eval-mode logits", model);
    if (qt_tensor_numel(y) != n)
      qt_test_fail("%s: %lld logits, want %lld", what, (long long)qt_tensor_numel(y), (long long)n);
    else
      fig.eval = expect_rel(what, qt_f32(y), want, n, TOL_OUT);
    float *y_eval = qt_test_copy_f32(qt_f32(y), qt_tensor_numel(y));
    if (preset) same_as_preset(model, g, ctx, x, n_x, y_eval);
    free(y_eval);
  }
  if (train) train_step(model, g, ctx, x, n_x, &fig);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr,
            "%-18s IR %2lld opset %2lld %3d nodes %6lld params  max relative error: eval %.2e  train %s%.2e  loss "
            "%.2e  grads (%d) %.2e  BN stats %.2e  (%d dropped, %d folded, %d permuted, %d external)\n",
            model, (long long)info.ir_version, (long long)info.opset, g->n_nodes, (long long)qt_graph_param_count(g),
            fig.eval, train ? "" : "(n/a) ", fig.train, fig.loss, fig.n_grads, fig.grad, fig.stats, info.dropped,
            info.folded, info.permuted, info.external);
  qt_ctx_free(ctx);
  free(x), free(want);
  qt_graph_free(g);
}

static void check_model(const char *model, int preset, const char *want_name, int train) {
  check_model_in("tests/onnx/models/", model, preset, want_name, train, NULL);
}

/* What the import reports about a file: IR version, opset, external initializers, BN nodes. */
static void expect_info(const char *dir, const char *model, int64_t ir, int64_t opset, int external, int batch_norms) {
  qt_onnx_info info;
  qt_graph *g = import_model(dir, model, &info);
  if (!g) return;
  if (info.ir_version != ir || info.opset != opset || info.external != external || info.batch_norms != batch_norms)
    qt_test_fail(
        "%s: IR %lld, opset %lld, %d external initializers, %d BatchNormalization nodes; want %lld, %lld, %d, "
        "%d",
        model, (long long)info.ir_version, (long long)info.opset, info.external, info.batch_norms, (long long)ir,
        (long long)opset, external, batch_norms);
  qt_graph_free(g);
}

int main(void) {
  /* torch 1.13's exports (tests/onnx/make_onnx_models.py) */
  check_model("fashion_cnn", 1, "fc1", 1);
  check_model("fashion_mlp", 1, "fc1", 1);
  check_model("res_cnn", 1, "block1.add", 1);
  check_model("mobilenet", 0, "block.dw.relu", 1);
  check_model("mobilenet_eval", 0, "block.dw.conv", 0); /* the eval export folded every BN */
  check_model("tiny_features", 0, "MatMul", 1);
  /* torch 1.13's export of the element-wise activations (tests/onnx/make_act_models.py) */
  ref_name = "act_ref.h5";
  check_model("act_cnn", 0, "u1.u1.2", 1);
  /* squeeze-excite (1x1 convs of a pooled vector, Mul by it) and GELU as Div, Erf, Add, Mul, Mul */
  check_model("se_cnn", 0, "se1.fc1", 1);
  /* Concat along channels (Fire modules, three branches) and of two pooled vectors */
  check_model("cat_cnn", 0, "fire1", 1);
  /* ShuffleNetV2's units: chunk (Slice), Concat, channel shuffle (Reshape, Transpose, Reshape) */
  check_model("shuffle_cnn", 0, "stage.stage.1.Reshape_1", 1);
  /* a vision transformer: patch tokens, position embedding, LayerNormalization, per-token MatMul,
   * multi-head attention written out (Reshape, Transpose, MatMul, Mul, Softmax), the mean token */
  check_model("vit", 0, "blocks.0.attn.q", 1);
  /* Mul, Add, Sub (either order) and Div of an activation and a constant scalar: affine, div */
  check_model("arith_cnn", 0, "Sub_1", 1);
  /* PRelu with one slope ([1]) and one per channel ([C, 1, 1]): prelu, its slopes learned */
  check_model("prelu_cnn", 0, "p2", 1);
  /* Resize by 2: nearest (asymmetric, floor) and bilinear (half_pixel), as nn.Upsample exports */
  check_model("resize_cnn", 0, "up2", 1);
  /* torch 2.x's exports of nn.MultiheadAttention in torchvision's ViT blocks (tests/onnx/make_mha_models.py):
   * the TorchScript exporter's (training mode, shapes computed from Shape) and the dynamo exporter's (eval mode,
   * constant shapes, k^T through Reshape / Transpose / Reshape, external data) */
  ref_name = "mha_ref.h5";
  check_model("mha_vit", 0, "blocks.0.self_attention.in_proj", 1);
  check_model("mha_vit_d", 0, "blocks.1.self_attention.in_proj", 0);
  /* torchvision's VisionTransformer: a class token (Expand, Concat: prepend_token) and x[:, 0] (first_token) */
  check_model("mha_vit_cls", 0, "class_token", 1);
  check_model("mha_vit_cls_d", 0, "class_token", 0);
  /* timm's ViT as written: its packed q, k, v (Reshape to 5-D, Transpose, Split or Slice, Squeeze) */
  check_model("mha_timm", 0, "blocks.0.attn.qkv", 1);
  check_model("mha_timm_d", 0, "blocks.0.attn.qkv", 0);
  /* torch 2.x's exports, the opset forms and external data (tests/onnx/make_torch2_models.py) */
  ref_name = "onnx2_ref.h5";
  check_model_in("tests/onnx/models/", "t2_fashion_cnn", 0, "fc1", 1, "fashion_cnn");
  check_model_in("tests/onnx/models/", "t2_mobilenet", 0, "block.dw.conv", 1, "mobilenet");
  check_model("t2_fashion_cnn_opt", 0, "fc1", 0); /* optimize=True folded BN */
  check_model("t2_mobilenet_opt", 0, "block.dw.conv", 0);
  check_model("forms_opset11", 0, NULL, 0);
  check_model("forms_opset13", 0, NULL, 0);
  check_model("forms_opset18", 0, NULL, 0);
  check_model("forms_opset22", 0, NULL, 0);
  check_model_in("tests/onnx/bad/", "ext_ok", 0, NULL, 0, NULL);
  expect_info("tests/onnx/models/", "t2_mobilenet", 10, 20, 21, 8);
  expect_info("tests/onnx/models/", "t2_fashion_cnn", 10, 20, 0, 2);
  expect_info("tests/onnx/models/", "t2_fashion_cnn_opt", 10, 20, 0, 0);
  expect_info("tests/onnx/models/", "forms_opset11", 6, 11, 0, 0);
  expect_info("tests/onnx/models/", "forms_opset22", 10, 22, 0, 0);
  expect_info("tests/onnx/bad/", "ext_ok", 7, 13, 1, 0);
  return qt_test_finish();
}
