/* What a Q/DQ file may hold (docs/qdq_format.md), checked on save (the graph in memory) and on
 * load (the rebuilt graph): the graph kind, ids, topological order, parameter and buffer slots
 * and output shapes as the op table (nn/ops.c) defines them, and every quantization record, so
 * a corrupt or hand-edited file gives a message naming the object, never a crash. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qdq_internal.h"

const char *const qt_qdq_param_slot_names[QT_MAX_PARAMS] = {"weight", "bias", "bn_weight", "bn_bias"};
const char *const qt_qdq_buffer_slot_names[QT_MAX_PARAMS] = {"running_mean", "running_var", "buffer2", "buffer3"};
const char *const qt_qdq_kind_names[KIND_COUNT] = {"qdq", "prepared"};
const char *const qt_qdq_kind_titles[KIND_COUNT] = {"Q/DQ graphs", "prepared graphs"};
const char *const qt_qdq_record_names[QDQ_RECORD_COUNT] = {"activation", "weight"};

void qt_qdq_shape_str(char *buf, size_t n, int ndim, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)s[i]);
  if (k < n) snprintf(buf + k, n - k, ")");
}

/* Node names become HDF5 link names: not empty, not ".", no '/'. */
int qt_qdq_bad_link_name(const char *name) { return !name[0] || !strcmp(name, ".") || strchr(name, '/') != NULL; }
/* The graphs an op belongs to (the op table's `graphs`); an invalid op fits none in particular. */
static int op_graphs(qt_op op) { return (unsigned)op < QT_OP_COUNT ? qt_op_info_get(op)->graphs : QT_OP_ANY_GRAPH; }

/* Which kind node n belongs to by itself: -1 when it fits both (fp32 ops). `why` says so. */
static int node_kind(const qt_node *n, char *why, size_t len) {
  const int graphs = op_graphs(n->op);
  if (graphs != QT_OP_ANY_GRAPH) {
    snprintf(why, len, "op '%s'", qt_op_name(n->op));
    return graphs == QT_OP_PREPARED_ONLY ? KIND_PREPARED : KIND_QDQ;
  }
  if (n->wq) {
    snprintf(why, len, "%s",
             n->wq->qweight ? "a weight quantized to integers" : "weight quantization without integer weights");
    return n->wq->qweight ? KIND_QDQ : KIND_PREPARED;
  }
  return -1;
}

/* The kind of an in-memory graph: prepared when any node is, else qdq (an fp32 graph is a
 * valid Q/DQ graph). A graph holding parts of both is refused. */
int qt_qdq_infer_kind(const qt_graph *g, graph_kind *kind, char *msg) {
  int first[KIND_COUNT] = {-1, -1};
  char why[KIND_COUNT][96];
  for (int i = 0; i < g->n_nodes; i++) {
    char w[96];
    int k = node_kind(&g->nodes[i], w, sizeof w);
    if (k >= 0 && first[k] < 0) {
      first[k] = i;
      memcpy(why[k], w, sizeof w);
    }
  }
  if (first[KIND_QDQ] >= 0 && first[KIND_PREPARED] >= 0) {
    const int p = first[KIND_PREPARED], q = first[KIND_QDQ];
    return qt_err(msg,
                  "node %d '%s': %s belongs to prepared graphs, but node %d '%s': %s belongs to Q/DQ graphs; a file "
                  "holds one or the other (save the prepared graph, or its qt_convert result)",
                  p, g->nodes[p].name, why[KIND_PREPARED], q, g->nodes[q].name, why[KIND_QDQ]);
  }
  *kind = first[KIND_PREPARED] >= 0 ? KIND_PREPARED : KIND_QDQ;
  return 0;
}

/* ---- validation, shared by save (the graph in memory) and load (the rebuilt graph) -------- */

static int check_slot(const qt_graph *g, const char *where, qt_op op, int t, int use, int is_buffer, const char *slot,
                      char *msg) {
  if (t < 0)
    return use == QT_SLOT_REQUIRED ? qt_err(msg, "%s: op '%s' needs a %s tensor", where, qt_op_name(op), slot) : 0;
  if (t >= g->n_tensors)
    return qt_err(msg, "%s: %s tensor id %d out of range (%d tensors)", where, slot, t, g->n_tensors);
  if (!use)
    return qt_err(msg, "%s: op '%s' has no %s tensor (found '%s')", where, qt_op_name(op), slot, g->tensors[t].name);
  if (g->tensors[t].is_buffer != is_buffer)
    return qt_err(msg, "%s: %s tensor '%s' is a %s, want a %s", where, slot, g->tensors[t].name,
                  g->tensors[t].is_buffer ? "buffer" : "parameter", is_buffer ? "buffer" : "parameter");
  return 0;
}

static int check_vector(const qt_graph *g, const char *where, int t, int64_t len, char *msg) {
  if (t < 0) return 0;
  const qt_param *p = &g->tensors[t];
  if (p->ndim != 1 || p->shape[0] != len) {
    char s[96];
    qt_qdq_shape_str(s, sizeof s, p->ndim, p->shape);
    return qt_err(msg, "%s: tensor '%s' has shape %s, want (%lld)", where, p->name, s, (long long)len);
  }
  return 0;
}

/* Per-sample value shapes: rank 1..3, every dimension and the size bounded. */
static int check_values(const qt_graph *g, char *msg) {
  for (int v = 0; v < g->n_values; v++) {
    const qt_value *val = &g->values[v];
    if (val->ndim < 1 || val->ndim > 3)
      return qt_err(msg, "value %d '%s': rank %d, want 1..3", v, val->name, val->ndim);
    int64_t numel = 1;
    for (int d = 0; d < val->ndim; d++) {
      if (val->shape[d] < 1 || val->shape[d] > QDQ_MAX_DIM)
        return qt_err(msg, "value %d '%s': dimension %d is %lld", v, val->name, d, (long long)val->shape[d]);
      numel *= val->shape[d];
      if (numel > QDQ_MAX_NUMEL)
        return qt_err(msg, "value %d '%s': more than %lld elements per sample", v, val->name, (long long)QDQ_MAX_NUMEL);
    }
  }
  return 0;
}

/* Tensor shapes: rank 1..4, bounded, and numel the product of the shape. */
static int check_tensors(const qt_graph *g, char *msg) {
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    if (p->ndim < 1 || p->ndim > 4) return qt_err(msg, "tensor '%s': rank %d, want 1..4", p->name, p->ndim);
    int64_t numel = 1;
    for (int d = 0; d < p->ndim; d++) {
      if (p->shape[d] < 1 || p->shape[d] > QDQ_MAX_NUMEL)
        return qt_err(msg, "tensor '%s': dimension %d is %lld", p->name, d, (long long)p->shape[d]);
      numel *= p->shape[d];
      if (numel > QDQ_MAX_NUMEL)
        return qt_err(msg, "tensor '%s': more than %lld elements", p->name, (long long)QDQ_MAX_NUMEL);
    }
    if (numel != p->numel)
      return qt_err(msg, "tensor '%s': numel %lld disagrees with its shape", p->name, (long long)p->numel);
  }
  return 0;
}

/* The node's op and quantization belong to graphs of `kind` (the op table's `graphs`). */
static int check_node_kind(const qt_node *n, graph_kind kind, const char *where, char *msg) {
  char why[96];
  const int nk = node_kind(n, why, sizeof why);
  if (op_graphs(n->op) == QT_OP_PREPARED_ONLY && kind == KIND_QDQ)
    return qt_err(msg, "%s: op '%s' belongs to prepared graphs, not to a Q/DQ graph (run qt_convert first)", where,
                  qt_op_name(n->op));
  if (nk >= 0 && nk != (int)kind)
    return qt_err(msg, "%s: %s belongs to %s, not to %s", where, why, qt_qdq_kind_titles[nk], qt_qdq_kind_titles[kind]);
  return 0;
}

/* Node i's inputs: as many as its op takes, produced by earlier nodes, and integers (a quantize
 * output) read by dequantize nodes only. */
static int check_node_inputs(const qt_graph *g, int i, const char *where, char *msg) {
  const qt_node *n = &g->nodes[i];
  const qt_op_info *info = qt_op_info_get(n->op);
  if (n->n_inputs < info->min_inputs || n->n_inputs > info->max_inputs)
    return qt_err(msg, "%s: op '%s' takes %d input(s), has %d", where, info->name, info->min_inputs, n->n_inputs);
  for (int k = 0; k < n->n_inputs; k++) {
    int v = n->inputs[k];
    if (v < 0 || v >= g->n_values)
      return qt_err(msg, "%s: input value id %d out of range (%d values)", where, v, g->n_values);
    int p = g->values[v].producer;
    if (p < 0 || p >= i)
      return qt_err(msg,
                    "%s: input value %d '%s' is not produced by an earlier node (nodes must be in topological order)",
                    where, v, g->values[v].name);
    int is_int = g->nodes[p].op == QT_OP_QUANTIZE;
    if (n->op == QT_OP_DEQUANTIZE && !is_int)
      return qt_err(msg, "%s: dequantize reads '%s', which is not the output of a quantize node", where,
                    g->values[v].name);
    if (n->op != QT_OP_DEQUANTIZE && is_int)
      return qt_err(msg, "%s: reads the integer output of quantize '%s'; only a dequantize may", where,
                    g->nodes[p].name);
  }
  return 0;
}

/* Every parameter and buffer slot as the op table uses it. */
static int check_node_slots(const qt_graph *g, const qt_node *n, const char *where, char *msg) {
  const qt_op_info *info = qt_op_info_get(n->op);
  for (int k = 0; k < QT_MAX_PARAMS; k++)
    if (check_slot(g, where, n->op, n->param[k], info->param_use[k], 0, qt_qdq_param_slot_names[k], msg) ||
        check_slot(g, where, n->op, n->buffer[k], info->buffer_use[k], 1, qt_qdq_buffer_slot_names[k], msg))
      return -1;
  return 0;
}

/* A convolution's weight (OC, C/groups, KH, KW) against its image input and attributes. */
static int check_conv_weight(const qt_node *n, const qt_value *x, const qt_param *W, const char *where, char *msg) {
  const char *op = qt_op_name(n->op);
  const qt_node_attrs *a = &n->attr;
  if (x->ndim != 3) return qt_err(msg, "%s: %s input '%s' is not an image (H, W, C)", where, op, x->name);
  if (W->ndim != 4)
    return qt_err(msg, "%s: weight '%s' is %d-D, %s wants 4-D (OC, C/groups, KH, KW)", where, W->name, W->ndim, op);
  char s[96];
  qt_qdq_shape_str(s, sizeof s, W->ndim, W->shape);
  const int64_t C = x->shape[2], OC = W->shape[0];
  if (a->groups < 1 || C % a->groups || OC % a->groups || W->shape[1] * a->groups != C)
    return qt_err(msg, "%s: weight '%s' %s does not fit %lld input channels with groups %d", where, W->name, s,
                  (long long)C, a->groups);
  if (W->shape[2] != a->kernel_h || W->shape[3] != a->kernel_w)
    return qt_err(msg, "%s: weight '%s' %s has a %lldx%lld kernel, the attributes say %dx%d", where, W->name, s,
                  (long long)W->shape[2], (long long)W->shape[3], a->kernel_h, a->kernel_w);
  return 0;
}

/* A linear layer's weight (OUT, IN) against its flat input. */
static int check_linear_weight(const qt_value *x, const qt_param *W, const char *where, char *msg) {
  if (x->ndim != 1)
    return qt_err(msg, "%s: linear input '%s' has rank %d, want flat features (F)", where, x->name, x->ndim);
  if (W->ndim != 2) return qt_err(msg, "%s: weight '%s' is %d-D, linear wants 2-D (OUT, IN)", where, W->name, W->ndim);
  if (W->shape[1] != x->shape[0])
    return qt_err(msg, "%s: weight '%s' takes %lld features, input '%s' has %lld", where, W->name,
                  (long long)W->shape[1], x->name, (long long)x->shape[0]);
  return 0;
}

/* The node's tensors against its input and attributes, as the op table lays them out: the
 * weight in the layout of its rank, with out_channels rows; every other slot (bias, BN
 * parameters and running statistics) one value per channel, the weight's rows or else the
 * input's last axis; and eps of the ops with BN statistics finite and > 0. */
static int check_node_tensors(const qt_graph *g, const qt_node *n, const char *where, char *msg) {
  const qt_op_info *info = qt_op_info_get(n->op);
  if (!n->n_inputs) return 0;
  const qt_value *x = &g->values[n->inputs[0]];
  int64_t channels = info->param_count_attr ? n->attr.out_channels : x->shape[x->ndim - 1];
  if (info->has_weight) {
    const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
    if (info->weight_rank == 4 ? check_conv_weight(n, x, W, where, msg) : check_linear_weight(x, W, where, msg))
      return -1;
    channels = W->shape[0];
    if (n->attr.out_channels != channels)
      return qt_err(msg, "%s: out_channels %d, weight '%s' has %lld", where, n->attr.out_channels, W->name,
                    (long long)channels);
  }
  if (info->param_per_sample) { /* add_param: the input's per-sample shape */
    const qt_param *P = &g->tensors[n->param[QT_P_WEIGHT]];
    if (P->ndim != x->ndim || memcmp(P->shape, x->shape, (size_t)x->ndim * sizeof *x->shape)) {
      char s[64], want[64];
      qt_qdq_shape_str(s, sizeof s, P->ndim, P->shape);
      qt_qdq_shape_str(want, sizeof want, x->ndim, x->shape);
      return qt_err(msg, "%s: parameter '%s' is %s, the input's shape %s", where, P->name, s, want);
    }
  }
  const int first = info->has_weight || info->param_per_sample ? QT_P_WEIGHT + 1 : 0;
  for (int k = first; k < QT_MAX_PARAMS; k++)
    if (check_vector(g, where, n->param[k], channels, msg)) return -1;
  for (int k = 0; k < QT_MAX_PARAMS; k++)
    if (check_vector(g, where, n->buffer[k], channels, msg)) return -1;
  const qt_node_attrs *a = &n->attr;
  if (info->buffer_use[QT_B_RUNNING_VAR] == QT_SLOT_REQUIRED &&
      (!isfinite(a->eps) || !(a->eps > 0) || !isfinite(a->momentum)))
    return qt_err(msg, "%s: eps %g must be finite and > 0, momentum %g finite", where, a->eps, a->momentum);
  return 0;
}

/* The output value's shape: an image for the input node, else what the op table infers. */
static int check_node_output(const qt_graph *g, const qt_node *n, const char *where, char *msg) {
  const qt_value *y = &g->values[n->output];
  int64_t want[3] = {0, 0, 0};
  int want_nd = 0;
  if (n->op == QT_OP_INPUT) {
    if (y->ndim != 3) return qt_err(msg, "%s: the input value must be an image (H, W, C), has rank %d", where, y->ndim);
    want_nd = 3;
    memcpy(want, y->shape, sizeof want);
  } else {
    const qt_value *in[QT_MAX_INPUTS];
    for (int k = 0; k < n->n_inputs; k++) in[k] = &g->values[n->inputs[k]];
    char shape_why[QT_ERR_LEN];
    if (qt_op_output_shape(n->op, &n->attr, in, n->n_inputs, &want_nd, want, shape_why))
      return qt_err(msg, "%s: %s", where, shape_why);
  }
  int same = y->ndim == want_nd;
  for (int d = 0; same && d < want_nd; d++) same = y->shape[d] == want[d];
  if (!same) {
    char s1[96], s2[96];
    qt_qdq_shape_str(s1, sizeof s1, y->ndim, y->shape);
    qt_qdq_shape_str(s2, sizeof s2, want_nd, want);
    return qt_err(msg, "%s: output value '%s' has shape %s, op '%s' computes %s", where, y->name, s1, qt_op_name(n->op),
                  s2);
  }
  return 0;
}

/* Node i: its op and kind, inputs, output id, slots, tensors and output shape. */
static int check_node(const qt_graph *g, int i, graph_kind kind, char *msg) {
  const qt_node *n = &g->nodes[i];
  char where[QT_NAME_LEN + 32];
  snprintf(where, sizeof where, "node %d '%s'", i, n->name);
  if ((unsigned)n->op >= QT_OP_COUNT) return qt_err(msg, "%s: op %d is not an op", where, (int)n->op);
  if (check_node_kind(n, kind, where, msg) || check_node_inputs(g, i, where, msg)) return -1;
  if (n->output < 0 || n->output >= g->n_values || g->values[n->output].producer != i)
    return qt_err(msg, "%s: output value id %d out of range or produced by another node", where, n->output);
  if (n->op == QT_OP_INPUT && g->input != n->output)
    return qt_err(msg, "%s: the graph input is value %d, this input node produces %d", where, g->input, n->output);
  if (check_node_slots(g, n, where, msg) || check_node_tensors(g, n, where, msg)) return -1;
  return check_node_output(g, n, where, msg);
}

/* Shapes, ids, topological order and slots: everything but quantization records. */
int qt_qdq_validate_structure(const qt_graph *g, graph_kind kind, char *msg) {
  if (g->n_nodes < 1) return qt_err(msg, "graph '%s' has no nodes", g->name);
  if (check_values(g, msg) || check_tensors(g, msg)) return -1;
  int n_input_nodes = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (check_node(g, i, kind, msg)) return -1;
    n_input_nodes += g->nodes[i].op == QT_OP_INPUT;
  }
  if (n_input_nodes != 1) return qt_err(msg, "graph '%s' has %d input nodes, want 1", g->name, n_input_nodes);
  if (g->output < 0 || g->output >= g->n_values)
    return qt_err(msg, "graph output value id %d out of range (%d values)", g->output, g->n_values);
  return 0;
}

/* The quantization axis of a record: -1 per tensor; weights: 0 (OIHW output channels);
 * activations: the last axis of the (N, ...) tensor, the channel of NHWC. */
int qt_qdq_record_axis(const qt_qspec *s, int is_weight, int value_ndim) {
  return !s->per_channel ? -1 : is_weight ? 0 : value_ndim;
}

/* The spec: bits, [qmin, qmax] within them, observer settings. */
static int check_qspec(const qt_qspec *s, const char *what, const char *where, char *msg) {
  if (s->bits < 2 || s->bits > QDQ_MAX_BITS)
    return qt_err(msg, "%s: %s: bits %d outside 2..%d", where, what, s->bits, QDQ_MAX_BITS);
  const int64_t lo = s->is_signed ? -((int64_t)1 << (s->bits - 1)) : 0;
  const int64_t hi = s->is_signed ? ((int64_t)1 << (s->bits - 1)) - 1 : ((int64_t)1 << s->bits) - 1;
  if (!(lo <= s->qmin && s->qmin < s->qmax && s->qmax <= hi))
    return qt_err(msg, "%s: %s: [qmin %d, qmax %d] is not a range within %d-bit %s [%lld, %lld]", where, what, s->qmin,
                  s->qmax, s->bits, s->is_signed ? "signed" : "unsigned", (long long)lo, (long long)hi);
  if ((unsigned)s->observer >= QT_OBSERVER_COUNT || (unsigned)s->method >= QT_RANGE_COUNT || !isfinite(s->percentile))
    return qt_err(msg, "%s: %s: bad observer settings", where, what);
  return 0;
}

/* The qparams: one channel per tensor or axis_dim per channel, each scale finite and > 0, each
 * zero point within [qmin, qmax]. */
static int check_qparams(const qt_qstate *q, graph_kind kind, int is_weight, int64_t axis_dim, const char *what,
                         const char *where, char *msg) {
  const qt_qspec *s = &q->spec;
  const int64_t want_ch = s->per_channel ? axis_dim : 1;
  if (q->channels != want_ch)
    return qt_err(
        msg, "%s: %s: %d channels, want %lld (%s)", where, what, q->channels, (long long)want_ch,
        s->per_channel ? (is_weight ? "per channel along axis 0" : "per channel along the last axis") : "per tensor");
  /* A loaded record is calibrated; an uncalibrated one holds placeholders, not qparams. */
  if (kind == KIND_PREPARED && !q->calibrated)
    return qt_err(msg, "%s: %s holds no qparams yet (its observer never ran: calibrate or train first)", where, what);
  for (int c = 0; c < q->channels; c++) {
    if (!isfinite(q->scale[c]) || !(q->scale[c] > 0))
      return qt_err(msg, "%s: %s: scale[%d] = %g is not a finite number > 0", where, what, c, q->scale[c]);
    if (q->zero_point[c] < s->qmin || q->zero_point[c] > s->qmax)
      return qt_err(msg, "%s: %s: zero_point[%d] = %d outside [qmin %d, qmax %d]", where, what, c, q->zero_point[c],
                    s->qmin, s->qmax);
  }
  return 0;
}

/* Integer weights: a Q/DQ graph's weight records hold numel of them within [qmin, qmax]; its
 * activation records and every record of a prepared graph hold none. */
static int check_qweights(const qt_qstate *q, graph_kind kind, int is_weight, int64_t numel, const char *what,
                          const char *where, char *msg) {
  const qt_qspec *s = &q->spec;
  if (kind == KIND_PREPARED) {
    /* The file cannot say that fake quant is off: the loaded graph would apply it. */
    if (!q->fake_quant)
      return qt_err(msg,
                    "%s: %s has fake quant off; a prepared graph is stored with fake quant on "
                    "(qt_set_fake_quant(g, 1) before saving)",
                    where, what);
    if (q->qweight) return qt_err(msg, "%s: %s holds integer weights, which a prepared graph does not", where, what);
    return 0;
  }
  if (!is_weight) {
    if (q->qweight) return qt_err(msg, "%s: activation quantization holds integer weights", where);
    return 0;
  }
  if (!q->qweight)
    return qt_err(msg, "%s: weight quantization without integer weights (a prepared graph? run qt_convert first)",
                  where);
  if (q->n_qweight != numel)
    return qt_err(msg, "%s: %lld integer weights, the weight has %lld elements", where, (long long)q->n_qweight,
                  (long long)numel);
  for (int64_t k = 0; k < numel; k++)
    if (q->qweight[k] < s->qmin || q->qweight[k] > s->qmax)
      return qt_err(msg, "%s: integer weight %lld = %d outside [qmin %d, qmax %d]", where, (long long)k, q->qweight[k],
                    s->qmin, s->qmax);
  return 0;
}

static int check_qstate(const qt_qstate *q, graph_kind kind, int is_weight, int64_t axis_dim, int64_t numel,
                        const char *where, char *msg) {
  const char *what = is_weight ? "weight quantization" : "activation quantization";
  if (check_qspec(&q->spec, what, where, msg) || check_qparams(q, kind, is_weight, axis_dim, what, where, msg))
    return -1;
  return check_qweights(q, kind, is_weight, numel, what, where, msg);
}

/* An int32 bias: a layer whose input lies on one per-tensor grid (its scale is part of the
 * bias's), and in a Q/DQ graph one integer per output channel inside the int32 bias range. */
static int check_bias(const qt_graph *g, int i, graph_kind kind, const char *where, char *msg) {
  const qt_node *n = &g->nodes[i];
  const qt_qstate *q = n->wq;
  if (!q->spec.bias_int32) {
    if (q->qbias) return qt_err(msg, "%s: integer biases without bias = int32", where);
    return 0;
  }
  if (qt_graph_quant_source(g, n->inputs[0]) < 0)
    return qt_err(msg,
                  "%s: an int32 bias needs an input quantized per tensor (a %s, through max_pool2d, flatten, relu, "
                  "a channel shuffle or slice, or a concat of inputs on one grid, at most); %s is not",
                  where, kind == KIND_PREPARED ? "fake_quant" : "dequantize", g->values[n->inputs[0]].name);
  if (kind == KIND_PREPARED || n->param[QT_P_BIAS] < 0) {
    if (q->qbias)
      return qt_err(msg, "%s: integer biases where %s", where,
                    kind == KIND_PREPARED ? "a prepared graph has none" : "the node has no bias");
    return 0;
  }
  const int64_t oc = g->tensors[n->param[QT_P_BIAS]].numel;
  if (!q->qbias || q->n_qbias != oc)
    return qt_err(msg, "%s: bias = int32, %lld integer biases for %lld channels", where,
                  (long long)(q->qbias ? q->n_qbias : 0), (long long)oc);
  for (int64_t c = 0; c < oc; c++)
    if (q->qbias[c] < QT_BIAS_QMIN || q->qbias[c] > QT_BIAS_QMAX)
      return qt_err(msg, "%s: integer bias %lld = %d outside [%d, %d]", where, (long long)c, q->qbias[c], QT_BIAS_QMIN,
                    QT_BIAS_QMAX);
  return 0;
}

/* Every tensor's values finite: a NaN weight turns into a clamp bound of the integer range
 * (the quantize's min and max drop the NaN), so the file would run and compute something no
 * float model did. A diverged training leaves such values. */
static int check_tensor_values(const qt_graph *g, char *msg) {
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    const float *v = (p->is_buffer ? g->buffers : g->params) + p->offset;
    for (int64_t i = 0; i < p->numel; i++)
      if (!isfinite(v[i]))
        return qt_err(msg,
                      "tensor '%s'[%lld] is %s: a Q/DQ graph holds finite values only (a diverged training "
                      "leaves such values)",
                      p->name, (long long)i, isnan(v[i]) ? "NaN" : "Inf");
  }
  return 0;
}

int qt_qdq_validate_quant(const qt_graph *g, graph_kind kind, char *msg) {
  if (check_tensor_values(g, msg)) return -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    char where[QT_NAME_LEN + 32];
    snprintf(where, sizeof where, "node %d '%s'", i, n->name);
    if (qt_op_info_get(n->op)->act_quant) {
      if (!n->q) return qt_err(msg, "%s: %s without an activation quantization record", where, qt_op_name(n->op));
      const qt_value *x = &g->values[n->inputs[0]];
      if (check_qstate(n->q, kind, 0, x->shape[x->ndim - 1], 0, where, msg)) return -1;
    } else if (n->q) {
      return qt_err(msg, "%s: op '%s' carries an activation quantization record (only %s do)", where, qt_op_name(n->op),
                    kind == KIND_PREPARED ? "fake_quant nodes" : "quantize/dequantize");
    }
    if (n->wq) {
      if (!qt_op_has_weight(n->op))
        return qt_err(msg, "%s: op '%s' carries a weight quantization record (only conv2d/linear%s do)", where,
                      qt_op_name(n->op), kind == KIND_PREPARED ? "/conv_bn" : "");
      const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
      if (check_qstate(n->wq, kind, 1, W->shape[0], W->numel, where, msg)) return -1;
      if (check_bias(g, i, kind, where, msg)) return -1;
    }
  }
  return 0;
}
