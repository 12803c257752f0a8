/* The Quantizer: annotations for a graph from a backend description (qat.h, qt_quantizer). The
 * descriptions themselves (oneDNN on this CPU, an accelerator from its INI file) are built by
 * the backend module. */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "base/base.h"

void qt_quantizer_config_default(qt_quantizer_config *c) {
  memset(c, 0, sizeof *c);
  c->weight_bits = 8;
  c->activation_bits = 8;
  c->weight_observer = QT_OBSERVER_MINMAX;
  c->activation_observer = QT_OBSERVER_MOVING_AVERAGE;
  c->activation_method = QT_RANGE_MINMAX;
  c->percentile = 99.99f;
}

int qt_parse_overrides(qt_quantizer_config *c, const char *text, char *err) {
  c->n_overrides = 0;
  const char *p = text;
  while (*p) {
    while (*p == ' ' || *p == ';' || *p == ',') p++;
    if (!*p) break;
    const char *end = p;
    while (*end && *end != ';' && *end != ',') end++;
    char item[128];
    size_t len = (size_t)(end - p);
    if (len >= sizeof item) len = sizeof item - 1;
    memcpy(item, p, len);
    item[len] = 0;
    while (len && item[len - 1] == ' ') item[--len] = 0;
    char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1]) {
      snprintf(err, QT_ERR_LEN, "quant.layer_overrides: '%s' is not NODE=fp32 or NODE=wNaM (e.g. fc2=fp32;conv1=w8a8)",
               item);
      return -1;
    }
    *eq = 0;
    if (c->n_overrides == QT_MAX_OVERRIDES) {
      snprintf(err, QT_ERR_LEN, "quant.layer_overrides: more than %d entries", QT_MAX_OVERRIDES);
      return -1;
    }
    for (int k = 0; k < c->n_overrides; k++)
      if (strcmp(c->overrides[k].name, item) == 0) return qt_err(err, "quant.layer_overrides: '%s' is set twice", item);
    qt_layer_override *o = &c->overrides[c->n_overrides];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", item);
    const char *v = eq + 1;
    if (strcmp(v, "fp32") == 0) {
      o->fp32 = 1;
    } else {
      int w = 0, a = 0, n = 0, has_w = 0, has_a = 0;
      if (sscanf(v, "w%da%d%n", &w, &a, &n) == 2 && v[n] == 0) {
        has_w = has_a = 1;
      } else if (sscanf(v, "w%d%n", &w, &n) == 1 && v[n] == 0) {
        has_w = 1;
      } else if (sscanf(v, "a%d%n", &a, &n) == 1 && v[n] == 0) {
        has_a = 1;
      } else {
        snprintf(err, QT_ERR_LEN, "quant.layer_overrides: '%s=%s': expected fp32, wNaM, wN or aM with N, M in 2..8",
                 item, v);
        return -1;
      }
      if ((has_w && (w < 2 || w > 8)) || (has_a && (a < 2 || a > 8))) {
        snprintf(err, QT_ERR_LEN, "quant.layer_overrides: '%s=%s': bit widths must lie in 2..8", item, v);
        return -1;
      }
      o->weight_bits = w;
      o->activation_bits = a;
    }
    c->n_overrides++;
    p = end;
  }
  return 0;
}

/* Whether an override's name is a shell pattern (*, ? or [...]) rather than one node's name. */
static int is_pattern(const char *name) { return strpbrk(name, "*?[") != NULL; }

/* Whether override o names node `name` itself: by its name, or by a pattern other than "*". */
static int names_node(const qt_layer_override *o, const char *name) {
  if (strcmp(o->name, name) == 0) return 1;
  return strcmp(o->name, QT_OVERRIDE_ANY) != 0 && is_pattern(o->name) && fnmatch(o->name, name, 0) == 0;
}

/* The layer's own override (its name, else the first pattern matching it), else the "*" entry,
 * else NULL. */
static const qt_layer_override *find_override(const qt_quantizer_config *c, const char *name) {
  const qt_layer_override *any = NULL, *pattern = NULL;
  for (int i = 0; i < c->n_overrides; i++) {
    const qt_layer_override *o = &c->overrides[i];
    if (strcmp(o->name, name) == 0) return o;
    if (strcmp(o->name, QT_OVERRIDE_ANY) == 0)
      any = o;
    else if (!pattern && names_node(o, name))
      pattern = o;
  }
  return pattern ? pattern : any;
}

/* ---- the specs a backend description implies ------------------------------------------------ */

const char *qt_signedness_name(qt_signedness s) {
  static const char *const names[] = {"any", "unsigned", "signed"};
  _Static_assert(sizeof names / sizeof names[0] == QT_SIGN_COUNT, "signedness names out of sync");
  return (unsigned)s < QT_SIGN_COUNT ? names[s] : "?";
}

static int bits_allowed(unsigned mask, int bits) { return bits >= 2 && bits <= 8 && ((mask >> bits) & 1u); }

void qt_bits_mask_str(unsigned mask, const char *sep, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (int b = 2; b <= 8; b++)
    if ((mask >> b) & 1u) len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%d", len ? sep : "", b);
  if (!len) snprintf(buf, n, "none");
}

static int act_signed(const qt_backend_desc *d) {
  return d->activation_sign == QT_SIGN_SIGNED || (d->activation_sign == QT_SIGN_ANY && d->activation_symmetric);
}

/* Activations: unsigned affine; signed when the backend asks for signed ones (affine unless it
 * asks for symmetric ones too); signed symmetric when it asks for symmetric ones; per tensor. */
static qt_qspec act_spec(const qt_backend_desc *d, const qt_quantizer_config *c, int bits) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = bits;
  s.is_signed = act_signed(d);
  s.symmetric = d->activation_symmetric;
  s.per_channel = 0;
  qt_qrange(bits, s.is_signed, &s.qmin, &s.qmax);
  s.observer = c->activation_observer;
  s.method = c->activation_method;
  s.percentile = c->percentile;
  s.learnable = c->learnable_scale;
  s.pow2_scale = d->pow2_scales;
  return s;
}

static qt_qspec weight_spec(const qt_backend_desc *d, const qt_quantizer_config *c, qt_op op, int bits) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = bits;
  s.is_signed = d->weight_sign != QT_SIGN_UNSIGNED;
  s.symmetric = d->weight_symmetric;
  s.per_channel = !d->weight_per_tensor_only && !d->weight_per_tensor_ops[op];
  qt_qrange(bits, s.is_signed, &s.qmin, &s.qmax);
  if (d->weight_8bit_as_7bit && bits == 8 && s.is_signed) {
    /* docs/design.md: no VNNI: without VNNI, u8 x s8 pairs saturate a 16-bit accumulator; weights in
     * [-64, 63] keep oneDNN's int8 kernels exact. */
    s.bits = 7;
    qt_qrange(7, 1, &s.qmin, &s.qmax);
  } else if (d->pair_sum_int16 && s.is_signed && !act_signed(d)) {
    /* docs/design.md: no VNNI: u8 x s8 pairs sum into a saturating int16: 2 * max|w| * max(a) <= 32767. */
    const int a_max = (1 << c->activation_bits) - 1;
    int w_max = 32767 / (2 * a_max);
    if (w_max < -s.qmin) {
      s.qmin = -w_max;
      s.qmax = w_max - 1;
      while (s.bits > 2 && (1 << (s.bits - 2)) >= w_max) s.bits--;
    }
  }
  s.observer = c->weight_observer;
  s.method = QT_RANGE_MINMAX;
  s.learnable = c->learnable_scale && (c->learnable_weights == QT_LSQ_WEIGHTS_ALL ||
                                       (c->learnable_weights == QT_LSQ_WEIGHTS_BELOW_8 && bits < 8));
  s.pow2_scale = d->pow2_scales;
  return s;
}

int qt_fixed_act_qparams(int act_kind, const qt_qspec *s, float *scale, int *zero_point) {
  if (act_kind != QT_ACT_SIGMOID && act_kind != QT_ACT_TANH) return 0;
  const int sig = act_kind == QT_ACT_SIGMOID;
  *scale = ldexpf(1.0f, (sig ? 0 : 1) - s->bits);
  *zero_point = s->qmin + (sig ? 0 : 1 << (s->bits - 1));
  return 1;
}

/* ---- the Quantizer ----------------------------------------------------------------------------- */

/* Whether v is a quantization point or shares one's qparams. */
static int quantized_value(const qt_annotations *a, int v) {
  for (int hops = 0; v >= 0 && hops < 1000; hops++) {
    if (a->act[v]) return 1;
    v = a->share[v];
  }
  return 0;
}

/* Whether node n may pass its input's qparams through (qt_node_keeps_grid: max-pool, flatten,
 * relu, the channel shuffle and slice and a nearest resize, which copy values) and the backend
 * runs it. Not relu6: 6 need not lie on the grid, so a relu6 outside a unit is an fp32 op whose
 * quantized consumers quantize its output. Dropout always: it is the identity in eval, and
 * convert removes it, so no backend runs it (in training its scaled values leave the grid, as a
 * QAT layer's float arithmetic does, and the observer before it sees the eval model's range). */
static int passes_through(const qt_backend_desc *d, const qt_node *n) {
  return qt_node_keeps_grid(n) && (n->op == QT_OP_DROPOUT || d->ops[n->op]);
}

/* Nodes without weights that start a quantized unit (inputs and output quantization points) when
 * the backend runs them on integers or asks for them quantized around an fp32 kernel. */
static int quantized_op(const qt_node *n) {
  const qt_op op = n->op;
  return op == QT_OP_ADD || op == QT_OP_AVG_POOL2D || op == QT_OP_GLOBAL_AVG_POOL || op == QT_OP_ACTIVATION ||
         op == QT_OP_MUL || op == QT_OP_CONCAT || op == QT_OP_PRELU ||
         (op == QT_OP_RESIZE && n->attr.mode == QT_RESIZE_BILINEAR);
}

/* The point v stands for: v, or the point it shares (through pass-through ops). */
static int root_of(const qt_annotations *a, int v) {
  for (int hops = 0; a->share[v] >= 0 && hops < 1000; hops++) v = a->share[v];
  return v;
}

/* Where prepare puts v's fake quant: right after v's producer (the graph input's first). */
static int fq_order(const qt_graph *g, int v) { return v == g->input ? -1 : g->values[v].producer; }

static int from_dropout(const qt_graph *g, int v) {
  return v != g->input && g->nodes[g->values[v].producer].op == QT_OP_DROPOUT;
}

static int leads(const qt_annotations *a, int v) {
  for (int u = 0; u < a->n_values; u++)
    if (a->tie[u] == v) return 1;
  return 0;
}

/* d->concat_shared: concat i's inputs become points tied to one leader, and its output shares the
 * leader's qparams (PT2E's SharedQuantizationSpec for cat): the backend copies them. The leader is
 * the point an input already shares (a max pool's or a channel slice's input, say), else the input
 * quantized first; its observer sees every input. The concat keeps its own output point and its
 * inputs their own when two inputs already share different points, an input is tied elsewhere or
 * leads another concat, comes from a dropout, or has other bits or fixed qparams than the leader,
 * or when the leader would be quantized after another input. */
static void tie_concat(const qt_graph *g, const qt_quantizer_config *cfg, const qt_backend_desc *d, int i,
                       qt_annotations *out) {
  const qt_node *n = &g->nodes[i];
  int leader = -1;
  for (int k = 0; k < n->n_inputs; k++) {
    const int v = n->inputs[k];
    if (out->share[v] < 0) continue;
    if (leader >= 0 && root_of(out, v) != leader) return;
    leader = root_of(out, v);
  }
  if (leader < 0) {
    leader = n->inputs[0];
    for (int k = 1; k < n->n_inputs; k++)
      if (fq_order(g, n->inputs[k]) < fq_order(g, leader)) leader = n->inputs[k];
  }
  const qt_layer_override *o = find_override(cfg, n->name);
  const qt_qspec spec = out->act[leader]
                            ? out->act_spec[leader]
                            : act_spec(d, cfg, o && o->activation_bits ? o->activation_bits : cfg->activation_bits);
  if (out->tie[leader] >= 0 || spec.fixed_scale > 0 || from_dropout(g, leader)) return;
  for (int k = 0; k < n->n_inputs; k++) {
    const int v = n->inputs[k];
    if (v == leader || out->share[v] >= 0) continue;
    if (out->tie[v] >= 0 || leads(out, v) || fq_order(g, v) < fq_order(g, leader) || from_dropout(g, v) ||
        (out->act[v] && (out->act_spec[v].bits != spec.bits || out->act_spec[v].fixed_scale > 0)))
      return;
  }
  out->act[leader] = 1;
  out->act_spec[leader] = spec;
  for (int k = 0; k < n->n_inputs; k++) {
    const int v = n->inputs[k];
    if (v == leader || out->share[v] >= 0) continue;
    out->act[v] = 1;
    out->act_spec[v] = spec;
    out->tie[v] = leader;
  }
  out->act[n->output] = 0;
  out->share[n->output] = leader;
}

/* d->resize_tied: bilinear resize i's output point is tied to its input's point (the input's own
 * or the one it shares), as a tied concat input is: one observer and one set of qparams for both,
 * so the backend interpolates on the input's grid. Left untied where that point is tied itself,
 * has fixed qparams or other bits, or comes before a dropout. */
static void tie_resize(const qt_graph *g, int i, qt_annotations *out) {
  const qt_node *n = &g->nodes[i];
  const int v = n->output, leader = root_of(out, n->inputs[0]);
  if (!out->act[v] || !out->act[leader] || out->tie[leader] >= 0 || out->tie[v] >= 0 || leads(out, v) ||
      out->act_spec[leader].fixed_scale > 0 || out->act_spec[v].bits != out->act_spec[leader].bits ||
      from_dropout(g, leader))
    return;
  out->act_spec[v] = out->act_spec[leader];
  out->tie[v] = leader;
}

/* The outputs of quantized units become quantization points and pass-through ops share their
 * input's qparams; then the inputs of quantized units that are not quantized yet (the graph
 * input, the output of an fp32 layer) become points too, and pass-through ops after them
 * share; a dropout's input rather than its output, so that the observer sees the values of eval.
 * last[i]: the last node of the unit headed by i. */
static void place_points(const qt_graph *g, const qt_quantizer_config *cfg, const qt_backend_desc *d, const int *last,
                         const int *quantized_unit, const int *other_in, qt_annotations *out) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (out->unit[i] != i) continue;
    if (quantized_unit[i]) {
      const qt_layer_override *o = find_override(cfg, n->name);
      const int bits = o && o->activation_bits ? o->activation_bits : cfg->activation_bits;
      const qt_node *t = &g->nodes[last[i]];
      const int v = t->output;
      if (v == g->output && cfg->fp32_output) continue; /* the logits stay fp32 */
      out->act[v] = 1;
      out->act_spec[v] = act_spec(d, cfg, bits);
      qt_qspec *sp = &out->act_spec[v];
      if (t->op == QT_OP_ACTIVATION && (d->fixed_act_kinds >> t->attr.act & 1u) &&
          qt_fixed_act_qparams(t->attr.act, sp, &sp->fixed_scale, &sp->fixed_zero_point))
        sp->learnable = sp->pow2_scale = 0; /* fixed: neither learned nor rounded */
    } else if (passes_through(d, n) && quantized_value(out, n->inputs[0])) {
      out->share[n->output] = n->inputs[0];
    }
  }
  for (int i = 0; i < g->n_nodes && d->concat_shared; i++)
    if (quantized_unit[i] && g->nodes[i].op == QT_OP_CONCAT) tie_concat(g, cfg, d, i, out);
  for (int i = 0; i < g->n_nodes; i++) {
    if (!quantized_unit[i]) continue;
    const qt_node *n = &g->nodes[i];
    for (int k = 0; k <= n->n_inputs; k++) { /* the head's inputs, then a fused add's or gate's other one */
      int v = k < n->n_inputs ? n->inputs[k] : other_in[i];
      if (v < 0 || quantized_value(out, v)) continue;
      while (v != g->input && g->nodes[g->values[v].producer].op == QT_OP_DROPOUT)
        v = g->nodes[g->values[v].producer].inputs[0];
      if (!quantized_value(out, v)) {
        out->act[v] = 1;
        out->act_spec[v] = act_spec(d, cfg, cfg->activation_bits);
      }
      for (int j = 0; j < g->n_nodes; j++) {
        const qt_node *m = &g->nodes[j];
        if (passes_through(d, m) && out->unit[j] == j && out->share[m->output] < 0 &&
            quantized_value(out, m->inputs[0]) && !out->act[m->output])
          out->share[m->output] = m->inputs[0];
      }
    }
  }
  for (int i = 0; i < g->n_nodes && d->resize_tied; i++)
    if (quantized_unit[i] && g->nodes[i].op == QT_OP_RESIZE && g->nodes[i].attr.mode == QT_RESIZE_BILINEAR)
      tie_resize(g, i, out);
}

/* Empty annotations for g (no points, nothing shared, every node its own unit). */
static void annotations_init(qt_annotations *out, const qt_graph *g) {
  out->n_values = g->n_values;
  out->n_nodes = g->n_nodes;
  out->act = calloc((size_t)g->n_values, sizeof(int));
  out->act_spec = calloc((size_t)g->n_values, sizeof(qt_qspec));
  out->share = malloc((size_t)g->n_values * sizeof(int));
  out->tie = malloc((size_t)g->n_values * sizeof(int));
  out->weight = calloc((size_t)g->n_nodes, sizeof(int));
  out->weight_spec = calloc((size_t)g->n_nodes, sizeof(qt_qspec));
  out->unit = malloc((size_t)g->n_nodes * sizeof(int));
  QT_ASSERT(out->act && out->act_spec && out->share && out->tie && out->weight && out->weight_spec && out->unit,
            "out of memory");
  for (int v = 0; v < g->n_values; v++) out->share[v] = out->tie[v] = -1;
  for (int i = 0; i < g->n_nodes; i++) out->unit[i] = i;
}

static int layer_fits(const qt_backend_desc *d, const qt_node *n) {
  return d->ops[n->op] && (d->max_channels <= 0 || n->attr.out_channels <= d->max_channels);
}

/* Whether the settings are ones the backend can take; -1 with err otherwise. */
static int check_settings(const qt_graph *g, const qt_backend_desc *d, const qt_quantizer_config *cfg, char *err) {
  if (cfg->weight_bits < 2 || cfg->weight_bits > 8 || cfg->activation_bits < 2 || cfg->activation_bits > 8)
    return qt_err(err, "quantizer %s: bit widths W%d A%d outside 2..8", d->name, cfg->weight_bits,
                  cfg->activation_bits);
  char wl[64], al[64];
  qt_bits_mask_str(d->weight_bits, ", ", wl, sizeof wl);
  qt_bits_mask_str(d->activation_bits, ", ", al, sizeof al);
  if (!bits_allowed(d->weight_bits, cfg->weight_bits) || !bits_allowed(d->activation_bits, cfg->activation_bits))
    return qt_err(err, "quantizer %s: W%d A%d requested; the backend allows weight bits {%s}, activation bits {%s}",
                  d->name, cfg->weight_bits, cfg->activation_bits, wl, al);
  if (d->activation_symmetric && d->activation_sign == QT_SIGN_UNSIGNED)
    return qt_err(err,
                  "quantizer %s: symmetric unsigned activations have no zero point 0 (use signed "
                  "activations or allow affine ones)",
                  d->name);
  if (cfg->learnable_scale && d->pow2_scales)
    return qt_err(err, "quantizer %s: learnable scales (LSQ) cannot stay powers of two", d->name);
  if (cfg->bias == QT_BIAS_FLOAT && d->bias_int32_only)
    return qt_err(err,
                  "quantizer %s: float biases requested; the backend takes int32 biases only (at input scale x "
                  "weight scale)",
                  d->name);
  if (cfg->fuse_add && !d->conv_add)
    return qt_err(err, "quantizer %s: quant.fuse_add: the backend runs no conv + add unit (onednn_cpu does)", d->name);
  if (cfg->fuse_gate && !d->gate_mul)
    return qt_err(
        err, "quantizer %s: quant.fuse_gate: the backend runs no layer -> activation -> mul unit (onednn_cpu does)",
        d->name);
  for (int i = 0; i < cfg->n_overrides; i++) {
    const qt_layer_override *o = &cfg->overrides[i];
    if (strcmp(o->name, QT_OVERRIDE_ANY) != 0 && is_pattern(o->name)) { /* a pattern: some layer it names */
      int k = 0;
      while (k < g->n_nodes &&
             !(names_node(o, g->nodes[k].name) && (qt_op_has_weight(g->nodes[k].op) || quantized_op(&g->nodes[k]))))
        k++;
      if (k == g->n_nodes)
        return qt_err(err,
                      "quant.layer_overrides: the pattern '%s' matches no layer that starts a quantized unit in "
                      "model %s",
                      o->name, g->name);
    } else if (strcmp(o->name, QT_OVERRIDE_ANY) != 0) { /* "*" names every layer; a name, one node */
      const int k = qt_graph_find_node(g, o->name);
      if (k < 0) return qt_err(err, "quant.layer_overrides: no node named '%s' in model %s", o->name, g->name);
      const qt_op op = g->nodes[k].op;
      if (!qt_op_has_weight(op) && !quantized_op(&g->nodes[k]))
        return qt_err(err,
                      "quant.layer_overrides: '%s' is a %s node; overrides name the layers that start a quantized "
                      "unit (conv2d, linear, add, average pools, activation, prelu, mul, concat, bilinear resize)",
                      o->name, qt_op_name(op));
    }
    if ((o->weight_bits && !bits_allowed(d->weight_bits, o->weight_bits)) ||
        (o->activation_bits && !bits_allowed(d->activation_bits, o->activation_bits)))
      return qt_err(err, "quant.layer_overrides: %s=w%da%d: %s allows weight bits {%s}, activation bits {%s}", o->name,
                    o->weight_bits, o->activation_bits, d->name, wl, al);
  }
  return 0;
}

/* Whether the node named `name` has an override of its own (its name or a pattern) that leaves
 * it fp32. */
static int own_fp32(const qt_quantizer_config *cfg, const char *name) {
  const qt_layer_override *o = find_override(cfg, name);
  return o && o->fp32 && strcmp(o->name, QT_OVERRIDE_ANY) != 0;
}

/* With quant.fuse_add, the other input of the add c that the conv unit ending at `tail` feeds
 * alone: the add then joins the unit. -1 when c is no such add, adds the conv's output to
 * itself, or is left fp32 by an override of its own. */
static int fused_add(const qt_graph *g, const qt_backend_desc *d, const qt_quantizer_config *cfg, int c, int tail) {
  if (!cfg->fuse_add || !d->conv_add || c < 0 || g->nodes[c].op != QT_OP_ADD || !d->ops[QT_OP_ADD]) return -1;
  const int mine = g->nodes[tail].output, other = qt_graph_other_input(g, c, mine);
  if (g->nodes[c].n_inputs != 2 || other == mine) return -1;
  return own_fp32(cfg, g->nodes[c].name) ? -1 : other;
}

/* With quant.fuse_gate, the other input of the mul after the activation c that a quantized layer
 * feeds alone (c's output going only to that mul): the activation and the mul then join the
 * layer's unit. -1 otherwise, or when an override of their own leaves either fp32. */
static int fused_gate(const qt_graph *g, const qt_backend_desc *d, const qt_quantizer_config *cfg, int c) {
  if (!cfg->fuse_gate || !d->gate_mul || c < 0 || g->nodes[c].op != QT_OP_ACTIVATION || !d->ops[QT_OP_MUL]) return -1;
  const int gate = g->nodes[c].output, m = qt_graph_sole_consumer(g, gate);
  if (m < 0 || g->nodes[m].op != QT_OP_MUL || g->nodes[m].n_inputs != 2) return -1;
  const int other = qt_graph_other_input(g, m, gate);
  if (other == gate || own_fp32(cfg, g->nodes[c].name) || own_fp32(cfg, g->nodes[m].name)) return -1;
  return other;
}

int qt_quantizer(const qt_graph *g, const qt_backend_desc *d, const qt_quantizer_config *cfg, qt_annotations *out,
                 char *err) {
  memset(out, 0, sizeof *out);
  if (check_settings(g, d, cfg, err)) return -1;
  annotations_init(out, g);
  int *last = malloc((size_t)g->n_nodes * sizeof(int)), *quantized_unit = calloc((size_t)g->n_nodes, sizeof(int));
  int *other_in = malloc((size_t)g->n_nodes * sizeof(int)); /* per head: a fused add's or gate's other input, or -1 */
  QT_ASSERT(last && quantized_unit && other_in, "out of memory");

  /* Units: conv -> bn (folded by prepare/convert), then a relu or relu6 the backend runs fused
   * after a conv, linear or add, or an activation it fuses after a quantized conv or linear, or
   * (quant.fuse_gate) an activation and the mul it feeds, or (quant.fuse_add) an add [-> relu]. */
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    last[i] = i;
    other_in[i] = -1;
    if (out->unit[i] != i) continue;
    const qt_layer_override *o = find_override(cfg, n->name);
    const int fp32 = o && o->fp32;
    int tail = i;
    if (n->op == QT_OP_CONV2D) {
      int c = qt_graph_sole_consumer(g, n->output);
      if (c >= 0 && g->nodes[c].op == QT_OP_BATCH_NORM) {
        out->unit[c] = i;
        tail = c;
      }
    }
    if (n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR || n->op == QT_OP_ADD) {
      const int c = qt_graph_sole_consumer(g, g->nodes[tail].output);
      if (c >= 0 && (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6) && d->ops[g->nodes[c].op]) {
        out->unit[c] = i;
        tail = c;
      } else if (c >= 0 && g->nodes[c].op == QT_OP_ACTIVATION && (d->fused_act_kinds >> g->nodes[c].attr.act & 1u) &&
                 n->op != QT_OP_ADD && !fp32 && layer_fits(d, n)) {
        out->unit[c] = i;
        tail = c;
      } else if (n->op != QT_OP_ADD && !fp32 && layer_fits(d, n) && (other_in[i] = fused_gate(g, d, cfg, c)) >= 0) {
        const int m = qt_graph_sole_consumer(g, g->nodes[c].output);
        out->unit[c] = out->unit[m] = i; /* conv / linear -> activation -> mul: a gate */
        tail = m;
      } else if (n->op == QT_OP_CONV2D && !fp32 && layer_fits(d, n) &&
                 (other_in[i] = fused_add(g, d, cfg, c, tail)) >= 0) {
        out->unit[c] = i; /* conv [-> bn] -> add [-> relu | relu6] */
        tail = c;
        const int r = qt_graph_sole_consumer(g, g->nodes[c].output);
        if (r >= 0 && (g->nodes[r].op == QT_OP_RELU || g->nodes[r].op == QT_OP_RELU6) && d->ops[g->nodes[r].op]) {
          out->unit[r] = i;
          tail = r;
        }
      }
    }
    last[i] = tail;
    if (qt_op_has_weight(n->op)) {
      quantized_unit[i] = !fp32 && layer_fits(d, n);
      if (quantized_unit[i]) {
        out->weight[i] = 1;
        out->weight_spec[i] = weight_spec(d, cfg, n->op, o && o->weight_bits ? o->weight_bits : cfg->weight_bits);
      }
    } else if (quantized_op(n)) {
      quantized_unit[i] = !fp32 && (qt_backend_runs(d, n) || d->fallback_quantized[n->op]);
    }
  }
  place_points(g, cfg, d, last, quantized_unit, other_in, out);
  /* int32 biases: every quantized layer (its input is a quantization point by now, per tensor) */
  const int bias_int32 = cfg->bias == QT_BIAS_INT32 || (cfg->bias == QT_BIAS_AUTO && d->bias_int32_only);
  for (int i = 0; i < g->n_nodes && bias_int32; i++)
    if (out->weight[i]) out->weight_spec[i].bias_int32 = 1;
  QT_FREE_ALL(last, quantized_unit, other_in);
  return 0;
}

void qt_annotations_free(qt_annotations *a) {
  QT_FREE_ALL(a->act, a->act_spec, a->share, a->tie, a->weight, a->weight_spec, a->unit);
  memset(a, 0, sizeof *a);
}

static void spec_str(const qt_qspec *s, char *buf, size_t n) {
  if (s->fixed_scale > 0) {
    snprintf(buf, n, "%s%d [%d, %d] fixed qparams: scale %g, zero point %d", s->is_signed ? "s" : "u", s->bits, s->qmin,
             s->qmax, s->fixed_scale, s->fixed_zero_point);
    return;
  }
  snprintf(buf, n, "%s%d [%d, %d] %s%s%s, %s%s%s", s->is_signed ? "s" : "u", s->bits, s->qmin, s->qmax,
           s->symmetric ? "symmetric" : "affine", s->per_channel ? " per-channel" : " per-tensor",
           s->pow2_scale ? " power-of-two scales" : "", qt_observer_kind_name(s->observer),
           s->learnable ? ", learned scale (LSQ)" : "", s->bias_int32 ? "; bias int32 at s_x * s_w" : "");
}

void qt_annotations_print(const qt_graph *g, const qt_annotations *a, FILE *f) {
  char buf[200];
  for (int v = 0; v < a->n_values; v++) {
    if (a->act[v] && a->tie[v] >= 0) {
      fprintf(f, "  activation %-16s tied to %s (shared qparams)\n", g->values[v].name, g->values[a->tie[v]].name);
    } else if (a->act[v]) {
      spec_str(&a->act_spec[v], buf, sizeof buf);
      fprintf(f, "  activation %-16s %s\n", g->values[v].name, buf);
    } else if (a->share[v] >= 0) {
      fprintf(f, "  activation %-16s shares %s\n", g->values[v].name, g->values[a->share[v]].name);
    }
  }
  for (int i = 0; i < a->n_nodes; i++)
    if (a->weight[i]) {
      spec_str(&a->weight_spec[i], buf, sizeof buf);
      fprintf(f, "  weight     %-16s %s\n", g->nodes[i].name, buf);
    }
}
