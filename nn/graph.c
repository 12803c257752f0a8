/* Graph IR: builder, finalize (slabs), initialization, mode switch and queries. The executor is
 * exec.c (its fusion decisions fuse.c), one node's computation node.c. */
#include "nn/nn.h"
#include "base/base.h"
#include "nn/names.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

qt_graph *qt_graph_create(const char *name) {
  qt_graph *g = calloc(1, sizeof *g);
  QT_ASSERT(g, "out of memory");
  snprintf(g->name, sizeof g->name, "%s", name);
  g->input = g->output = -1;
  return g;
}

void qt_graph_free(qt_graph *g) {
  if (!g) return;
  for (int i = 0; i < g->n_nodes; i++) {
    if (!g->nodes[i].q_tied) qt_qstate_free(g->nodes[i].q);
    qt_qstate_free(g->nodes[i].wq);
  }
  QT_FREE_ALL(g->nodes, g->values, g->tensors, g->params, g->grads, g->buffers);
  qt_node_names_free(g);
  free(g);
}

static int builder_error(qt_graph *g, const char *fmt, ...) {
  if (g->error[0]) return -1;
  QT_VFORMAT(g->error, fmt);
  return -1;
}

static int check_value(qt_graph *g, const char *name, int x) {
  if (g->error[0]) return -1;
  if (g->finalized) return builder_error(g, "graph %s: node %s added after finalize", g->name, name);
  if (x < 0 || x >= g->n_values) return builder_error(g, "node %s: input value %d does not exist", name, x);
  return 0;
}

static int new_value(qt_graph *g, const char *name, int ndim, const int64_t *shape, int producer) {
  g->values = qt_grow(g->values, &g->cap_values, g->n_values + 1, sizeof *g->values, "a graph table");
  qt_value *v = &g->values[g->n_values];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->ndim = ndim;
  for (int i = 0; i < ndim; i++) v->shape[i] = shape[i];
  v->producer = producer;
  return g->n_values++;
}

static qt_node *new_node(qt_graph *g, qt_op op, const char *name, const int *inputs, int n_inputs) {
  if (qt_node_names_find(g, name) >= 0) {
    builder_error(g, "graph %s: two nodes named '%s'", g->name, name);
    return NULL;
  }
  if (strlen(name) >= QT_NAME_LEN) {
    builder_error(g, "graph %s: node name '%s' longer than %d characters", g->name, name, QT_NAME_LEN - 1);
    return NULL;
  }
  g->nodes = qt_grow(g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes, "a graph table");
  qt_node *n = &g->nodes[g->n_nodes++];
  memset(n, 0, sizeof *n);
  n->op = op;
  snprintf(n->name, sizeof n->name, "%s", name);
  for (int i = 0; i < n_inputs; i++) {
    n->inputs[i] = inputs[i];
    g->values[inputs[i]].consumers++;
  }
  n->n_inputs = n_inputs;
  for (int i = 0; i < QT_MAX_PARAMS; i++) n->param[i] = n->buffer[i] = -1;
  n->training = 1;
  qt_node_names_add(g, g->n_nodes - 1);
  return n;
}

static int new_tensor(qt_graph *g, int node, const char *suffix, int ndim, const int64_t *shape, int is_buffer) {
  g->tensors = qt_grow(g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors, "a graph table");
  qt_param *p = &g->tensors[g->n_tensors];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s.%s", g->nodes[node].name, suffix);
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) {
    p->shape[i] = shape[i];
    p->numel *= shape[i];
  }
  p->is_buffer = is_buffer;
  p->node = node;
  p->tape_at = -1;
  return g->n_tensors++;
}

int qt_graph_input(qt_graph *g, const char *name, int h, int w, int c) {
  if (g->error[0]) return -1;
  if (g->input >= 0) return builder_error(g, "graph %s: a second input '%s'", g->name, name);
  if (h < 1 || w < 1 || c < 1) return builder_error(g, "input %s: bad shape %dx%dx%d", name, h, w, c);
  qt_node *n = new_node(g, QT_OP_INPUT, name, NULL, 0);
  if (!n) return -1;
  int64_t shape[3] = {h, w, c};
  n->output = new_value(g, name, 3, shape, g->n_nodes - 1);
  g->input = n->output;
  return n->output;
}

/* The builders' common path: checks the inputs, infers the output shape with the op table,
 * adds the node and the tensors of its slots (in slot order, parameters first): slot
 * QT_P_WEIGHT of a layer with a weight takes wshape, that of an op whose parameter is per sample
 * (add_param) the output's per-sample shape, every other slot is a vector over the output
 * channels; an optional slot is made only when `optional` asks for it. */
static int build(qt_graph *g, qt_op op, const char *name, const int *inputs, int n_inputs, const qt_node_attrs *attr,
                 int wndim, const int64_t *wshape, int optional) {
  const qt_value *in[QT_MAX_INPUTS];
  for (int i = 0; i < n_inputs; i++) {
    if (check_value(g, name, inputs[i])) return -1;
    in[i] = &g->values[inputs[i]];
  }
  const qt_op_info *info = qt_op_info_get(op);
  char why[QT_ERR_LEN];
  int ndim = 0;
  int64_t shape[3];
  if (qt_op_output_shape(op, attr, in, n_inputs, &ndim, shape, why))
    return builder_error(g, "%s %s: %s", info->name, name, why);
  qt_node *n = new_node(g, op, name, inputs, n_inputs);
  if (!n) return -1;
  const int id = g->n_nodes - 1;
  n->attr = *attr;
  const int64_t channels[1] = {info->param_count_attr ? attr->out_channels : shape[ndim - 1]};
  for (int b = 0; b < 2; b++)
    for (int k = 0; k < QT_MAX_PARAMS; k++) {
      const int use = b ? info->buffer_use[k] : info->param_use[k];
      if (use == QT_SLOT_NONE || (use == QT_SLOT_OPTIONAL && !optional)) continue;
      const int is_weight = !b && k == QT_P_WEIGHT && info->has_weight,
                per_sample = !b && k == QT_P_WEIGHT && info->param_per_sample;
      const int t = new_tensor(g, id, b ? info->buffer_suffix[k] : info->param_suffix[k],
                               is_weight    ? wndim
                               : per_sample ? ndim
                                            : 1,
                               is_weight    ? wshape
                               : per_sample ? shape
                                            : channels,
                               b);
      if (b)
        g->nodes[id].buffer[k] = t;
      else
        g->nodes[id].param[k] = t;
    }
  return g->nodes[id].output = new_value(g, name, ndim, shape, id);
}

/* The attributes of a square window: kernel, stride and pad the same in H and W. */
static qt_node_attrs square_window(int kernel, int stride, int pad) {
  return (qt_node_attrs){
      .kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad};
}

int qt_graph_conv2d(qt_graph *g, const char *name, int x, int out_channels, int kernel, int stride, int pad, int groups,
                    int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_value *v = &g->values[x];
  const int64_t C = v->ndim == 3 ? v->shape[2] : 1;
  qt_node_attrs attr = square_window(kernel, stride, pad);
  attr.groups = groups;
  attr.out_channels = out_channels;
  const int64_t ws[4] = {out_channels, groups >= 1 ? C / groups : 0, kernel, kernel};
  return build(g, QT_OP_CONV2D, name, &x, 1, &attr, 4, ws, bias);
}

int qt_graph_conv2d_attr(qt_graph *g, const char *name, int x, const qt_node_attrs *a, int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_value *v = &g->values[x];
  const int64_t C = v->ndim == 3 ? v->shape[2] : 1;
  const qt_node_attrs attr = {.kernel_h = a->kernel_h,
                              .kernel_w = a->kernel_w,
                              .stride_h = a->stride_h,
                              .stride_w = a->stride_w,
                              .pad_h = a->pad_h,
                              .pad_w = a->pad_w,
                              .groups = a->groups,
                              .out_channels = a->out_channels};
  const int64_t ws[4] = {a->out_channels, a->groups >= 1 ? C / a->groups : 0, a->kernel_h, a->kernel_w};
  return build(g, QT_OP_CONV2D, name, &x, 1, &attr, 4, ws, bias);
}

int qt_graph_batch_norm(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {.eps = 1e-5f, .momentum = 0.1f};
  return build(g, QT_OP_BATCH_NORM, name, &x, 1, &attr, 0, NULL, 0);
}

/* A node of inputs[0..n-1] and no attributes. */
static int no_attrs(qt_graph *g, qt_op op, const char *name, const int *inputs, int n) {
  const qt_node_attrs attr = {0};
  return build(g, op, name, inputs, n, &attr, 0, NULL, 0);
}
static int plain(qt_graph *g, qt_op op, const char *name, int x) { return no_attrs(g, op, name, &x, 1); }
int qt_graph_relu(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_RELU, name, x); }

int qt_graph_relu6(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_RELU6, name, x); }

int qt_graph_activation(qt_graph *g, const char *name, int x, qt_act a) {
  const qt_node_attrs attr = {.act = (int)a.kind, .alpha = a.alpha, .beta = a.beta};
  return build(g, QT_OP_ACTIVATION, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_pool2d(qt_graph *g, qt_op op, const char *name, int x, int kernel, int stride, int pad, int ceil) {
  qt_node_attrs attr = square_window(kernel, stride, pad);
  attr.ceil = ceil;
  return build(g, op, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_max_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad) {
  return qt_graph_pool2d(g, QT_OP_MAX_POOL2D, name, x, kernel, stride, pad, 0);
}
int qt_graph_avg_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad) {
  return qt_graph_pool2d(g, QT_OP_AVG_POOL2D, name, x, kernel, stride, pad, 0);
}

int qt_graph_global_avg_pool(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_GLOBAL_AVG_POOL, name, x); }

int qt_graph_flatten(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_FLATTEN, name, x); }

int qt_graph_linear(qt_graph *g, const char *name, int x, int out_features, int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_node_attrs attr = {.out_channels = out_features};
  const int64_t ws[2] = {out_features, g->values[x].shape[0]};
  return build(g, QT_OP_LINEAR, name, &x, 1, &attr, 2, ws, bias);
}

int qt_graph_add(qt_graph *g, const char *name, int a, int b) {
  return no_attrs(g, QT_OP_ADD, name, (const int[2]){a, b}, 2);
}

int qt_graph_mul(qt_graph *g, const char *name, int a, int b) {
  return no_attrs(g, QT_OP_MUL, name, (const int[2]){a, b}, 2);
}

int qt_graph_concat(qt_graph *g, const char *name, const int *inputs, int n) {
  return no_attrs(g, QT_OP_CONCAT, name, inputs, n);
}

int qt_graph_channel_shuffle(qt_graph *g, const char *name, int x, int groups) {
  const qt_node_attrs attr = {.groups = groups};
  return build(g, QT_OP_CHANNEL_SHUFFLE, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_channel_slice(qt_graph *g, const char *name, int x, int begin, int end) {
  const qt_node_attrs attr = {.begin = begin, .end = end};
  return build(g, QT_OP_CHANNEL_SLICE, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_dropout(qt_graph *g, const char *name, int x, float ratio) {
  const qt_node_attrs attr = {.ratio = ratio};
  return build(g, QT_OP_DROPOUT, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_layer_norm(qt_graph *g, const char *name, int x, float eps) {
  const qt_node_attrs attr = {.eps = eps};
  return build(g, QT_OP_LAYER_NORM, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_attention(qt_graph *g, const char *name, int q, int k, int v, int heads) {
  const qt_node_attrs attr = {.heads = heads};
  return build(g, QT_OP_ATTENTION, name, (const int[3]){q, k, v}, 3, &attr, 0, NULL, 0);
}

int qt_graph_add_param(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_ADD_PARAM, name, x); }

int qt_graph_resize(qt_graph *g, const char *name, int x, int mode) {
  const qt_node_attrs a = {.stride_h = 2, .stride_w = 2, .mode = mode};
  return build(g, QT_OP_RESIZE, name, &x, 1, &a, 0, NULL, 0);
}

int qt_graph_prepend_token(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_PREPEND_TOKEN, name, x); }
int qt_graph_first_token(qt_graph *g, const char *name, int x) { return plain(g, QT_OP_FIRST_TOKEN, name, x); }

int qt_graph_prelu(qt_graph *g, const char *name, int x, int slopes) {
  const qt_node_attrs a = {.out_channels = slopes};
  return build(g, QT_OP_PRELU, name, &x, 1, &a, 0, NULL, 0);
}

int qt_graph_alloc(qt_graph *g, char *err) {
  if (g->error[0]) {
    snprintf(err, QT_ERR_LEN, "%s", g->error);
    return -1;
  }
  if (g->input < 0) {
    snprintf(err, QT_ERR_LEN, "graph %s: no input", g->name);
    return -1;
  }
  if (g->output < 0 || g->output >= g->n_values) {
    snprintf(err, QT_ERR_LEN, "graph %s: output value %d does not exist", g->name, g->output);
    return -1;
  }
  g->n_params = g->n_buffers = 0;
  for (int i = 0; i < g->n_tensors; i++) {
    qt_param *p = &g->tensors[i];
    int64_t *n = p->is_buffer ? &g->n_buffers : &g->n_params;
    p->offset = *n;
    *n += (p->numel + 15) & ~(int64_t)15; /* 64-byte aligned regions */
  }
  QT_FREE_ALL(g->params, g->grads, g->buffers);
  g->params = aligned_alloc(64, (size_t)(g->n_params + 16) * sizeof(float));
  g->grads = aligned_alloc(64, (size_t)(g->n_params + 16) * sizeof(float));
  g->buffers = aligned_alloc(64, (size_t)(g->n_buffers + 16) * sizeof(float));
  QT_ASSERT(g->params && g->grads && g->buffers, "out of memory allocating %lld parameters", (long long)g->n_params);
  memset(g->params, 0, (size_t)(g->n_params + 16) * sizeof(float));
  memset(g->grads, 0, (size_t)(g->n_params + 16) * sizeof(float));
  memset(g->buffers, 0, (size_t)(g->n_buffers + 16) * sizeof(float));
  g->finalized = 1;
  return 0;
}

int qt_input_preprocessing_check(const qt_graph *g, const qt_input_preprocessing *p, char *err) {
  if (g->input < 0 || g->values[g->input].ndim != 3) return qt_err(err, "graph %s: no image input", g->name);
  const int64_t C = g->values[g->input].shape[2];
  if (p->channels != C || p->channels < 1 || p->channels > QT_MAX_INPUT_CHANNELS)
    return qt_err(err, "input preprocessing of graph %s: %d channels, expected the input's %lld", g->name, p->channels,
                  (long long)C);
  for (int c = 0; c < p->channels; c++)
    if (!isfinite(p->mean[c]) || !isfinite(p->std[c]) || !(p->std[c] > 0))
      return qt_err(err,
                    "input preprocessing of graph %s: channel %d: mean %g, std %g, expected finite values and std > 0",
                    g->name, c, p->mean[c], p->std[c]);
  return 0;
}

int qt_graph_set_input_preprocessing(qt_graph *g, const float *mean, const float *std, int channels, char *err) {
  qt_input_preprocessing p = {.set = 1, .channels = channels};
  if (channels < 1 || channels > QT_MAX_INPUT_CHANNELS)
    return qt_err(err, "input preprocessing of graph %s: %d channels, expected 1..%d", g->name, channels,
                  QT_MAX_INPUT_CHANNELS);
  memcpy(p.mean, mean, (size_t)channels * sizeof *mean);
  memcpy(p.std, std, (size_t)channels * sizeof *std);
  if (qt_input_preprocessing_check(g, &p, err)) return -1;
  g->input_pre = p;
  return 0;
}

int qt_graph_finalize(qt_graph *g, int output, char *err) {
  g->output = output;
  if (qt_graph_alloc(g, err)) return -1;
  qt_graph_init_params(g, 0);
  return 0;
}

int qt_graph_add_node(qt_graph *g, qt_op op, const char *name, const int *inputs, int n_inputs,
                      const qt_node_attrs *attr, int out_ndim, const int64_t *out_shape) {
  for (int i = 0; i < n_inputs; i++)
    if (check_value(g, name, inputs[i])) return -1;
  QT_ASSERT(n_inputs <= QT_MAX_INPUTS, "node %s: %d inputs", name, n_inputs);
  qt_node *n = new_node(g, op, name, inputs, n_inputs);
  if (!n) return -1;
  int id = g->n_nodes - 1;
  if (attr) n->attr = *attr;
  if (op == QT_OP_INPUT) {
    g->nodes[id].output = new_value(g, name, out_ndim, out_shape, id);
    g->input = g->nodes[id].output;
  } else {
    g->nodes[id].output = new_value(g, name, out_ndim, out_shape, id);
  }
  return id;
}

int qt_graph_share_weight(qt_graph *g, int node, int from_node) {
  if (g->error[0]) return -1;
  qt_node *n = &g->nodes[node], *f = &g->nodes[from_node];
  int own = n->param[QT_P_WEIGHT], other = f->param[QT_P_WEIGHT];
  if (own < 0 || other < 0 || n->param[QT_P_BIAS] >= 0 || own != g->n_tensors - 1)
    return builder_error(g, "node %s: can share the weight of %s only right after being added, without bias", n->name,
                         f->name);
  qt_param *a = &g->tensors[own], *b = &g->tensors[other];
  int same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
  if (!same) return builder_error(g, "node %s: weight shape differs from %s's", n->name, f->name);
  g->n_tensors--;
  n->param[QT_P_WEIGHT] = other;
  return 0;
}

int qt_graph_add_tensor(qt_graph *g, int node, const char *suffix, int ndim, const int64_t *shape, int is_buffer) {
  return new_tensor(g, node, suffix, ndim, shape, is_buffer);
}

/* splitmix64: a small, well-mixed generator for initialization. */
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static float uniform(uint64_t *s, float bound) {
  double u = (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
  return (float)((2.0 * u - 1.0) * bound);
}

void qt_graph_init_params(qt_graph *g, uint64_t seed) {
  QT_ASSERT(g->finalized, "init of graph %s before finalize", g->name);
  uint64_t s = seed ^ 0x5EEDull;
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR) {
      qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
      int64_t fan_in = w->numel / w->shape[0];
      float bound = 1.0f / sqrtf((float)fan_in);
      float *wd = g->params + w->offset;
      for (int64_t k = 0; k < w->numel; k++) wd[k] = uniform(&s, bound);
      if (n->param[QT_P_BIAS] >= 0) {
        qt_param *b = &g->tensors[n->param[QT_P_BIAS]];
        for (int64_t k = 0; k < b->numel; k++) g->params[b->offset + k] = uniform(&s, bound);
      }
    } else if (n->op == QT_OP_PRELU) {
      const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
      for (int64_t k = 0; k < w->numel; k++) g->params[w->offset + k] = 0.25f; /* PyTorch's init */
    } else if (n->op == QT_OP_LAYER_NORM) {
      const qt_param *gm = &g->tensors[n->param[QT_P_GAMMA]], *bt = &g->tensors[n->param[QT_P_BETA]];
      for (int64_t k = 0; k < gm->numel; k++) {
        g->params[gm->offset + k] = 1.0f;
        g->params[bt->offset + k] = 0.0f;
      }
    } else if (n->op == QT_OP_BATCH_NORM) {
      qt_param *gm = &g->tensors[n->param[QT_P_GAMMA]], *bt = &g->tensors[n->param[QT_P_BETA]];
      qt_param *rm = &g->tensors[n->buffer[QT_B_RUNNING_MEAN]], *rv = &g->tensors[n->buffer[QT_B_RUNNING_VAR]];
      for (int64_t k = 0; k < gm->numel; k++) {
        g->params[gm->offset + k] = 1.0f;
        g->params[bt->offset + k] = 0.0f;
        g->buffers[rm->offset + k] = 0.0f;
        g->buffers[rv->offset + k] = 1.0f;
      }
    }
  }
}

int qt_graph_check_memory(const qt_graph *g, int64_t batch, char *err) {
  double bytes = 0, big = 0;
  int largest = 0;
  for (int v = 0; v < g->n_values; v++) {
    double n = 1;
    for (int d = 0; d < g->values[v].ndim; d++) n *= (double)g->values[v].shape[d];
    bytes += n * 4.0 * (double)batch;
    if (n > big) big = n, largest = v;
  }
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
    mem = (double)rl.rlim_cur;
  if (mem > 0 && bytes > mem)
    return qt_err(err,
                  "graph '%s' needs %.1f GB for a batch of %lld images (every value of the batch is kept; the largest, "
                  "'%s', holds %.0f elements per image), more than this machine's %.1f GB: use a smaller batch",
                  g->name, bytes / 1e9, (long long)batch, g->values[largest].name, big, mem / 1e9);
  return 0;
}

void qt_graph_exchange_params(qt_graph *g, float *other) {
  for (int64_t i = 0; i < g->n_params; i++) {
    const float t = g->params[i];
    g->params[i] = other[i];
    other[i] = t;
  }
}

int64_t qt_graph_param_count(const qt_graph *g) {
  int64_t n = 0;
  for (int i = 0; i < g->n_tensors; i++)
    if (!g->tensors[i].is_buffer) n += g->tensors[i].numel;
  return n;
}

int qt_graph_find_tensor(const qt_graph *g, const char *name) {
  for (int i = 0; i < g->n_tensors; i++)
    if (strcmp(g->tensors[i].name, name) == 0) return i;
  return -1;
}

float *qt_graph_tensor_data(qt_graph *g, int tensor) {
  QT_ASSERT(tensor >= 0 && tensor < g->n_tensors && g->finalized, "tensor %d of graph %s", tensor, g->name);
  qt_param *p = &g->tensors[tensor];
  return (p->is_buffer ? g->buffers : g->params) + p->offset;
}

int qt_graph_sole_consumer(const qt_graph *g, int v) {
  if (g->values[v].consumers != 1 || v == g->output) return -1;
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++)
      if (g->nodes[i].inputs[k] == v) return i;
  return -1;
}

int qt_graph_other_input(const qt_graph *g, int node, int v) {
  const qt_node *n = &g->nodes[node];
  return n->inputs[0] == v ? n->inputs[1] : n->inputs[0];
}

int qt_node_keeps_grid(const qt_node *n) {
  const qt_op op = n->op;
  return op == QT_OP_MAX_POOL2D || op == QT_OP_FLATTEN || op == QT_OP_RELU || op == QT_OP_DROPOUT ||
         op == QT_OP_CHANNEL_SHUFFLE || op == QT_OP_CHANNEL_SLICE ||
         (op == QT_OP_RESIZE && n->attr.mode == QT_RESIZE_NEAREST);
}

int qt_graph_quant_source(const qt_graph *g, int v) {
  for (int hops = 0; v >= 0 && v != g->input && hops <= g->n_nodes; hops++) {
    const qt_node *n = &g->nodes[g->values[v].producer];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_DEQUANTIZE)
      return n->q && n->q->channels == 1 ? g->values[v].producer : -1;
    if (n->op == QT_OP_CONCAT) { /* on one grid when every input's source has the first's qparams */
      const int s0 = qt_graph_quant_source(g, n->inputs[0]);
      for (int k = 1; k < n->n_inputs && s0 >= 0; k++) {
        const int s = qt_graph_quant_source(g, n->inputs[k]);
        const qt_qstate *a = g->nodes[s0].q, *b = s >= 0 ? g->nodes[s].q : NULL;
        if (!b || a->scale[0] != b->scale[0] || a->zero_point[0] != b->zero_point[0] || a->spec.qmin != b->spec.qmin ||
            a->spec.qmax != b->spec.qmax)
          return -1;
      }
      return s0;
    }
    if (!qt_node_keeps_grid(n)) return -1;
    v = n->inputs[0];
  }
  return -1;
}

int qt_bias_scales(const qt_graph *g, int node, float *scale, char *err) {
  const qt_node *n = &g->nodes[node];
  const qt_qstate *wq = n->wq;
  QT_ASSERT(wq && qt_op_has_weight(n->op), "bias scales of %s: no weight quantization", n->name);
  const int src = qt_graph_quant_source(g, n->inputs[0]);
  if (src < 0)
    return qt_err(err,
                  "%s: the int32 bias needs an input quantized per tensor (through max_pool2d, flatten, relu, dropout, "
                  "a nearest resize, "
                  "a channel shuffle or slice, or a concat of inputs on one grid, at most), and %s is not",
                  n->name, g->values[n->inputs[0]].name);
  const qt_qstate *xq = g->nodes[src].q;
  if (!xq->calibrated || !wq->calibrated)
    return qt_err(err,
                  "%s: the int32 bias's scale needs the qparams of %s and of the weight (calibrate or train "
                  "first)",
                  n->name, g->nodes[src].name);
  const int OC = n->attr.out_channels;
  for (int c = 0; c < OC; c++) scale[c] = xq->scale[0] * wq->scale[wq->channels == 1 ? 0 : c];
  return 0;
}

int64_t qt_value_numel(const qt_value *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

int qt_graph_find_node(const qt_graph *g, const char *name) {
  return qt_node_names_find((qt_graph *)g, name); /* the index is a cache: built here on first use */
}

void qt_graph_set_training(qt_graph *g, int training) {
  for (int i = 0; i < g->n_nodes; i++) g->nodes[i].training = training;
}

/* In chunks across the OpenMP threads: ResNet-18's 11.2 M gradients (45 MB) took 4.4 ms a step
 * on one thread (bench_profile's zero_grad row, 2 threads, batch 128). */
#define ZERO_GRAD_CHUNK ((int64_t)1 << 16)
void qt_graph_zero_grad(qt_graph *g) {
  const int64_t n = g->n_params, chunks = (n + ZERO_GRAD_CHUNK - 1) / ZERO_GRAD_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t k = 0; k < chunks; k++) {
    const int64_t at = k * ZERO_GRAD_CHUNK, len = n - at < ZERO_GRAD_CHUNK ? n - at : ZERO_GRAD_CHUNK;
    memset(g->grads + at, 0, (size_t)len * sizeof(float));
  }
}
