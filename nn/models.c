/* Model presets (docs/training.md: presets) and the human-readable and Graphviz dumps. */
#include "nn/nn.h"

#include <string.h>

/* The graph with output x, or NULL (freed) with err. */
static qt_graph *finish(qt_graph *g, int x, char *err) {
  if (qt_graph_finalize(g, x, err)) {
    qt_graph_free(g);
    return NULL;
  }
  return g;
}

/* A 3x3 convolution (pad 1, no bias) to `channels`, then batch norm and ReLU, with their names. */
static int conv_bn_relu(qt_graph *g, const char *conv, const char *bn, const char *relu, int x, int channels,
                        int stride) {
  x = qt_graph_conv2d(g, conv, x, channels, 3, stride, 1, 1, 0);
  x = qt_graph_batch_norm(g, bn, x);
  return qt_graph_relu(g, relu, x);
}

/* FashionCNN: conv 1->32 3x3 pad 1 (no bias) + BN + ReLU, max-pool 2; conv 32->64 3x3 pad 1
 * (no bias) + BN + ReLU, max-pool 2; flatten 3136; linear 3136->128 + ReLU; linear 128->10. */
static qt_graph *fashion_cnn(char *err) {
  qt_graph *g = qt_graph_create("fashion_cnn");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  x = conv_bn_relu(g, "conv1", "bn1", "relu1", x, 32, 1);
  x = qt_graph_max_pool2d(g, "pool1", x, 2, 2, 0);
  x = conv_bn_relu(g, "conv2", "bn2", "relu2", x, 64, 1);
  x = qt_graph_max_pool2d(g, "pool2", x, 2, 2, 0);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc1", x, 128, 1);
  x = qt_graph_relu(g, "relu3", x);
  x = qt_graph_linear(g, "fc2", x, 10, 1);
  return finish(g, x, err);
}

/* FashionMLP: 784 -> 256 ReLU -> 10. */
static qt_graph *fashion_mlp(char *err) {
  qt_graph *g = qt_graph_create("fashion_mlp");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc1", x, 256, 1);
  x = qt_graph_relu(g, "relu1", x);
  x = qt_graph_linear(g, "fc2", x, 10, 1);
  return finish(g, x, err);
}

/* A basic residual block: conv-bn-relu-conv-bn, add the shortcut, relu. */
static int res_block(qt_graph *g, const char *prefix, int x, int channels) {
  char name[QT_NAME_LEN];
#define NM(s) (snprintf(name, sizeof name, "%s.%s", prefix, s), name)
  char conv[QT_NAME_LEN], bn[QT_NAME_LEN];
  snprintf(conv, sizeof conv, "%s.conv1", prefix);
  snprintf(bn, sizeof bn, "%s.bn1", prefix);
  int y = conv_bn_relu(g, conv, bn, NM("relu1"), x, channels, 1);
  y = qt_graph_conv2d(g, NM("conv2"), y, channels, 3, 1, 1, 1, 0);
  y = qt_graph_batch_norm(g, NM("bn2"), y);
  y = qt_graph_add(g, NM("add"), y, x);
  return qt_graph_relu(g, NM("relu2"), y);
#undef NM
}

/* ResCNN: stem conv 1->16 + BN + ReLU; residual block 16; conv 16->32 stride 2 + BN + ReLU;
 * residual block 32; global average pool; linear 32->10. Small, and exercises add. */
static qt_graph *res_cnn(char *err) {
  qt_graph *g = qt_graph_create("res_cnn");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  x = conv_bn_relu(g, "stem.conv", "stem.bn", "stem.relu", x, 16, 1);
  x = res_block(g, "block1", x, 16);
  x = conv_bn_relu(g, "down.conv", "down.bn", "down.relu", x, 32, 2);
  x = res_block(g, "block2", x, 32);
  x = qt_graph_global_avg_pool(g, "gap", x);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  return finish(g, x, err);
}

static const struct {
  const char *name;
  qt_graph *(*build)(char *err);
} presets[] = {{"fashion_cnn", fashion_cnn}, {"fashion_mlp", fashion_mlp}, {"res_cnn", res_cnn}};

const char *qt_model_names(void) { return "fashion_cnn|fashion_mlp|res_cnn"; }

qt_graph *qt_model_build(const char *name, char *err) {
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(presets[i].name, name) == 0) return presets[i].build(err);
  snprintf(err, QT_ERR_LEN, "unknown model '%s' (known: %s)", name, qt_model_names());
  return NULL;
}

static void shape_str(const qt_value *v, char *buf, size_t n) {
  if (v->ndim == 3)
    snprintf(buf, n, "%lldx%lldx%lld", (long long)v->shape[0], (long long)v->shape[1], (long long)v->shape[2]);
  else
    snprintf(buf, n, "%lld", (long long)v->shape[0]);
}

int qt_graph_write_dot(const qt_graph *g, FILE *f) {
  fprintf(f, "digraph \"%s\" {\n  rankdir=TB;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n", g->name);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    char shape[64];
    shape_str(&g->values[n->output], shape, sizeof shape);
    fprintf(f, "  n%d [label=\"%s\\n%s\\n[N, %s]", i, n->name, qt_op_name(n->op), shape);
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      if (n->param[k] >= 0) {
        const qt_param *p = &g->tensors[n->param[k]];
        size_t len = strlen(n->name);
        const char *suffix = strncmp(p->name, n->name, len) == 0 && p->name[len] == '.' ? p->name + len + 1 : p->name;
        fprintf(f, "\\n%s (", suffix);
        for (int d = 0; d < p->ndim; d++) fprintf(f, "%s%lld", d ? "x" : "", (long long)p->shape[d]);
        fprintf(f, ")");
      }
    const qt_qstate *qs[2] = {n->q, n->wq};
    for (int k = 0; k < 2; k++)
      if (qs[k])
        fprintf(f, "\\n%s%s%d [%d, %d]%s%s", k ? "weight " : "", qs[k]->spec.is_signed ? "s" : "u", qs[k]->spec.bits,
                qs[k]->spec.qmin, qs[k]->spec.qmax, qs[k]->spec.per_channel ? " per-channel" : "",
                qs[k]->qweight ? " (integers)" : "");
    const int quant = n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_QUANTIZE || n->op == QT_OP_DEQUANTIZE;
    fprintf(f, "\"%s];\n",
            n->op == QT_OP_INPUT ? ", shape=ellipse"
            : quant              ? ", style=\"rounded,filled\", fillcolor=\"#e8f0ff\""
                                 : "");
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    for (int k = 0; k < n->n_inputs; k++) fprintf(f, "  n%d -> n%d;\n", g->values[n->inputs[k]].producer, i);
  }
  fprintf(f, "}\n");
  return ferror(f) ? -1 : 0;
}

void qt_graph_print(const qt_graph *g, FILE *f) {
  fprintf(f, "graph %s: %d nodes, %lld parameters\n", g->name, g->n_nodes, (long long)qt_graph_param_count(g));
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    char shape[64];
    shape_str(&g->values[n->output], shape, sizeof shape);
    int64_t np = 0;
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      if (n->param[k] >= 0) np += g->tensors[n->param[k]].numel;
    fprintf(f, "  %-16s %-16s -> %-12s params %lld\n", n->name, qt_op_name(n->op), shape, (long long)np);
  }
}
