/* AdaRound (Nagel et al., 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization")
 * and block reconstruction (Li et al., 2021, BRECQ; with Wei et al., 2022, QDrop): each weight is
 * rounded down or up, not to nearest, as minimizes the output error of its layer or block on
 * calibration data. The choice is relaxed to floor(w / s) + h(v) with h the rectified sigmoid and
 * learned by Adam with this project's autograd (autograd/ops_adaround.c), a regularizer with an
 * annealed exponent pushing h(v) to 0 or 1; then frozen. A block also learns its activation
 * scales (LSQ) and, with QDrop, trains with each activation's quantization dropped at random.
 * Units go in graph order, each one's input taken from the quantized model with the earlier units
 * done, its target from the float model (the paper's asymmetric reconstruction, its section 4). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "nn/node.h"
#include "optim/optim.h"
#include "qat/qat.h"

void qt_adaround_config_default(qt_adaround_config *c) {
  *c = (qt_adaround_config){.unit = QT_RECON_LAYER,
                            .iterations = 2000,
                            .batch = 32,
                            .lambda = 0.01f,
                            .beta_start = 20.0f,
                            .beta_end = 2.0f,
                            .warm_start = 0.2f,
                            .lr = 1e-3f,
                            .scale_lr = 4e-5f,
                            .drop = 0.5f,
                            .seed = 0};
}

#define EVAL_BATCH 128

/* A unit: its nodes in graph order, the value it reads and the one it ends at, the layers it
 * rounds and the fake quants whose scales it learns. */
typedef struct {
  int *nodes, n_nodes;
  int in, out;
  int *layers, n_layers;
  int *acts, n_acts;
} unit;

/* What a unit learns: per layer, v and floor(w / s) at offsets into one array, the fixed bias;
 * per learned fake quant, its scales at offsets into another. */
typedef struct {
  float *v, *dv, *w_floor;
  int64_t *v_at; /* per layer, then the total */
  float **bias;
  float *s, *ds;
  int *s_at; /* per learned fake quant, then the total */
} unit_state;

typedef struct {
  qt_graph *g;
  qt_ctx *ctx;
  const qt_adaround_config *c;
  float *other; /* the float model's parameters; g's own while those are in (qt_graph_exchange_params) */
  const float *images;
  int n;
  unsigned char *keep;
} ar_run;

static int is_rounded(const qt_node *n) {
  return (n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR) && n->wq && n->wq->fake_quant;
}

/* A fake quant whose scale a block learns: per tensor or channel, not restricted to powers of two. */
static int is_learned_act(const qt_node *n) {
  return n->op == QT_OP_FAKE_QUANT && n->q && n->q->fake_quant && !n->q->spec.pow2_scale;
}

/* The relu / relu6 node that alone reads node's output, or -1. */
static int activation_after(const qt_graph *g, int node) {
  const int v = g->nodes[node].output;
  if (g->values[v].consumers != 1) return -1;
  for (int i = node + 1; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++)
      if (g->nodes[i].inputs[k] == v) return g->nodes[i].op == QT_OP_RELU || g->nodes[i].op == QT_OP_RELU6 ? i : -1;
  return -1;
}

static void unit_add(unit *u, const qt_graph *g, int node, int learn_acts) {
  u->nodes[u->n_nodes++] = node;
  if (is_rounded(&g->nodes[node])) u->layers[u->n_layers++] = node;
  if (learn_acts && is_learned_act(&g->nodes[node])) u->acts[u->n_acts++] = node;
}

static unit *unit_new(const qt_graph *g) {
  unit *u = calloc(1, sizeof *u);
  QT_ASSERT(u, "out of memory");
  u->nodes = malloc((size_t)g->n_nodes * sizeof(int));
  u->layers = malloc((size_t)g->n_nodes * sizeof(int));
  u->acts = malloc((size_t)g->n_nodes * sizeof(int));
  QT_ASSERT(u->nodes && u->layers && u->acts, "out of memory");
  return u;
}

static void unit_free(unit *u) {
  if (u) QT_FREE_ALL(u->nodes, u->layers, u->acts, u);
}

/* The layer units: each rounded layer with its activation. */
static int layer_units(const qt_graph *g, unit **units) {
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (!is_rounded(&g->nodes[i])) continue;
    unit *u = units[k++] = unit_new(g);
    const int act = activation_after(g, i);
    unit_add(u, g, i, 0);
    if (act >= 0) unit_add(u, g, act, 0);
    u->in = g->nodes[i].inputs[0];
    u->out = g->nodes[u->nodes[u->n_nodes - 1]].output;
  }
  return k;
}

/* The blocks: the graph cut where one value alone is live (every later node reads only it and
 * what comes after it), and each block runs from a cut to the first later cut at a fake quant's
 * output (or the graph's output) with at least one rounded layer before it. Nodes after the last
 * block (no rounded layer) stay as they are. */
static int block_units(const qt_graph *g, unit **units) {
  int *last_use = malloc((size_t)g->n_values * sizeof(int));
  QT_ASSERT(last_use, "out of memory");
  for (int v = 0; v < g->n_values; v++) last_use[v] = -1;
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++) last_use[g->nodes[i].inputs[k]] = i;
  last_use[g->output] = g->n_nodes;
  int k = 0, start = -1, in = -1, live = 0;
  unit *u = NULL;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *nd = &g->nodes[i];
    /* live: values made so far and read after node i */
    if (last_use[nd->output] > i) live++;
    for (int j = 0; j < nd->n_inputs; j++) {
      int seen = 0; /* a value read twice (add(x, x)) dies once */
      for (int m = 0; m < j; m++) seen |= nd->inputs[m] == nd->inputs[j];
      if (!seen && last_use[nd->inputs[j]] == i) live--;
    }
    if (nd->op == QT_OP_INPUT) {
      in = nd->output;
      continue;
    }
    if (start < 0) {
      start = i;
      u = unit_new(g);
      u->in = in;
    }
    unit_add(u, g, i, 1);
    const int cut = live == 1 && last_use[nd->output] > i;
    if (cut && u->n_layers > 0 && (nd->op == QT_OP_FAKE_QUANT || nd->output == g->output)) {
      u->out = nd->output;
      units[k++] = u;
      u = NULL;
      start = -1;
      in = nd->output;
    } else if (cut && u->n_layers == 0 && nd->op == QT_OP_FAKE_QUANT) {
      /* nothing to learn before this cut: the next block starts after it */
      unit_free(u);
      u = NULL;
      start = -1;
      in = nd->output;
    }
  }
  unit_free(u);
  free(last_use);
  return k;
}

static int64_t per_image(const qt_graph *g, int value) { return qt_value_numel(&g->values[value]); }

static qt_tensor *batch_tensor(qt_ctx *ctx, const qt_graph *g, int value, int B, float *data) {
  const qt_value *v = &g->values[value];
  int64_t shape[4] = {B, 0, 0, 0};
  for (int d = 0; d < v->ndim; d++) shape[1 + d] = v->shape[d];
  return qt_tensor_wrap(ctx, QT_F32, 1 + v->ndim, shape, data);
}

/* Runs the images through g in `mode` and copies, per image, value a into xa and value b into xb
 * (each when not NULL). */
static int collect(ar_run *r, qt_graph_mode mode, int a, float *xa, int b, float *xb, char *err) {
  qt_graph *g = r->g;
  const int64_t in_img = per_image(g, g->input), a_img = per_image(g, a), b_img = per_image(g, b);
  memset(r->keep, 0, (size_t)g->n_values);
  r->keep[a] = r->keep[b] = 1;
  qt_graph_set_mode(g, mode);
  for (int i0 = 0; i0 < r->n; i0 += EVAL_BATCH) {
    const int B = r->n - i0 < EVAL_BATCH ? r->n - i0 : EVAL_BATCH;
    qt_ctx_reset(r->ctx);
    qt_tensor **values = NULL;
    qt_tensor *in = batch_tensor(r->ctx, g, g->input, B, (float *)(r->images + (int64_t)i0 * in_img));
    if (!qt_graph_forward_keep(g, r->ctx, in, &values, NULL, r->keep))
      return qt_err(err, "adaround: forward: %s", g->error);
    if (xa) memcpy(xa + (int64_t)i0 * a_img, qt_f32(values[a]), (size_t)(B * a_img) * sizeof(float));
    if (xb) memcpy(xb + (int64_t)i0 * b_img, qt_f32(values[b]), (size_t)(B * b_img) * sizeof(float));
  }
  qt_ctx_reset(r->ctx);
  return 0;
}

/* A tensor the unit learns (v, activation scales): data and gradient in the unit's own arrays. */
static qt_tensor *learned(qt_ctx *ctx, int ndim, const int64_t *shape, float *data, float *grad) {
  qt_tensor *t = qt_tensor_wrap(ctx, QT_F32, ndim, shape, data);
  t->grad = grad;
  t->requires_grad = 1;
  return t;
}

/* The unit on input xq (and, when learning with QDrop, the float input xf): with learn, the soft
 * weights, the learned activation scales and QDrop's drops (seeded by seed); without, as the
 * graph computes it in eval mode (fake quant on). NULL with err on failure. */
static qt_tensor *unit_forward(ar_run *r, const unit *u, unit_state *st, qt_tensor *xq, qt_tensor *xf, int learn,
                               uint64_t seed, char *err) {
  qt_graph *g = r->g;
  qt_ctx *ctx = r->ctx;
  const float drop = r->c->unit == QT_RECON_BLOCK ? r->c->drop : 0.0f;
  qt_tensor **vals = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *vals);
  vals[u->in] = learn && drop > 0 && xf ? qt_qdrop(ctx, xf, xq, drop, seed) : xq;
  for (int k = 0, li = 0, ai = 0; k < u->n_nodes; k++) {
    const int node = u->nodes[k];
    qt_node *nd = &g->nodes[node];
    qt_tensor *in[QT_MAX_INPUTS] = {0}, *y = NULL;
    for (int j = 0; j < nd->n_inputs; j++) {
      in[j] = vals[nd->inputs[j]];
      QT_ASSERT(in[j], "unit: node %s reads a value from outside its unit", nd->name);
    }
    const qt_param *wp = qt_op_has_weight(nd->op) ? &g->tensors[nd->param[QT_P_WEIGHT]] : NULL;
    if (learn && li < u->n_layers && u->layers[li] == node) {
      const qt_qstate *q = nd->wq;
      qt_tensor *v = learned(ctx, wp->ndim, wp->shape, st->v + st->v_at[li], st->dv + st->v_at[li]);
      qt_tensor *w = qt_adaround_weight(ctx, v, st->w_floor + st->v_at[li], 1, q->channels, wp->numel / q->channels,
                                        q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
      const int64_t bshape[1] = {nd->attr.out_channels};
      qt_tensor *b = st->bias[li] ? qt_tensor_wrap(ctx, QT_F32, 1, bshape, st->bias[li]) : NULL;
      y = nd->op == QT_OP_CONV2D ? qt_conv2d(ctx, in[0], w, b, nd->attr.stride_h, nd->attr.stride_w, nd->attr.pad_h,
                                             nd->attr.pad_w, nd->attr.groups)
                                 : qt_linear(ctx, in[0], w, b);
      li++;
    } else if (nd->op == QT_OP_FAKE_QUANT) {
      const qt_qstate *q = nd->q;
      const int64_t numel = qt_tensor_numel(in[0]), outer = numel / q->channels;
      if (learn && ai < u->n_acts && u->acts[ai] == node) {
        const int64_t cshape[1] = {q->channels};
        qt_tensor *s = learned(ctx, 1, cshape, st->s + st->s_at[ai], st->ds + st->s_at[ai]);
        const float gf = 1.0f / sqrtf((float)(numel / in[0]->shape[0]) * (float)q->spec.qmax);
        y = qt_fake_quant_lsq(ctx, in[0], outer, q->channels, 1, s, q->zero_point, q->spec.qmin, q->spec.qmax, gf);
        if (drop > 0) y = qt_qdrop(ctx, in[0], y, drop, seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(node + 1)));
        ai++;
      } else if (q->fake_quant) {
        y = qt_fake_quant(ctx, in[0], outer, q->channels, 1, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
      } else {
        y = in[0];
      }
    } else if (qt_op_is_param_free(nd->op)) {
      y = qt_apply_simple_op(ctx, nd->op, &nd->attr, in, nd->n_inputs, 0);
    } else if (nd->op == QT_OP_CONV2D || nd->op == QT_OP_LINEAR || nd->op == QT_OP_BATCH_NORM) {
      y = qt_node_forward(g, ctx, node, in, 0, err);
      if (!y) return NULL;
    } else {
      qt_err(err, "adaround: node %s: a reconstruction cannot run op '%s'", nd->name, qt_op_name(nd->op));
      return NULL;
    }
    vals[nd->output] = y;
  }
  return vals[u->out];
}

/* SQNR in dB of the unit's output in eval mode on the inputs xq against the targets y. */
static int unit_sqnr(ar_run *r, const unit *u, const float *xq, const float *y, double *db, char *err) {
  qt_graph *g = r->g;
  const int64_t x_img = per_image(g, u->in), y_img = per_image(g, u->out);
  double signal = 0, noise = 0;
  qt_graph_set_mode(g, QT_MODE_EVAL);
  for (int i0 = 0; i0 < r->n; i0 += EVAL_BATCH) {
    const int B = r->n - i0 < EVAL_BATCH ? r->n - i0 : EVAL_BATCH;
    qt_ctx_reset(r->ctx);
    qt_tensor *xin = batch_tensor(r->ctx, g, u->in, B, (float *)(xq + (int64_t)i0 * x_img));
    qt_tensor *out = unit_forward(r, u, NULL, xin, NULL, 0, 0, err);
    if (!out) return -1;
    const float *o = qt_f32(out), *t = y + (int64_t)i0 * y_img;
    for (int64_t i = 0; i < B * y_img; i++) {
      signal += (double)t[i] * t[i];
      noise += ((double)o[i] - t[i]) * ((double)o[i] - t[i]);
    }
  }
  qt_ctx_reset(r->ctx);
  *db = noise > 0 ? 10.0 * log10(signal / noise) : INFINITY;
  return 0;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The regularizer's exponent at step t of T: beta_start through the warm start, then linearly
 * down to beta_end (BRECQ's LinearTempDecay; AIMET's schedule). */
static float beta_at(const qt_adaround_config *c, int t, int T) {
  const double warm = c->warm_start * T;
  if (t < warm) return c->beta_start;
  const double rel = (t - warm) / (T - warm);
  return (float)(c->beta_end + (c->beta_start - c->beta_end) * fmax(0.0, 1.0 - rel));
}

/* The last axis of a value: its channels. */
static int64_t channels_of(const qt_graph *g, int value) {
  const qt_value *v = &g->values[value];
  return v->shape[v->ndim - 1];
}

/* The optimization of v (and the activation scales) for one unit, on the quantized-model inputs
 * xq, the float-model inputs xf (NULL without QDrop) and the targets y. */
static int learn(ar_run *r, const unit *u, unit_state *st, const float *xq, const float *xf, const float *y,
                 uint64_t unit_seed, char *err) {
  qt_graph *g = r->g;
  const qt_adaround_config *c = r->c;
  const int B = c->batch < r->n ? c->batch : r->n;
  const int64_t x_img = per_image(g, u->in), y_img = per_image(g, u->out);
  const qt_optim_config oc = {.kind = QT_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  qt_optim *ov = qt_optim_create(&oc, st->v_at[u->n_layers]);
  qt_optim *os = u->n_acts ? qt_optim_create(&oc, st->s_at[u->n_acts]) : NULL;
  float *xb = malloc((size_t)(B * x_img) * sizeof(float)), *yb = malloc((size_t)(B * y_img) * sizeof(float));
  float *fb = xf ? malloc((size_t)(B * x_img) * sizeof(float)) : NULL;
  QT_ASSERT(ov && (os || !u->n_acts) && xb && yb && (fb || !xf), "out of memory");
  uint64_t rng = unit_seed;
  int rc = 0;
  qt_ctx_set_grad(r->ctx, 1);
  for (int t = 0; t < c->iterations && !rc; t++) {
    for (int b = 0; b < B; b++) {
      const int64_t i = (int64_t)(splitmix64(&rng) % (uint64_t)r->n);
      memcpy(xb + b * x_img, xq + i * x_img, (size_t)x_img * sizeof(float));
      if (fb) memcpy(fb + b * x_img, xf + i * x_img, (size_t)x_img * sizeof(float));
      memcpy(yb + b * y_img, y + i * y_img, (size_t)y_img * sizeof(float));
    }
    qt_ctx_reset(r->ctx);
    memset(st->dv, 0, (size_t)st->v_at[u->n_layers] * sizeof(float));
    if (u->n_acts) memset(st->ds, 0, (size_t)st->s_at[u->n_acts] * sizeof(float));
    qt_tensor *x = batch_tensor(r->ctx, g, u->in, B, xb), *xfl = fb ? batch_tensor(r->ctx, g, u->in, B, fb) : NULL;
    qt_tensor *out = unit_forward(r, u, st, x, xfl, 1, splitmix64(&rng), err);
    if (!out) {
      rc = -1;
      break;
    }
    qt_tensor *loss = qt_squared_error(r->ctx, out, yb, (double)(qt_tensor_numel(out) / channels_of(g, u->out)));
    if (t >= c->warm_start * c->iterations)
      for (int l = 0; l < u->n_layers; l++) {
        const qt_param *wp = &g->tensors[g->nodes[u->layers[l]].param[QT_P_WEIGHT]];
        qt_tensor *v = learned(r->ctx, wp->ndim, wp->shape, st->v + st->v_at[l], st->dv + st->v_at[l]);
        loss = qt_add(r->ctx, loss, qt_adaround_round_loss(r->ctx, v, beta_at(c, t, c->iterations), c->lambda));
      }
    if (!isfinite(qt_f32(loss)[0])) {
      rc = qt_err(err, "adaround: unit ending at %s: the loss is %g at step %d",
                  g->nodes[u->nodes[u->n_nodes - 1]].name, (double)qt_f32(loss)[0], t);
      break;
    }
    qt_backward(r->ctx, loss);
    qt_optim_step(ov, st->v, st->dv, c->lr);
    if (os) {
      qt_optim_step(os, st->s, st->ds, c->scale_lr);
      for (int i = 0; i < st->s_at[u->n_acts]; i++)
        if (!(st->s[i] >= FLT_EPSILON)) st->s[i] = FLT_EPSILON;
    }
  }
  qt_ctx_set_grad(r->ctx, 0);
  qt_ctx_reset(r->ctx);
  qt_optim_free(ov);
  qt_optim_free(os);
  QT_FREE_ALL(xb, yb, fb);
  return rc;
}

/* The state a unit starts from: v where h(v) is each weight's fraction, the fixed biases (an int32
 * bias fake-quantized), the calibrated activation scales. */
static int state_init(ar_run *r, const unit *u, unit_state *st, char *err) {
  qt_graph *g = r->g;
  st->v_at = malloc((size_t)(u->n_layers + 1) * sizeof(int64_t));
  st->bias = calloc((size_t)(u->n_layers ? u->n_layers : 1), sizeof(float *));
  st->s_at = malloc((size_t)(u->n_acts + 1) * sizeof(int));
  QT_ASSERT(st->v_at && st->bias && st->s_at, "out of memory");
  st->v_at[0] = 0;
  for (int l = 0; l < u->n_layers; l++)
    st->v_at[l + 1] = st->v_at[l] + g->tensors[g->nodes[u->layers[l]].param[QT_P_WEIGHT]].numel;
  st->s_at[0] = 0;
  for (int a = 0; a < u->n_acts; a++) st->s_at[a + 1] = st->s_at[a] + g->nodes[u->acts[a]].q->channels;
  const int64_t nv = st->v_at[u->n_layers];
  st->v = malloc((size_t)nv * sizeof(float));
  st->dv = malloc((size_t)nv * sizeof(float));
  st->w_floor = malloc((size_t)nv * sizeof(float));
  st->s = malloc((size_t)(st->s_at[u->n_acts] + 1) * sizeof(float));
  st->ds = malloc((size_t)(st->s_at[u->n_acts] + 1) * sizeof(float));
  QT_ASSERT(st->v && st->dv && st->w_floor && st->s && st->ds, "out of memory");
  for (int a = 0; a < u->n_acts; a++)
    memcpy(st->s + st->s_at[a], g->nodes[u->acts[a]].q->scale,
           (size_t)g->nodes[u->acts[a]].q->channels * sizeof(float));
  qt_graph_set_mode(g, QT_MODE_EVAL);
  for (int l = 0; l < u->n_layers; l++) {
    const int node = u->layers[l];
    const qt_node *nd = &g->nodes[node];
    const qt_qstate *q = nd->wq;
    const qt_param *wp = &g->tensors[nd->param[QT_P_WEIGHT]];
    const float *w = g->params + wp->offset;
    const int64_t inner = wp->numel / q->channels;
    for (int64_t i = 0; i < wp->numel; i++) {
      const float ws = w[i] / q->scale[q->channels == 1 ? 0 : i / inner];
      st->w_floor[st->v_at[l] + i] = floorf(ws);
      st->v[st->v_at[l] + i] = qt_adaround_v_init(ws - floorf(ws));
    }
    if (nd->param[QT_P_BIAS] < 0) continue;
    qt_ctx_reset(r->ctx);
    const qt_param *bp = &g->tensors[nd->param[QT_P_BIAS]];
    qt_tensor *b = qt_tensor_wrap(r->ctx, QT_F32, bp->ndim, bp->shape, g->params + bp->offset);
    qt_tensor *eb = qt_effective_bias(g, r->ctx, node, b, err);
    if (!eb) return -1;
    st->bias[l] = malloc((size_t)bp->numel * sizeof(float));
    QT_ASSERT(st->bias[l], "out of memory");
    memcpy(st->bias[l], qt_f32(eb), (size_t)bp->numel * sizeof(float));
  }
  qt_ctx_reset(r->ctx);
  return 0;
}

/* Each weight on its grid point as v rounds it, the learned activation scales into their fake
 * quants; returns how many weights went the other way than to nearest. */
static int64_t state_freeze(ar_run *r, const unit *u, const unit_state *st) {
  qt_graph *g = r->g;
  int64_t flipped = 0;
  for (int l = 0; l < u->n_layers; l++) {
    const qt_node *nd = &g->nodes[u->layers[l]];
    const qt_qstate *q = nd->wq;
    const qt_param *wp = &g->tensors[nd->param[QT_P_WEIGHT]];
    float *w = g->params + wp->offset;
    const int64_t inner = wp->numel / q->channels;
    const float lo = (float)q->spec.qmin, hi = (float)q->spec.qmax;
    for (int64_t i = 0; i < wp->numel; i++) {
      const int ch = q->channels == 1 ? 0 : (int)(i / inner);
      const float zp = (float)q->zero_point[ch];
      const float up = st->v[st->v_at[l] + i] >= 0.0f ? 1.0f : 0.0f;
      const float qv = fminf(fmaxf(st->w_floor[st->v_at[l] + i] + up + zp, lo), hi);
      const float nearest = fminf(fmaxf(nearbyintf(w[i] / q->scale[ch]) + zp, lo), hi);
      flipped += qv != nearest;
      w[i] = (qv - zp) * q->scale[ch];
    }
  }
  for (int a = 0; a < u->n_acts; a++)
    memcpy(g->nodes[u->acts[a]].q->scale, st->s + st->s_at[a],
           (size_t)g->nodes[u->acts[a]].q->channels * sizeof(float));
  return flipped;
}

static void state_free(const unit *u, unit_state *st) {
  for (int l = 0; l < u->n_layers && st->bias; l++) free(st->bias[l]);
  QT_FREE_ALL(st->v, st->dv, st->w_floor, st->v_at, st->bias, st->s, st->ds, st->s_at);
}

static int reconstruct(ar_run *r, const unit *u, int index, qt_adaround_unit *out, char *err) {
  qt_graph *g = r->g;
  const double t0 = qt_now_seconds();
  const int qdrop = r->c->unit == QT_RECON_BLOCK && r->c->drop > 0;
  const int64_t x_img = per_image(g, u->in), y_img = per_image(g, u->out);
  float *xq = malloc((size_t)(r->n * x_img) * sizeof(float));
  float *xf = qdrop ? malloc((size_t)(r->n * x_img) * sizeof(float)) : NULL;
  float *y = malloc((size_t)(r->n * y_img) * sizeof(float));
  QT_ASSERT(xq && y && (xf || !qdrop), "out of memory");
  unit_state st = {0};
  int rc = collect(r, QT_MODE_EVAL, u->in, xq, u->in, NULL, err);
  if (!rc) {
    qt_graph_exchange_params(g, r->other);
    rc = collect(r, QT_MODE_EVAL_FLOAT, u->in, xf, u->out, y, err);
    qt_graph_exchange_params(g, r->other);
  }
  if (!rc) rc = unit_sqnr(r, u, xq, y, &out->sqnr_nearest_db, err);
  if (!rc) rc = state_init(r, u, &st, err);
  if (!rc) rc = learn(r, u, &st, xq, xf, y, r->c->seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(index + 1)), err);
  const int64_t flipped = rc ? 0 : state_freeze(r, u, &st);
  if (!rc) rc = unit_sqnr(r, u, xq, y, &out->sqnr_adaround_db, err);
  const qt_node *first = &g->nodes[u->nodes[0]], *last = &g->nodes[u->nodes[u->n_nodes - 1]];
  if (r->c->unit == QT_RECON_LAYER)
    snprintf(out->name, sizeof out->name, "%s", first->name);
  else
    snprintf(out->name, sizeof out->name, "%s..%s", first->name, last->name);
  out->layers = u->n_layers;
  out->activations = u->n_acts;
  out->weights = rc ? 0 : st.v_at[u->n_layers];
  out->flipped = out->weights ? (double)flipped / (double)out->weights : 0;
  out->seconds = qt_now_seconds() - t0;
  state_free(u, &st);
  QT_FREE_ALL(xq, xf, y);
  return rc;
}

int qt_adaround(qt_graph *g, qt_ctx *ctx, const float *reference, const float *images, int n,
                const qt_adaround_config *cfg, qt_adaround_result *res, FILE *progress, char *err) {
  memset(res, 0, sizeof *res);
  if (n < 1) return qt_err(err, "adaround: needs calibration images (got %d)", n);
  if (cfg->iterations < 1 || cfg->batch < 1 || !(cfg->lambda >= 0) || !(cfg->lr > 0) || !(cfg->scale_lr >= 0) ||
      !(cfg->beta_end >= 1) || !(cfg->beta_start >= cfg->beta_end) || !(cfg->warm_start >= 0 && cfg->warm_start < 1) ||
      !(cfg->drop >= 0 && cfg->drop <= 1))
    return qt_err(err,
                  "adaround: settings out of range (iterations %d, batch %d, lambda %g, lr %g, scale lr %g, beta %g "
                  "-> %g, warm start %g, drop %g)",
                  cfg->iterations, cfg->batch, (double)cfg->lambda, (double)cfg->lr, (double)cfg->scale_lr,
                  (double)cfg->beta_start, (double)cfg->beta_end, (double)cfg->warm_start, (double)cfg->drop);
  qt_graph_set_mode(g, QT_MODE_EVAL); /* fake quant on wherever the graph quantizes (whatever mode it was in) */
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *nd = &g->nodes[i];
    const qt_qstate *q = is_rounded(nd) ? nd->wq : nd->op == QT_OP_FAKE_QUANT ? nd->q : NULL;
    if (!q || !q->fake_quant) continue;
    if (!q->calibrated) return qt_err(err, "adaround: %s has no qparams (calibrate first)", nd->name);
    if (q->scale_param >= 0)
      return qt_err(err, "adaround: %s learns its scale (LSQ, QAT); reconstruction is for PTQ", nd->name);
  }
  unit **units = calloc((size_t)g->n_nodes, sizeof *units);
  QT_ASSERT(units, "out of memory");
  const int total = cfg->unit == QT_RECON_LAYER ? layer_units(g, units) : block_units(g, units);
  const double t0 = qt_now_seconds();
  /* the float model: the reference, or g as it is now */
  ar_run r = {g, ctx, cfg, malloc((size_t)g->n_params * sizeof(float)), images, n, malloc((size_t)g->n_values)};
  QT_ASSERT(r.other && r.keep, "out of memory");
  memcpy(r.other, reference ? reference : g->params, (size_t)g->n_params * sizeof(float));
  int rc = 0;
  for (int k = 0; k < total && !rc; k++) {
    qt_adaround_unit one, *out = k < QT_ADAROUND_MAX_LISTED ? &res->unit[k] : &one;
    memset(out, 0, sizeof *out);
    if ((rc = reconstruct(&r, units[k], k, out, err))) break;
    res->units++;
    res->layers += out->layers;
    if (progress)
      fprintf(progress,
              "%s %d/%d %s: %lld weights%s, %.1f%% rounded the other way, output SQNR %.2f -> %.2f dB, %.1f s\n",
              cfg->unit == QT_RECON_LAYER ? "adaround: layer" : "adaround: block", k + 1, total, out->name,
              (long long)out->weights, out->activations ? " and activation scales" : "", 100 * out->flipped,
              out->sqnr_nearest_db, out->sqnr_adaround_db, out->seconds);
  }
  res->listed = res->units < QT_ADAROUND_MAX_LISTED ? res->units : QT_ADAROUND_MAX_LISTED;
  res->seconds = qt_now_seconds() - t0;
  qt_graph_set_mode(g, QT_MODE_TRAIN);
  for (int k = 0; k < total; k++) unit_free(units[k]);
  QT_FREE_ALL(units, r.other, r.keep);
  return rc ? -1 : 0;
}
