/* Graph IR: builder, finalize (slabs), initialization, mode switch and executor. */
#include "nn/nn.h"
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
    qt_qstate_free(g->nodes[i].q);
    qt_qstate_free(g->nodes[i].wq);
  }
  free(g->nodes);
  free(g->values);
  free(g->tensors);
  free(g->params);
  free(g->grads);
  free(g->buffers);
  qt_node_names_free(g);
  free(g);
}

static int builder_error(qt_graph *g, const char *fmt, ...) {
  if (g->error[0]) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->error, sizeof g->error, fmt, ap);
  va_end(ap);
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
 * QT_P_WEIGHT of a layer with a weight takes wshape, every other slot is a vector over the
 * output channels; an optional slot is made only when `optional` asks for it. */
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
  const int64_t channels[1] = {shape[ndim - 1]};
  for (int b = 0; b < 2; b++)
    for (int k = 0; k < QT_MAX_PARAMS; k++) {
      const int use = b ? info->buffer_use[k] : info->param_use[k];
      if (use == QT_SLOT_NONE || (use == QT_SLOT_OPTIONAL && !optional)) continue;
      const int is_weight = !b && k == QT_P_WEIGHT && info->has_weight;
      const int t = new_tensor(g, id, b ? info->buffer_suffix[k] : info->param_suffix[k], is_weight ? wndim : 1,
                               is_weight ? wshape : channels, b);
      if (b) g->nodes[id].buffer[k] = t;
      else g->nodes[id].param[k] = t;
    }
  return g->nodes[id].output = new_value(g, name, ndim, shape, id);
}

int qt_graph_conv2d(qt_graph *g, const char *name, int x, int out_channels, int kernel, int stride, int pad,
                    int groups, int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_value *v = &g->values[x];
  const int64_t C = v->ndim == 3 ? v->shape[2] : 1;
  const qt_node_attrs attr = {.kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride,
                              .pad_h = pad, .pad_w = pad, .groups = groups, .out_channels = out_channels};
  const int64_t ws[4] = {out_channels, groups >= 1 ? C / groups : 0, kernel, kernel};
  return build(g, QT_OP_CONV2D, name, &x, 1, &attr, 4, ws, bias);
}

int qt_graph_conv2d_attr(qt_graph *g, const char *name, int x, const qt_node_attrs *a, int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_value *v = &g->values[x];
  const int64_t C = v->ndim == 3 ? v->shape[2] : 1;
  const qt_node_attrs attr = {.kernel_h = a->kernel_h, .kernel_w = a->kernel_w, .stride_h = a->stride_h,
                              .stride_w = a->stride_w, .pad_h = a->pad_h, .pad_w = a->pad_w, .groups = a->groups,
                              .out_channels = a->out_channels};
  const int64_t ws[4] = {a->out_channels, a->groups >= 1 ? C / a->groups : 0, a->kernel_h, a->kernel_w};
  return build(g, QT_OP_CONV2D, name, &x, 1, &attr, 4, ws, bias);
}

int qt_graph_batch_norm(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {.eps = 1e-5f, .momentum = 0.1f};
  return build(g, QT_OP_BATCH_NORM, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_relu(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {0};
  return build(g, QT_OP_RELU, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_relu6(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {0};
  return build(g, QT_OP_RELU6, name, &x, 1, &attr, 0, NULL, 0);
}

static int pool(qt_graph *g, qt_op op, const char *name, int x, int kernel, int stride, int pad) {
  const qt_node_attrs attr = {.kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride,
                              .pad_h = pad, .pad_w = pad};
  return build(g, op, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_max_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad) {
  return pool(g, QT_OP_MAX_POOL2D, name, x, kernel, stride, pad);
}
int qt_graph_avg_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad) {
  return pool(g, QT_OP_AVG_POOL2D, name, x, kernel, stride, pad);
}

int qt_graph_global_avg_pool(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {0};
  return build(g, QT_OP_GLOBAL_AVG_POOL, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_flatten(qt_graph *g, const char *name, int x) {
  const qt_node_attrs attr = {0};
  return build(g, QT_OP_FLATTEN, name, &x, 1, &attr, 0, NULL, 0);
}

int qt_graph_linear(qt_graph *g, const char *name, int x, int out_features, int bias) {
  if (check_value(g, name, x)) return -1;
  const qt_node_attrs attr = {.out_channels = out_features};
  const int64_t ws[2] = {out_features, g->values[x].shape[0]};
  return build(g, QT_OP_LINEAR, name, &x, 1, &attr, 2, ws, bias);
}

int qt_graph_add(qt_graph *g, const char *name, int a, int b) {
  const int inputs[2] = {a, b};
  const qt_node_attrs attr = {0};
  return build(g, QT_OP_ADD, name, inputs, 2, &attr, 0, NULL, 0);
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
  free(g->params);
  free(g->grads);
  free(g->buffers);
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
      return qt_err(err, "input preprocessing of graph %s: channel %d: mean %g, std %g, expected finite values and std > 0",
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

int qt_graph_quant_source(const qt_graph *g, int v) {
  for (int hops = 0; v >= 0 && v != g->input && hops <= g->n_nodes; hops++) {
    const qt_node *n = &g->nodes[g->values[v].producer];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_DEQUANTIZE) return n->q && n->q->channels == 1 ? g->values[v].producer : -1;
    if (n->op != QT_OP_MAX_POOL2D && n->op != QT_OP_FLATTEN && n->op != QT_OP_RELU) return -1;
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
    return qt_err(err, "%s: the int32 bias needs an input quantized per tensor (through max_pool2d, flatten, relu at "
                  "most), and %s is not", n->name, g->values[n->inputs[0]].name);
  const qt_qstate *xq = g->nodes[src].q;
  if (!xq->calibrated || !wq->calibrated)
    return qt_err(err, "%s: the int32 bias's scale needs the qparams of %s and of the weight (calibrate or train "
                  "first)", n->name, g->nodes[src].name);
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

void qt_graph_zero_grad(qt_graph *g) { memset(g->grads, 0, (size_t)g->n_params * sizeof(float)); }

/* A parameter as an arena tensor header over the slabs. */
static qt_tensor *param_tensor(qt_graph *g, qt_ctx *ctx, int idx) {
  if (idx < 0) return NULL;
  qt_param *p = &g->tensors[idx];
  QT_ASSERT(!p->is_buffer, "parameter %s is a buffer", p->name);
  if (p->tape_at < 0) p->tape_at = (int64_t)qt_ctx_tape_length(ctx);
  qt_tensor *t = qt_tensor_wrap(ctx, QT_F32, p->ndim, p->shape, g->params + p->offset);
  t->grad = g->grads + p->offset;
  t->requires_grad = 1;
  return t;
}

/* Whether relu (or an unrecorded batch norm) may overwrite its input: the input has no other
 * reader, and its producer owns the buffer and does not need its own output for backward. */
static int relu_inplace_ok(const qt_graph *g, int x) {
  const qt_value *v = &g->values[x];
  if (v->consumers != 1 || x == g->output) return 0;
  qt_op p = g->nodes[v->producer].op;
  return p == QT_OP_CONV2D || p == QT_OP_BATCH_NORM || p == QT_OP_LINEAR || p == QT_OP_ADD || p == QT_OP_CONV_BN;
}

static qt_tensor *fail(qt_graph *g, const char *fmt, const char *node, const char *why) {
  snprintf(g->error, sizeof g->error, fmt, node, why);
  return NULL;
}

/* LSQ: once fake quant runs on calibrated qparams the learned scale is the source of truth and
 * observers no longer touch it. Before that (a calibration pass, fake quant off) every batch is
 * observed and the scale follows the observer; in QAT started from observers the first training
 * batch initializes it. */
static int lsq_initialized(const qt_qstate *q) { return q->scale_param >= 0 && q->calibrated && q->fake_quant; }

/* LSQ: the observer's qparams initialize the learned scale. */
static void lsq_init(qt_graph *g, qt_qstate *q) {
  memcpy(qt_graph_tensor_data(g, q->scale_param), q->scale, (size_t)q->channels * sizeof(float));
}

/* LSQ: the learned scale as a parameter tensor, clamped to >= FLT_EPSILON (as PyTorch's
 * _LearnableFakeQuantize clamps it), mirrored into q->scale so convert and the check see the
 * qparams training used. */
static qt_tensor *lsq_scale(qt_graph *g, qt_ctx *ctx, qt_qstate *q) {
  float *s = qt_graph_tensor_data(g, q->scale_param);
  for (int c = 0; c < q->channels; c++) {
    if (!(s[c] >= FLT_EPSILON)) s[c] = FLT_EPSILON;
    q->scale[c] = s[c];
  }
  return param_tensor(g, ctx, q->scale_param);
}

void qt_graph_sync_learned_scales(qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    qt_qstate *qs[2] = {g->nodes[i].q, g->nodes[i].wq};
    for (int k = 0; k < 2; k++) {
      qt_qstate *q = qs[k];
      if (!q || q->scale_param < 0 || !q->calibrated) continue;
      float *s = qt_graph_tensor_data(g, q->scale_param);
      for (int c = 0; c < q->channels; c++) {
        if (!(s[c] >= FLT_EPSILON)) s[c] = FLT_EPSILON;
        q->scale[c] = s[c];
      }
    }
  }
}

/* The weight a conv/linear computes with: the parameter itself (fp32), its fake-quantized
 * version (prepared graphs; observed first in training mode), or the dequantized integer
 * weights of a convert graph. */
static qt_tensor *effective_weight(qt_graph *g, qt_ctx *ctx, qt_node *n, qt_tensor *w, char *err) {
  qt_qstate *q = n->wq;
  if (!q) return w;
  const int64_t numel = qt_tensor_numel(w), inner = numel / q->channels;
  if (q->qweight) {
    qt_tensor *t = qt_tensor_new(ctx, QT_F32, w->ndim, w->shape);
    qt_dequantize(qt_f32(t), q->qweight, 1, q->channels, inner, q->scale, q->zero_point);
    return t;
  }
  if (n->training && q->observe && !lsq_initialized(q)) {
    char why[QT_ERR_LEN];
    const double t0 = qt_ctx_profile(ctx) ? qt_now_seconds() : 0;
    if (qt_qstate_observe(q, qt_f32(w), 1, inner, why)) {
      qt_err(err, "weight quantization of %s: %s", n->name, why);
      return NULL;
    }
    if (q->scale_param >= 0) lsq_init(g, q);
    if (qt_ctx_profile(ctx)) qt_profile_add_phase(qt_ctx_profile(ctx), QT_PROFILE_OBSERVER, qt_now_seconds() - t0);
  }
  if (!q->fake_quant) return w;
  if (!q->calibrated) {
    qt_err(err, "weight quantization of %s: %s", n->name, "no qparams yet (observer never ran)");
    return NULL;
  }
  if (q->scale_param >= 0) {
    qt_tensor *st = lsq_scale(g, ctx, q);
    /* LSQ's gradient scale 1/sqrt(N Qp) with N the whole weight tensor's element count, per
     * channel too (PyTorch's _LearnableFakeQuantize with use_grad_scaling; the LSQ paper's N for
     * a layer's weights). N = one channel's count made each channel's scale step sqrt(channels)
     * times larger, and at 8 bits scales overshot into the range where every weight of the
     * channel rounds to 0, where their gradient vanishes (ResCNN W8A8: scales 200x the channel's
     * max/Qp, 84.17% after one epoch against 89.14% with this N; docs/experiments.md, "LSQ at 8 bits"). */
    return qt_fake_quant_lsq(ctx, w, 1, q->channels, inner, st, q->zero_point, q->spec.qmin, q->spec.qmax,
                             1.0f / sqrtf((float)numel * (float)q->spec.qmax));
  }
  return qt_fake_quant(ctx, w, 1, q->channels, inner, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
}

/* The bias a conv/linear computes with: the parameter itself (fp32, or a float bias), or, with
 * an int32 bias (weight spec bias_int32), the dequantized integers of a convert graph or the
 * fake-quantized bias of a prepared graph (scale s_x * s_w[c], zero point 0; the straight-through
 * estimator passes its gradient, which the int32 range never clips in practice). */
static qt_tensor *effective_bias(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *b, char *err) {
  qt_node *n = &g->nodes[node];
  qt_qstate *q = n->wq;
  if (!b || !q || !q->spec.bias_int32 || (!q->qbias && !q->fake_quant)) return b;
  const int OC = n->attr.out_channels;
  float *scale = qt_arena_calloc(ctx, (size_t)OC * sizeof(float));
  if (qt_bias_scales(g, node, scale, err)) return NULL;
  if (q->qbias) {
    QT_ASSERT(q->n_qbias == OC, "%s: %lld integer biases for %d channels", n->name, (long long)q->n_qbias, OC);
    qt_tensor *t = qt_tensor_new(ctx, QT_F32, b->ndim, b->shape);
    int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
    qt_dequantize(qt_f32(t), q->qbias, 1, OC, 1, scale, zero);
    return t;
  }
  int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  return qt_fake_quant(ctx, b, 1, OC, 1, scale, zero, QT_BIAS_QMIN, QT_BIAS_QMAX);
}

/* conv_bn in eval mode with an int32 bias: what its folded bias loses to the int32 grid,
 * fq(bf) - bf per channel (bf = beta + (b - running_mean) * sf, qt_bn_fold), so that the eval
 * forward computes what convert's conv2d with the integer bias computes (training mode keeps
 * the float BN, as delayed folding does). NULL with nothing to add. */
static qt_tensor *conv_bn_bias_rounding(qt_graph *g, qt_ctx *ctx, int node, char *err, int *failed) {
  qt_node *n = &g->nodes[node];
  *failed = 0;
  if (n->training || !n->wq || !n->wq->spec.bias_int32 || !n->wq->fake_quant) return NULL;
  const int OC = n->attr.out_channels;
  float *scale = qt_arena_calloc(ctx, (size_t)OC * sizeof(float));
  if (qt_bias_scales(g, node, scale, err)) {
    *failed = 1;
    return NULL;
  }
  const int64_t shape[1] = {OC};
  qt_tensor *bf = qt_tensor_new(ctx, QT_F32, 1, shape);
  qt_bn_fold(NULL, qt_f32(bf), NULL, n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, n->param[QT_P_BIAS]) : NULL,
             qt_graph_tensor_data(g, n->param[QT_P_BN_GAMMA]), qt_graph_tensor_data(g, n->param[QT_P_BN_BETA]),
             qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_MEAN]), qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_VAR]),
             n->attr.eps, OC, 0);
  int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  int32_t *qb = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  qt_quantize(qb, qt_f32(bf), 1, OC, 1, scale, zero, QT_BIAS_QMIN, QT_BIAS_QMAX);
  qt_tensor *d = qt_tensor_new(ctx, QT_F32, 1, shape);
  qt_dequantize(qt_f32(d), qb, 1, OC, 1, scale, zero);
  for (int c = 0; c < OC; c++) qt_f32(d)[c] -= qt_f32(bf)[c];
  return d;
}

/* Without grad nothing is recorded: a temporary a node made (a fake-quantized or dequantized
 * weight, conv_bn's intermediate activations) is dead once the op that read it has run, and its
 * memory goes back to the arena, unless it is `keep` or lies in keep's memory (a weight that
 * is the parameter itself, an op that returned its input). Grad mode keeps everything. */
static void drop_unless(qt_ctx *ctx, qt_tensor *dead, const qt_tensor *keep) {
  if (dead && dead != keep && !(keep && dead->data == keep->data) && !qt_ctx_grad_enabled(ctx))
    qt_tensor_free(ctx, dead);
}

qt_tensor *qt_apply_simple_op(qt_ctx *ctx, qt_op op, const qt_node_attrs *a, qt_tensor *x, qt_tensor *x2, int inplace) {
  switch (op) {
    case QT_OP_RELU:
      return qt_relu(ctx, x, inplace);
    case QT_OP_RELU6:
      return qt_relu6(ctx, x, inplace);
    case QT_OP_MAX_POOL2D:
      return qt_max_pool2d(ctx, x, a->kernel_h, a->stride_h, a->pad_h);
    case QT_OP_AVG_POOL2D:
      return qt_avg_pool2d(ctx, x, a->kernel_h, a->stride_h, a->pad_h);
    case QT_OP_GLOBAL_AVG_POOL:
      return qt_global_avg_pool(ctx, x);
    case QT_OP_FLATTEN:
      return qt_flatten(ctx, x);
    case QT_OP_ADD:
      return x2 ? qt_add(ctx, x, x2) : NULL;
    default:
      return NULL;
  }
}

qt_tensor *qt_node_forward(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *const *inputs, int inplace, char *err) {
  QT_ASSERT(node >= 0 && node < g->n_nodes && g->finalized, "node %d of graph %s", node, g->name);
  qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  qt_tensor *x = n->n_inputs > 0 ? inputs[0] : NULL, *w = NULL, *b = NULL;
  switch (n->op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: {
      qt_tensor *wp = param_tensor(g, ctx, n->param[QT_P_WEIGHT]), *bp = param_tensor(g, ctx, n->param[QT_P_BIAS]);
      if (!(w = effective_weight(g, ctx, n, wp, err))) return NULL;
      if (!(b = effective_bias(g, ctx, node, bp, err)) && bp) return NULL;
      qt_tensor *y = n->op == QT_OP_CONV2D ? qt_conv2d(ctx, x, w, b, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups)
                                           : qt_linear(ctx, x, w, b);
      drop_unless(ctx, b, bp);
      drop_unless(ctx, w, wp);
      return y;
    }
    case QT_OP_BATCH_NORM:
      return qt_batch_norm(ctx, x, param_tensor(g, ctx, n->param[QT_P_GAMMA]), param_tensor(g, ctx, n->param[QT_P_BETA]),
                           g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                           g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, n->training && !n->bn_frozen,
                           a->momentum, a->eps, inplace);
    default:
      if (qt_op_is_param_free(n->op))
        return qt_apply_simple_op(ctx, n->op, a, x, n->n_inputs > 1 ? inputs[1] : NULL, inplace && (n->op == QT_OP_RELU || n->op == QT_OP_RELU6));
      qt_err(err, "node %s: op '%s' is not an fp32 op (qt_node_forward computes conv2d, linear, batch_norm and the "
                  "parameter-free ops)", n->name, qt_op_name(n->op));
      return NULL;
  }
}

/* ---- the executor and its no-grad memory planner ----------------------------------------
 *
 * With ctx's grad mode off nothing is recorded, so a value is dead once the last node reading
 * it has run (nodes run in order). The planner hands its memory back to the arena
 * (qt_arena_free), whose later allocations take the smallest freed range that fits: a forward
 * then spans about the largest set of values alive at once instead of the sum of all of them
 * (FashionCNN at batch 256: tests/nn/test_forward_memory.c). Memory is tracked per buffer,
 * not per value: in-place relu/relu6/batch_norm, flatten views and a disabled fake quant return
 * a tensor over their input's buffer, so a buffer (its first value, the root) goes back once
 * every value over it is dead. Never handed back: the graph input (the caller's), forced values
 * (another arena's), the output and the values the caller keeps. Whether an op runs in place
 * is decided as without the planner (relu_inplace_ok: the input's only consumer), so the
 * planner changes where values live, never what is computed. Temporaries inside a node (a
 * fake-quantized weight, conv_bn's intermediate activations) go back as soon as the node has
 * used them (drop_unless). With grad on and the ctx's frees on (qt_ctx_set_backward_frees, as
 * the trainer runs), a buffer goes back once its values are dead unless one of them was saved
 * for backward (qt_tensor.saved, set by the ops that recorded it; read when the value dies,
 * after all its consumers recorded): a relu's output that only a max pool read, a fake quant's
 * input that only an STE fake quant read. With grad on and frees off, every value is kept. */
typedef struct {
  int *last;          /* per value: the last node reading it (its producer when none does) */
  int *root;          /* per value: the value whose buffer it lives in, -1 when not ours */
  int *refs;          /* per root: live values over its buffer */
  qt_tensor **owner;  /* per root: the tensor its buffer was made for (size and pointer) */
  unsigned char *saved; /* per root: a value over its buffer is saved for backward (grad mode) */
  const unsigned char *keep;
} forward_plan;

static void plan_init(forward_plan *p, const qt_graph *g, qt_ctx *ctx, const unsigned char *keep) {
  p->last = qt_arena_alloc(ctx, (size_t)g->n_values * sizeof *p->last);
  p->root = qt_arena_alloc(ctx, (size_t)g->n_values * sizeof *p->root);
  p->refs = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *p->refs);
  p->owner = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *p->owner);
  p->saved = qt_arena_calloc(ctx, (size_t)g->n_values);
  p->keep = keep;
  for (int v = 0; v < g->n_values; v++) {
    p->last[v] = g->values[v].producer;
    p->root[v] = -1;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++)
      if (p->last[g->nodes[i].inputs[k]] < i) p->last[g->nodes[i].inputs[k]] = i;
}

/* Value v is now vals[v], computed by node `node` (y its tensor, which vals[v] is unless v was
 * forced): note which buffer it lives in; a computed tensor that was replaced by a forced one
 * is dead at once. */
static void plan_produced(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int node, int v, qt_tensor *y,
                          qt_tensor **vals) {
  const qt_node *n = &g->nodes[node];
  int alias = -2; /* -2: a buffer of its own */
  for (int k = 0; k < n->n_inputs && alias == -2; k++)
    if (vals[n->inputs[k]] && y->data == vals[n->inputs[k]]->data) alias = p->root[n->inputs[k]];
  const int own = alias == -2 && y->data && qt_arena_owns(ctx, y->data);
  if (vals[v] != y) { /* forced */
    if (own) qt_tensor_free(ctx, y);
    return;
  }
  p->root[v] = alias != -2 ? alias : own ? v : -1;
  if (own) p->owner[v] = y;
  if (p->root[v] >= 0) p->refs[p->root[v]]++;
}

static void plan_dead(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int v, qt_tensor **vals) {
  if (v == g->output || (p->keep && p->keep[v])) return;
  const int r = p->root[v];
  /* every consumer has run, and recorded what its backward reads */
  if (r >= 0 && vals[v]->saved) p->saved[r] = 1;
  vals[v] = NULL;
  if (r >= 0 && --p->refs[r] == 0 && !p->saved[r]) qt_tensor_free(ctx, p->owner[r]);
}

/* After node `node`: its inputs it was the last to read, and its output if nothing reads it. */
static void plan_after(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int node, qt_tensor **vals) {
  const qt_node *n = &g->nodes[node];
  for (int k = 0; k < n->n_inputs; k++) {
    const int u = n->inputs[k];
    int seen = 0; /* add(x, x) reads x twice: dead once */
    for (int j = 0; j < k; j++) seen |= n->inputs[j] == u;
    if (!seen && p->last[u] == node && u != g->input) plan_dead(p, g, ctx, u, vals);
  }
  if (p->last[n->output] == node) plan_dead(p, g, ctx, n->output, vals);
}

static qt_tensor *graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                qt_tensor *const *force, int keep_all, const unsigned char *keep);

/* In the training forward (grad on, values not kept), a batch norm or conv_bn in training mode
 * whose only consumer is a relu or relu6 runs with it as one op (qt_batch_norm_relu: one pass
 * over memory each way instead of two, the same numbers): returns that relu node, else -1. The
 * batch norm's value then holds the relu's output, which only the relu (skipped) reads. */
static int relu_fused_after(const qt_graph *g, int node) {
  const qt_node *n = &g->nodes[node];
  if ((n->op != QT_OP_BATCH_NORM && n->op != QT_OP_CONV_BN) || !n->training || n->bn_frozen) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0) return -1;
  return g->nodes[j].op == QT_OP_RELU || g->nodes[j].op == QT_OP_RELU6 ? j : -1;
}

/* In the training forward, a per-tensor fake quant whose only consumer is a max pool with windows
 * tiling its input (stride = kernel, no padding) runs with it as one op (LSQ:
 * qt_fake_quant_lsq_max_pool2d, its backward on the windows' argmax inputs only; fixed qparams:
 * qt_fake_quant_max_pool2d; the fake-quantized tensor is never in memory): returns that pool
 * node, else -1. The fake quant's value then holds the pool's output, which only the pool
 * (skipped) reads. */
#define NODE_DONE (-2) /* graph_forward's deferred[]: the node's output is its input's value */

static int pool_fused_after(const qt_graph *g, int node, const qt_tensor *x, qt_tensor *const *force,
                            const unsigned char *keep) {
  const qt_node *n = &g->nodes[node];
  const qt_qstate *q = n->q;
  if (n->op != QT_OP_FAKE_QUANT || !q || q->channels != 1 || x->ndim != 4) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || g->nodes[j].op != QT_OP_MAX_POOL2D) return -1;
  const qt_node_attrs *a = &g->nodes[j].attr;
  const int k = a->kernel_h;
  if (a->stride_h != k || a->pad_h != 0 || x->shape[1] % k || x->shape[2] % k || x->shape[1] < k || x->shape[2] < k)
    return -1;
  if (keep && (keep[n->output] || keep[g->nodes[j].output])) return -1;
  if (force && (force[n->output] || force[g->nodes[j].output])) return -1;
  return j;
}

/* In the training forward, a per-tensor LSQ fake quant of a value that needs no gradient (the
 * image) whose only consumer is a conv2d or conv_bn with groups 1 and at most 4 input channels
 * runs inside that convolution (qt_conv2d_lsq_input: the scale's gradient without the
 * convolution's input gradient): returns the convolution node, else -1. The fake quant's value
 * is then its input, which only the convolution (given the fake quant's node) reads. */
static int conv_fused_after(const qt_graph *g, int node, const qt_tensor *x, qt_tensor *const *force,
                            const unsigned char *keep) {
  const qt_node *n = &g->nodes[node];
  const qt_qstate *q = n->q;
  if (n->op != QT_OP_FAKE_QUANT || !q || q->scale_param < 0 || q->channels != 1 || x->requires_grad ||
      x->ndim != 4 || x->shape[3] > 4)
    return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || (g->nodes[j].op != QT_OP_CONV2D && g->nodes[j].op != QT_OP_CONV_BN) || g->nodes[j].attr.groups != 1)
    return -1;
  if ((keep && keep[n->output]) || (force && force[n->output])) return -1;
  return j;
}

/* In the training forward, a batch norm (or conv_bn's) fused with its relu (relu_fused_after: relu
 * is that node), whose relu's only consumer is a max pool with windows tiling it (stride = kernel,
 * no padding), or a per-tensor fake quant that does not observe in this step and whose only
 * consumer is such a pool, runs with them as one op (qt_batch_norm_relu_max_pool2d: neither the
 * normalized, the relu'd nor the quantized tensor is ever in memory): returns the pool node and
 * sets *fq_node (-1: none), else -1. The batch norm's value then holds the pool's output, which
 * only the skipped nodes read. */
static int bn_pool_fused_after(const qt_graph *g, int relu, qt_tensor *const *force, const unsigned char *keep,
                               int *fq_node) {
  *fq_node = -1;
  const qt_value *v = &g->values[g->nodes[relu].output];
  int j = qt_graph_sole_consumer(g, g->nodes[relu].output);
  if (j < 0 || (keep && keep[g->nodes[relu].output]) || (force && force[g->nodes[relu].output])) return -1;
  if (g->nodes[j].op == QT_OP_FAKE_QUANT) {
    const qt_node *f = &g->nodes[j];
    const qt_qstate *q = f->q;
    if (!q || q->channels != 1 || !q->fake_quant || !q->calibrated || (f->training && q->observe && !lsq_initialized(q)))
      return -1;
    if ((keep && keep[f->output]) || (force && force[f->output])) return -1;
    *fq_node = j;
    j = qt_graph_sole_consumer(g, f->output);
    if (j < 0) return -1;
  }
  const qt_node *pn = &g->nodes[j];
  const qt_node_attrs *a = &pn->attr;
  const int k = a->kernel_h;
  if (pn->op != QT_OP_MAX_POOL2D || v->ndim != 3 || a->kernel_w != k || a->stride_h != k || a->stride_w != k ||
      a->pad_h != 0 || a->pad_w != 0 || v->shape[0] % k || v->shape[1] % k || v->shape[0] < k || v->shape[1] < k)
    return -1;
  if ((keep && keep[pn->output]) || (force && force[pn->output])) return -1;
  return j;
}

/* Whether node `node`'s convolution (conv2d or conv_bn: stride 1, groups 1) of x, a one-channel
 * value that needs no gradient (the image), followed by relu node `relu` and pool node `pool`,
 * has a shape qt_conv1_bn_relu_max_pool2d takes; not under SyncBN. */
static int conv1_pool_takes(const qt_graph *g, qt_ctx *ctx, int node, const qt_tensor *x, int relu, int pool) {
  const qt_node_attrs *a = &g->nodes[node].attr;
  if (a->groups != 1 || a->stride_h != 1 || a->stride_w != 1 || !x || x->ndim != 4 || x->shape[3] != 1 ||
      x->requires_grad || (qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1))
    return 0;
  return qt_conv1_bn_relu_max_pool2d_takes((int)x->shape[0], (int)x->shape[1], (int)x->shape[2], a->out_channels,
                                           a->kernel_h, a->kernel_w, a->pad_h, a->pad_w,
                                           g->nodes[relu].op == QT_OP_RELU6 ? 2 : 1, g->nodes[pool].attr.kernel_h);
}

/* In the training forward, a conv2d of the image (conv1_pool_takes) with plain weights (no fake
 * quant) whose only consumer is a training batch norm fused with its relu and a max pool
 * (bn_pool_fused_after, no fake quant between) runs with them as one op
 * (qt_conv1_bn_relu_max_pool2d: the convolution's output is never in memory): returns the pool
 * node and sets *bn and *relu, else -1. The convolution's value then holds the pool's output,
 * which only the skipped nodes read. (QAT's conv_bn takes the op in graph_forward's conv_bn
 * branch, with its image's LSQ fake quant, sf and the activations' fake quant.) */
static int conv1_pool_fused_after(const qt_graph *g, qt_ctx *ctx, int node, const qt_tensor *x,
                                  qt_tensor *const *force, const unsigned char *keep, int *bn, int *relu) {
  const qt_node *n = &g->nodes[node];
  if (n->op != QT_OP_CONV2D || n->wq) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || g->nodes[j].op != QT_OP_BATCH_NORM) return -1;
  if ((keep && (keep[n->output] || keep[g->nodes[j].output])) ||
      (force && (force[n->output] || force[g->nodes[j].output])))
    return -1;
  const int r = relu_fused_after(g, j);
  int fq = -1;
  const int pool = r >= 0 ? bn_pool_fused_after(g, r, force, keep, &fq) : -1;
  if (pool < 0 || fq >= 0 || !conv1_pool_takes(g, ctx, node, x, r, pool)) return -1;
  *bn = j;
  *relu = r;
  return pool;
}

/* In the training forward, whether value v, an (H, W, C) activation of N samples a fused op writes, goes to
 * a convolution blocked (qt_conv1_bn_relu_max_pool2d's out_blocked): its sole consumer is a conv2d
 * or conv_bn node whose convolution takes it so in this step (qt_conv2d_takes_blocked: it reaches
 * the convolution unchanged, since a fake quant between would be that sole consumer), and the
 * value is neither kept nor forced. */
static int value_to_blocked_conv(const qt_graph *g, const qt_ctx *ctx, int v, int64_t N, qt_tensor *const *force,
                                 const unsigned char *keep) {
  const int j = qt_graph_sole_consumer(g, v);
  if (j < 0 || (keep && keep[v]) || (force && force[v]) || g->values[v].ndim != 3) return 0;
  const int64_t shape[4] = {N, g->values[v].shape[0], g->values[v].shape[1], g->values[v].shape[2]};
  const qt_node_attrs *a = &g->nodes[j].attr;
  if ((g->nodes[j].op != QT_OP_CONV2D && g->nodes[j].op != QT_OP_CONV_BN) || a->groups < 1 || shape[3] % a->groups)
    return 0;
  const int64_t w_shape[4] = {a->out_channels, shape[3] / a->groups, a->kernel_h, a->kernel_w};
  return qt_conv2d_takes_blocked(ctx, shape, w_shape, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
}

/* In the training forward, whether conv2d node `node`'s output goes blocked (qt_conv2d_to_blocked)
 * to the batch norm that is its sole consumer: that batch norm runs with its relu and pool as one
 * op (bn_pool_fused_after), which takes a blocked input of the convolution's channels
 * (qt_batch_norm_relu_max_pool2d_takes_blocked), and the value is neither kept nor forced. */
static int conv_to_bn_pool(const qt_graph *g, int node, qt_tensor *const *force, const unsigned char *keep) {
  const int v = g->nodes[node].output, j = qt_graph_sole_consumer(g, v);
  if (j < 0 || g->nodes[j].op != QT_OP_BATCH_NORM || (keep && keep[v]) || (force && force[v]) ||
      !qt_batch_norm_relu_max_pool2d_takes_blocked(g->nodes[node].attr.out_channels))
    return 0;
  const int r = relu_fused_after(g, j);
  int fq;
  return r >= 0 && bn_pool_fused_after(g, r, force, keep, &fq) >= 0;
}

/* Node fq_node's per-tensor fake quant as a fused op takes it, for a tensor of per_sample values
 * per sample (LSQ's gradient scale). */
static qt_pool_fake_quant fused_fake_quant(qt_graph *g, qt_ctx *ctx, int fq_node, int64_t per_sample) {
  qt_qstate *q = g->nodes[fq_node].q;
  return (qt_pool_fake_quant){q->scale_param >= 0 ? lsq_scale(g, ctx, q) : NULL, q->scale, q->zero_point,
                              q->spec.qmin, q->spec.qmax, 1.0f / sqrtf((float)per_sample * (float)q->spec.qmax)};
}

static qt_tensor *bn_relu_pool(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, qt_tensor *div, qt_tensor *gamma,
                               qt_tensor *beta, int relu, int fq_node, int pool, int *deferred) {
  const qt_node *n = &g->nodes[node];
  qt_pool_fake_quant fq;
  if (fq_node >= 0) {
    fq = fused_fake_quant(g, ctx, fq_node, qt_tensor_numel(x) / (x->shape[0] > 0 ? x->shape[0] : 1));
    deferred[fq_node] = NODE_DONE;
  }
  deferred[relu] = deferred[pool] = NODE_DONE;
  return qt_batch_norm_relu_max_pool2d(ctx, x, div, gamma, beta, g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                                       g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, n->attr.momentum,
                                       n->attr.eps, g->nodes[relu].op == QT_OP_RELU6 ? 2 : 1,
                                       fq_node >= 0 ? &fq : NULL, g->nodes[pool].attr.kernel_h);
}

/* conv2d(fq(x), w, b) for conv_fused_after's pair: fq is node fq_node's quantizer. */
static qt_tensor *conv_of_lsq_input(qt_graph *g, qt_ctx *ctx, int fq_node, qt_tensor *x, qt_tensor *w, qt_tensor *b,
                                    const qt_node_attrs *a) {
  qt_qstate *q = g->nodes[fq_node].q;
  const int64_t per_sample = qt_tensor_numel(x) / (x->shape[0] > 0 ? x->shape[0] : 1);
  return qt_conv2d_lsq_input(ctx, x, lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin, q->spec.qmax,
                             1.0f / sqrtf((float)per_sample * (float)q->spec.qmax), w, b, a->stride_h, a->stride_w,
                             a->pad_h, a->pad_w);
}

qt_tensor *qt_graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input) {
  return graph_forward(g, ctx, input, NULL, NULL, 0, NULL);
}

qt_tensor *qt_graph_forward_values(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values) {
  return graph_forward(g, ctx, input, values, NULL, 1, NULL);
}

qt_tensor *qt_graph_forward_forced(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                   qt_tensor *const *force) {
  return graph_forward(g, ctx, input, values, force, 1, NULL);
}

qt_tensor *qt_graph_forward_keep(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                 qt_tensor *const *force, const unsigned char *keep) {
  return graph_forward(g, ctx, input, values, force, 0, keep);
}

static qt_tensor *graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                qt_tensor *const *force, int keep_all, const unsigned char *keep) {
  QT_ASSERT(g->finalized, "forward of graph %s before finalize", g->name);
  qt_value *in = &g->values[g->input];
  if (!(input->ndim == 4 && input->shape[1] == in->shape[0] && input->shape[2] == in->shape[1] &&
        input->shape[3] == in->shape[2])) {
    snprintf(g->error, sizeof g->error, "graph %s: input of shape (%lld, %lld, %lld, %lld), want (N, %lld, %lld, %lld)",
             g->name, (long long)input->shape[0], (long long)input->shape[1], (long long)input->shape[2],
             (long long)input->shape[3], (long long)in->shape[0], (long long)in->shape[1], (long long)in->shape[2]);
    return NULL;
  }
  g->error[0] = 0;
  for (int i = 0; i < g->n_tensors; i++) g->tensors[i].tape_at = -1;
  qt_tensor **vals = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *vals);
  if (values) *values = vals;
  vals[g->input] = input;
  forward_plan plan;
  memset(&plan, 0, sizeof plan);
  const int planned = !keep_all && (!qt_ctx_grad_enabled(ctx) || qt_ctx_backward_frees(ctx));
  if (planned) plan_init(&plan, g, ctx, keep);
  /* the training forward's fusions (relu_fused_after, pool_fused_after, conv_fused_after) */
  const int fuse = !keep_all && qt_ctx_grad_enabled(ctx);
  /* per node, what an earlier node left it: NODE_DONE (a fused producer computed its output: a
   * relu after its batch norm, a max pool after its fake quant), or the fake quant node whose
   * quantization it runs (conv_fused_after), else -1. Per node, so fused pairs may interleave. */
  int *deferred = qt_arena_alloc(ctx, (size_t)g->n_nodes * sizeof *deferred);
  for (int i = 0; i < g->n_nodes; i++) deferred[i] = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *n = &g->nodes[i];
    qt_tensor *x = n->n_inputs > 0 ? vals[n->inputs[0]] : NULL;
    qt_tensor *y = NULL;
    const qt_node_attrs *a = &n->attr;
    const int fused = fuse ? relu_fused_after(g, i) : -1;
    int fq_node = -1; /* the pool (and fake quant) that run with the batch norm and its relu */
    const int pool = fused >= 0 ? bn_pool_fused_after(g, fused, force, keep, &fq_node) : -1;
    int c1_bn = -1, c1_relu = -1; /* the batch norm and relu that run with a conv2d and its pool */
    const int c1_pool = fuse && n->op == QT_OP_CONV2D && deferred[i] == -1
                            ? conv1_pool_fused_after(g, ctx, i, x, force, keep, &c1_bn, &c1_relu)
                            : -1;
    if (deferred[i] == NODE_DONE) {
      y = x; /* its producer wrote this node's output (qt_batch_norm_relu, qt_fake_quant_*max_pool2d) */
    } else if (c1_pool >= 0) {
      const qt_node *b = &g->nodes[c1_bn];
      y = qt_conv1_bn_relu_max_pool2d(ctx, x, NULL, param_tensor(g, ctx, n->param[QT_P_WEIGHT]),
                                      param_tensor(g, ctx, n->param[QT_P_BIAS]), NULL,
                                      param_tensor(g, ctx, b->param[QT_P_GAMMA]), param_tensor(g, ctx, b->param[QT_P_BETA]),
                                      g->buffers + g->tensors[b->buffer[QT_B_RUNNING_MEAN]].offset,
                                      g->buffers + g->tensors[b->buffer[QT_B_RUNNING_VAR]].offset, b->attr.momentum,
                                      b->attr.eps, a->pad_h, a->pad_w, g->nodes[c1_relu].op == QT_OP_RELU6 ? 2 : 1,
                                      NULL, g->nodes[c1_pool].attr.kernel_h,
                                      value_to_blocked_conv(g, ctx, g->nodes[c1_pool].output, x->shape[0], force, keep));
      deferred[c1_bn] = deferred[c1_relu] = deferred[c1_pool] = NODE_DONE;
    } else if (n->op == QT_OP_CONV2D && (deferred[i] >= 0 || (fuse && conv_to_bn_pool(g, i, force, keep)))) {
      qt_tensor *wp = param_tensor(g, ctx, n->param[QT_P_WEIGHT]), *bp = param_tensor(g, ctx, n->param[QT_P_BIAS]);
      qt_tensor *w = effective_weight(g, ctx, n, wp, g->error), *b = w ? effective_bias(g, ctx, i, bp, g->error) : NULL;
      if (!w || (!b && bp)) return NULL;
      y = deferred[i] >= 0 ? conv_of_lsq_input(g, ctx, deferred[i], x, w, b, a)
                           : qt_conv2d_to_blocked(ctx, x, w, b, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
      drop_unless(ctx, b, bp);
      drop_unless(ctx, w, wp);
    } else if (pool >= 0 && n->op == QT_OP_BATCH_NORM) {
      y = bn_relu_pool(g, ctx, i, x, NULL, param_tensor(g, ctx, n->param[QT_P_GAMMA]),
                       param_tensor(g, ctx, n->param[QT_P_BETA]), fused, fq_node, pool, deferred);
    } else if (fused >= 0 && n->op == QT_OP_BATCH_NORM) {
      y = qt_batch_norm_relu(ctx, x, param_tensor(g, ctx, n->param[QT_P_GAMMA]), param_tensor(g, ctx, n->param[QT_P_BETA]),
                             g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                             g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, a->momentum, a->eps,
                             g->nodes[fused].op == QT_OP_RELU6);
      deferred[fused] = NODE_DONE;
    } else switch (n->op) {
      case QT_OP_INPUT:
        continue;
      case QT_OP_CONV_BN: {
        /* docs/design.md: delayed folding: conv(x, fq(W * sf)) / sf (+ b), then a real BN. */
        qt_tensor *gamma = param_tensor(g, ctx, n->param[QT_P_BN_GAMMA]);
        const float *rv = g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset;
        qt_tensor *sf = qt_bn_scale_factor(ctx, gamma, rv, a->eps);
        qt_tensor *wp = param_tensor(g, ctx, n->param[QT_P_WEIGHT]);
        qt_tensor *ws = qt_channel_scale(ctx, wp, sf, 1, 0);
        qt_tensor *w = effective_weight(g, ctx, n, ws, g->error);
        if (!w) return NULL;
        if (fuse && n->training && n->param[QT_P_BIAS] < 0 && pool >= 0 && conv1_pool_takes(g, ctx, i, x, fused, pool)) {
          /* the image's convolution (its LSQ fake quant too when conv_fused_after deferred it),
           * the division by sf, BN, relu, the activations' fake quant and the pool as one op */
          const int64_t oh = x->shape[1] + 2 * a->pad_h - a->kernel_h + 1, ow = x->shape[2] + 2 * a->pad_w - a->kernel_w + 1;
          qt_pool_fake_quant xq, aq;
          if (deferred[i] >= 0) xq = fused_fake_quant(g, ctx, deferred[i], x->shape[1] * x->shape[2]);
          if (fq_node >= 0) {
            aq = fused_fake_quant(g, ctx, fq_node, oh * ow * a->out_channels);
            deferred[fq_node] = NODE_DONE;
          }
          y = qt_conv1_bn_relu_max_pool2d(ctx, x, deferred[i] >= 0 ? &xq : NULL, w, NULL, sf, gamma,
                                          param_tensor(g, ctx, n->param[QT_P_BN_BETA]),
                                          g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                                          g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, a->momentum,
                                          a->eps, a->pad_h, a->pad_w, g->nodes[fused].op == QT_OP_RELU6 ? 2 : 1,
                                          fq_node >= 0 ? &aq : NULL, g->nodes[pool].attr.kernel_h,
                                          value_to_blocked_conv(g, ctx, g->nodes[pool].output, x->shape[0], force, keep));
          deferred[fused] = deferred[pool] = NODE_DONE;
          drop_unless(ctx, w, ws);
          drop_unless(ctx, ws, wp);
          break;
        }
        qt_tensor *t;
        if (deferred[i] >= 0) {
          t = conv_of_lsq_input(g, ctx, deferred[i], x, w, NULL, a);
        } else if (fuse && n->training && n->param[QT_P_BIAS] < 0 && pool >= 0 &&
                   qt_batch_norm_relu_max_pool2d_takes_blocked(a->out_channels)) {
          /* for bn_relu_pool below, which takes it blocked */
          t = qt_conv2d_to_blocked(ctx, x, w, NULL, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
        } else {
          t = qt_conv2d(ctx, x, w, NULL, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
        }
        drop_unless(ctx, w, ws);
        drop_unless(ctx, ws, wp);
        if (fuse && n->training && n->param[QT_P_BIAS] < 0) {
          /* the training forward: BN of t / sf without the quotient in memory (the same numbers;
           * training mode: no bias rounding) */
          if (pool >= 0) {
            y = bn_relu_pool(g, ctx, i, t, sf, gamma, param_tensor(g, ctx, n->param[QT_P_BN_BETA]), fused, fq_node,
                             pool, deferred);
            break;
          }
          y = qt_batch_norm_div(ctx, t, sf, gamma, param_tensor(g, ctx, n->param[QT_P_BN_BETA]),
                                g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                                g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, !n->bn_frozen,
                                a->momentum, a->eps, fused < 0 ? 0 : g->nodes[fused].op == QT_OP_RELU6 ? 2 : 1);
          if (fused >= 0) deferred[fused] = NODE_DONE;
          break;
        }
        y = qt_channel_scale(ctx, t, sf, 0, 1);
        drop_unless(ctx, t, y);
        if (n->param[QT_P_BIAS] >= 0) {
          t = y;
          y = qt_channel_add(ctx, t, param_tensor(g, ctx, n->param[QT_P_BIAS]));
          drop_unless(ctx, t, y);
        }
        t = y;
        if (fused >= 0) { /* training mode: no bias rounding below */
          y = qt_batch_norm_relu(ctx, t, gamma, param_tensor(g, ctx, n->param[QT_P_BN_BETA]),
                                 g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                                 g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, a->momentum, a->eps,
                                 g->nodes[fused].op == QT_OP_RELU6);
          deferred[fused] = NODE_DONE;
        } else {
          y = qt_batch_norm(ctx, t, gamma, param_tensor(g, ctx, n->param[QT_P_BN_BETA]),
                            g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                            g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, n->training && !n->bn_frozen,
                            a->momentum, a->eps, 0);
        }
        drop_unless(ctx, t, y);
        int failed;
        qt_tensor *round = conv_bn_bias_rounding(g, ctx, i, g->error, &failed);
        if (failed) return NULL;
        if (round) {
          t = y;
          y = qt_channel_add(ctx, t, round);
          drop_unless(ctx, t, y);
        }
        break;
      }
      case QT_OP_CONV2D:
      case QT_OP_LINEAR:
      case QT_OP_BATCH_NORM:
      case QT_OP_RELU:
      case QT_OP_RELU6:
      case QT_OP_MAX_POOL2D:
      case QT_OP_AVG_POOL2D:
      case QT_OP_GLOBAL_AVG_POOL:
      case QT_OP_FLATTEN:
      case QT_OP_ADD: {
        qt_tensor *ins[QT_MAX_INPUTS];
        for (int k = 0; k < n->n_inputs; k++) ins[k] = vals[n->inputs[k]];
        const int inplace = (n->op == QT_OP_RELU || n->op == QT_OP_RELU6 || n->op == QT_OP_BATCH_NORM) &&
                            relu_inplace_ok(g, n->inputs[0]);
        if (!(y = qt_node_forward(g, ctx, i, ins, inplace, g->error))) return NULL;
        break;
      }
      case QT_OP_FAKE_QUANT: {
        qt_qstate *q = n->q;
        const int64_t numel = qt_tensor_numel(x), outer = numel / q->channels;
        if (n->training && q->observe && !lsq_initialized(q)) {
          char err[QT_ERR_LEN];
          const double t0 = qt_ctx_profile(ctx) ? qt_now_seconds() : 0;
          /* activations: the whole batch's, when the batch is split across processes (weights
           * are the same on every process and need no synchronization) */
          if (qt_qstate_observe_sync(q, qt_f32(x), outer, 1, qt_ctx_batch_sync(ctx), err))
            return fail(g, "fake_quant %s: %s", n->name, err);
          if (q->scale_param >= 0) lsq_init(g, q);
          if (qt_ctx_profile(ctx))
            qt_profile_add_phase(qt_ctx_profile(ctx), QT_PROFILE_OBSERVER, qt_now_seconds() - t0);
        }
        if (!q->fake_quant) {
          y = x;
          break;
        }
        if (!q->calibrated) return fail(g, "fake_quant %s: %s", n->name, "no qparams yet (observer never ran)");
        const int pooled = fuse ? pool_fused_after(g, i, x, force, keep) : -1; /* the pool it runs with */
        if (pooled >= 0) deferred[pooled] = NODE_DONE;
        if (q->scale_param >= 0) {
          const int64_t per_sample = numel / (x->shape[0] > 0 ? x->shape[0] : 1);
          const float gf = 1.0f / sqrtf((float)per_sample * (float)q->spec.qmax);
          const int conv = fuse && pooled < 0 ? conv_fused_after(g, i, x, force, keep) : -1;
          if (conv >= 0) {
            y = x; /* the convolution quantizes it (conv_of_lsq_input) */
            deferred[conv] = i;
          } else if (pooled >= 0) {
            y = qt_fake_quant_lsq_max_pool2d(ctx, x, lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin, q->spec.qmax,
                                             gf, g->nodes[pooled].attr.kernel_h);
          } else {
            y = qt_fake_quant_lsq(ctx, x, outer, q->channels, 1, lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin,
                                  q->spec.qmax, gf);
          }
        } else if (pooled >= 0) {
          y = qt_fake_quant_max_pool2d(ctx, x, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax,
                                       g->nodes[pooled].attr.kernel_h);
        } else {
          y = qt_fake_quant(ctx, x, outer, q->channels, 1, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
        }
        break;
      }
      case QT_OP_QUANTIZE: {
        qt_qstate *q = n->q;
        const int64_t numel = qt_tensor_numel(x);
        y = qt_tensor_new(ctx, QT_I32, x->ndim, x->shape);
        qt_quantize((int32_t *)y->data, qt_f32(x), numel / q->channels, q->channels, 1, q->scale, q->zero_point,
                    q->spec.qmin, q->spec.qmax);
        break;
      }
      case QT_OP_DEQUANTIZE: {
        qt_qstate *q = n->q;
        QT_ASSERT(x->dtype == QT_I32, "dequantize %s: input is %s", n->name, qt_dtype_name(x->dtype));
        const int64_t numel = qt_tensor_numel(x);
        y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
        qt_dequantize(qt_f32(y), (const int32_t *)x->data, numel / q->channels, q->channels, 1, q->scale,
                      q->zero_point);
        break;
      }
      case QT_OP_COUNT:
        break;
    }
    QT_ASSERT(y, "graph %s: node %s has op %d with no executor", g->name, n->name, (int)n->op);
    vals[n->output] = force && force[n->output] ? force[n->output] : y;
    if (planned) {
      plan_produced(&plan, g, ctx, i, n->output, y, vals);
      plan_after(&plan, g, ctx, i, vals);
    }
  }
  return vals[g->output];
}
