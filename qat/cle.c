/* Cross-layer equalization (Nagel et al., "Data-Free Quantization Through Weight Equalization and
 * Bias Correction", 2019): for a layer A whose output reaches a layer B only through functions
 * that commute with a positive per-channel scale (ReLU, max and average pooling, flatten, the
 * activation fake quant of a graph not yet calibrated), A's output channel i is divided by s_i and
 * B's input channel i multiplied by it, which leaves the function unchanged. s_i = sqrt(r1_i / r2_i),
 * r1_i the largest |weight| of A's output channel i and r2_i that of B's input channel i, makes both
 * sqrt(r1_i * r2_i): per-tensor weight quantization then wastes less of its range on a few wide
 * channels. A chain A -> B -> C is equalized pair by pair, repeatedly, until no scale moves. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "qat/qat.h"

/* How B reads A's channels: B's weight (rank 4: OC, C/groups, KH, KW; rank 2: OUT, IN) and, for a
 * linear layer after a flatten of (H, W, C), the C channels its columns cycle through. */
typedef struct {
  int a, b;     /* the layers */
  int channels; /* A's output channels */
  int flat;     /* B is a linear layer reading a flattened (H, W, C): column j is channel j % C */
} cle_pair;

static int is_layer(const qt_node *n) { return n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR; }

/* The tensor of node i's slot k is used by no other node. */
static int tensor_own(const qt_graph *g, int i, int k) {
  const int t = g->nodes[i].param[k];
  if (t < 0) return 1;
  for (int j = 0; j < g->n_nodes; j++)
    for (int s = 0; s < QT_MAX_PARAMS; s++)
      if (j != i && g->nodes[j].param[s] == t) return 0;
  return 1;
}

/* The layer B that layer a's output reaches through channel-wise positive-homogeneous nodes only,
 * each the sole consumer of the last; -1 when there is none (another consumer, an add, a batch
 * norm, a relu6 unless relu6_ok). *flat: a flatten was crossed. */
static int follow(const qt_graph *g, int a, int relu6_ok, int *flat) {
  int v = g->nodes[a].output;
  *flat = 0;
  for (;;) {
    const int c = qt_graph_sole_consumer(g, v);
    if (c < 0) return -1;
    const qt_node *n = &g->nodes[c];
    if (is_layer(n)) return n->inputs[0] == v ? c : -1;
    switch (n->op) {
      case QT_OP_RELU6:
        if (!relu6_ok) return -1;
        break;
      case QT_OP_RELU:
      case QT_OP_MAX_POOL2D:
      case QT_OP_AVG_POOL2D:
      case QT_OP_GLOBAL_AVG_POOL: break;
      case QT_OP_FLATTEN: *flat = 1; break;
      case QT_OP_FAKE_QUANT: break; /* not calibrated yet (checked) */
      default: return -1;
    }
    v = n->output;
  }
}

/* The pairs of g in graph order. */
static int find_pairs(const qt_graph *g, int relu6_ok, cle_pair *pairs) {
  int n = 0;
  for (int a = 0; a < g->n_nodes; a++) {
    const qt_node *na = &g->nodes[a];
    if (!is_layer(na) || !tensor_own(g, a, QT_P_WEIGHT) || !tensor_own(g, a, QT_P_BIAS)) continue;
    int flat;
    const int b = follow(g, a, relu6_ok, &flat);
    if (b < 0 || !tensor_own(g, b, QT_P_WEIGHT)) continue;
    const qt_param *wa = &g->tensors[na->param[QT_P_WEIGHT]], *wb = &g->tensors[g->nodes[b].param[QT_P_WEIGHT]];
    const int channels = (int)wa->shape[0];
    /* B's input channels: a conv's C (groups * its weight's dim 1), a linear layer's IN */
    const int64_t b_in = wb->ndim == 4 ? wb->shape[1] * g->nodes[b].attr.groups : wb->shape[1];
    if (flat ? wb->ndim != 2 || b_in % channels != 0 : b_in != channels) continue;
    pairs[n++] = (cle_pair){a, b, channels, flat};
  }
  return n;
}

/* The channel of A that B's weight element idx multiplies. */
static int b_channel(const qt_graph *g, const cle_pair *p, const qt_param *wb, int64_t idx) {
  if (wb->ndim == 2) return (int)(idx % wb->shape[1] % p->channels);
  const int64_t cg = wb->shape[1], k = wb->shape[2] * wb->shape[3], ocg = wb->shape[0] / g->nodes[p->b].attr.groups;
  const int64_t o = idx / (cg * k), c = idx / k % cg;
  return (int)(o / ocg * cg + c);
}

/* Equalizes one pair; returns the largest |log s_i|. r1, r2: scratch of p->channels doubles. */
static double equalize(qt_graph *g, const cle_pair *p, double *r1, double *r2) {
  const int C = p->channels;
  const qt_node *na = &g->nodes[p->a];
  float *wa = qt_graph_tensor_data(g, na->param[QT_P_WEIGHT]);
  float *ba = na->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, na->param[QT_P_BIAS]) : NULL;
  const int64_t per = g->tensors[na->param[QT_P_WEIGHT]].numel / C;
  for (int c = 0; c < C; c++) {
    r1[c] = r2[c] = 0;
    for (int64_t t = 0; t < per; t++) r1[c] = fmax(r1[c], fabs((double)wa[c * per + t]));
  }
  const qt_param *tb = &g->tensors[g->nodes[p->b].param[QT_P_WEIGHT]];
  float *wb = qt_graph_tensor_data(g, g->nodes[p->b].param[QT_P_WEIGHT]);
  for (int64_t i = 0; i < tb->numel; i++) {
    const int c = b_channel(g, p, tb, i);
    r2[c] = fmax(r2[c], fabs((double)wb[i]));
  }
  double moved = 0;
  for (int c = 0; c < C; c++) {
    /* s_i; 1 for a channel that is zero on either side */
    r1[c] = r1[c] > 0 && r2[c] > 0 ? sqrt(r1[c] / r2[c]) : 1.0;
    moved = fmax(moved, fabs(log(r1[c])));
    for (int64_t t = 0; t < per; t++) wa[c * per + t] = (float)((double)wa[c * per + t] / r1[c]);
    if (ba) ba[c] = (float)((double)ba[c] / r1[c]);
  }
  for (int64_t i = 0; i < tb->numel; i++) wb[i] = (float)((double)wb[i] * r1[b_channel(g, p, tb, i)]);
  return moved;
}

/* The relu6 nodes between the layers of pair p become relu; returns how many. */
static int relu6_to_relu(qt_graph *g, const cle_pair *p) {
  int n = 0;
  for (int v = g->nodes[p->a].output, c; (c = qt_graph_sole_consumer(g, v)) >= 0 && c != p->b; v = g->nodes[c].output)
    if (g->nodes[c].op == QT_OP_RELU6) {
      g->nodes[c].op = QT_OP_RELU;
      n++;
    }
  return n;
}

int qt_cross_layer_equalize(qt_graph *g, int relu6_as_relu, qt_cle_result *res, char *err) {
  memset(res, 0, sizeof *res);
  if (!g->finalized || !g->params)
    return qt_err(err, "cross-layer equalization: graph '%s' has no parameters", g->name);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_BATCH_NORM || n->op == QT_OP_CONV_BN)
      return qt_err(err,
                    "cross-layer equalization: node '%s' is a batch norm; equalization needs BN folded into the "
                    "convolutions (quant.mode = ptq)",
                    n->name);
    if ((n->q && n->q->calibrated) || (n->wq && n->wq->calibrated))
      return qt_err(err,
                    "cross-layer equalization: node '%s' is calibrated already; equalize before calibration, "
                    "whose ranges it changes",
                    n->name);
  }
  cle_pair *pairs = malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof *pairs);
  QT_ASSERT(pairs, "out of memory");
  const int n = find_pairs(g, relu6_as_relu, pairs);
  for (int k = 0; k < n && relu6_as_relu; k++) res->relu6_replaced += relu6_to_relu(g, &pairs[k]);
  size_t max_c = 1;
  for (int k = 0; k < n; k++) max_c = (size_t)pairs[k].channels > max_c ? (size_t)pairs[k].channels : max_c;
  double *r1 = malloc(2 * max_c * sizeof *r1);
  QT_ASSERT(r1, "out of memory");
  int it = 0;
  double moved = n ? INFINITY : 0;
  while (moved > QT_CLE_TOLERANCE && it < QT_CLE_MAX_ITERATIONS) {
    moved = 0;
    for (int k = 0; k < n; k++) moved = fmax(moved, equalize(g, &pairs[k], r1, r1 + max_c));
    it++;
  }
  res->pairs = n;
  res->iterations = it;
  res->last_change = moved;
  for (int k = 0; k < n && k < QT_CLE_MAX_LISTED; k++) {
    snprintf(res->a[k], sizeof res->a[k], "%s", g->nodes[pairs[k].a].name);
    snprintf(res->b[k], sizeof res->b[k], "%s", g->nodes[pairs[k].b].name);
  }
  QT_FREE_ALL(pairs, r1);
  return 0;
}
