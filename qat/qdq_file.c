/* The Q/DQ graph file (docs/qdq_format.md): qt_qdq_save writes a convert graph, or an
 * eval-mode prepared (training) graph, to HDF5 in a layout any HDF5 reader (h5py) can use
 * without this code; qt_qdq_load rebuilds it with the graph builder and validates everything
 * an executor would trust (op names, value ids and their order, tensor shapes against each op,
 * quantization ranges, scales, integer weights), so a corrupt or hand-edited file gives a
 * message naming the file and the object, never a crash. The root attribute `kind` says which
 * of the two graphs a file holds; each kind admits only its own ops and records, so a reader
 * of Q/DQ graphs never mistakes fake-quantized float weights for integer ones. Datasets carry
 * Fletcher-32 checksums and metadata uses HDF5 1.10's checksummed object headers, so flipped
 * bytes are caught rather than loaded as other numbers. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qat/qat.h"
#include "qat/qstate_file.h"

#define QDQ_FORMAT "qt-qdq-graph"
#define QDQ_VERSION 1
#define QDQ_MAX_NODES 1000000
#define QDQ_MAX_DIM ((int64_t)1 << 24)
#define QDQ_MAX_NUMEL ((int64_t)1 << 28) /* per tensor or per-sample value */
#define QDQ_MAX_CHANNELS (1 << 24)
#define QDQ_MAX_BITS 16
#define QDQ_CHUNK_BYTES ((size_t)1 << 24)
#define QDQ_COMPACT_LINKS 65535 /* links kept in the (checksummed) group header, not a heap */
#define NODE_LINK_LEN (QT_NAME_LEN + 16)

/* Node attributes naming the tensors in param[] / buffer[] slots (PyTorch's names; conv_bn's
 * BN gamma and beta are its BatchNorm's weight and bias). */
static const char *const param_slot_names[QT_MAX_PARAMS] = {"weight", "bias", "bn_weight", "bn_bias"};
static const char *const buffer_slot_names[QT_MAX_PARAMS] = {"running_mean", "running_var", "buffer2", "buffer3"};

static void shape_str(char *buf, size_t n, int ndim, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)s[i]);
  if (k < n) snprintf(buf + k, n - k, ")");
}

/* Node names become HDF5 link names: not empty, not ".", no '/'. */
static int bad_link_name(const char *name) { return !name[0] || !strcmp(name, ".") || strchr(name, '/') != NULL; }

/* What a file holds (root attribute `kind`): a convert graph (quantize/dequantize, integer
 * weights) or a prepared graph in eval mode (fake_quant, conv_bn, fake-quantized float weights). */
typedef enum { KIND_QDQ, KIND_PREPARED, KIND_COUNT } graph_kind;
static const char *const kind_names[KIND_COUNT] = {"qdq", "prepared"};
static const char *const kind_titles[KIND_COUNT] = {"Q/DQ graphs", "prepared graphs"};

/* Which kind node n belongs to by itself: -1 when it fits both (fp32 ops). `why` says so. */
static int node_kind(const qt_node *n, char *why, size_t len) {
  if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || n->op == QT_OP_QUANTIZE || n->op == QT_OP_DEQUANTIZE) {
    snprintf(why, len, "op '%s'", qt_op_name(n->op));
    return n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN ? KIND_PREPARED : KIND_QDQ;
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
static int infer_kind(const qt_graph *g, graph_kind *kind, char *msg) {
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

/* How an op uses a parameter / buffer slot: 0 never, 1 optional, 2 required. */
_Static_assert(QT_MAX_PARAMS == 4 && QT_P_BN_GAMMA == 2 && QT_P_BN_BETA == 3, "conv_bn slots and their names");
static int param_slot_use(qt_op op, int k) {
  if (op == QT_OP_CONV2D || op == QT_OP_LINEAR) return k == QT_P_WEIGHT ? 2 : k == QT_P_BIAS ? 1 : 0;
  if (op == QT_OP_CONV_BN) return k == QT_P_BIAS ? 1 : 2; /* weight, bias, BN gamma, BN beta */
  if (op == QT_OP_BATCH_NORM) return k == QT_P_GAMMA || k == QT_P_BETA ? 2 : 0;
  return 0;
}
static int buffer_slot_use(qt_op op, int k) {
  return (op == QT_OP_BATCH_NORM || op == QT_OP_CONV_BN) && (k == QT_B_RUNNING_MEAN || k == QT_B_RUNNING_VAR) ? 2 : 0;
}

static int op_inputs(qt_op op) { return op == QT_OP_INPUT ? 0 : op == QT_OP_ADD ? 2 : 1; }

static int check_slot(const qt_graph *g, const char *where, qt_op op, int t, int use, int is_buffer,
                      const char *slot, char *msg) {
  if (t < 0) return use == 2 ? qt_err(msg, "%s: op '%s' needs a %s tensor", where, qt_op_name(op), slot) : 0;
  if (t >= g->n_tensors) return qt_err(msg, "%s: %s tensor id %d out of range (%d tensors)", where, slot, t, g->n_tensors);
  if (!use) return qt_err(msg, "%s: op '%s' has no %s tensor (found '%s')", where, qt_op_name(op), slot, g->tensors[t].name);
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
    shape_str(s, sizeof s, p->ndim, p->shape);
    return qt_err(msg, "%s: tensor '%s' has shape %s, want (%lld)", where, p->name, s, (long long)len);
  }
  return 0;
}

/* Output side of a pooling window; -1 when it does not fit. */
static int64_t window_out(int64_t in, int k, int s, int p) {
  if (k < 1 || s < 1 || p < 0 || in + 2 * (int64_t)p < k) return -1;
  return (in + 2 * (int64_t)p - k) / s + 1;
}

/* Shapes, ids, topological order and slots: everything but quantization records. */
static int validate_structure(const qt_graph *g, graph_kind kind, char *msg) {
  if (g->n_nodes < 1) return qt_err(msg, "graph '%s' has no nodes", g->name);
  for (int v = 0; v < g->n_values; v++) {
    const qt_value *val = &g->values[v];
    if (val->ndim < 1 || val->ndim > 3) return qt_err(msg, "value %d '%s': rank %d, want 1..3", v, val->name, val->ndim);
    int64_t numel = 1;
    for (int d = 0; d < val->ndim; d++) {
      if (val->shape[d] < 1 || val->shape[d] > QDQ_MAX_DIM)
        return qt_err(msg, "value %d '%s': dimension %d is %lld", v, val->name, d, (long long)val->shape[d]);
      numel *= val->shape[d];
      if (numel > QDQ_MAX_NUMEL) return qt_err(msg, "value %d '%s': more than %lld elements per sample", v, val->name,
                                             (long long)QDQ_MAX_NUMEL);
    }
  }
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    if (p->ndim < 1 || p->ndim > 4) return qt_err(msg, "tensor '%s': rank %d, want 1..4", p->name, p->ndim);
    int64_t numel = 1;
    for (int d = 0; d < p->ndim; d++) {
      if (p->shape[d] < 1 || p->shape[d] > QDQ_MAX_NUMEL)
        return qt_err(msg, "tensor '%s': dimension %d is %lld", p->name, d, (long long)p->shape[d]);
      numel *= p->shape[d];
      if (numel > QDQ_MAX_NUMEL) return qt_err(msg, "tensor '%s': more than %lld elements", p->name, (long long)QDQ_MAX_NUMEL);
    }
    if (numel != p->numel) return qt_err(msg, "tensor '%s': numel %lld disagrees with its shape", p->name, (long long)p->numel);
  }
  int n_input_nodes = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    char where[QT_NAME_LEN + 32];
    snprintf(where, sizeof where, "node %d '%s'", i, n->name);
    if ((unsigned)n->op >= QT_OP_COUNT) return qt_err(msg, "%s: op %d is not an op", where, (int)n->op);
    const char *op = qt_op_name(n->op);
    char why[96];
    const int nk = node_kind(n, why, sizeof why);
    if ((n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN) && kind == KIND_QDQ)
      return qt_err(msg, "%s: op '%s' belongs to prepared graphs, not to a Q/DQ graph (run qt_convert first)", where, op);
    if (nk >= 0 && nk != (int)kind)
      return qt_err(msg, "%s: %s belongs to %s, not to %s", where, why, kind_titles[nk], kind_titles[kind]);
    if (n->n_inputs != op_inputs(n->op))
      return qt_err(msg, "%s: op '%s' takes %d input(s), has %d", where, op, op_inputs(n->op), n->n_inputs);
    for (int k = 0; k < n->n_inputs; k++) {
      int v = n->inputs[k];
      if (v < 0 || v >= g->n_values)
        return qt_err(msg, "%s: input value id %d out of range (%d values)", where, v, g->n_values);
      int p = g->values[v].producer;
      if (p < 0 || p >= i)
        return qt_err(msg, "%s: input value %d '%s' is not produced by an earlier node (nodes must be in topological order)",
                    where, v, g->values[v].name);
      int is_int = g->nodes[p].op == QT_OP_QUANTIZE;
      if (n->op == QT_OP_DEQUANTIZE && !is_int)
        return qt_err(msg, "%s: dequantize reads '%s', which is not the output of a quantize node", where,
                    g->values[v].name);
      if (n->op != QT_OP_DEQUANTIZE && is_int)
        return qt_err(msg, "%s: reads the integer output of quantize '%s'; only a dequantize may", where,
                    g->nodes[p].name);
    }
    if (n->output < 0 || n->output >= g->n_values || g->values[n->output].producer != i)
      return qt_err(msg, "%s: output value id %d out of range or produced by another node", where, n->output);
    if (n->op == QT_OP_INPUT) {
      n_input_nodes++;
      if (g->input != n->output)
        return qt_err(msg, "%s: the graph input is value %d, this input node produces %d", where, g->input, n->output);
    }
    for (int k = 0; k < QT_MAX_PARAMS; k++) {
      if (check_slot(g, where, n->op, n->param[k], param_slot_use(n->op, k), 0, param_slot_names[k], msg) ||
          check_slot(g, where, n->op, n->buffer[k], buffer_slot_use(n->op, k), 1, buffer_slot_names[k], msg))
        return -1;
    }
    const qt_value *x = n->n_inputs ? &g->values[n->inputs[0]] : NULL, *y = &g->values[n->output];
    const qt_node_attrs *a = &n->attr;
    const qt_param *W = n->param[QT_P_WEIGHT] >= 0 ? &g->tensors[n->param[QT_P_WEIGHT]] : NULL;
    char s1[96], s2[96];
    int64_t want[3] = {0, 0, 0};
    int want_nd = 0;
    switch (n->op) {
      case QT_OP_INPUT:
        if (y->ndim != 3) return qt_err(msg, "%s: the input value must be an image (H, W, C), has rank %d", where, y->ndim);
        want_nd = 3;
        memcpy(want, y->shape, sizeof want);
        break;
      case QT_OP_CONV2D:
      case QT_OP_CONV_BN: {
        if (x->ndim != 3) return qt_err(msg, "%s: %s input '%s' is not an image (H, W, C)", where, op, x->name);
        if (W->ndim != 4)
          return qt_err(msg, "%s: weight '%s' is %d-D, %s wants 4-D (OC, C/groups, KH, KW)", where, W->name, W->ndim, op);
        shape_str(s1, sizeof s1, W->ndim, W->shape);
        const int64_t C = x->shape[2], OC = W->shape[0];
        if (a->groups < 1 || C % a->groups || OC % a->groups || W->shape[1] * a->groups != C)
          return qt_err(msg, "%s: weight '%s' %s does not fit %lld input channels with groups %d", where, W->name, s1,
                      (long long)C, a->groups);
        if (W->shape[2] != a->kernel_h || W->shape[3] != a->kernel_w)
          return qt_err(msg, "%s: weight '%s' %s has a %lldx%lld kernel, the attributes say %dx%d", where, W->name, s1,
                      (long long)W->shape[2], (long long)W->shape[3], a->kernel_h, a->kernel_w);
        if (a->out_channels != OC)
          return qt_err(msg, "%s: out_channels %d, weight '%s' has %lld", where, a->out_channels, W->name, (long long)OC);
        want[0] = window_out(x->shape[0], a->kernel_h, a->stride_h, a->pad_h);
        want[1] = window_out(x->shape[1], a->kernel_w, a->stride_w, a->pad_w);
        if (want[0] < 1 || want[1] < 1)
          return qt_err(msg, "%s: kernel %dx%d stride %dx%d pad %dx%d do not fit input %lldx%lld", where, a->kernel_h,
                      a->kernel_w, a->stride_h, a->stride_w, a->pad_h, a->pad_w, (long long)x->shape[0],
                      (long long)x->shape[1]);
        want[2] = OC;
        want_nd = 3;
        if (check_vector(g, where, n->param[QT_P_BIAS], OC, msg)) return -1;
        if (n->op == QT_OP_CONV_BN &&
            (check_vector(g, where, n->param[QT_P_BN_GAMMA], OC, msg) ||
             check_vector(g, where, n->param[QT_P_BN_BETA], OC, msg) ||
             check_vector(g, where, n->buffer[QT_B_RUNNING_MEAN], OC, msg) ||
             check_vector(g, where, n->buffer[QT_B_RUNNING_VAR], OC, msg)))
          return -1;
        if (n->op == QT_OP_CONV_BN && (!isfinite(a->eps) || !(a->eps > 0) || !isfinite(a->momentum)))
          return qt_err(msg, "%s: eps %g must be finite and > 0, momentum %g finite", where, a->eps, a->momentum);
        break;
      }
      case QT_OP_LINEAR:
        if (x->ndim != 1)
          return qt_err(msg, "%s: linear input '%s' has rank %d, want flat features (F)", where, x->name, x->ndim);
        if (W->ndim != 2) return qt_err(msg, "%s: weight '%s' is %d-D, linear wants 2-D (OUT, IN)", where, W->name, W->ndim);
        if (W->shape[1] != x->shape[0])
          return qt_err(msg, "%s: weight '%s' takes %lld features, input '%s' has %lld", where, W->name,
                      (long long)W->shape[1], x->name, (long long)x->shape[0]);
        if (a->out_channels != W->shape[0])
          return qt_err(msg, "%s: out_channels %d, weight '%s' has %lld", where, a->out_channels, W->name,
                      (long long)W->shape[0]);
        want[0] = W->shape[0];
        want_nd = 1;
        if (check_vector(g, where, n->param[QT_P_BIAS], W->shape[0], msg)) return -1;
        break;
      case QT_OP_BATCH_NORM: {
        const int64_t C = x->shape[x->ndim - 1];
        if (check_vector(g, where, n->param[QT_P_GAMMA], C, msg) || check_vector(g, where, n->param[QT_P_BETA], C, msg) ||
            check_vector(g, where, n->buffer[QT_B_RUNNING_MEAN], C, msg) ||
            check_vector(g, where, n->buffer[QT_B_RUNNING_VAR], C, msg))
          return -1;
        if (!isfinite(a->eps) || !(a->eps > 0) || !isfinite(a->momentum))
          return qt_err(msg, "%s: eps %g must be finite and > 0, momentum %g finite", where, a->eps, a->momentum);
        want_nd = x->ndim;
        memcpy(want, x->shape, sizeof want);
        break;
      }
      case QT_OP_MAX_POOL2D:
      case QT_OP_AVG_POOL2D:
        if (x->ndim != 3) return qt_err(msg, "%s: %s input '%s' is not an image (H, W, C)", where, op, x->name);
        if (a->kernel_h != a->kernel_w || a->stride_h != a->stride_w || a->pad_h != a->pad_w)
          return qt_err(msg, "%s: %s needs a square kernel, stride and padding (kernel %dx%d stride %dx%d pad %dx%d)",
                      where, op, a->kernel_h, a->kernel_w, a->stride_h, a->stride_w, a->pad_h, a->pad_w);
        want[0] = window_out(x->shape[0], a->kernel_h, a->stride_h, a->pad_h);
        want[1] = window_out(x->shape[1], a->kernel_w, a->stride_w, a->pad_w);
        if (want[0] < 1 || want[1] < 1 || 2 * a->pad_h > a->kernel_h)
          return qt_err(msg, "%s: kernel %d stride %d pad %d do not fit input %lldx%lld", where, a->kernel_h, a->stride_h,
                      a->pad_h, (long long)x->shape[0], (long long)x->shape[1]);
        want[2] = x->shape[2];
        want_nd = 3;
        break;
      case QT_OP_GLOBAL_AVG_POOL:
        if (x->ndim != 3) return qt_err(msg, "%s: global_avg_pool input '%s' is not an image (H, W, C)", where, x->name);
        want[0] = x->shape[2];
        want_nd = 1;
        break;
      case QT_OP_FLATTEN:
        want[0] = 1;
        for (int d = 0; d < x->ndim; d++) want[0] *= x->shape[d];
        want_nd = 1;
        break;
      case QT_OP_ADD: {
        const qt_value *b = &g->values[n->inputs[1]];
        int same = b->ndim == x->ndim;
        for (int d = 0; same && d < x->ndim; d++) same = b->shape[d] == x->shape[d];
        if (!same) return qt_err(msg, "%s: add inputs '%s' and '%s' differ in shape", where, x->name, b->name);
      }
        /* fall through */
      case QT_OP_RELU:
      case QT_OP_QUANTIZE:
      case QT_OP_DEQUANTIZE:
      case QT_OP_FAKE_QUANT:
        want_nd = x->ndim;
        memcpy(want, x->shape, sizeof want);
        break;
      default:
        return qt_err(msg, "%s: op '%s' has no meaning in a file", where, op);
    }
    int same = y->ndim == want_nd;
    for (int d = 0; same && d < want_nd; d++) same = y->shape[d] == want[d];
    if (!same) {
      shape_str(s1, sizeof s1, y->ndim, y->shape);
      shape_str(s2, sizeof s2, want_nd, want);
      return qt_err(msg, "%s: output value '%s' has shape %s, op '%s' computes %s", where, y->name, s1, op, s2);
    }
  }
  if (n_input_nodes != 1) return qt_err(msg, "graph '%s' has %d input nodes, want 1", g->name, n_input_nodes);
  if (g->output < 0 || g->output >= g->n_values)
    return qt_err(msg, "graph output value id %d out of range (%d values)", g->output, g->n_values);
  return 0;
}

/* The quantization axis of a record: -1 per tensor; weights: 0 (OIHW output channels);
 * activations: the last axis of the (N, ...) tensor, the channel of NHWC. */
static int record_axis(const qt_qspec *s, int is_weight, int value_ndim) {
  return !s->per_channel ? -1 : is_weight ? 0 : value_ndim;
}

static int check_qstate(const qt_qstate *q, graph_kind kind, int is_weight, int64_t axis_dim, int64_t numel,
                        const char *where, char *msg) {
  const char *what = is_weight ? "weight quantization" : "activation quantization";
  const qt_qspec *s = &q->spec;
  if (s->bits < 2 || s->bits > QDQ_MAX_BITS)
    return qt_err(msg, "%s: %s: bits %d outside 2..%d", where, what, s->bits, QDQ_MAX_BITS);
  const int64_t lo = s->is_signed ? -((int64_t)1 << (s->bits - 1)) : 0;
  const int64_t hi = s->is_signed ? ((int64_t)1 << (s->bits - 1)) - 1 : ((int64_t)1 << s->bits) - 1;
  if (!(lo <= s->qmin && s->qmin < s->qmax && s->qmax <= hi))
    return qt_err(msg, "%s: %s: [qmin %d, qmax %d] is not a range within %d-bit %s [%lld, %lld]", where, what, s->qmin,
                s->qmax, s->bits, s->is_signed ? "signed" : "unsigned", (long long)lo, (long long)hi);
  if ((unsigned)s->observer >= QT_OBSERVER_COUNT || (unsigned)s->method >= QT_RANGE_COUNT || !isfinite(s->percentile))
    return qt_err(msg, "%s: %s: bad observer settings", where, what);
  const int64_t want_ch = s->per_channel ? axis_dim : 1;
  if (q->channels != want_ch)
    return qt_err(msg, "%s: %s: %d channels, want %lld (%s)", where, what, q->channels, (long long)want_ch,
                s->per_channel ? (is_weight ? "per channel along axis 0" : "per channel along the last axis")
                               : "per tensor");
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
  if (kind == KIND_PREPARED) {
    /* The file cannot say that fake quant is off: the loaded graph would apply it. */
    if (!q->fake_quant)
      return qt_err(msg, "%s: %s has fake quant off; a prepared graph is stored with fake quant on "
                       "(qt_set_fake_quant(g, 1) before saving)", where, what);
    if (q->qweight) return qt_err(msg, "%s: %s holds integer weights, which a prepared graph does not", where, what);
    return 0;
  }
  if (!is_weight) {
    if (q->qweight) return qt_err(msg, "%s: activation quantization holds integer weights", where);
    return 0;
  }
  if (!q->qweight)
    return qt_err(msg, "%s: weight quantization without integer weights (a prepared graph? run qt_convert first)", where);
  if (q->n_qweight != numel)
    return qt_err(msg, "%s: %lld integer weights, the weight has %lld elements", where, (long long)q->n_qweight,
                (long long)numel);
  for (int64_t k = 0; k < numel; k++)
    if (q->qweight[k] < s->qmin || q->qweight[k] > s->qmax)
      return qt_err(msg, "%s: integer weight %lld = %d outside [qmin %d, qmax %d]", where, (long long)k, q->qweight[k],
                  s->qmin, s->qmax);
  return 0;
}

static int validate_quant(const qt_graph *g, graph_kind kind, char *msg) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    char where[QT_NAME_LEN + 32];
    snprintf(where, sizeof where, "node %d '%s'", i, n->name);
    if (n->op == QT_OP_QUANTIZE || n->op == QT_OP_DEQUANTIZE || n->op == QT_OP_FAKE_QUANT) {
      if (!n->q) return qt_err(msg, "%s: %s without an activation quantization record", where, qt_op_name(n->op));
      const qt_value *x = &g->values[n->inputs[0]];
      if (check_qstate(n->q, kind, 0, x->shape[x->ndim - 1], 0, where, msg)) return -1;
    } else if (n->q) {
      return qt_err(msg, "%s: op '%s' carries an activation quantization record (only %s do)", where, qt_op_name(n->op),
                  kind == KIND_PREPARED ? "fake_quant nodes" : "quantize/dequantize");
    }
    if (n->wq) {
      if (n->op != QT_OP_CONV2D && n->op != QT_OP_LINEAR && n->op != QT_OP_CONV_BN)
        return qt_err(msg, "%s: op '%s' carries a weight quantization record (only conv2d/linear%s do)", where,
                    qt_op_name(n->op), kind == KIND_PREPARED ? "/conv_bn" : "");
      const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
      if (check_qstate(n->wq, kind, 1, W->shape[0], W->numel, where, msg)) return -1;
    }
  }
  return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct {
  hid_t dcpl, gcpl; /* object times off: the same graph always gives the same bytes */
  char where[2 * QT_NAME_LEN + 64];
} writer;

static int attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, int n, const void *data) {
  hsize_t dims[1] = {(hsize_t)(n < 0 ? 0 : n)};
  hid_t sp = n < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL);
  if (sp < 0) return -1;
  hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t r = a < 0 ? -1 : n == 0 ? 0 : H5Awrite(a, mtype, data);
  if (a >= 0 && H5Aclose(a) < 0) r = -1;
  H5Sclose(sp);
  return r < 0 ? -1 : 0;
}
static int attr_int(hid_t loc, const char *name, int v) { return attr_write(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT, -1, &v); }
static int attr_float(hid_t loc, const char *name, float v) {
  return attr_write(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, -1, &v);
}
static int attr_str(hid_t loc, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return -1;
  int r = H5Tset_size(t, strlen(s) + 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0 ? -1
                                                                                         : attr_write(loc, name, t, t, -1, s);
  H5Tclose(t);
  return r;
}

/* A chunked dataset with a Fletcher-32 checksum (chunks of at most 16 MiB). */
static int dset_write(writer *w, hid_t loc, const char *name, hid_t ftype, hid_t mtype, int ndim, const hsize_t *dims,
                      const void *data) {
  hsize_t chunk[4];
  size_t bytes = H5Tget_size(ftype);
  for (int d = 0; d < ndim; d++) {
    chunk[d] = dims[d];
    bytes *= (size_t)dims[d];
  }
  while (bytes > QDQ_CHUNK_BYTES && chunk[0] > 1) {
    bytes /= (size_t)chunk[0];
    chunk[0] = (chunk[0] + 1) / 2;
    bytes *= (size_t)chunk[0];
  }
  hid_t dcpl = H5Pcopy(w->dcpl);
  hid_t sp = H5Screate_simple(ndim, dims, NULL);
  int bad = dcpl < 0 || sp < 0 || H5Pset_chunk(dcpl, ndim, chunk) < 0 || H5Pset_fletcher32(dcpl) < 0;
  hid_t d = bad ? -1 : H5Dcreate2(loc, name, ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  bad |= d < 0 || H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0;
  if (d >= 0) bad |= H5Dclose(d) < 0;
  if (sp >= 0) H5Sclose(sp);
  if (dcpl >= 0) H5Pclose(dcpl);
  return bad ? -1 : 0;
}

static hid_t group_create(writer *w, hid_t loc, const char *name) {
  return H5Gcreate2(loc, name, H5P_DEFAULT, w->gcpl, H5P_DEFAULT);
}

/* Integer weights are stored in the narrowest type holding [qmin, qmax]: uint8 for an unsigned
 * spec up to 255, int8, uint8, int16, else int32. */
typedef enum { WI_U8, WI_I8, WI_I16, WI_I32 } weight_int_kind;
static weight_int_kind weight_int_pick(const qt_qspec *s) {
  if (!s->is_signed && s->qmin >= 0 && s->qmax <= 255) return WI_U8;
  if (s->qmin >= -128 && s->qmax <= 127) return WI_I8;
  if (s->qmin >= 0 && s->qmax <= 255) return WI_U8;
  if (s->qmin >= -32768 && s->qmax <= 32767) return WI_I16;
  return WI_I32;
}

/* Training state of a record (checkpoints only, see qt_quant_state_write): the enable flags,
 * the LSQ tensor and the observer's running state in a subgroup `observer`. */
static int write_train_state(writer *w, hid_t r, const qt_graph *g, const qt_qstate *q) {
  const qt_observer *o = &q->obs;
  int bad = attr_int(r, "observe", q->observe ? 1 : 0) || attr_int(r, "fake_quant", q->fake_quant ? 1 : 0) ||
            attr_int(r, "calibrated", q->calibrated ? 1 : 0) || attr_int(r, "pow2_scale", q->spec.pow2_scale ? 1 : 0);
  if (!bad && q->scale_param >= 0) bad = attr_str(r, "learned_scale", g->tensors[q->scale_param].name);
  if (bad) return -1;
  hid_t og = group_create(w, r, "observer");
  if (og < 0) return -1;
  hsize_t ch[1] = {(hsize_t)o->channels}, nb[1] = {(hsize_t)o->bins};
  bad = attr_str(og, "kind", qt_observer_kind_name(o->kind)) || attr_int(og, "channels", o->channels) ||
        attr_float(og, "averaging_constant", o->averaging_constant) ||
        attr_str(og, "method", qt_range_method_name(o->method)) || attr_float(og, "percentile", o->percentile) ||
        attr_int(og, "bins", o->bins) || attr_int(og, "initialized", o->initialized ? 1 : 0) ||
        attr_float(og, "hist_min", o->hist_min) || attr_float(og, "hist_max", o->hist_max) ||
        dset_write(w, og, "min", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, o->min) ||
        dset_write(w, og, "max", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, o->max);
  if (!bad && o->hist) bad = dset_write(w, og, "hist", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, nb, o->hist);
  bad |= H5Gclose(og) < 0;
  return bad ? -1 : 0;
}

/* One quantization record; with_state adds the training state (checkpoints). */
static int write_qrecord(writer *w, hid_t parent, const qt_graph *g, int node, const qt_qstate *q, int is_weight,
                         int with_state) {
  const qt_node *n = &g->nodes[node];
  snprintf(w->where, sizeof w->where, "/quant/%s/%s", is_weight ? "weight" : "activation", n->name);
  hid_t r = group_create(w, parent, n->name);
  if (r < 0) return -1;
  const qt_qspec *s = &q->spec;
  const qt_value *x = &g->values[n->n_inputs ? n->inputs[0] : n->output];
  int bad = attr_int(r, "node", node) || attr_int(r, "bits", s->bits) || attr_int(r, "qmin", s->qmin) ||
            attr_int(r, "qmax", s->qmax) || attr_int(r, "signed", s->is_signed ? 1 : 0) ||
            attr_int(r, "symmetric", s->symmetric ? 1 : 0) || attr_int(r, "per_channel", s->per_channel ? 1 : 0) ||
            attr_int(r, "axis", record_axis(s, is_weight, x->ndim)) || attr_int(r, "channels", q->channels) ||
            attr_str(r, "observer", qt_observer_kind_name(s->observer)) ||
            attr_str(r, "method", qt_range_method_name(s->method)) || attr_float(r, "percentile", s->percentile);
  hsize_t ch[1] = {(hsize_t)q->channels};
  bad = bad || dset_write(w, r, "scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, q->scale) ||
        dset_write(w, r, "zero_point", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, ch, q->zero_point);
  if (!bad && is_weight) bad = attr_str(r, "tensor", g->tensors[n->param[QT_P_WEIGHT]].name);
  if (!bad && is_weight && q->qweight) { /* Q/DQ graphs; a prepared graph fake-quantizes the float weight */
    const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
    const weight_int_kind kind = weight_int_pick(s);
    const hid_t ftypes[] = {H5T_STD_U8LE, H5T_STD_I8LE, H5T_STD_I16LE, H5T_STD_I32LE};
    const hid_t mtypes[] = {H5T_NATIVE_UINT8, H5T_NATIVE_INT8, H5T_NATIVE_INT16, H5T_NATIVE_INT32};
    const size_t sizes[] = {1, 1, 2, 4};
    hid_t ftype = ftypes[kind], mtype = mtypes[kind];
    void *buf = malloc((size_t)W->numel * sizes[kind]);
    QT_ASSERT(buf, "out of memory packing %lld integer weights", (long long)W->numel);
    for (int64_t k = 0; k < W->numel; k++) {
      const int32_t v = q->qweight[k];
      switch (kind) {
        case WI_U8: ((uint8_t *)buf)[k] = (uint8_t)v; break;
        case WI_I8: ((int8_t *)buf)[k] = (int8_t)v; break;
        case WI_I16: ((int16_t *)buf)[k] = (int16_t)v; break;
        case WI_I32: ((int32_t *)buf)[k] = v; break;
      }
    }
    hsize_t dims[4];
    for (int d = 0; d < W->ndim; d++) dims[d] = (hsize_t)W->shape[d];
    bad = dset_write(w, r, "weight_int", ftype, mtype, W->ndim, dims, buf);
    free(buf);
  }
  if (!bad && with_state) bad = write_train_state(w, r, g, q);
  bad |= H5Gclose(r) < 0;
  return bad ? -1 : 0;
}

static int write_graph(writer *w, hid_t f, const qt_graph *g, graph_kind kind) {
  snprintf(w->where, sizeof w->where, "the root attributes");
  if (attr_str(f, "format", QDQ_FORMAT) || attr_int(f, "format_version", QDQ_VERSION) ||
      attr_str(f, "kind", kind_names[kind]) || attr_str(f, "name", g->name) ||
      attr_int(f, "input", g->input) || attr_int(f, "output", g->output) || attr_int(f, "n_nodes", g->n_nodes) ||
      attr_int(f, "n_values", g->n_values) || attr_int(f, "n_tensors", g->n_tensors) ||
      attr_str(f, "layout", "activations NHWC, weights OIHW, per-sample value shapes"))
    return -1;

  /* /values: parallel arrays indexed by value id. */
  snprintf(w->where, sizeof w->where, "/values");
  hid_t gv = group_create(w, f, "values");
  if (gv < 0) return -1;
  const int nv = g->n_values;
  char *names = calloc((size_t)nv, QT_NAME_LEN);
  int *ndim = calloc((size_t)nv, sizeof(int)), *producer = calloc((size_t)nv, sizeof(int));
  int64_t *shape = calloc((size_t)nv * 3, sizeof(int64_t));
  QT_ASSERT(names && ndim && producer && shape, "out of memory");
  for (int v = 0; v < nv; v++) {
    snprintf(names + (size_t)v * QT_NAME_LEN, QT_NAME_LEN, "%s", g->values[v].name);
    ndim[v] = g->values[v].ndim;
    producer[v] = g->values[v].producer;
    for (int d = 0; d < g->values[v].ndim; d++) shape[v * 3 + d] = g->values[v].shape[d];
  }
  hid_t st = H5Tcopy(H5T_C_S1);
  int bad = st < 0 || H5Tset_size(st, QT_NAME_LEN) < 0 || H5Tset_strpad(st, H5T_STR_NULLTERM) < 0;
  hsize_t d1[1] = {(hsize_t)nv}, d2[2] = {(hsize_t)nv, 3};
  bad = bad || dset_write(w, gv, "name", st, st, 1, d1, names) ||
        dset_write(w, gv, "ndim", H5T_STD_I32LE, H5T_NATIVE_INT, 1, d1, ndim) ||
        dset_write(w, gv, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2, shape) ||
        dset_write(w, gv, "producer", H5T_STD_I32LE, H5T_NATIVE_INT, 1, d1, producer);
  if (st >= 0) H5Tclose(st);
  free(names);
  free(ndim);
  free(producer);
  free(shape);
  bad |= H5Gclose(gv) < 0;
  if (bad) return -1;

  /* /tensors/<name>: float32 in the tensor's own shape. */
  hid_t gt = group_create(w, f, "tensors");
  if (gt < 0) return -1;
  for (int t = 0; t < g->n_tensors && !bad; t++) {
    const qt_param *p = &g->tensors[t];
    snprintf(w->where, sizeof w->where, "/tensors/%s", p->name);
    hsize_t dims[4];
    for (int d = 0; d < p->ndim; d++) dims[d] = (hsize_t)p->shape[d];
    const float *data = (p->is_buffer ? g->buffers : g->params) + p->offset;
    hid_t d = -1;
    bad = dset_write(w, gt, p->name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p->ndim, dims, data) ||
          (d = H5Dopen2(gt, p->name, H5P_DEFAULT)) < 0 || attr_int(d, "index", t) || attr_int(d, "node", p->node) ||
          attr_int(d, "is_buffer", p->is_buffer ? 1 : 0);
    if (d >= 0) bad |= H5Dclose(d) < 0;
  }
  bad |= H5Gclose(gt) < 0;
  if (bad) return -1;

  /* /nodes/<index>_<name>: one group per node, all attributes. */
  snprintf(w->where, sizeof w->where, "/nodes");
  hid_t gn = group_create(w, f, "nodes");
  if (gn < 0) return -1;
  for (int i = 0; i < g->n_nodes && !bad; i++) {
    const qt_node *n = &g->nodes[i];
    char gname[QT_NAME_LEN + 16];
    snprintf(gname, sizeof gname, "%04d_%s", i, n->name);
    snprintf(w->where, sizeof w->where, "/nodes/%s", gname);
    hid_t ng = group_create(w, gn, gname);
    if (ng < 0) {
      bad = 1;
      break;
    }
    const qt_node_attrs *a = &n->attr;
    bad = attr_int(ng, "index", i) || attr_str(ng, "name", n->name) || attr_str(ng, "op", qt_op_name(n->op)) ||
          attr_write(ng, "inputs", H5T_STD_I32LE, H5T_NATIVE_INT, n->n_inputs, n->inputs) ||
          attr_int(ng, "output", n->output) || attr_int(ng, "kernel_h", a->kernel_h) ||
          attr_int(ng, "kernel_w", a->kernel_w) || attr_int(ng, "stride_h", a->stride_h) ||
          attr_int(ng, "stride_w", a->stride_w) || attr_int(ng, "pad_h", a->pad_h) || attr_int(ng, "pad_w", a->pad_w) ||
          attr_int(ng, "groups", a->groups) || attr_int(ng, "out_channels", a->out_channels) ||
          attr_float(ng, "eps", a->eps) || attr_float(ng, "momentum", a->momentum) ||
          attr_int(ng, "bn_frozen", n->bn_frozen);
    for (int k = 0; k < QT_MAX_PARAMS && !bad; k++) {
      if (n->param[k] >= 0) bad = attr_str(ng, param_slot_names[k], g->tensors[n->param[k]].name);
      if (!bad && n->buffer[k] >= 0) bad = attr_str(ng, buffer_slot_names[k], g->tensors[n->buffer[k]].name);
    }
    bad |= H5Gclose(ng) < 0;
  }
  bad |= H5Gclose(gn) < 0;
  if (bad) return -1;

  /* /quant/activation/<node>, /quant/weight/<node>. */
  snprintf(w->where, sizeof w->where, "/quant");
  hid_t gq = group_create(w, f, "quant");
  if (gq < 0) return -1;
  hid_t ga = group_create(w, gq, "activation"), gw = group_create(w, gq, "weight");
  bad = ga < 0 || gw < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++) {
    if (g->nodes[i].q) bad = write_qrecord(w, ga, g, i, g->nodes[i].q, 0, 0);
    if (!bad && g->nodes[i].wq) bad = write_qrecord(w, gw, g, i, g->nodes[i].wq, 1, 0);
  }
  if (ga >= 0) bad |= H5Gclose(ga) < 0;
  if (gw >= 0) bad |= H5Gclose(gw) < 0;
  bad |= H5Gclose(gq) < 0;
  return bad ? -1 : 0;
}

/* A file access list asking for HDF5 1.10's format: checksummed object headers, superblock
 * and chunk indexes. */
static hid_t file_access(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_LATEST) < 0) {
    H5Pclose(fapl);
    return -1;
  }
  return fapl;
}

int qt_qdq_save(const char *path, const qt_graph *g, char *err) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  err[0] = 0;
  char msg[QT_ERR_LEN];
  if (!g->finalized) return qt_err(err, "qdq save '%s': graph '%s' is not finalized", path, g->name);
  for (int i = 0; i < g->n_nodes; i++)
    if (bad_link_name(g->nodes[i].name))
      return qt_err(err, "qdq save '%s': node %d name '%s' is empty, '.' or holds '/', which an HDF5 name cannot", path, i,
                  g->nodes[i].name);
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    if (strchr(p->name, '/'))
      return qt_err(err, "qdq save '%s': tensor name '%s' holds '/', which an HDF5 name cannot", path, p->name);
    const size_t len = p->node >= 0 && p->node < g->n_nodes ? strlen(g->nodes[p->node].name) : 0;
    if (!len || strncmp(p->name, g->nodes[p->node].name, len) != 0 || p->name[len] != '.' || !p->name[len + 1])
      return qt_err(err, "qdq save '%s': tensor '%s' is not named '<owner node>.<suffix>' (owner node %d)", path, p->name,
                  p->node);
  }
  graph_kind kind = KIND_QDQ;
  if (infer_kind(g, &kind, msg) || validate_structure(g, kind, msg) || validate_quant(g, kind, msg))
    return qt_err(err, "qdq save '%s': %s", path, msg);

  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return qt_err(err, "qdq save: path too long");
  hid_t fapl = file_access();
  /* The root group is created with the file: its object times must be off too, or the bytes
   * depend on the clock. */
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  hid_t f = fapl < 0 || fcpl < 0 || H5Pset_obj_track_times(fcpl, 0) < 0 ? -1
                                                                       : H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl);
  if (fapl >= 0) H5Pclose(fapl);
  if (fcpl >= 0) H5Pclose(fcpl);
  if (f < 0) return qt_err(err, "qdq save '%s': cannot create '%s' (directory missing or not writable?)", path, tmp);
  writer w;
  snprintf(w.where, sizeof w.where, "the file");
  w.dcpl = H5Pcreate(H5P_DATASET_CREATE);
  w.gcpl = H5Pcreate(H5P_GROUP_CREATE);
  int bad = w.dcpl < 0 || w.gcpl < 0 || H5Pset_obj_track_times(w.dcpl, 0) < 0 ||
            H5Pset_obj_track_times(w.gcpl, 0) < 0 ||
            H5Pset_link_phase_change(w.gcpl, QDQ_COMPACT_LINKS, QDQ_COMPACT_LINKS) < 0;
  bad = bad || write_graph(&w, f, g, kind);
  if (w.dcpl >= 0) H5Pclose(w.dcpl);
  if (w.gcpl >= 0) H5Pclose(w.gcpl);
  bad |= H5Fclose(f) < 0;
  if (bad) {
    unlink(tmp);
    return qt_err(err, "qdq save '%s': writing %s failed (disk full or not writable?); '%s' is unchanged", path,
                  w.where, path);
  }
  char cerr[QT_ERR_LEN];
  if (qt_file_commit(tmp, path, cerr))
    return qt_err(err, "qdq save '%s': %s (disk full or not writable?); '%s' is unchanged", path, cerr, path);
  return 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Opens attribute `name` of loc with the expected type class and element count range. */
static hid_t attr_open(hid_t loc, const char *obj, const char *name, H5T_class_t cls, int min_n, int max_n, int *n,
                       char *msg) {
  htri_t exists = H5Aexists(loc, name);
  if (exists < 0) return qt_err(msg, "%s: cannot read the attributes (corrupt file: checksum or decoding failed)", obj);
  if (exists == 0) return qt_err(msg, "%s: missing attribute '%s'", obj, name);
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return qt_err(msg, "%s: cannot open attribute '%s'", obj, name);
  hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
  H5T_class_t c = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
  hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  const char *want = cls == H5T_INTEGER ? "an integer" : cls == H5T_FLOAT ? "a float" : "a string";
  if (c != cls) {
    H5Aclose(a);
    return qt_err(msg, "%s: attribute '%s' is not %s", obj, name, want);
  }
  if (np < min_n || np > max_n) {
    H5Aclose(a);
    return qt_err(msg, "%s: attribute '%s' has %lld elements, want %d..%d", obj, name, (long long)np, min_n, max_n);
  }
  if (n) *n = (int)np;
  return a;
}

static int read_attr_ints(hid_t loc, const char *obj, const char *name, int *v, int min_n, int max_n, int *n,
                          char *msg) {
  int count = 0;
  hid_t a = attr_open(loc, obj, name, H5T_INTEGER, min_n, max_n, &count, msg);
  if (a < 0) return -1;
  herr_t r = count ? H5Aread(a, H5T_NATIVE_INT, v) : 0;
  H5Aclose(a);
  if (n) *n = count;
  return r < 0 ? qt_err(msg, "%s: cannot read attribute '%s'", obj, name) : 0;
}
static int read_attr_int(hid_t loc, const char *obj, const char *name, int *v, char *msg) {
  return read_attr_ints(loc, obj, name, v, 1, 1, NULL, msg);
}
static int read_attr_flag(hid_t loc, const char *obj, const char *name, int *v, char *msg) {
  if (read_attr_int(loc, obj, name, v, msg)) return -1;
  return *v == 0 || *v == 1 ? 0 : qt_err(msg, "%s: attribute '%s' is %d, want 0 or 1", obj, name, *v);
}
static int read_attr_float(hid_t loc, const char *obj, const char *name, float *v, char *msg) {
  hid_t a = attr_open(loc, obj, name, H5T_FLOAT, 1, 1, NULL, msg);
  if (a < 0) return -1;
  herr_t r = H5Aread(a, H5T_NATIVE_FLOAT, v);
  H5Aclose(a);
  return r < 0 ? qt_err(msg, "%s: cannot read attribute '%s'", obj, name) : 0;
}

/* A fixed- or variable-length string attribute into buf (cap bytes with the terminator). */
static int read_attr_str(hid_t loc, const char *obj, const char *name, char *buf, size_t cap, char *msg) {
  hid_t a = attr_open(loc, obj, name, H5T_STRING, 1, 1, NULL, msg);
  if (a < 0) return -1;
  hid_t t = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
  int rc = -1;
  if (t >= 0 && mt >= 0 && H5Tset_cset(mt, H5Tget_cset(t)) >= 0) {
    if (H5Tis_variable_str(t) > 0) {
      char *s = NULL;
      if (H5Tset_size(mt, H5T_VARIABLE) >= 0 && H5Aread(a, mt, &s) >= 0 && s) {
        if (strlen(s) < cap) {
          memcpy(buf, s, strlen(s) + 1);
          rc = 0;
        } else {
          rc = -2;
        }
      }
      if (s) H5free_memory(s);
    } else {
      size_t sz = H5Tget_size(t);
      if (sz == 0 || sz + 1 > cap) rc = -2;
      else if (H5Tset_size(mt, sz + 1) >= 0 && H5Tset_strpad(mt, H5T_STR_NULLTERM) >= 0 && H5Aread(a, mt, buf) >= 0) {
        buf[sz] = 0;
        rc = 0;
      }
    }
  }
  if (mt >= 0) H5Tclose(mt);
  if (t >= 0) H5Tclose(t);
  H5Aclose(a);
  if (rc == -2) return qt_err(msg, "%s: attribute '%s' is longer than %zu characters", obj, name, cap - 1);
  return rc ? qt_err(msg, "%s: cannot read attribute '%s'", obj, name) : 0;
}

/* Reads dataset `name` of loc (type class cls) into a new buffer of mtype elements. When
 * want_ndim > 0 the shape must be want_dims; else the shape (rank 1..max_ndim) is returned. */
static void *read_dataset(hid_t loc, const char *obj, const char *name, H5T_class_t cls, hid_t mtype, int want_ndim,
                          const int64_t *want_dims, int max_ndim, int *ndim_out, int64_t *dims_out, char *msg) {
  htri_t exists = H5Lexists(loc, name, H5P_DEFAULT);
  if (exists <= 0) {
    qt_err(msg, exists < 0 ? "%s: cannot look up dataset '%s' (corrupt file?)" : "%s: missing dataset '%s'", obj, name);
    return NULL;
  }
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
  if (d < 0) {
    qt_err(msg, "%s: '%s' is not a readable dataset (corrupt file?)", obj, name);
    return NULL;
  }
  void *buf = NULL;
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
  hsize_t dims[8];
  char s1[96], s2[96];
  if (t < 0 || H5Tget_class(t) != cls) {
    qt_err(msg, "%s: dataset '%s' is not %s", obj, name,
         cls == H5T_INTEGER ? "integer" : cls == H5T_FLOAT ? "floating point" : "a string array");
    goto done;
  }
  if (nd < 1 || nd > (want_ndim > 0 ? want_ndim : max_ndim) || nd > 8 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
    qt_err(msg, "%s: dataset '%s' has rank %d, want %s%d", obj, name, nd, want_ndim > 0 ? "" : "1..",
         want_ndim > 0 ? want_ndim : max_ndim);
    goto done;
  }
  int64_t got[8], numel = 1;
  for (int k = 0; k < nd; k++) {
    got[k] = (int64_t)dims[k];
    if (dims[k] > (hsize_t)QDQ_MAX_NUMEL || (numel *= got[k]) > QDQ_MAX_NUMEL || got[k] < 1) {
      qt_err(msg, "%s: dataset '%s' is empty or larger than %lld elements", obj, name, (long long)QDQ_MAX_NUMEL);
      goto done;
    }
  }
  if (want_ndim > 0) {
    int same = nd == want_ndim;
    for (int k = 0; same && k < nd; k++) same = got[k] == want_dims[k];
    if (!same) {
      shape_str(s1, sizeof s1, nd, got);
      shape_str(s2, sizeof s2, want_ndim, want_dims);
      qt_err(msg, "%s: dataset '%s' has shape %s, want %s", obj, name, s1, s2);
      goto done;
    }
  }
  buf = malloc((size_t)numel * H5Tget_size(mtype) + 1);
  QT_ASSERT(buf, "out of memory reading %lld elements", (long long)numel);
  if (H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
    qt_err(msg, "%s: cannot read dataset '%s' (corrupt file: checksum or decoding failed)", obj, name);
    free(buf);
    buf = NULL;
    goto done;
  }
  if (ndim_out) *ndim_out = nd;
  if (dims_out)
    for (int k = 0; k < nd; k++) dims_out[k] = got[k];
done:
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  H5Dclose(d);
  return buf;
}

static hid_t group_open(hid_t loc, const char *obj, const char *name, char *msg) {
  htri_t exists = H5Lexists(loc, name, H5P_DEFAULT);
  if (exists <= 0)
    return qt_err(msg, exists < 0 ? "%s: cannot look up group '%s' (corrupt file?)" : "%s: missing group '%s'", obj, name);
  hid_t g = H5Gopen2(loc, name, H5P_DEFAULT);
  return g < 0 ? qt_err(msg, "%s: '%s' is not a readable group (corrupt file?)", obj, name) : g;
}

/* Number of links in a group, bounded. */
static int group_count(hid_t g, const char *obj, int max, char *msg) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) return qt_err(msg, "%s: cannot list the group (corrupt file?)", obj);
  if (info.nlinks > (hsize_t)max) return qt_err(msg, "%s: %llu entries, more than %d", obj, (unsigned long long)info.nlinks, max);
  return (int)info.nlinks;
}

/* The names of a group's links, in HDF5's native order (not sorted): H5Literate walks the
 * link index directly. (H5Lget_name_by_idx in name order builds a sorted table instead, and
 * HDF5 1.10.8 frees uninitialized entries of that table when a corrupt link fails to decode.)
 * Returns n names of `stride` bytes each in a new buffer, or NULL. */
typedef struct {
  char *names;
  int n, max;
  size_t stride;
  int too_long;
} link_list;

static herr_t link_list_add(hid_t g, const char *name, const H5L_info_t *info, void *data) {
  (void)g;
  (void)info;
  link_list *l = data;
  if (l->n >= l->max) return -1;
  if (strlen(name) >= l->stride) {
    l->too_long = 1;
    return -1;
  }
  memcpy(l->names + (size_t)l->n * l->stride, name, strlen(name) + 1);
  l->n++;
  return 0;
}

static char *list_links(hid_t g, const char *obj, int count, size_t stride, char *msg) {
  link_list l = {.names = calloc((size_t)count + 1, stride), .max = count, .stride = stride};
  QT_ASSERT(l.names, "out of memory listing %d links", count);
  hsize_t idx = 0;
  herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, link_list_add, &l);
  if (r < 0 || l.n != count) {
    if (l.too_long) qt_err(msg, "%s: an entry has a name longer than %zu characters", obj, stride - 1);
    else qt_err(msg, "%s: cannot list the entries (corrupt file?)", obj);
    free(l.names);
    return NULL;
  }
  return l.names;
}

typedef struct {
  qt_op op;
  char name[QT_NAME_LEN];
  int inputs[QT_MAX_INPUTS], n_inputs, output, bn_frozen;
  qt_node_attrs attr;
  char param[QT_MAX_PARAMS][2 * QT_NAME_LEN], buffer[QT_MAX_PARAMS][2 * QT_NAME_LEN];
  int seen;
} node_rec;

typedef struct {
  char name[2 * QT_NAME_LEN];
  int node, is_buffer, ndim, seen;
  int64_t shape[4];
  float *data;
} tensor_rec;

static int read_node(hid_t gn, const char *link, int n_nodes, node_rec *recs, char *msg) {
  char obj[QT_NAME_LEN + 64];
  snprintf(obj, sizeof obj, "/nodes/%s", link);
  char *end = NULL;
  long idx = strtol(link, &end, 10);
  if (end == link || *end != '_' || idx < 0 || idx >= n_nodes)
    return qt_err(msg, "%s: a node group must be named <index>_<name> with index < %d", obj, n_nodes);
  node_rec *r = &recs[idx];
  if (r->seen) return qt_err(msg, "%s: a second group for node %ld", obj, idx);
  r->seen = 1;
  hid_t g = group_open(gn, "/nodes", link, msg);
  if (g < 0) return -1;
  int index = -1, rc = -1;
  char op[64];
  qt_node_attrs *a = &r->attr;
  if (read_attr_int(g, obj, "index", &index, msg) || read_attr_str(g, obj, "name", r->name, sizeof r->name, msg) ||
      read_attr_str(g, obj, "op", op, sizeof op, msg))
    goto done;
  if (index != idx) {
    qt_err(msg, "%s: attribute index is %d, the group name says %ld", obj, index, idx);
    goto done;
  }
  if (bad_link_name(r->name)) {
    qt_err(msg, "%s: node name '%s' is empty, '.' or holds '/'", obj, r->name);
    goto done;
  }
  if (strcmp(end + 1, r->name) != 0) {
    qt_err(msg, "%s: attribute name is '%s', the group name says '%s'", obj, r->name, end + 1);
    goto done;
  }
  if (qt_op_parse(op, &r->op)) {
    qt_err(msg, "node %d '%s': unknown op '%s'", index, r->name, op);
    goto done;
  }
  if (read_attr_ints(g, obj, "inputs", r->inputs, 0, QT_MAX_INPUTS, &r->n_inputs, msg) ||
      read_attr_int(g, obj, "output", &r->output, msg) || read_attr_int(g, obj, "kernel_h", &a->kernel_h, msg) ||
      read_attr_int(g, obj, "kernel_w", &a->kernel_w, msg) || read_attr_int(g, obj, "stride_h", &a->stride_h, msg) ||
      read_attr_int(g, obj, "stride_w", &a->stride_w, msg) || read_attr_int(g, obj, "pad_h", &a->pad_h, msg) ||
      read_attr_int(g, obj, "pad_w", &a->pad_w, msg) || read_attr_int(g, obj, "groups", &a->groups, msg) ||
      read_attr_int(g, obj, "out_channels", &a->out_channels, msg) || read_attr_float(g, obj, "eps", &a->eps, msg) ||
      read_attr_float(g, obj, "momentum", &a->momentum, msg) || read_attr_flag(g, obj, "bn_frozen", &r->bn_frozen, msg))
    goto done;
  for (int k = 0; k < QT_MAX_PARAMS; k++) {
    if (H5Aexists(g, param_slot_names[k]) != 0 &&
        read_attr_str(g, obj, param_slot_names[k], r->param[k], sizeof r->param[k], msg))
      goto done;
    if (H5Aexists(g, buffer_slot_names[k]) != 0 &&
        read_attr_str(g, obj, buffer_slot_names[k], r->buffer[k], sizeof r->buffer[k], msg))
      goto done;
  }
  rc = 0;
done:
  H5Gclose(g);
  return rc;
}

static int read_tensor(hid_t gt, const char *name, int n_tensors, int n_nodes, tensor_rec *recs, char *msg) {
  char obj[2 * QT_NAME_LEN + 16];
  snprintf(obj, sizeof obj, "/tensors/%s", name);
  hid_t d = H5Dopen2(gt, name, H5P_DEFAULT);
  if (d < 0) return qt_err(msg, "%s: not a readable dataset (corrupt file?)", obj);
  int index = -1, node = -1, is_buffer = 0;
  int bad = read_attr_int(d, obj, "index", &index, msg) || read_attr_int(d, obj, "node", &node, msg) ||
            read_attr_flag(d, obj, "is_buffer", &is_buffer, msg);
  H5Dclose(d);
  if (bad) return -1;
  if (index < 0 || index >= n_tensors) return qt_err(msg, "%s: index %d out of range (%d tensors)", obj, index, n_tensors);
  if (node < 0 || node >= n_nodes) return qt_err(msg, "%s: owner node %d out of range (%d nodes)", obj, node, n_nodes);
  tensor_rec *r = &recs[index];
  if (r->seen) return qt_err(msg, "%s: index %d is taken by '%s'", obj, index, r->name);
  r->seen = 1;
  snprintf(r->name, sizeof r->name, "%s", name);
  r->node = node;
  r->is_buffer = is_buffer;
  r->data = read_dataset(gt, "/tensors", name, H5T_FLOAT, H5T_NATIVE_FLOAT, 0, NULL, 4, &r->ndim, r->shape, msg);
  return r->data ? 0 : -1;
}

/* Reads /quant/<kind>/<node name> of node `node` of g into a new qstate (*out); weight records
 * hold integer weights in Q/DQ graphs and none in prepared graphs. read_qrecord puts it on the
 * node. */
static int read_qrecord_new(hid_t parent, const char *kind, graph_kind graph, const qt_graph *g, int node,
                           qt_qstate **out, char *msg) {
  const qt_node *n = &g->nodes[node];
  const int is_weight = kind[0] == 'w';
  char obj[QT_NAME_LEN + 32];
  snprintf(obj, sizeof obj, "/quant/%s/%s", kind, n->name);
  hid_t r = group_open(parent, "/quant", n->name, msg);
  if (r < 0) return -1;
  int rc = -1, at_node = -1, axis = 0, channels = 0;
  qt_qspec s;
  memset(&s, 0, sizeof s);
  char observer[64], method[64];
  float *scale = NULL;
  int32_t *zp = NULL, *qw = NULL;
  qt_qstate *q = NULL;
  if (read_attr_int(r, obj, "node", &at_node, msg) || read_attr_int(r, obj, "bits", &s.bits, msg) ||
      read_attr_int(r, obj, "qmin", &s.qmin, msg) || read_attr_int(r, obj, "qmax", &s.qmax, msg) ||
      read_attr_flag(r, obj, "signed", &s.is_signed, msg) || read_attr_flag(r, obj, "symmetric", &s.symmetric, msg) ||
      read_attr_flag(r, obj, "per_channel", &s.per_channel, msg) || read_attr_int(r, obj, "axis", &axis, msg) ||
      read_attr_int(r, obj, "channels", &channels, msg) ||
      read_attr_str(r, obj, "observer", observer, sizeof observer, msg) ||
      read_attr_str(r, obj, "method", method, sizeof method, msg) ||
      read_attr_float(r, obj, "percentile", &s.percentile, msg))
    goto done;
  if (at_node != node) {
    qt_err(msg, "%s: attribute node is %d, the record belongs to node %d", obj, at_node, node);
    goto done;
  }
  if (qt_observer_kind_parse(observer, &s.observer) || qt_range_method_parse(method, &s.method)) {
    qt_err(msg, "%s: unknown observer '%s' or range method '%s'", obj, observer, method);
    goto done;
  }
  const qt_value *x = &g->values[n->n_inputs ? n->inputs[0] : n->output];
  if (axis != record_axis(&s, is_weight, x->ndim)) {
    qt_err(msg, "%s: axis %d, want %d for a %s %s record", obj, axis, record_axis(&s, is_weight, x->ndim),
         s.per_channel ? "per-channel" : "per-tensor", kind);
    goto done;
  }
  if (channels < 1 || channels > QDQ_MAX_CHANNELS) {
    qt_err(msg, "%s: channels %d out of range", obj, channels);
    goto done;
  }
  const int64_t ch[1] = {channels};
  if (!(scale = read_dataset(r, obj, "scale", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      !(zp = read_dataset(r, obj, "zero_point", H5T_INTEGER, H5T_NATIVE_INT32, 1, ch, 1, NULL, NULL, msg)))
    goto done;
  int64_t n_qweight = 0;
  if (is_weight) {
    if (n->param[QT_P_WEIGHT] < 0) {
      qt_err(msg, "%s: node %d '%s' (%s) has no weight to quantize", obj, node, n->name, qt_op_name(n->op));
      goto done;
    }
    const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
    char tensor[2 * QT_NAME_LEN];
    if (read_attr_str(r, obj, "tensor", tensor, sizeof tensor, msg)) goto done;
    if (strcmp(tensor, W->name) != 0) {
      qt_err(msg, "%s: quantizes tensor '%s', the node's weight is '%s'", obj, tensor, W->name);
      goto done;
    }
    if (graph == KIND_PREPARED) {
      htri_t has = H5Lexists(r, "weight_int", H5P_DEFAULT);
      if (has != 0) {
        qt_err(msg, has < 0 ? "%s: cannot look up dataset 'weight_int' (corrupt file?)"
                          : "%s: holds 'weight_int', but a prepared graph fake-quantizes its float weight (kind "
                            "'prepared' has no integer weights)",
             obj);
        goto done;
      }
    } else {
      if (!(qw = read_dataset(r, obj, "weight_int", H5T_INTEGER, H5T_NATIVE_INT32, W->ndim, W->shape, 4, NULL, NULL,
                              msg)))
        goto done;
      n_qweight = W->numel;
    }
  }
  char cerr[QT_ERR_LEN];
  if (!(q = qt_qstate_create(&s, channels, cerr))) {
    qt_err(msg, "%s: %s", obj, cerr);
    goto done;
  }
  memcpy(q->scale, scale, (size_t)channels * sizeof(float));
  memcpy(q->zero_point, zp, (size_t)channels * sizeof(int32_t));
  q->calibrated = 1;
  q->observe = 0;
  q->fake_quant = 1;
  q->qweight = qw;
  q->n_qweight = n_qweight;
  qw = NULL;
  *out = q;
  rc = 0;
done:
  free(scale);
  free(zp);
  free(qw);
  H5Gclose(r);
  return rc;
}

static int read_qrecord(hid_t parent, const char *kind, graph_kind graph, qt_graph *g, int node, char *msg) {
  qt_qstate *q = NULL;
  if (read_qrecord_new(parent, kind, graph, g, node, &q, msg)) return -1;
  if (kind[0] == 'w') g->nodes[node].wq = q;
  else g->nodes[node].q = q;
  return 0;
}

/* Every record in /quant/<kind> must belong to a node that has it. */
static int check_records_claimed(hid_t gk, const char *kind, const qt_graph *g, char *msg) {
  char obj[32];
  snprintf(obj, sizeof obj, "/quant/%s", kind);
  int count = group_count(gk, obj, QDQ_MAX_NODES, msg);
  char *names = count < 0 ? NULL : list_links(gk, obj, count, QT_NAME_LEN, msg);
  if (!names) return -1;
  int rc = 0;
  for (int k = 0; k < count && !rc; k++) {
    const char *name = names + (size_t)k * QT_NAME_LEN;
    int i = qt_graph_find_node(g, name);
    if (i < 0 || !(kind[0] == 'w' ? g->nodes[i].wq : g->nodes[i].q))
      rc = qt_err(msg, "%s/%s: a record for no node of that name", obj, name);
  }
  free(names);
  return rc;
}

static qt_graph *load_graph(hid_t f, char *msg) {
  qt_graph *g = NULL;
  node_rec *nodes = NULL;
  tensor_rec *tensors = NULL;
  char *vname = NULL, *links = NULL;
  int *vndim = NULL, *vprod = NULL;
  int64_t *vshape = NULL;
  hid_t gn = -1, gt = -1, gv = -1, gq = -1, ga = -1, gw = -1;
  int n_nodes = 0, n_tensors = 0, n_values = 0, ok = 0;

  char format[64], name[QT_NAME_LEN];
  int version = 0, input = -1, output = -1, a_nodes = 0, a_values = 0, a_tensors = 0;
  if (read_attr_str(f, "/", "format", format, sizeof format, msg)) {
    qt_err(msg, "no 'format' attribute: not a Q/DQ graph file");
    goto done;
  }
  if (strcmp(format, QDQ_FORMAT) != 0) {
    qt_err(msg, "format is '%s', want '%s'", format, QDQ_FORMAT);
    goto done;
  }
  if (read_attr_int(f, "/", "format_version", &version, msg)) goto done;
  if (version != QDQ_VERSION) {
    qt_err(msg, "format version %d; this build reads version %d", version, QDQ_VERSION);
    goto done;
  }
  graph_kind kind = KIND_QDQ; /* files written before `kind` existed hold Q/DQ graphs */
  {
    htri_t has = H5Aexists(f, "kind");
    char ks[64];
    if (has < 0) {
      qt_err(msg, "/: cannot read the attributes (corrupt file: checksum or decoding failed)");
      goto done;
    }
    if (has > 0) {
      if (read_attr_str(f, "/", "kind", ks, sizeof ks, msg)) goto done;
      if (strcmp(ks, kind_names[KIND_QDQ]) == 0) {
        kind = KIND_QDQ;
      } else if (strcmp(ks, kind_names[KIND_PREPARED]) == 0) {
        kind = KIND_PREPARED;
      } else {
        qt_err(msg, "kind is '%s', want '%s' or '%s'", ks, kind_names[KIND_QDQ], kind_names[KIND_PREPARED]);
        goto done;
      }
    }
  }
  if (read_attr_str(f, "/", "name", name, sizeof name, msg) || read_attr_int(f, "/", "input", &input, msg) ||
      read_attr_int(f, "/", "output", &output, msg) || read_attr_int(f, "/", "n_nodes", &a_nodes, msg) ||
      read_attr_int(f, "/", "n_values", &a_values, msg) || read_attr_int(f, "/", "n_tensors", &a_tensors, msg))
    goto done;

  /* Nodes. */
  if ((gn = group_open(f, "/", "nodes", msg)) < 0 || (n_nodes = group_count(gn, "/nodes", QDQ_MAX_NODES, msg)) < 0)
    goto done;
  if (n_nodes != a_nodes || n_nodes < 1) {
    qt_err(msg, "/nodes holds %d groups, attribute n_nodes says %d", n_nodes, a_nodes);
    goto done;
  }
  nodes = calloc((size_t)n_nodes, sizeof *nodes);
  QT_ASSERT(nodes, "out of memory");
  if (!(links = list_links(gn, "/nodes", n_nodes, NODE_LINK_LEN, msg))) goto done;
  for (int k = 0; k < n_nodes; k++)
    if (read_node(gn, links + (size_t)k * NODE_LINK_LEN, n_nodes, nodes, msg)) goto done;
  free(links);
  links = NULL;

  /* Values. */
  if ((gv = group_open(f, "/", "values", msg)) < 0) goto done;
  int64_t vd[8];
  int vnd = 0;
  if (!(vndim = read_dataset(gv, "/values", "ndim", H5T_INTEGER, H5T_NATIVE_INT, 0, NULL, 1, &vnd, vd, msg))) goto done;
  n_values = (int)vd[0];
  if (n_values != a_values) {
    qt_err(msg, "/values/ndim has %d entries, attribute n_values says %d", n_values, a_values);
    goto done;
  }
  const int64_t want_n[1] = {n_values}, want_s[2] = {n_values, 3};
  if (!(vprod = read_dataset(gv, "/values", "producer", H5T_INTEGER, H5T_NATIVE_INT, 1, want_n, 1, NULL, NULL, msg)) ||
      !(vshape = read_dataset(gv, "/values", "shape", H5T_INTEGER, H5T_NATIVE_INT64, 2, want_s, 2, NULL, NULL, msg)))
    goto done;
  {
    hid_t st = H5Tcopy(H5T_C_S1);
    if (st < 0 || H5Tset_size(st, QT_NAME_LEN) < 0 || H5Tset_strpad(st, H5T_STR_NULLTERM) < 0) {
      qt_err(msg, "/values: cannot make a string type");
      if (st >= 0) H5Tclose(st);
      goto done;
    }
    vname = read_dataset(gv, "/values", "name", H5T_STRING, st, 1, want_n, 1, NULL, NULL, msg);
    H5Tclose(st);
    if (!vname) goto done;
  }
  for (int v = 0; v < n_values; v++) {
    vname[(size_t)v * QT_NAME_LEN + QT_NAME_LEN - 1] = 0;
    if (vndim[v] < 1 || vndim[v] > 3) {
      qt_err(msg, "/values: value %d has rank %d, want 1..3", v, vndim[v]);
      goto done;
    }
  }

  /* Tensors. */
  if ((gt = group_open(f, "/", "tensors", msg)) < 0 ||
      (n_tensors = group_count(gt, "/tensors", 4 * QDQ_MAX_NODES, msg)) < 0)
    goto done;
  if (n_tensors != a_tensors) {
    qt_err(msg, "/tensors holds %d datasets, attribute n_tensors says %d", n_tensors, a_tensors);
    goto done;
  }
  tensors = calloc((size_t)n_tensors + 1, sizeof *tensors);
  QT_ASSERT(tensors, "out of memory");
  if (!(links = list_links(gt, "/tensors", n_tensors, 2 * QT_NAME_LEN, msg))) goto done;
  for (int k = 0; k < n_tensors; k++)
    if (read_tensor(gt, links + (size_t)k * 2 * QT_NAME_LEN, n_tensors, n_nodes, tensors, msg)) goto done;
  free(links);
  links = NULL;

  /* Rebuild with the builder: nodes in order, then tensors in index order. */
  g = qt_graph_create(name);
  for (int i = 0; i < n_nodes; i++) {
    node_rec *r = &nodes[i];
    for (int k = 0; k < r->n_inputs; k++)
      if (r->inputs[k] < 0 || r->inputs[k] >= g->n_values) {
        if (r->inputs[k] < 0 || r->inputs[k] >= n_values)
          qt_err(msg, "node %d '%s': input value id %d out of range (%d values)", i, r->name, r->inputs[k], n_values);
        else
          qt_err(msg, "node %d '%s': input value %d is produced by a later node (nodes must be in topological order)", i,
               r->name, r->inputs[k]);
        goto done;
      }
    if (r->output < 0 || r->output >= n_values) {
      qt_err(msg, "node %d '%s': output value id %d out of range (%d values)", i, r->name, r->output, n_values);
      goto done;
    }
    const int o = r->output;
    if (qt_graph_add_node(g, r->op, r->name, r->inputs, r->n_inputs, &r->attr, vndim[o], vshape + (size_t)o * 3) < 0) {
      qt_err(msg, "node %d '%s': %s", i, r->name, g->error);
      goto done;
    }
    if (g->nodes[i].output != o) {
      qt_err(msg, "node %d '%s': output value id %d, but it produces value %d (one value per node, in node order)", i,
           r->name, o, g->nodes[i].output);
      goto done;
    }
    g->nodes[i].bn_frozen = r->bn_frozen;
  }
  if (g->n_values != n_values) {
    qt_err(msg, "/values has %d entries, the %d nodes produce %d", n_values, n_nodes, g->n_values);
    goto done;
  }
  for (int v = 0; v < n_values; v++) {
    const qt_value *val = &g->values[v];
    int same = strcmp(val->name, vname + (size_t)v * QT_NAME_LEN) == 0 && vprod[v] == val->producer;
    for (int d = 0; d < 3; d++) same = same && vshape[v * 3 + d] == (d < val->ndim ? val->shape[d] : 0);
    if (!same) {
      qt_err(msg, "/values: entry %d ('%s', producer %d) disagrees with node %d '%s'", v, vname + (size_t)v * QT_NAME_LEN,
           vprod[v], val->producer, val->name);
      goto done;
    }
  }
  if (input != g->input) {
    qt_err(msg, "graph input is value %d, the input node produces value %d", input, g->input);
    goto done;
  }
  if (output < 0 || output >= n_values) {
    qt_err(msg, "graph output value id %d out of range (%d values)", output, n_values);
    goto done;
  }
  g->output = output;
  for (int t = 0; t < n_tensors; t++) {
    tensor_rec *r = &tensors[t];
    const char *owner = g->nodes[r->node].name;
    size_t len = strlen(owner);
    if (strncmp(r->name, owner, len) != 0 || r->name[len] != '.' || !r->name[len + 1]) {
      qt_err(msg, "/tensors/%s: the name must be '<owner node>.<suffix>' with owner node %d '%s'", r->name, r->node, owner);
      goto done;
    }
    int id = qt_graph_add_tensor(g, r->node, r->name + len + 1, r->ndim, r->shape, r->is_buffer);
    QT_ASSERT(id == t && strcmp(g->tensors[id].name, r->name) == 0, "rebuilding tensor %s", r->name);
  }
  for (int i = 0; i < n_nodes; i++)
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      for (int b = 0; b < 2; b++) {
        const char *ref = b ? nodes[i].buffer[k] : nodes[i].param[k];
        if (!ref[0]) continue;
        int t = qt_graph_find_tensor(g, ref);
        if (t < 0) {
          qt_err(msg, "node %d '%s': %s tensor '%s' is not in /tensors", i, nodes[i].name,
               b ? buffer_slot_names[k] : param_slot_names[k], ref);
          goto done;
        }
        if (b) g->nodes[i].buffer[k] = t;
        else g->nodes[i].param[k] = t;
      }
  if (validate_structure(g, kind, msg)) goto done;
  char aerr[QT_ERR_LEN];
  if (qt_graph_alloc(g, aerr)) {
    qt_err(msg, "%s", aerr);
    goto done;
  }
  for (int t = 0; t < n_tensors; t++)
    memcpy(qt_graph_tensor_data(g, t), tensors[t].data, (size_t)g->tensors[t].numel * sizeof(float));

  /* Quantization records. */
  if ((gq = group_open(f, "/", "quant", msg)) < 0 || (ga = group_open(gq, "/quant", "activation", msg)) < 0 ||
      (gw = group_open(gq, "/quant", "weight", msg)) < 0)
    goto done;
  for (int i = 0; i < n_nodes; i++) {
    if (H5Lexists(ga, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(ga, "activation", kind, g, i, msg))
      goto done;
    if (H5Lexists(gw, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(gw, "weight", kind, g, i, msg)) goto done;
  }
  if (check_records_claimed(ga, "activation", g, msg) || check_records_claimed(gw, "weight", g, msg) ||
      validate_quant(g, kind, msg))
    goto done;
  qt_graph_set_training(g, 0);
  ok = 1;
done:
  if (gn >= 0) H5Gclose(gn);
  if (gt >= 0) H5Gclose(gt);
  if (gv >= 0) H5Gclose(gv);
  if (ga >= 0) H5Gclose(ga);
  if (gw >= 0) H5Gclose(gw);
  if (gq >= 0) H5Gclose(gq);
  for (int t = 0; tensors && t < n_tensors; t++) free(tensors[t].data);
  free(tensors);
  free(nodes);
  free(links);
  free(vname);
  free(vndim);
  free(vprod);
  free(vshape);
  if (!ok) {
    qt_graph_free(g);
    return NULL;
  }
  return g;
}

qt_graph *qt_qdq_load(const char *path, char *err) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  err[0] = 0;
  if (access(path, R_OK) != 0) {
    qt_err(err, "qdq file '%s': cannot open: %s", path, strerror(errno));
    return NULL;
  }
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  hid_t f = fapl < 0 ? -1 : H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (fapl >= 0) H5Pclose(fapl);
  if (f < 0) {
    qt_err(err, "qdq file '%s': not a readable HDF5 file (corrupt or truncated?)", path);
    return NULL;
  }
  char msg[QT_ERR_LEN] = "";
  qt_graph *g = load_graph(f, msg);
  H5Fclose(f);
  if (!g) qt_err(err, "qdq file '%s': %s", path, msg[0] ? msg : "unreadable");
  return g;
}

/* ---- training state in checkpoints (qat/qstate_file.h) ------------------------------------ */

#define QSTATE_FORMAT "qt-quant-state"
#define QSTATE_VERSION 1

static int is_bn_node(const qt_node *n) { return n->op == QT_OP_BATCH_NORM || n->op == QT_OP_CONV_BN; }

int qt_graph_has_quant_state(const qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->q || n->wq || n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN) return 1;
  }
  return 0;
}

int qt_quant_state_write(hid_t f, const qt_graph *g, char *err) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  for (int i = 0; i < g->n_nodes; i++)
    if (bad_link_name(g->nodes[i].name))
      return qt_err(err, "/quant: node %d name '%s' is empty, '.' or holds '/', which an HDF5 name cannot", i,
                  g->nodes[i].name);
  writer w;
  snprintf(w.where, sizeof w.where, "/quant");
  w.dcpl = H5Pcreate(H5P_DATASET_CREATE);
  w.gcpl = H5Pcreate(H5P_GROUP_CREATE);
  int bad = w.dcpl < 0 || w.gcpl < 0 || H5Pset_obj_track_times(w.dcpl, 0) < 0 || H5Pset_obj_track_times(w.gcpl, 0) < 0;
  hid_t gq = bad ? -1 : group_create(&w, f, "quant");
  bad = bad || gq < 0 || attr_str(gq, "format", QSTATE_FORMAT) || attr_int(gq, "format_version", QSTATE_VERSION);
  hid_t ga = bad ? -1 : group_create(&w, gq, "activation"), gw = bad ? -1 : group_create(&w, gq, "weight");
  bad = bad || ga < 0 || gw < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++) {
    if (g->nodes[i].q) bad = write_qrecord(&w, ga, g, i, g->nodes[i].q, 0, 1);
    if (!bad && g->nodes[i].wq) bad = write_qrecord(&w, gw, g, i, g->nodes[i].wq, 1, 1);
  }
  if (!bad) snprintf(w.where, sizeof w.where, "/quant/bn");
  hid_t gb = bad ? -1 : group_create(&w, gq, "bn");
  bad = bad || gb < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++)
    if (is_bn_node(&g->nodes[i])) bad = attr_int(gb, g->nodes[i].name, g->nodes[i].bn_frozen ? 1 : 0);
  if (gb >= 0) bad |= H5Gclose(gb) < 0;
  if (ga >= 0) bad |= H5Gclose(ga) < 0;
  if (gw >= 0) bad |= H5Gclose(gw) < 0;
  if (gq >= 0) bad |= H5Gclose(gq) < 0;
  if (w.dcpl >= 0) H5Pclose(w.dcpl);
  if (w.gcpl >= 0) H5Pclose(w.gcpl);
  return bad ? qt_err(err, "writing %s failed", w.where) : 0;
}

struct qt_quant_state {
  int n_nodes;
  qt_qstate **act, **wt; /* per node, NULL where the node has none */
  int *bn_frozen;
};

void qt_quant_state_free(qt_quant_state *s) {
  if (!s) return;
  for (int i = 0; i < s->n_nodes; i++) {
    qt_qstate_free(s->act[i]);
    qt_qstate_free(s->wt[i]);
  }
  free(s->act);
  free(s->wt);
  free(s->bn_frozen);
  free(s);
}

/* The stored spec must be the one this graph quantizes with. */
static int same_spec(const char *obj, const qt_qstate *got, const qt_qstate *want, char *msg) {
  const qt_qspec *a = &got->spec, *b = &want->spec;
  const char *tail = "in the checkpoint, but this run's prepared graph has";
#define SAME_INT(field, name)                                                                                  \
  if (a->field != b->field) return qt_err(msg, "%s: %s is %d %s %d", obj, name, (int)a->field, tail, (int)b->field)
  SAME_INT(bits, "bits");
  SAME_INT(qmin, "qmin");
  SAME_INT(qmax, "qmax");
  SAME_INT(is_signed, "signed");
  SAME_INT(symmetric, "symmetric");
  SAME_INT(per_channel, "per_channel");
#undef SAME_INT
  if (got->channels != want->channels)
    return qt_err(msg, "%s: channels is %d %s %d", obj, got->channels, tail, want->channels);
  if (a->observer != b->observer)
    return qt_err(msg, "%s: observer is '%s' %s '%s'", obj, qt_observer_kind_name(a->observer), tail,
                qt_observer_kind_name(b->observer));
  if (a->method != b->method)
    return qt_err(msg, "%s: method is '%s' %s '%s'", obj, qt_range_method_name(a->method), tail,
                qt_range_method_name(b->method));
  if (memcmp(&a->percentile, &b->percentile, sizeof(float)) != 0)
    return qt_err(msg, "%s: percentile is %g %s %g", obj, a->percentile, tail, b->percentile);
  return 0;
}

/* Reads the training state of the record group r into q (made by read_qrecord_new from the
 * same group) and checks it against the graph's own state `want`. */
static int read_train_state(hid_t r, const char *obj, const qt_graph *g, qt_qstate *q, const qt_qstate *want,
                            char *msg) {
  int pow2 = 0;
  if (read_attr_flag(r, obj, "observe", &q->observe, msg) || read_attr_flag(r, obj, "fake_quant", &q->fake_quant, msg) ||
      read_attr_flag(r, obj, "calibrated", &q->calibrated, msg) || read_attr_flag(r, obj, "pow2_scale", &pow2, msg))
    return -1;
  if (pow2 != (want->spec.pow2_scale ? 1 : 0))
    return qt_err(msg, "%s: pow2_scale is %d in the checkpoint, but this run's prepared graph has %d", obj, pow2,
                want->spec.pow2_scale ? 1 : 0);
  htri_t has = H5Aexists(r, "learned_scale");
  if (has < 0) return qt_err(msg, "%s: cannot read the attributes (corrupt file?)", obj);
  char lsq[2 * QT_NAME_LEN] = "";
  if (has && read_attr_str(r, obj, "learned_scale", lsq, sizeof lsq, msg)) return -1;
  const char *want_lsq = want->scale_param >= 0 ? g->tensors[want->scale_param].name : "";
  if (strcmp(lsq, want_lsq) != 0)
    return qt_err(msg, "%s: learned scale (LSQ) %s%s%s in the checkpoint, but %s%s%s in this run's prepared graph", obj,
                lsq[0] ? "'" : "", lsq[0] ? lsq : "none", lsq[0] ? "'" : "", want_lsq[0] ? "'" : "",
                want_lsq[0] ? want_lsq : "none", want_lsq[0] ? "'" : "");
  q->scale_param = want->scale_param;
  q->spec.pow2_scale = want->spec.pow2_scale;
  q->spec.learnable = want->spec.learnable;
  if (q->calibrated)
    for (int c = 0; c < q->channels; c++)
      if (!isfinite(q->scale[c]) || !(q->scale[c] > 0) || q->zero_point[c] < q->spec.qmin ||
          q->zero_point[c] > q->spec.qmax)
        return qt_err(msg, "%s: channel %d: scale %g, zero point %d are not qparams of [%d, %d]", obj, c, q->scale[c],
                    q->zero_point[c], q->spec.qmin, q->spec.qmax);

  char oobj[QT_NAME_LEN + 48];
  snprintf(oobj, sizeof oobj, "%s/observer", obj);
  hid_t og = group_open(r, obj, "observer", msg);
  if (og < 0) return -1;
  qt_observer *o = &q->obs;
  const qt_observer *wo = &want->obs;
  char kind[64], method[64];
  int channels = 0, bins = 0, initialized = 0, rc = -1;
  float ac = 0, pct = 0;
  float *mn = NULL, *mx = NULL;
  int64_t *hist = NULL;
  if (read_attr_str(og, oobj, "kind", kind, sizeof kind, msg) || read_attr_int(og, oobj, "channels", &channels, msg) ||
      read_attr_float(og, oobj, "averaging_constant", &ac, msg) ||
      read_attr_str(og, oobj, "method", method, sizeof method, msg) ||
      read_attr_float(og, oobj, "percentile", &pct, msg) || read_attr_int(og, oobj, "bins", &bins, msg) ||
      read_attr_flag(og, oobj, "initialized", &initialized, msg) ||
      read_attr_float(og, oobj, "hist_min", &o->hist_min, msg) || read_attr_float(og, oobj, "hist_max", &o->hist_max, msg))
    goto done;
  qt_observer_kind k;
  qt_range_method m;
  if (qt_observer_kind_parse(kind, &k) || qt_range_method_parse(method, &m)) {
    qt_err(msg, "%s: unknown observer '%s' or range method '%s'", oobj, kind, method);
    goto done;
  }
  if (k != wo->kind || channels != wo->channels || m != wo->method || memcmp(&ac, &wo->averaging_constant, sizeof ac) ||
      memcmp(&pct, &wo->percentile, sizeof pct) || bins != wo->bins) {
    qt_err(msg,
         "%s: a %s observer (%d channels, averaging constant %g, method %s, percentile %g, %d bins) in the checkpoint, "
         "but this run's prepared graph has a %s observer (%d channels, averaging constant %g, method %s, percentile "
         "%g, %d bins)",
         oobj, kind, channels, ac, method, pct, bins, qt_observer_kind_name(wo->kind), wo->channels,
         wo->averaging_constant, qt_range_method_name(wo->method), wo->percentile, wo->bins);
    goto done;
  }
  const int64_t ch[1] = {channels}, nb[1] = {bins};
  if (!(mn = read_dataset(og, oobj, "min", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      !(mx = read_dataset(og, oobj, "max", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)))
    goto done;
  has = H5Lexists(og, "hist", H5P_DEFAULT);
  if (has < 0) {
    qt_err(msg, "%s: cannot look up dataset 'hist' (corrupt file?)", oobj);
    goto done;
  }
  if (has && k != QT_OBSERVER_HISTOGRAM) {
    qt_err(msg, "%s: a %s observer holds no histogram", oobj, kind);
    goto done;
  }
  if (has) {
    if (!(hist = read_dataset(og, oobj, "hist", H5T_INTEGER, H5T_NATIVE_INT64, 1, nb, 1, NULL, NULL, msg))) goto done;
    for (int b = 0; b < bins; b++)
      if (hist[b] < 0) {
        qt_err(msg, "%s: hist[%d] = %lld is negative", oobj, b, (long long)hist[b]);
        goto done;
      }
  }
  o->averaging_constant = ac;
  o->method = m;
  o->percentile = pct;
  o->bins = bins;
  o->initialized = initialized;
  memcpy(o->min, mn, (size_t)channels * sizeof(float));
  memcpy(o->max, mx, (size_t)channels * sizeof(float));
  free(o->hist);
  o->hist = hist;
  hist = NULL;
  rc = 0;
done:
  free(mn);
  free(mx);
  free(hist);
  H5Gclose(og);
  return rc;
}

/* One record of node i: read, compared with the graph's, its training state added. */
static int read_state_record(hid_t gk, const char *kind, const qt_graph *g, int i, qt_qstate **out, char *msg) {
  const qt_node *n = &g->nodes[i];
  const qt_qstate *want = kind[0] == 'w' ? n->wq : n->q;
  char obj[QT_NAME_LEN + 32];
  snprintf(obj, sizeof obj, "/quant/%s/%s", kind, n->name);
  htri_t has = H5Lexists(gk, n->name, H5P_DEFAULT);
  if (has < 0) return qt_err(msg, "%s: cannot look up the record (corrupt file?)", obj);
  if (!has)
    return qt_err(msg, "%s: missing: this run's prepared graph quantizes %s %s, the checkpoint does not", obj,
                kind[0] == 'w' ? "the weight of" : "the activation at", n->name);
  qt_qstate *q = NULL;
  if (read_qrecord_new(gk, kind, KIND_PREPARED, g, i, &q, msg)) return -1;
  hid_t r = -1;
  int rc = same_spec(obj, q, want, msg);
  if (!rc && (r = group_open(gk, "/quant", n->name, msg)) < 0) rc = -1;
  if (!rc) rc = read_train_state(r, obj, g, q, want, msg);
  if (r >= 0) H5Gclose(r);
  if (rc) {
    qt_qstate_free(q);
    return -1;
  }
  *out = q;
  return 0;
}

typedef struct {
  const qt_graph *g;
  char *msg;
} bn_check;

static herr_t bn_attr_known(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
  (void)loc;
  (void)info;
  bn_check *c = data;
  int i = qt_graph_find_node(c->g, name);
  if (i < 0 || !is_bn_node(&c->g->nodes[i])) {
    qt_err(c->msg, "/quant/bn: a flag for '%s', which is no batch_norm or conv_bn node of this run's prepared graph",
         name);
    return -1;
  }
  return 0;
}

qt_quant_state *qt_quant_state_read(hid_t f, const qt_graph *g, char *err) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  err[0] = 0;
  qt_quant_state *s = calloc(1, sizeof *s);
  QT_ASSERT(s, "out of memory");
  s->n_nodes = g->n_nodes;
  s->act = calloc((size_t)g->n_nodes + 1, sizeof *s->act);
  s->wt = calloc((size_t)g->n_nodes + 1, sizeof *s->wt);
  s->bn_frozen = calloc((size_t)g->n_nodes + 1, sizeof *s->bn_frozen);
  QT_ASSERT(s->act && s->wt && s->bn_frozen, "out of memory");
  hid_t gq = -1, ga = -1, gw = -1, gb = -1;
  int ok = 0, version = 0;
  char format[64];
  if ((gq = group_open(f, "/", "quant", err)) < 0 || read_attr_str(gq, "/quant", "format", format, sizeof format, err) ||
      read_attr_int(gq, "/quant", "format_version", &version, err))
    goto done;
  if (strcmp(format, QSTATE_FORMAT) != 0 || version != QSTATE_VERSION) {
    qt_err(err, "/quant: format '%s' version %d; this build reads '%s' version %d", format, version, QSTATE_FORMAT,
         QSTATE_VERSION);
    goto done;
  }
  if ((ga = group_open(gq, "/quant", "activation", err)) < 0 || (gw = group_open(gq, "/quant", "weight", err)) < 0 ||
      (gb = group_open(gq, "/quant", "bn", err)) < 0)
    goto done;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->q && read_state_record(ga, "activation", g, i, &s->act[i], err)) goto done;
    if (n->wq && read_state_record(gw, "weight", g, i, &s->wt[i], err)) goto done;
    if (is_bn_node(n)) {
      htri_t has = H5Aexists(gb, n->name);
      if (has < 0) {
        qt_err(err, "/quant/bn: cannot read the attributes (corrupt file?)");
        goto done;
      }
      if (!has) {
        qt_err(err, "/quant/bn: no flag for %s node '%s' of this run's prepared graph", qt_op_name(n->op), n->name);
        goto done;
      }
      if (read_attr_flag(gb, "/quant/bn", n->name, &s->bn_frozen[i], err)) goto done;
    }
  }
  if (check_records_claimed(ga, "activation", g, err) || check_records_claimed(gw, "weight", g, err)) goto done;
  bn_check bc = {g, err};
  hsize_t idx = 0;
  if (H5Aiterate2(gb, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, bn_attr_known, &bc) < 0) {
    if (!err[0]) qt_err(err, "/quant/bn: cannot list the attributes (corrupt file?)");
    goto done;
  }
  ok = 1;
done:
  if (gb >= 0) H5Gclose(gb);
  if (ga >= 0) H5Gclose(ga);
  if (gw >= 0) H5Gclose(gw);
  if (gq >= 0) H5Gclose(gq);
  if (!ok) {
    qt_quant_state_free(s);
    return NULL;
  }
  return s;
}

/* Copies src's qparams, flags and observer state into dst (the same spec). */
static void qstate_assign(qt_qstate *dst, const qt_qstate *src) {
  char err[QT_ERR_LEN];
  memcpy(dst->scale, src->scale, (size_t)src->channels * sizeof(float));
  memcpy(dst->zero_point, src->zero_point, (size_t)src->channels * sizeof(int32_t));
  dst->observe = src->observe;
  dst->fake_quant = src->fake_quant;
  dst->calibrated = src->calibrated;
  QT_ASSERT(qt_observer_copy(&dst->obs, &src->obs, err) == 0, "copying an observer: %s", err);
}

void qt_quant_state_apply(qt_graph *g, qt_quant_state *s) {
  QT_ASSERT(s->n_nodes == g->n_nodes, "quant state of %d nodes applied to a graph of %d", s->n_nodes, g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *n = &g->nodes[i];
    if (s->act[i]) qstate_assign(n->q, s->act[i]);
    if (s->wt[i]) qstate_assign(n->wq, s->wt[i]);
    if (is_bn_node(n)) n->bn_frozen = s->bn_frozen[i];
  }
  qt_quant_state_free(s);
}
