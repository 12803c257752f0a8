/* The lowering skeleton (lowering.h): the program's slots, steps and kept allocations, the walk
 * over a Q/DQ graph with its value representations, the quantize / dequantize boundaries and
 * the fp32 fallback partitions, for the backends that fill it with their patterns. */
#include "backend/lowering.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

/* ---- the program ---------------------------------------------------------------------------- */

void *qt_keep(qt_program *p, size_t bytes) {
  void *a = calloc(1, bytes ? bytes : 1);
  QT_ASSERT(a, "out of memory");
  p->kept = qt_grow(p->kept, &p->cap_kept, p->n_kept + 1, sizeof *p->kept, "a lowered model table");
  p->kept[p->n_kept++] = a;
  return a;
}

void *qt_keep_copy(qt_program *p, const void *src, size_t bytes) {
  void *a = qt_keep(p, bytes);
  memcpy(a, src, bytes);
  return a;
}

int qt_new_slot(qt_program *p, size_t bytes_per_sample) {
  p->slot_bytes = qt_grow(p->slot_bytes, &p->cap_slots, p->n_slots + 1, sizeof *p->slot_bytes, "a lowered model table");
  p->slot_bytes[p->n_slots] = bytes_per_sample;
  return p->n_slots++;
}

qt_step *qt_new_step(qt_program *p, qt_step_kind kind) {
  p->steps = qt_grow(p->steps, &p->cap_steps, p->n_steps + 1, sizeof *p->steps, "a lowered model table");
  qt_step *s = &p->steps[p->n_steps++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  for (int k = 0; k < QT_MAX_INPUTS; k++) s->in[k] = -1;
  s->out = -1;
  return s;
}

qt_step *qt_kernel_step(qt_program *p, int op_kind, void *op, int in_slot, int64_t in_numel, size_t out_bytes) {
  qt_step *s = qt_new_step(p, QT_STEP_KERNEL);
  s->op_kind = op_kind;
  s->op = op;
  s->in[0] = in_slot;
  s->in_numel = in_numel;
  s->out = qt_new_slot(p, out_bytes);
  return s;
}

void qt_program_free(qt_program *p) {
  for (int i = 0; i < p->n_kept; i++) free(p->kept[i]);
  QT_FREE_ALL(p->kept, p->steps, p->slot_bytes);
  qt_part_list_free(&p->parts);
  free(p->bufs);
  qt_ctx_free(p->ctx);
}

static qt_tensor *wrap(qt_ctx *ctx, void *data, int N, int ndim, const int64_t *shape) {
  int64_t s[4] = {N, 0, 0, 0};
  for (int d = 0; d < ndim; d++) s[d + 1] = shape[d];
  return qt_tensor_wrap(ctx, QT_F32, ndim + 1, s, data);
}

void qt_fallback_inputs(qt_program *p, const qt_step *s, int N, qt_tensor **ins) {
  const qt_node *n = &p->g->nodes[s->node];
  for (int k = 0; k < n->n_inputs; k++) ins[k] = wrap(p->ctx, p->bufs[s->in[k]], N, s->in_ndim[k], s->in_shape[k]);
}

/* ---- value representations ------------------------------------------------------------------ */

const float *qt_param_data(const qt_graph *g, int t) { return t >= 0 ? g->params + g->tensors[t].offset : NULL; }

static const char *rep_name(const qt_lowering *L, qt_rep_kind k) {
  return k == QT_REP_INT8 ? L->ops->int8_name : k == QT_REP_I32 ? L->ops->int32_name : "fp32";
}

int qt_f32_slot(qt_lowering *L, int v) {
  qt_value_rep *r = &L->rep[v];
  if (r->f32_slot >= 0) return r->f32_slot;
  const qt_value *val = &L->g->values[v];
  qt_step *s = qt_new_step(L->p, QT_STEP_DEQUANTIZE);
  s->in[0] = r->slot;
  s->in_numel = qt_value_numel(val);
  s->out = qt_new_slot(L->p, (size_t)s->in_numel * sizeof(float));
  s->channels = r->channels;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  s->int8 = r->kind == QT_REP_INT8;
  r->f32_slot = s->out;
  qt_part_add(&L->p->parts, QT_PART_BOUNDARY, val->name, "dequantize %s -> fp32 (for an fp32 consumer)",
              rep_name(L, r->kind));
  return s->out;
}

void qt_set_qparams(qt_lowering *L, qt_value_rep *r, const qt_qstate *q) {
  r->channels = q->channels;
  r->scale = qt_keep_copy(L->p, q->scale, (size_t)q->channels * sizeof(float));
  r->zero_point = qt_keep_copy(L->p, q->zero_point, (size_t)q->channels * sizeof(int32_t));
  r->qmin = q->spec.qmin;
  r->qmax = q->spec.qmax;
}

static void lower_quantize(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const qt_qstate *q = n->q;
  const int x = qt_f32_slot(L, n->inputs[0]);
  qt_step *s = qt_new_step(L->p, QT_STEP_QUANTIZE);
  s->in[0] = x;
  s->in_numel = qt_value_numel(&L->g->values[n->output]);
  s->int8 = L->ops->fits_int8(q->spec.qmin, q->spec.qmax);
  s->out = qt_new_slot(L->p, (size_t)s->in_numel * (s->int8 ? 1 : sizeof(int32_t)));
  s->qmin = q->spec.qmin;
  s->qmax = q->spec.qmax;
  qt_value_rep *r = &L->rep[n->output];
  r->kind = s->int8 ? QT_REP_INT8 : QT_REP_I32;
  r->slot = s->out;
  r->f32_slot = -1;
  qt_set_qparams(L, r, q);
  s->channels = r->channels;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  qt_part_add(&L->p->parts, QT_PART_BOUNDARY, n->name, "quantize fp32 -> %s [%d, %d]", rep_name(L, r->kind),
              q->spec.qmin, q->spec.qmax);
}

/* ---- units: a pattern's nodes up to its quantize -------------------------------------------- */

const char *qt_match_output(qt_lowering *L, int i, int *act, int *quant) {
  const qt_graph *g = L->g;
  int v = g->nodes[i].output, c = L->consumer[v];
  *act = *quant = -1;
  if (v == g->output) return "its output is the model's fp32 output (no requantization point)";
  if (c < 0) return "output is not consumed by exactly one node (no requantization point)";
  if (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6) {
    *act = c;
    v = g->nodes[c].output;
    c = L->consumer[v];
    if (v == g->output || c < 0) return "relu output is not consumed by exactly one quantize";
  }
  if (g->nodes[c].op != QT_OP_QUANTIZE) return "output is not followed by a quantize (no requantization point)";
  const qt_qstate *q = g->nodes[c].q;
  if (q->channels != 1) return "output has per-channel activation qparams";
  const char *why = L->ops->output_range_problem(L, q);
  if (why) return why;
  *quant = c;
  return NULL;
}

void qt_unit_done(qt_lowering *L, int first, int act, int quant, int slot) {
  const qt_node *qn = &L->g->nodes[quant];
  qt_value_rep *r = &L->rep[qn->output];
  r->kind = QT_REP_INT8;
  r->slot = slot;
  r->f32_slot = -1;
  qt_set_qparams(L, r, qn->q);
  L->done[first] = 1;
  if (act >= 0) L->done[act] = 1;
  L->done[quant] = 1;
}

void qt_unit_nodes(const qt_lowering *L, int first, int n_in, int act, int quant, char *buf, size_t n) {
  const qt_graph *g = L->g;
  const qt_node *f = &g->nodes[first];
  size_t len = 0;
  for (int k = 0; k < n_in && len < n; k++)
    len +=
        (size_t)snprintf(buf + len, n - len, "%s%s", k ? " + " : "", g->nodes[g->values[f->inputs[k]].producer].name);
  if (len < n)
    snprintf(buf + len, n - len, " -> %s%s%s -> %s", f->name, act >= 0 ? " -> " : "",
             act >= 0 ? g->nodes[act].name : "", g->nodes[quant].name);
}

void qt_same_qparams(qt_lowering *L, int i, int slot) {
  const qt_node *n = &L->g->nodes[i];
  qt_value_rep *r = &L->rep[n->output];
  *r = L->rep[n->inputs[0]];
  r->slot = slot;
  r->f32_slot = -1;
}

int qt_off_grid_input(const qt_lowering *L, const qt_node *n) {
  const qt_value_rep *r0 = &L->rep[n->inputs[0]];
  for (int k = 1; k < n->n_inputs; k++) {
    const qt_value_rep *r = &L->rep[n->inputs[k]];
    if (r->scale[0] != r0->scale[0] || r->zero_point[0] != r0->zero_point[0] || r->qmin != r0->qmin ||
        r->qmax != r0->qmax)
      return k;
  }
  return -1;
}

qt_step *qt_concat_copy_step(qt_lowering *L, int i, int kind, int64_t *C, int64_t *off, int64_t *Y) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value *yv = &g->values[n->output];
  *Y = yv->shape[yv->ndim - 1];
  for (int k = 0; k < n->n_inputs; k++) {
    const qt_value *xv = &g->values[n->inputs[k]];
    C[k] = xv->shape[xv->ndim - 1];
    off[k] = k ? off[k - 1] + C[k - 1] : 0;
  }
  qt_step *s =
      qt_kernel_step(L->p, kind, NULL, L->rep[n->inputs[0]].slot, qt_value_numel(yv), (size_t)qt_value_numel(yv));
  for (int k = 1; k < n->n_inputs; k++) s->in[k] = L->rep[n->inputs[k]].slot;
  qt_same_qparams(L, i, s->out);
  return s;
}

qt_step *qt_resize_nearest_step(qt_lowering *L, int i, int kind) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  qt_step *s =
      qt_kernel_step(L->p, kind, NULL, L->rep[n->inputs[0]].slot, qt_value_numel(xv), (size_t)qt_value_numel(yv));
  s->H = (int)xv->shape[0];
  s->W = (int)xv->shape[1];
  qt_same_qparams(L, i, s->out);
  return s;
}

void qt_resize_nearest_rows(const qt_step *s, void *out, const void *in, int64_t r0, int64_t r1) {
  const int64_t W = s->W, C = s->in_numel / ((int64_t)s->H * W);
  for (int64_t r = r0; r < r1; r++) { /* output row r of an image's 2 H reads input row r / 2 */
    const unsigned char *x = (const unsigned char *)in + (r / 2) * W * C;
    unsigned char *y = (unsigned char *)out + r * 2 * W * C;
    for (int64_t w = 0; w < W; w++) {
      memcpy(y + 2 * w * C, x + w * C, (size_t)C);
      memcpy(y + (2 * w + 1) * C, x + w * C, (size_t)C);
    }
  }
}

/* ---- the walk ------------------------------------------------------------------------------- */

/* dq -> fp32 op: the node runs with the framework's fp32 kernels on fp32 inputs. */
static void lower_fallback(qt_lowering *L, int i, const char *reason) {
  const qt_graph *g = L->g;
  qt_program *p = L->p;
  const qt_node *n = &g->nodes[i];
  int in_slots[QT_MAX_INPUTS];
  for (int k = 0; k < n->n_inputs; k++) in_slots[k] = qt_f32_slot(L, n->inputs[k]);
  qt_step *s = qt_new_step(p, QT_STEP_FALLBACK);
  s->node = i;
  for (int k = 0; k < n->n_inputs; k++) {
    const qt_value *v = &g->values[n->inputs[k]];
    s->in[k] = in_slots[k];
    s->in_ndim[k] = v->ndim;
    for (int d = 0; d < 3; d++) s->in_shape[k][d] = v->shape[d];
  }
  s->out = qt_new_slot(p, (size_t)qt_value_numel(&g->values[n->output]) * sizeof(float));
  qt_value_rep *r = &L->rep[n->output];
  r->kind = QT_REP_F32;
  r->slot = r->f32_slot = s->out;
  r->fallback = L->cause >= 0 ? L->cause : p->parts.n;
  qt_part_add(&p->parts, QT_PART_FALLBACK, n->name, "%s in fp32: %s", qt_op_name(n->op), reason);
}

/* Node i as the skeleton lowers it, or as the backend does: NULL, or the reason for a fallback. */
static const char *lower_node(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  qt_value_rep *out = &L->rep[n->output];
  switch (n->op) {
    case QT_OP_INPUT:
      L->p->input_slot = qt_new_slot(L->p, (size_t)qt_value_numel(&g->values[g->input]) * sizeof(float));
      out->kind = QT_REP_F32;
      out->slot = out->f32_slot = L->p->input_slot;
      return NULL;
    case QT_OP_QUANTIZE: lower_quantize(L, i); return NULL;
    case QT_OP_DEQUANTIZE: {
      const qt_value_rep *in = &L->rep[n->inputs[0]];
      QT_ASSERT(in->kind != QT_REP_F32, "dequantize %s reads an fp32 value", n->name);
      out->kind = in->kind;
      out->slot = in->slot;
      out->f32_slot = -1;
      qt_set_qparams(L, out, n->q);
      return NULL;
    }
    case QT_OP_FLATTEN:
      /* NHWC flatten is a view of the same buffer, whatever the representation */
      *out = L->rep[n->inputs[0]];
      qt_part_add(&L->p->parts, out->kind == QT_REP_INT8 ? QT_PART_INT8 : QT_PART_FALLBACK, n->name,
                  "flatten: a view of the %s tensor", rep_name(L, out->kind));
      return NULL;
    default: return L->ops->lower_node(L, i);
  }
}

int qt_lowering_check(const qt_graph *g, const qt_lowering_ops *ops, char *err) {
  if (!g->finalized) return qt_err(err, "%s: graph %s is not finalized", ops->prefix, g->name);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || (n->wq && !n->wq->qweight))
      return qt_err(err,
                    "%s: graph %s: node %d '%s' (%s) belongs to a prepared (training) graph; %s the Q/DQ graph "
                    "from qt_convert (model_qdq.h5)",
                    ops->prefix, g->name, i, n->name, qt_op_name(n->op), ops->verb);
    if (n->op == QT_OP_QUANTIZE && n->q->spec.qmin < INT32_MIN / 2)
      return qt_err(err, "%s: node '%s': integer range out of bounds", ops->prefix, n->name);
  }
  if (g->nodes[g->values[g->output].producer].op == QT_OP_QUANTIZE)
    return qt_err(err, "%s: graph %s: the output '%s' is integers (a quantize); the runtime returns fp32", ops->prefix,
                  g->name, g->values[g->output].name);
  return 0;
}

void qt_lowering_build(qt_program *p, const qt_graph *g, const qt_lowering_ops *ops) {
  p->g = g;
  snprintf(p->name, sizeof p->name, "%s", g->name);
  qt_lowering L = {g,
                   p,
                   ops,
                   calloc((size_t)g->n_values, sizeof(qt_value_rep)),
                   malloc((size_t)g->n_values * sizeof(int)),
                   calloc((size_t)g->n_nodes, sizeof(int)),
                   "",
                   -1};
  QT_ASSERT(L.rep && L.consumer && L.done, "out of memory");
  for (int v = 0; v < g->n_values; v++) {
    L.consumer[v] = -1;
    L.rep[v].slot = L.rep[v].f32_slot = L.rep[v].fallback = -1;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++) {
      const int v = g->nodes[i].inputs[k];
      L.consumer[v] = g->values[v].consumers == 1 ? i : -1;
    }
  for (int i = 0; i < g->n_nodes; i++) {
    if (L.done[i]) continue;
    L.cause = -1;
    const char *reason = lower_node(&L, i);
    if (reason) lower_fallback(&L, i, reason);
  }
  p->output_slot = qt_f32_slot(&L, g->output);
  p->out_numel = qt_value_numel(&g->values[g->output]);
  QT_FREE_ALL(L.rep, L.consumer, L.done);
  p->ctx = qt_ctx_create();
  qt_ctx_set_grad(p->ctx, 0);
  p->bufs = calloc((size_t)p->n_slots, sizeof *p->bufs);
  QT_ASSERT(p->bufs, "out of memory");
}
