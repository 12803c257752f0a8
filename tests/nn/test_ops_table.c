/* The op table (nn/ops.c) and qt_node_forward: every op's name parses back to it; the flags
 * (has_weight, stateful, parameter-free, the weight's rank, activation quantization, the graphs
 * holding the op) and slots are the ones the rest of the code assumes;
 * shape inference computes the builder's shapes and refuses what does not fit with the
 * validator's messages; the builder names tensors with the table's suffixes; and recomputing
 * every node of the preset models with qt_node_forward from the executor's own inputs gives
 * bit-identical values (the executor runs through it), while ops it does not compute are
 * refused with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "tests/common/testutil.h"

static void check_names_and_flags(void) {
  for (int op = 0; op < QT_OP_COUNT; op++) {
    const qt_op_info *info = qt_op_info_get((qt_op)op);
    qt_op back;
    if (!info->name || qt_op_parse(info->name, &back) || back != (qt_op)op || strcmp(qt_op_name((qt_op)op), info->name))
      qt_test_fail("op %d: name '%s' does not parse back", op, info->name ? info->name : "(null)");
    if (info->min_inputs > info->max_inputs || info->max_inputs > QT_MAX_INPUTS)
      qt_test_fail("op %s: inputs %d..%d", info->name, info->min_inputs, info->max_inputs);
    const int weight = op == QT_OP_CONV2D || op == QT_OP_LINEAR || op == QT_OP_CONV_BN;
    const int stateful = op == QT_OP_BATCH_NORM || op == QT_OP_CONV_BN || op == QT_OP_FAKE_QUANT || op == QT_OP_DROPOUT;
    const int simple = op == QT_OP_RELU || op == QT_OP_RELU6 || op == QT_OP_MAX_POOL2D || op == QT_OP_AVG_POOL2D ||
                       op == QT_OP_GLOBAL_AVG_POOL || op == QT_OP_FLATTEN || op == QT_OP_ADD ||
                       op == QT_OP_ACTIVATION || op == QT_OP_MUL || op == QT_OP_CONCAT || op == QT_OP_CHANNEL_SHUFFLE ||
                       op == QT_OP_CHANNEL_SLICE || op == QT_OP_ATTENTION || op == QT_OP_RESIZE ||
                       op == QT_OP_FIRST_TOKEN;
    if (qt_op_has_weight((qt_op)op) != weight || qt_op_is_stateful((qt_op)op) != stateful ||
        qt_op_is_param_free((qt_op)op) != simple)
      qt_test_fail("op %s: flags has_weight %d stateful %d param_free %d", info->name, qt_op_has_weight((qt_op)op),
                   qt_op_is_stateful((qt_op)op), qt_op_is_param_free((qt_op)op));
    const int rank = op == QT_OP_CONV2D || op == QT_OP_CONV_BN ? 4 : op == QT_OP_LINEAR ? 2 : 0;
    const int act_quant = op == QT_OP_FAKE_QUANT || op == QT_OP_QUANTIZE || op == QT_OP_DEQUANTIZE;
    const int graphs = op == QT_OP_FAKE_QUANT || op == QT_OP_CONV_BN    ? QT_OP_PREPARED_ONLY
                       : op == QT_OP_QUANTIZE || op == QT_OP_DEQUANTIZE ? QT_OP_CONVERT_ONLY
                                                                        : QT_OP_ANY_GRAPH;
    if (info->weight_rank != rank || info->act_quant != act_quant || info->graphs != graphs)
      qt_test_fail("op %s: weight_rank %d act_quant %d graphs %d", info->name, info->weight_rank, info->act_quant,
                   info->graphs);
    if (weight &&
        (info->param_use[QT_P_WEIGHT] != QT_SLOT_REQUIRED || strcmp(info->param_suffix[QT_P_WEIGHT], "weight")))
      qt_test_fail("op %s: the weight slot", info->name);
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      if ((info->param_use[k] != QT_SLOT_NONE) != (info->param_suffix[k] != NULL) ||
          (info->buffer_use[k] != QT_SLOT_NONE) != (info->buffer_suffix[k] != NULL))
        qt_test_fail("op %s: slot %d has a use without a suffix or the reverse", info->name, k);
    if ((info->shape == NULL) != (op == QT_OP_INPUT)) qt_test_fail("op %s: shape function", info->name);
  }
  qt_op out;
  QT_CHECK(qt_op_parse("sigmoid", &out) == -1);
  QT_CHECK(!qt_op_has_weight(QT_OP_COUNT) && strcmp(qt_op_name(QT_OP_COUNT), "?") == 0);
  const qt_op_info *bn = qt_op_info_get(QT_OP_BATCH_NORM), *cbn = qt_op_info_get(QT_OP_CONV_BN);
  QT_CHECK(!strcmp(bn->param_suffix[QT_P_GAMMA], "weight") &&
           !strcmp(bn->buffer_suffix[QT_B_RUNNING_VAR], "running_var"));
  QT_CHECK(!strcmp(cbn->param_suffix[QT_P_BN_GAMMA], "bn.weight") &&
           !strcmp(cbn->buffer_suffix[QT_B_RUNNING_MEAN], "bn.running_mean") &&
           cbn->param_use[QT_P_BIAS] == QT_SLOT_OPTIONAL);
}

static void expect_shape(const char *what, qt_op op, const qt_node_attrs *a, const qt_value *const *in, int n_in,
                         int want_nd, const int64_t *want, const char *needle) {
  char err[QT_ERR_LEN] = "";
  int nd = -1;
  int64_t shape[3] = {0, 0, 0};
  const int rc = qt_op_output_shape(op, a, in, n_in, &nd, shape, err);
  if (needle) {
    if (rc == 0 || !strstr(err, needle))
      qt_test_fail("%s: rc %d, message '%s', want one with '%s'", what, rc, err, needle);
    return;
  }
  if (rc) {
    qt_test_fail("%s: %s", what, err);
    return;
  }
  int same = nd == want_nd;
  for (int d = 0; same && d < nd; d++) same = shape[d] == want[d];
  if (!same)
    qt_test_fail("%s: rank %d (%lld, %lld, %lld), want rank %d", what, nd, (long long)shape[0], (long long)shape[1],
                 (long long)shape[2], want_nd);
}

static void check_shapes(void) {
  const qt_value img = {.name = "x", .ndim = 3, .shape = {28, 28, 1}},
                 img2 = {.name = "y", .ndim = 3, .shape = {28, 28, 2}}, flat = {.name = "f", .ndim = 1, .shape = {784}};
  const qt_value *x[2] = {&img, &img}, *xy[2] = {&img, &img2}, *f[1] = {&flat};
  const qt_node_attrs conv = {.kernel_h = 3,
                              .kernel_w = 3,
                              .stride_h = 1,
                              .stride_w = 1,
                              .pad_h = 1,
                              .pad_w = 1,
                              .groups = 1,
                              .out_channels = 32};
  const qt_node_attrs pool = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
  const qt_node_attrs big = {.kernel_h = 31, .kernel_w = 31, .stride_h = 1, .stride_w = 1};
  const qt_node_attrs lin = {.out_channels = 10}, none = {0};
  expect_shape("conv", QT_OP_CONV2D, &conv, x, 1, 3, (int64_t[]){28, 28, 32}, NULL);
  expect_shape("conv_bn", QT_OP_CONV_BN, &conv, x, 1, 3, (int64_t[]){28, 28, 32}, NULL);
  expect_shape("pool", QT_OP_MAX_POOL2D, &pool, x, 1, 3, (int64_t[]){14, 14, 1}, NULL);
  expect_shape("gap", QT_OP_GLOBAL_AVG_POOL, &none, x, 1, 1, (int64_t[]){1}, NULL);
  expect_shape("flatten", QT_OP_FLATTEN, &none, x, 1, 1, (int64_t[]){784}, NULL);
  expect_shape("linear", QT_OP_LINEAR, &lin, f, 1, 1, (int64_t[]){10}, NULL);
  expect_shape("add", QT_OP_ADD, &none, x, 2, 3, (int64_t[]){28, 28, 1}, NULL);
  expect_shape("relu arity", QT_OP_RELU, &none, x, 2, 0, NULL, "op 'relu' takes 1 input(s), has 2");
  expect_shape("activation", QT_OP_ACTIVATION, &(qt_node_attrs){.act = QT_ACT_ELU, .alpha = 0.5f}, x, 1, 3,
               (int64_t[]){28, 28, 1}, NULL);
  expect_shape("resize", QT_OP_RESIZE, &(qt_node_attrs){.stride_h = 2, .stride_w = 2, .mode = QT_RESIZE_BILINEAR}, x,
               1, 3, (int64_t[]){56, 56, 1}, NULL);
  expect_shape("resize scales", QT_OP_RESIZE, &(qt_node_attrs){.stride_h = 3, .stride_w = 2}, x, 1, 0, NULL,
               "scales 3 x 2; only 2 x 2 is supported");
  expect_shape("resize mode", QT_OP_RESIZE, &(qt_node_attrs){.stride_h = 2, .stride_w = 2, .mode = 7}, x, 1, 0, NULL,
               "mode 7 is neither nearest (0) nor bilinear (1)");
  expect_shape("prelu", QT_OP_PRELU, &(qt_node_attrs){.out_channels = 1}, x, 1, 3, (int64_t[]){28, 28, 1}, NULL);
  expect_shape("prelu slopes", QT_OP_PRELU, &(qt_node_attrs){.out_channels = 4}, x, 1, 0, NULL,
               "4 slopes for 1 channels (1, or one per channel)");
  expect_shape("activation kind", QT_OP_ACTIVATION, &(qt_node_attrs){.act = QT_ACT_COUNT}, x, 1, 0, NULL,
               "activation kind 11 is not one of 0..10");
  expect_shape("activation alpha", QT_OP_ACTIVATION, &(qt_node_attrs){.act = QT_ACT_ELU, .alpha = INFINITY}, x, 1, 0,
               NULL, "elu: alpha inf and beta 0 must be finite");
  expect_shape("add shapes", QT_OP_ADD, &none, xy, 2, 0, NULL, "add inputs 'x' and 'y' differ in shape");
  const qt_value gate = {.name = "g", .ndim = 1, .shape = {2}};
  const qt_value *se[2] = {&img2, &gate}, *se_bad[2] = {&img, &gate}, *se_rev[2] = {&gate, &img2};
  expect_shape("mul", QT_OP_MUL, &none, x, 2, 3, (int64_t[]){28, 28, 1}, NULL);
  expect_shape("mul by channels", QT_OP_MUL, &none, se, 2, 3, (int64_t[]){28, 28, 2}, NULL);
  expect_shape("mul channels", QT_OP_MUL, &none, se_bad, 2, 0, NULL,
               "mul inputs 'x' and 'g' neither have one shape nor are an image and a vector of its channels");
  expect_shape("mul order", QT_OP_MUL, &none, se_rev, 2, 0, NULL, "mul inputs 'g' and 'y' neither");
  expect_shape("mul arity", QT_OP_MUL, &none, x, 1, 0, NULL, "op 'mul' takes 2 input(s), has 1");
  const qt_value *cat3[3] = {&img, &img2, &img}, *cat_bad[2] = {&img, &flat};
  expect_shape("concat", QT_OP_CONCAT, &none, cat3, 3, 3, (int64_t[]){28, 28, 4}, NULL);
  expect_shape("concat flat", QT_OP_CONCAT, &none, (const qt_value *const[]){&flat, &gate}, 2, 1, (int64_t[]){786},
               NULL);
  expect_shape("concat rank", QT_OP_CONCAT, &none, cat_bad, 2, 0, NULL,
               "concat inputs 'x' and 'f' differ in rank or in a dimension other than the last");
  expect_shape("concat arity", QT_OP_CONCAT, &none, x, 1, 0, NULL, "op 'concat' takes 2 to 4 inputs, has 1");
  const qt_value img6 = {.name = "z", .ndim = 3, .shape = {7, 7, 6}};
  const qt_value *z[1] = {&img6};
  expect_shape("shuffle", QT_OP_CHANNEL_SHUFFLE, &(qt_node_attrs){.groups = 3}, z, 1, 3, (int64_t[]){7, 7, 6}, NULL);
  expect_shape("shuffle groups", QT_OP_CHANNEL_SHUFFLE, &(qt_node_attrs){.groups = 4}, z, 1, 0, NULL,
               "channel_shuffle: 4 groups do not divide the 6 channels of 'z'");
  expect_shape("slice", QT_OP_CHANNEL_SLICE, &(qt_node_attrs){.begin = 2, .end = 5}, z, 1, 3, (int64_t[]){7, 7, 3},
               NULL);
  expect_shape("slice range", QT_OP_CHANNEL_SLICE, &(qt_node_attrs){.begin = 4, .end = 7}, z, 1, 0, NULL,
               "channel_slice: channels [4, 7) of the 6 of 'z'");
  const qt_value *qkv[3] = {&img6, &img6, &img6}, *qkv_bad[3] = {&img6, &img6, &img};
  expect_shape("attention", QT_OP_ATTENTION, &(qt_node_attrs){.heads = 3}, qkv, 3, 3, (int64_t[]){7, 7, 6}, NULL);
  expect_shape("attention heads", QT_OP_ATTENTION, &(qt_node_attrs){.heads = 4}, qkv, 3, 0, NULL,
               "attention: 4 heads do not divide the 6 channels of 'z'");
  expect_shape("attention shapes", QT_OP_ATTENTION, &(qt_node_attrs){.heads = 1}, qkv_bad, 3, 0, NULL,
               "attention inputs 'z' and 'x' differ in shape");
  const qt_value *flat3[3] = {&flat, &flat, &flat};
  expect_shape("attention flat", QT_OP_ATTENTION, &(qt_node_attrs){.heads = 1}, flat3, 3, 0, NULL,
               "attention input 'f' is not an image");
  expect_shape("layer_norm", QT_OP_LAYER_NORM, &(qt_node_attrs){.eps = 1e-6f}, z, 1, 3, (int64_t[]){7, 7, 6}, NULL);
  expect_shape("layer_norm eps", QT_OP_LAYER_NORM, &none, z, 1, 0, NULL, "layer_norm: eps 0 must be finite and > 0");
  expect_shape("add_param", QT_OP_ADD_PARAM, &none, z, 1, 3, (int64_t[]){7, 7, 6}, NULL);
  expect_shape("prepend_token", QT_OP_PREPEND_TOKEN, &none, z, 1, 3, (int64_t[]){1, 50, 6}, NULL);
  expect_shape("prepend_token flat", QT_OP_PREPEND_TOKEN, &none, flat3, 1, 0, NULL,
               "prepend_token input 'f' is not an image");
  expect_shape("first_token", QT_OP_FIRST_TOKEN, &none, z, 1, 1, (int64_t[]){6}, NULL);
  expect_shape("first_token flat", QT_OP_FIRST_TOKEN, &none, flat3, 1, 0, NULL, "first_token input 'f' is not an image");
  expect_shape("pool fit", QT_OP_AVG_POOL2D, &big, x, 1, 0, NULL, "kernel 31 stride 1 pad 0 do not fit input 28x28");
  expect_shape(
      "conv fit", QT_OP_CONV2D,
      &(qt_node_attrs){.kernel_h = 31, .kernel_w = 31, .stride_h = 1, .stride_w = 1, .groups = 1, .out_channels = 4}, x,
      1, 0, NULL, "kernel 31x31 stride 1x1 pad 0x0 do not fit input 28x28");
  expect_shape("linear rank", QT_OP_LINEAR, &lin, x, 1, 0, NULL, "insert a flatten");
  expect_shape("conv rank", QT_OP_CONV2D, &conv, f, 1, 0, NULL, "conv2d input 'f' is not an image");
}

/* Each node recomputed with qt_node_forward from the executor's inputs equals the executor's
 * value bit for bit; ops it does not compute are refused. */
static void check_node_forward(const char *model) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 3);
  qt_graph_set_training(g, 0);
  const qt_value *in = &g->values[g->input];
  const int64_t xs[4] = {2, in->shape[0], in->shape[1], in->shape[2]};
  const int64_t xn = xs[0] * xs[1] * xs[2] * xs[3];
  float *xd = malloc((size_t)xn * sizeof(float));
  QT_ASSERT(xd, "out of memory");
  qt_test_fill_uniform(xd, xn, -1.0f, 1.0f, 5);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_tensor **vals = NULL;
  QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, xs, xd), &vals), "%s", g->error);
  /* The executor runs relu and batch_norm in place over a value they alone read, so such a
   * value is compared through its reader; the chain below never works in place. */
  qt_tensor **mine = calloc((size_t)g->n_values, sizeof *mine);
  QT_ASSERT(mine, "out of memory");
  mine[g->input] = vals[g->input];
  int checked = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    qt_tensor *ins[QT_MAX_INPUTS];
    for (int k = 0; k < n->n_inputs; k++) ins[k] = mine[n->inputs[k]];
    err[0] = 0;
    qt_tensor *y = qt_node_forward(g, ctx, i, ins, 0, err);
    if (n->op == QT_OP_INPUT) {
      if (y || !strstr(err, "is not an fp32 op")) qt_test_fail("%s: input node: '%s'", model, err);
      continue;
    }
    if (!y) {
      qt_test_fail("%s: node %d '%s': %s", model, i, n->name, err);
      break;
    }
    mine[n->output] = y;
    const int v = n->output, reader = qt_graph_sole_consumer(g, v);
    const int overwritten =
        reader >= 0 && (g->nodes[reader].op == QT_OP_RELU || g->nodes[reader].op == QT_OP_BATCH_NORM);
    if (overwritten) continue;
    const qt_tensor *want = vals[v];
    if (qt_tensor_numel(y) != qt_tensor_numel(want) ||
        memcmp(y->data, want->data, (size_t)qt_tensor_numel(y) * sizeof(float))) {
      qt_test_fail("%s: node %d '%s' (%s): qt_node_forward differs from the executor", model, i, n->name,
                   qt_op_name(n->op));
      continue;
    }
    checked++;
  }
  free(mine);
  if (checked < 3) qt_test_fail("%s: only %d nodes recomputed", model, checked);
  qt_ctx_free(ctx);
  free(xd);
  qt_graph_free(g);
}

static void check_builder_suffixes(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  QT_ASSERT(g, "%s", err);
  const char *want[] = {"conv1.weight",    "bn1.weight", "bn1.bias", "bn1.running_mean",
                        "bn1.running_var", "fc1.weight", "fc1.bias"};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
    if (qt_graph_find_tensor(g, want[k]) < 0) qt_test_fail("fashion_cnn has no tensor '%s'", want[k]);
  QT_CHECK(qt_graph_find_tensor(g, "conv1.bias") < 0); /* conv without bias: the optional slot stays empty */
  qt_graph_free(g);
}

int main(void) {
  check_names_and_flags();
  check_shapes();
  check_builder_suffixes();
  char names[256];
  snprintf(names, sizeof names, "%s", qt_model_names());
  for (char *save = NULL, *m = strtok_r(names, "|", &save); m; m = strtok_r(NULL, "|", &save)) check_node_forward(m);
  return qt_test_finish();
}
