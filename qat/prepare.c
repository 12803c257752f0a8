/* prepare (PTQ: fold BN, then observe; QAT: conv_bn with delayed folding), mode switches. */
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "base/base.h"

typedef struct {
  int dst, src; /* tensor ids: new graph <- old graph */
} tensor_copy;

typedef struct {
  int w, b;     /* new conv weight and bias tensors */
  int conv, bn; /* old nodes */
} bn_fold;

typedef struct {
  const qt_graph *g;
  qt_graph *p;
  int *vmap; /* old value -> new value */
  int *tmap; /* old tensor -> new tensor */
  tensor_copy *copies;
  int n_copies;
  bn_fold *folds;
  int n_folds;
} prep;

static const char *suffix_of(const qt_graph *g, int tensor) {
  const qt_param *t = &g->tensors[tensor];
  const char *owner = g->nodes[t->node].name;
  size_t n = strlen(owner);
  return strncmp(t->name, owner, n) == 0 && t->name[n] == '.' ? t->name + n + 1 : t->name;
}

/* Maps an old tensor into the new graph on node `node` (shared tensors map once). */
static int map_tensor(prep *s, int node, int old, const char *suffix) {
  if (old < 0) return -1;
  if (s->tmap[old] >= 0) return s->tmap[old];
  const qt_param *t = &s->g->tensors[old];
  int nt = qt_graph_add_tensor(s->p, node, suffix ? suffix : suffix_of(s->g, old), t->ndim, t->shape, t->is_buffer);
  s->tmap[old] = nt;
  s->copies[s->n_copies++] = (tensor_copy){nt, old};
  return nt;
}

/* Copies node i as is (same op, attributes, parameters). */
static int copy_node(prep *s, int i) {
  const qt_node *n = &s->g->nodes[i];
  int inputs[QT_MAX_INPUTS];
  for (int k = 0; k < n->n_inputs; k++) inputs[k] = s->vmap[n->inputs[k]];
  const qt_value *v = &s->g->values[n->output];
  int id = qt_graph_add_node(s->p, n->op, n->name, inputs, n->n_inputs, &n->attr, v->ndim, v->shape);
  if (id < 0) return -1;
  for (int k = 0; k < QT_MAX_PARAMS; k++) {
    s->p->nodes[id].param[k] = map_tensor(s, id, n->param[k], NULL);
    s->p->nodes[id].buffer[k] = map_tensor(s, id, n->buffer[k], NULL);
  }
  s->p->nodes[id].bn_frozen = n->bn_frozen;
  s->vmap[n->output] = s->p->nodes[id].output;
  return id;
}

/* The fake quant at old_value (a point of a): its own state from the spec, or, tied, the state of
 * the fake quant at its leader (made earlier: the Quantizer ties to a point quantized first). */
static int add_fake_quant(prep *s, int old_value, const qt_annotations *a, char *err) {
  const qt_qspec *spec = &a->act_spec[old_value];
  const int leader = a->tie ? a->tie[old_value] : -1;
  char name[QT_NAME_LEN];
  snprintf(name, sizeof name, "%s.fq", s->g->values[old_value].name);
  int in = s->vmap[old_value];
  /* a copy: adding the node may move the values table */
  const qt_value v = s->p->values[in];
  int id = qt_graph_add_node(s->p, QT_OP_FAKE_QUANT, name, &in, 1, NULL, v.ndim, v.shape);
  if (id < 0) {
    snprintf(err, QT_ERR_LEN, "prepare: %s", s->p->error);
    return -1;
  }
  if (leader >= 0) {
    const int lv = s->vmap[leader], ln = lv >= 0 ? s->p->values[lv].producer : -1;
    if (ln < 0 || s->p->nodes[ln].op != QT_OP_FAKE_QUANT)
      return qt_err(err, "prepare: %s is tied to the point at %s, which is not quantized before it", name,
                    s->g->values[leader].name);
    s->p->nodes[id].q = s->p->nodes[ln].q;
    s->p->nodes[id].q_tied = 1;
    s->vmap[old_value] = s->p->nodes[id].output;
    return 0;
  }
  s->p->nodes[id].q = qt_qstate_create(spec, 1, err);
  if (!s->p->nodes[id].q) return -1;
  if (spec->learnable) {
    int64_t one = 1;
    s->p->nodes[id].q->scale_param = qt_graph_add_tensor(s->p, id, "scale", 1, &one, 0);
  }
  s->vmap[old_value] = s->p->nodes[id].output;
  return 0;
}

static int attach_weight_quant(prep *s, int new_node, const qt_qspec *spec, int out_channels, char *err) {
  qt_qspec sp = *spec;
  s->p->nodes[new_node].wq = qt_qstate_create(&sp, sp.per_channel ? out_channels : 1, err);
  if (!s->p->nodes[new_node].wq) return -1;
  if (sp.learnable) {
    int64_t ch = sp.per_channel ? out_channels : 1;
    s->p->nodes[new_node].wq->scale_param = qt_graph_add_tensor(s->p, new_node, "weight_scale", 1, &ch, 0);
  }
  return 0;
}

/* A weight used by two conv->bn chains cannot be folded: each chain would fold it with its own
 * BN statistics. */
static int check_shared_folds(const qt_graph *g, const qt_annotations *a, char *err) {
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].op != QT_OP_BATCH_NORM || a->unit[i] == i || g->nodes[a->unit[i]].op != QT_OP_CONV2D) continue;
    int w = g->nodes[a->unit[i]].param[QT_P_WEIGHT];
    for (int j = i + 1; j < g->n_nodes; j++) {
      if (g->nodes[j].op != QT_OP_BATCH_NORM || a->unit[j] == j) continue;
      const qt_node *c2 = &g->nodes[a->unit[j]];
      if (c2->op == QT_OP_CONV2D && c2->param[QT_P_WEIGHT] == w) {
        snprintf(err, QT_ERR_LEN,
                 "prepare: weight %s is shared by two conv->bn chains (%s->%s and %s->%s); folding BN into it "
                 "would fold it twice with different statistics. Refusing: give each conv its own weight",
                 g->tensors[w].name, g->nodes[a->unit[i]].name, g->nodes[i].name, c2->name, g->nodes[j].name);
        return -1;
      }
    }
  }
  return 0;
}

/* QAT: conv n and its BN b as one conv_bn node (delayed folding) reading new value `in`. */
static int add_conv_bn(prep *s, const qt_node *n, const qt_node *b, int in) {
  const qt_value *v = &s->g->values[b->output];
  qt_node_attrs attr = n->attr; /* conv_bn keeps its BN's eps and momentum */
  attr.eps = b->attr.eps;
  attr.momentum = b->attr.momentum;
  const int new_id = qt_graph_add_node(s->p, QT_OP_CONV_BN, n->name, &in, 1, &attr, v->ndim, v->shape);
  if (new_id < 0) return -1;
  qt_node *m = &s->p->nodes[new_id];
  m->param[QT_P_WEIGHT] = map_tensor(s, new_id, n->param[QT_P_WEIGHT], "weight");
  m = &s->p->nodes[new_id];
  m->param[QT_P_BIAS] = map_tensor(s, new_id, n->param[QT_P_BIAS], "bias");
  m = &s->p->nodes[new_id];
  m->param[QT_P_BN_GAMMA] = map_tensor(s, new_id, b->param[QT_P_GAMMA], "bn.weight");
  m = &s->p->nodes[new_id];
  m->param[QT_P_BN_BETA] = map_tensor(s, new_id, b->param[QT_P_BETA], "bn.bias");
  m = &s->p->nodes[new_id];
  m->buffer[QT_B_RUNNING_MEAN] = map_tensor(s, new_id, b->buffer[QT_B_RUNNING_MEAN], "bn.running_mean");
  m = &s->p->nodes[new_id];
  m->buffer[QT_B_RUNNING_VAR] = map_tensor(s, new_id, b->buffer[QT_B_RUNNING_VAR], "bn.running_var");
  s->p->nodes[new_id].bn_frozen = b->bn_frozen;
  return new_id;
}

/* PTQ: conv i with BN bn folded into a conv with bias, right here (docs/design.md: delayed
 * folding); the fold itself runs once the new graph has its slabs (fill_tensors). */
static int add_folded_conv(prep *s, int i, int bn, int in) {
  const qt_node *n = &s->g->nodes[i];
  const qt_value *v = &s->g->values[s->g->nodes[bn].output];
  const int new_id = qt_graph_add_node(s->p, QT_OP_CONV2D, n->name, &in, 1, &n->attr, v->ndim, v->shape);
  if (new_id < 0) return -1;
  const qt_param *w = &s->g->tensors[n->param[QT_P_WEIGHT]];
  int wt = qt_graph_add_tensor(s->p, new_id, "weight", w->ndim, w->shape, 0);
  int64_t oc = w->shape[0];
  int bt = qt_graph_add_tensor(s->p, new_id, "bias", 1, &oc, 0);
  s->p->nodes[new_id].param[QT_P_WEIGHT] = wt;
  s->p->nodes[new_id].param[QT_P_BIAS] = bt;
  s->folds[s->n_folds++] = (bn_fold){wt, bt, i, bn};
  return new_id;
}

/* Conv i with the BN bn that follows it, as one node (conv_bn for QAT, a folded conv for PTQ),
 * with its weight quantization and the fake quant after the BN. 1 when the builder refused the
 * node (its error in s->p->error), -1 with err set. */
static int prepare_conv_bn(prep *s, int i, int bn, const qt_annotations *a, qt_prepare_mode mode, char *err) {
  const qt_node *n = &s->g->nodes[i], *b = &s->g->nodes[bn];
  const int in = s->vmap[n->inputs[0]];
  const int new_id = mode == QT_PREPARE_QAT ? add_conv_bn(s, n, b, in) : add_folded_conv(s, i, bn, in);
  if (new_id < 0) return 1;
  if (a->weight[i] && attach_weight_quant(s, new_id, &a->weight_spec[i], n->attr.out_channels, err)) return -1;
  s->vmap[n->output] = s->vmap[b->output] = s->p->nodes[new_id].output;
  if (a->act[b->output] && add_fake_quant(s, b->output, a, err)) return -1;
  return 0;
}

/* Node i as it is (the input node, or a copy with its weight quantization), and the fake quant
 * after it. 1 when the builder refused the node, -1 with err set. */
static int prepare_node(prep *s, int i, const qt_annotations *a, char *err) {
  const qt_node *n = &s->g->nodes[i];
  if (n->op == QT_OP_INPUT) {
    const qt_value *v = &s->g->values[n->output];
    const int new_id = qt_graph_add_node(s->p, QT_OP_INPUT, n->name, NULL, 0, NULL, v->ndim, v->shape);
    if (new_id < 0) return 1;
    s->vmap[n->output] = s->p->nodes[new_id].output;
  } else {
    const int new_id = copy_node(s, i);
    if (new_id < 0) return 1;
    if (a->weight[i] && attach_weight_quant(s, new_id, &a->weight_spec[i], n->attr.out_channels, err)) return -1;
  }
  if (a->act[n->output] && add_fake_quant(s, n->output, a, err)) return -1;
  return 0;
}

/* The BN node that conv i folds (-1 if none): the last batch_norm of its unit. */
static int folded_bn(const qt_graph *g, const qt_annotations *a, int i) {
  int bn = -1;
  if (g->nodes[i].op == QT_OP_CONV2D)
    for (int j = i + 1; j < g->n_nodes; j++)
      if (a->unit[j] == i && g->nodes[j].op == QT_OP_BATCH_NORM) bn = j;
  return bn;
}

/* The new graph's tensors once allocated: copies of the old ones, and the PTQ folds. */
static void fill_tensors(prep *s) {
  const qt_graph *g = s->g;
  for (int k = 0; k < s->n_copies; k++)
    memcpy(qt_graph_tensor_data(s->p, s->copies[k].dst), qt_graph_tensor_data((qt_graph *)g, s->copies[k].src),
           (size_t)g->tensors[s->copies[k].src].numel * sizeof(float));
  for (int k = 0; k < s->n_folds; k++) {
    const bn_fold *f = &s->folds[k];
    const qt_node *c = &g->nodes[f->conv], *b = &g->nodes[f->bn];
    qt_graph *gg = (qt_graph *)g;
    const qt_param *w = &g->tensors[c->param[QT_P_WEIGHT]];
    const int OC = (int)w->shape[0];
    const int64_t inner = w->numel / OC;
    const float *W = qt_graph_tensor_data(gg, c->param[QT_P_WEIGHT]);
    const float *cb = c->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(gg, c->param[QT_P_BIAS]) : NULL;
    const float *gamma = qt_graph_tensor_data(gg, b->param[QT_P_GAMMA]);
    const float *beta = qt_graph_tensor_data(gg, b->param[QT_P_BETA]);
    qt_bn_fold(qt_graph_tensor_data(s->p, f->w), qt_graph_tensor_data(s->p, f->b), W, cb, gamma, beta,
               qt_graph_tensor_data(gg, b->buffer[QT_B_RUNNING_MEAN]),
               qt_graph_tensor_data(gg, b->buffer[QT_B_RUNNING_VAR]), b->attr.eps, OC, inner);
  }
}

qt_graph *qt_prepare(const qt_graph *g, const qt_annotations *a, qt_prepare_mode mode, char *err) {
  err[0] = 0;
  prep s = {.g = g};
  s.p = qt_graph_create(g->name);
  s.p->input_pre = g->input_pre;
  s.vmap = malloc((size_t)g->n_values * sizeof(int));
  s.tmap = malloc((size_t)(g->n_tensors + 1) * sizeof(int));
  s.copies = malloc((size_t)(g->n_tensors + 1) * sizeof(tensor_copy));
  s.folds = malloc((size_t)(g->n_nodes + 1) * sizeof(bn_fold));
  QT_ASSERT(s.vmap && s.tmap && s.copies && s.folds, "out of memory");
  for (int v = 0; v < g->n_values; v++) s.vmap[v] = -1;
  for (int t = 0; t < g->n_tensors; t++) s.tmap[t] = -1;
  if (check_shared_folds(g, a, err)) goto fail;

  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_BATCH_NORM && a->unit[i] != i && g->nodes[a->unit[i]].op == QT_OP_CONV2D &&
        (mode == QT_PREPARE_PTQ || a->weight[a->unit[i]])) {
      /* handled with its conv below */
      continue;
    }
    const int bn = folded_bn(g, a, i);
    const int rc = bn >= 0 && (mode == QT_PREPARE_PTQ || a->weight[i]) ? prepare_conv_bn(&s, i, bn, a, mode, err)
                                                                       : prepare_node(&s, i, a, err);
    if (rc > 0) break;
    if (rc < 0) goto fail;
  }
  if (s.p->error[0]) {
    snprintf(err, QT_ERR_LEN, "prepare: %s", s.p->error);
    goto fail;
  }
  s.p->output = s.vmap[g->output];
  if (qt_graph_alloc(s.p, err)) goto fail;
  fill_tensors(&s);
  QT_FREE_ALL(s.vmap, s.tmap, s.copies, s.folds);
  qt_graph_set_mode(s.p, QT_MODE_TRAIN);
  return s.p;
fail:
  if (!err[0] && s.p->error[0]) snprintf(err, QT_ERR_LEN, "prepare: %s", s.p->error);
  QT_FREE_ALL(s.vmap, s.tmap, s.copies, s.folds);
  qt_graph_free(s.p);
  return NULL;
}

void qt_set_observers(qt_graph *g, int enabled) {
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].q) g->nodes[i].q->observe = enabled;
    if (g->nodes[i].wq) g->nodes[i].wq->observe = enabled;
  }
}

void qt_set_fake_quant(qt_graph *g, int enabled) {
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].q) g->nodes[i].q->fake_quant = enabled;
    if (g->nodes[i].wq) g->nodes[i].wq->fake_quant = enabled;
  }
}

void qt_graph_set_mode(qt_graph *g, qt_graph_mode mode) {
  switch (mode) {
    case QT_MODE_TRAIN:
    case QT_MODE_EVAL:
    case QT_MODE_EVAL_FLOAT:
      qt_graph_set_training(g, mode == QT_MODE_TRAIN);
      qt_set_fake_quant(g, mode != QT_MODE_EVAL_FLOAT);
      break;
    case QT_MODE_CALIBRATE:
      /* observers see every batch; the rest computes as in eval (BN uses its running statistics) */
      qt_graph_set_training(g, 0);
      for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].q || g->nodes[i].wq) g->nodes[i].training = 1;
      qt_set_observers(g, 1);
      qt_set_fake_quant(g, 0);
      break;
    default: QT_ASSERT(0, "qt_graph_set_mode: mode %d", (int)mode);
  }
}

void qt_freeze_bn(qt_graph *g, int frozen) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == QT_OP_BATCH_NORM || g->nodes[i].op == QT_OP_CONV_BN) g->nodes[i].bn_frozen = frozen;
}
