/* The backend check pass: reads only a Q/DQ graph and lists every place where it asks a backend
 * for something the backend's integer kernels cannot do (backend.h, qt_backend_check), and the
 * description of the built-in onednn_cpu backend the pass checks against by default.
 *
 * Why a separate pass: the lowering (lower.c) silently falls back to fp32 for what it cannot
 * lower, and on x86 without VNNI oneDNN silently saturates u8 x s8 pair sums in 16 bits.
 * Neither shows in the Q/DQ graph's own numbers; this pass makes both visible before
 * deployment, from the file alone. */
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

const char *qt_violation_kind_name(qt_violation_kind k) {
  static const char *const names[] = {"op",           "bits",     "sign",       "symmetric", "granularity",
                                      "power-of-two", "channels", "saturation", "input",     "bias"};
  _Static_assert(sizeof names / sizeof names[0] == QT_VIOLATION_COUNT, "violation kind names out of sync");
  return (unsigned)k < QT_VIOLATION_COUNT ? names[k] : "?";
}

/* ---- the onednn_cpu description ---------------------------------------------------------- */

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch ((int)isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

int qt_cpu_has_vnni(void) {
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
         (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
}

void qt_backend_desc_onednn_cpu(qt_backend_desc *d, qt_isa_choice isa) {
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "onednn_cpu");
  d->onednn_runtime = 1;
  const qt_op ops[] = {QT_OP_CONV2D,        QT_OP_LINEAR,  QT_OP_RELU,   QT_OP_RELU6,
                       QT_OP_MAX_POOL2D,    QT_OP_FLATTEN, QT_OP_ADD,    QT_OP_GLOBAL_AVG_POOL,
                       QT_OP_ACTIVATION,    QT_OP_MUL,     QT_OP_CONCAT, QT_OP_CHANNEL_SHUFFLE,
                       QT_OP_CHANNEL_SLICE, QT_OP_PRELU,   QT_OP_RESIZE};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) d->ops[ops[i]] = 1;
  d->weight_bits = d->activation_bits = 0x1fc; /* 2..8 */
  d->weight_sign = QT_SIGN_SIGNED;             /* s8 weights */
  d->activation_sign = QT_SIGN_UNSIGNED;       /* u8 activations (s8 ones are never exact, docs/design.md: no VNNI) */
  d->weight_symmetric = 1;                     /* oneDNN takes no weight zero point */
  d->activation_per_tensor_only = 1;           /* one runtime zero point per tensor */
  const int vnni = isa == QT_ISA_AUTO ? qt_cpu_has_vnni() : isa == QT_ISA_VNNI;
  d->pair_sum_int16 = !vnni;
  d->weight_8bit_as_7bit = !vnni; /* the Quantizer's answer to pair_sum_int16 (docs/design.md: no VNNI) */
  /* the average pool has no u8 kernel here; its input and output stay quantized, so it runs
   * as a dq -> fp32 -> q fallback partition between int8 kernels */
  d->fallback_quantized[QT_OP_AVG_POOL2D] = 1;
  /* conv / linear -> SiLU or hard swish: the layer's f32 output, the activation and the
   * requantization in one partition, as PT2E's X86 Inductor quantizer fuses conv + unary: no
   * per-tensor point on the pre-activation output (EfficientNet-B0's QAT W4A8,
   * docs/experiments.md) */
  d->fused_act_kinds = 1u << QT_ACT_SILU | 1u << QT_ACT_HARDSWISH;
  /* conv -> add [-> relu]: the conv's f32 output, the other input dequantized, the add and the
   * requantization in one partition (with quant.fuse_add; the X86 Inductor quantizer's conv +
   * add) */
  d->conv_add = 1;
  /* conv / linear -> activation -> mul (squeeze-excite): the layer's f32 output, the activation,
   * the product with the other input dequantized and the requantization in one partition (with
   * quant.fuse_gate) */
  d->gate_mul = 1;
  if (isa == QT_ISA_AUTO)
    snprintf(d->isa, sizeof d->isa, "%s", isa_name(dnnl_get_effective_cpu_isa()));
  else
    snprintf(d->isa, sizeof d->isa, "%s (forced)", vnni ? "vnni" : "avx2, no vnni");
}

/* ---- the xnnpack description ------------------------------------------------------------ */

/* From the operators xnnpack.h (Debian's 2022-02 snapshot) declares: qs8 activations (int8 with
 * a zero point), qc8 convolution weights (int8, one scale per output channel, no zero point),
 * qs8 fully connected with one weight scale (there is no qc8 fully connected in this version),
 * int32 bias in accumulator units; s8 max pooling, qs8 global average pooling, add and multiply;
 * qs8 elu, sigmoid and tanh (the last two with fixed output qparams); qu8 leaky ReLU and average
 * pooling (run on the int8 data with the top bit flipped: xnnpack.c); x8 channel shuffle and copy
 * (a channel slice); ReLU / ReLU6 as the output clamp of the operator before them. No copy that
 * requantizes: a concat runs as copies of inputs that share one set of qparams (concat_shared;
 * the copies are ours, XNNPACK has no concatenation operator), a nearest resize as our copy with
 * its input's qparams, and a bilinear one by its s8 resize, which keeps its input's qparams: the
 * Quantizer ties the output's point to the input's (resize_tied). */
void qt_backend_desc_xnnpack(qt_backend_desc *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "xnnpack");
  d->xnnpack_runtime = 1;
  const qt_op ops[] = {QT_OP_CONV2D,          QT_OP_LINEAR,     QT_OP_RELU,       QT_OP_RELU6,
                       QT_OP_MAX_POOL2D,      QT_OP_AVG_POOL2D, QT_OP_FLATTEN,    QT_OP_ADD,
                       QT_OP_GLOBAL_AVG_POOL, QT_OP_MUL,        QT_OP_ACTIVATION, QT_OP_CHANNEL_SHUFFLE,
                       QT_OP_CHANNEL_SLICE,   QT_OP_CONCAT,     QT_OP_RESIZE};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) d->ops[ops[i]] = 1;
  /* elu and leaky ReLU with any qparams; sigmoid and tanh only with fixed output qparams (1/256,
   * -128; 1/128, 0), which the Quantizer gives them (at fewer bits the lowering finds other
   * qparams and runs them as fp32 fallbacks); no hard swish, GELU or SiLU here */
  d->act_kinds = 1u << QT_ACT_ELU | 1u << QT_ACT_SIGMOID | 1u << QT_ACT_TANH | 1u << QT_ACT_LEAKY_RELU;
  d->fixed_act_kinds = 1u << QT_ACT_SIGMOID | 1u << QT_ACT_TANH;
  d->concat_shared = 1;
  d->resize_tied = 1;                          /* resize_bilinear2d_nhwc_s8 keeps its input's qparams */
  d->weight_bits = d->activation_bits = 0x1fc; /* 2..8 bits inside int8 */
  d->weight_sign = QT_SIGN_SIGNED;             /* qc8 / qs8 weights */
  d->activation_sign = QT_SIGN_SIGNED;         /* qs8 activations, affine (int8 zero point) */
  d->weight_symmetric = 1;                     /* no weight zero point in the API */
  d->activation_per_tensor_only = 1;           /* one input / output scale per operator */
  d->weight_per_tensor_ops[QT_OP_LINEAR] = 1;  /* xnn_create_fully_connected_nc_qs8: one kernel_scale */
  d->bias_int32_only = 1;                      /* const int32_t* bias in accumulator units */
  d->fallback_quantized[QT_OP_PRELU] = 1;      /* only f32 PReLU in this XNNPACK */
  snprintf(d->isa, sizeof d->isa, "xnnpack operators");
}

int qt_backend_desc_named(qt_backend_desc *d, const char *name, qt_isa_choice isa, char *err) {
  if (strcmp(name, "onednn") == 0 || strcmp(name, "onednn_cpu") == 0) {
    qt_backend_desc_onednn_cpu(d, isa);
    return 0;
  }
  if (isa != QT_ISA_AUTO) return qt_err(err, "the ISA choice applies to the onednn_cpu backend, not to %s", name);
  if (strcmp(name, "xnnpack") == 0) {
    qt_backend_desc_xnnpack(d);
    return 0;
  }
  return qt_backend_desc_load(d, name, err);
}

void qt_backend_desc_print(const qt_backend_desc *d, FILE *f) {
  char wb[32], ab[32];
  qt_bits_mask_str(d->weight_bits, ",", wb, sizeof wb);
  qt_bits_mask_str(d->activation_bits, ",", ab, sizeof ab);
  fprintf(f, "backend %s (%s)\n  ops:", d->name, d->isa);
  for (int op = 0; op < QT_OP_COUNT; op++) {
    if (!d->ops[op]) continue;
    fprintf(f, " %s", qt_op_name((qt_op)op));
    for (int k = 0, first = 1; op == QT_OP_ACTIVATION && d->act_kinds && k < QT_ACT_COUNT; k++)
      if (d->act_kinds >> k & 1u) {
        fprintf(f, "%s%s", first ? " (" : ", ", qt_act_name((qt_act_kind)k));
        first = 0;
      }
    if (op == QT_OP_ACTIVATION && d->act_kinds) fputc(')', f);
  }
  for (int k = 0, first = 1; k < QT_ACT_COUNT; k++)
    if (d->fused_act_kinds >> k & 1u) {
      fprintf(f, "%s%s", first ? "\n  fused after conv2d / linear: " : ", ", qt_act_name((qt_act_kind)k));
      first = 0;
    }
  for (int k = 0, first = 1; k < QT_ACT_COUNT; k++)
    if (d->fixed_act_kinds >> k & 1u) {
      fprintf(f, "%s%s", first ? "\n  fixed output qparams: " : ", ", qt_act_name((qt_act_kind)k));
      first = 0;
    }
  if (d->concat_shared) fprintf(f, "\n  concat: inputs tied to one set of qparams (a copy)");
  if (d->resize_tied) fprintf(f, "\n  bilinear resize: output tied to its input's qparams");
  if (d->conv_add) fprintf(f, "\n  fused after conv2d: add [-> relu | relu6] (quant.fuse_add)");
  if (d->gate_mul) fprintf(f, "\n  fused after conv2d / linear: activation -> mul (quant.fuse_gate)");
  fprintf(f, "\n  weights: %s bits, %s, %s, %s", wb, qt_signedness_name(d->weight_sign),
          d->weight_symmetric ? "symmetric" : "affine allowed",
          d->weight_per_tensor_only ? "per-tensor only" : "per-channel allowed");
  if (!d->weight_per_tensor_only) {
    char ops[160] = "";
    size_t len = 0;
    for (int op = 0; op < QT_OP_COUNT; op++)
      if (d->weight_per_tensor_ops[op] && len < sizeof ops)
        len += (size_t)snprintf(ops + len, sizeof ops - len, "%s%s", len ? ", " : "", qt_op_name((qt_op)op));
    if (len) fprintf(f, " (per-tensor only: %s)", ops);
  }
  fprintf(f, "\n");
  fprintf(f, "  activations: %s bits, %s, %s, %s\n", ab, qt_signedness_name(d->activation_sign),
          d->activation_symmetric ? "symmetric" : "affine allowed",
          d->activation_per_tensor_only ? "per-tensor only" : "per-channel allowed");
  fprintf(f, "  scales: %s; max channels: ", d->pow2_scales ? "powers of two" : "any");
  if (d->max_channels > 0)
    fprintf(f, "%d", d->max_channels);
  else
    fprintf(f, "any");
  fprintf(f, "; u8 x s8 pair sums: %s\n", d->pair_sum_int16 ? "saturating int16 (no VNNI)" : "exact");
  fprintf(f, "  bias: %s\n", d->bias_int32_only ? "int32 only (input scale x weight scale)" : "float or int32");
}

/* ---- records ----------------------------------------------------------------------------- */

typedef struct {
  qt_violation_kind kind;
  char reason[320];
} problem;

static int is_pow2(float s) {
  int e;
  return s > 0 && isfinite(s) && frexpf(s, &e) == 0.5f;
}

/* Every problem of one record (at most one per kind); returns the count. */
static int record_problems(const qt_backend_desc *d, const qt_qstate *q, int is_weight, qt_op op, problem *out) {
  const char *what = is_weight ? "weights" : "activations";
  const int bits = q->spec.bits, is_signed = q->spec.is_signed || q->spec.qmin < 0;
  const unsigned mask = is_weight ? d->weight_bits : d->activation_bits;
  const qt_signedness need = is_weight ? d->weight_sign : d->activation_sign;
  int n = 0;
  if (bits < 2 || bits > 8 || !((mask >> bits) & 1u)) {
    char allowed[32];
    qt_bits_mask_str(mask, ",", allowed, sizeof allowed);
    out[n].kind = QT_VIOLATION_BITS;
    snprintf(out[n++].reason, sizeof out->reason, "%d-bit %s [%d, %d]; %s takes {%s}-bit %s", bits, what, q->spec.qmin,
             q->spec.qmax, d->name, allowed, what);
  }
  if ((need == QT_SIGN_SIGNED && !is_signed) || (need == QT_SIGN_UNSIGNED && is_signed)) {
    out[n].kind = QT_VIOLATION_SIGN;
    snprintf(out[n++].reason, sizeof out->reason, "%s %s [%d, %d]; %s takes %s %s only",
             is_signed ? "signed" : "unsigned", what, q->spec.qmin, q->spec.qmax, d->name, qt_signedness_name(need),
             what);
  }
  if (is_weight ? d->weight_symmetric : d->activation_symmetric) {
    int bad = 0, first = -1;
    for (int c = 0; c < q->channels; c++)
      if (q->zero_point[c] != 0) {
        if (first < 0) first = c;
        bad++;
      }
    if (bad) {
      out[n].kind = QT_VIOLATION_SYMMETRIC;
      snprintf(out[n++].reason, sizeof out->reason,
               "%s zero point %d%s (%d of %d channels non-zero); %s requires "
               "symmetric %s (zero point 0)",
               what, q->zero_point[first], q->channels > 1 ? " in a channel" : "", bad, q->channels, d->name, what);
    }
  }
  const int op_per_tensor = is_weight && op < QT_OP_COUNT && d->weight_per_tensor_ops[op];
  if (q->channels > 1 && (is_weight ? d->weight_per_tensor_only || op_per_tensor : d->activation_per_tensor_only)) {
    out[n].kind = QT_VIOLATION_GRANULARITY;
    if (op_per_tensor && !d->weight_per_tensor_only)
      snprintf(out[n++].reason, sizeof out->reason,
               "per-channel %s %s (%d scales); %s takes one weight scale per "
               "%s (per-channel weights on other layers)",
               qt_op_name(op), what, q->channels, d->name, qt_op_name(op));
    else
      snprintf(out[n++].reason, sizeof out->reason, "per-channel %s (%d scales); %s requires one scale per tensor",
               what, q->channels, d->name);
  }
  if (d->pow2_scales) {
    int bad = 0, first = -1;
    for (int c = 0; c < q->channels; c++)
      if (!is_pow2(q->scale[c])) {
        if (first < 0) first = c;
        bad++;
      }
    if (bad) {
      int e;
      frexpf(q->scale[first], &e);
      out[n].kind = QT_VIOLATION_POW2;
      snprintf(out[n++].reason, sizeof out->reason,
               "%s scale %.9g is not a power of two (between 2^%d and 2^%d; %d of "
               "%d scales); %s rescales by shifting",
               what, q->scale[first], e - 1, e, bad, q->channels, d->name);
    }
  }
  return n;
}

const char *qt_backend_record_problem(const qt_backend_desc *d, const qt_qstate *q, int is_weight, char *why,
                                      size_t n) {
  problem p[QT_VIOLATION_COUNT];
  if (!record_problems(d, q, is_weight, QT_OP_COUNT, p)) return NULL;
  snprintf(why, n, "%s", p[0].reason);
  return why;
}

/* ---- the pass ---------------------------------------------------------------------------- */

static void add_violation(qt_backend_check_result *r, const qt_graph *g, int node, qt_violation_kind kind,
                          const char *fmt, ...) {
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 16;
    r->items = realloc(r->items, (size_t)r->cap * sizeof *r->items);
    QT_ASSERT(r->items, "out of memory");
  }
  qt_violation *v = &r->items[r->n++];
  v->kind = kind;
  v->node = node;
  snprintf(v->node_name, sizeof v->node_name, "%s", g->nodes[node].name);
  QT_VFORMAT(v->reason, fmt);
  r->count[kind]++;
}

static void add_note(qt_backend_check_result *r, const char *fmt, ...) {
  if (r->n_notes == r->cap_notes) {
    r->cap_notes = r->cap_notes ? 2 * r->cap_notes : 8;
    r->notes = realloc(r->notes, (size_t)r->cap_notes * sizeof *r->notes);
    QT_ASSERT(r->notes, "out of memory");
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->notes[r->n_notes++], sizeof r->notes[0], fmt, ap);
  va_end(ap);
}

/* The dequantize whose integers value v carries, through ops that keep them (flatten,
 * max_pool2d and relu commute with a dequantize); -1 when v is computed in fp32. */
static int integer_source(const qt_graph *g, int v) {
  for (;;) {
    const qt_node *p = &g->nodes[g->values[v].producer];
    if (p->op == QT_OP_DEQUANTIZE) return g->values[v].producer;
    if (p->op != QT_OP_FLATTEN && p->op != QT_OP_MAX_POOL2D && p->op != QT_OP_RELU) return -1;
    v = p->inputs[0];
  }
}

/* The pair-sum bound of docs/design.md: no VNNI: oneDNN without VNNI multiplies u8 activations by s8 weights
 * and adds adjacent products in a saturating int16 (vpmaddubsw), so a1*w1 + a2*w2 must stay
 * within [-32768, 32767]. The worst pair is 2 * max(a) * max|w| with a the raw u8 value. */
static void check_saturation(qt_backend_check_result *r, const qt_graph *g, int i, const qt_qstate *in) {
  const qt_node *n = &g->nodes[i];
  const qt_qstate *wq = n->wq;
  const int a_max = in->spec.qmax;
  if (in->spec.qmin < 0) return; /* signed activations: flagged as a sign violation instead */
  const int64_t w_max = qt_max_abs_weight(wq);
  const int64_t pair = 2 * (int64_t)a_max * w_max;
  if (pair > 32767)
    add_violation(r, g, i, QT_VIOLATION_SATURATION,
                  "u8 x s8 pair sums reach 2 * %d * %lld = %lld > 32767 (activations [%d, %d], integer weights up to "
                  "|%lld|): without VNNI the int16 sum saturates and results are wrong; keep weights in [-64, 63] "
                  "(7 bits) or activations in [0, 127]",
                  a_max, (long long)w_max, (long long)pair, in->spec.qmin, in->spec.qmax, (long long)w_max);
}

int64_t qt_max_abs_weight(const qt_qstate *wq) {
  const int64_t inner = wq->n_qweight / wq->channels;
  int64_t w_max = 0;
  for (int64_t k = 0; k < wq->n_qweight; k++) {
    const int64_t w = llabs((int64_t)wq->qweight[k] - wq->zero_point[k / inner]);
    if (w > w_max) w_max = w;
  }
  return w_max;
}

int qt_backend_check(const qt_graph *g, const qt_backend_desc *d, qt_backend_check_result *r, char *err) {
  memset(r, 0, sizeof *r);
  snprintf(r->graph, sizeof r->graph, "%s", g->name);
  snprintf(r->backend, sizeof r->backend, "%s", d->name);
  snprintf(r->isa, sizeof r->isa, "%s", d->isa);
  if (!g->finalized) {
    snprintf(err, QT_ERR_LEN, "backend check: graph %s is not finalized", g->name);
    return -1;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || (n->wq && !n->wq->qweight)) {
      snprintf(err, QT_ERR_LEN,
               "backend check: graph %s: node %d '%s' (%s) belongs to a prepared (training) graph; check the Q/DQ "
               "graph from qt_convert (model_qdq.h5)",
               g->name, i, n->name, qt_op_name(n->op));
      return -1;
    }
  }
  problem p[QT_VIOLATION_COUNT];
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    switch (n->op) {
      case QT_OP_INPUT:
      case QT_OP_DEQUANTIZE: /* carries its quantize's record (the loader checks the pair) */ continue;
      case QT_OP_QUANTIZE: {
        r->n_records++;
        const int k = record_problems(d, n->q, 0, QT_OP_COUNT, p);
        for (int j = 0; j < k; j++) add_violation(r, g, i, p[j].kind, "%s", p[j].reason);
        continue;
      }
      default: break;
    }
    int integer_input = 0;
    for (int k = 0; k < n->n_inputs; k++) integer_input |= integer_source(g, n->inputs[k]) >= 0;
    const int layer = qt_op_has_weight(n->op) && n->wq;
    if (!qt_backend_runs(d, n) && (integer_input || layer))
      add_violation(r, g, i, QT_VIOLATION_OP,
                    "op %s on quantized data is not run by %s: it runs in fp32 on the CPU (a fallback partition)",
                    qt_op_name(n->op), d->name);
    if (!layer) {
      if (qt_op_has_weight(n->op) && integer_input && d->ops[n->op])
        add_note(r, "%s: %s left in fp32 (weights not quantized): runs on the CPU", n->name, qt_op_name(n->op));
      continue;
    }
    r->n_layers++;
    const int k = record_problems(d, n->wq, 1, n->op, p);
    for (int j = 0; j < k; j++) add_violation(r, g, i, p[j].kind, "%s", p[j].reason);
    if (d->max_channels > 0 && n->attr.out_channels > d->max_channels)
      add_violation(r, g, i, QT_VIOLATION_CHANNELS, "%d output %s; %s has at most %d", n->attr.out_channels,
                    n->op == QT_OP_CONV2D ? "channels" : "features", d->name, d->max_channels);
    const int src = integer_source(g, n->inputs[0]);
    if (src < 0) {
      add_violation(r, g, i, QT_VIOLATION_INPUT,
                    "integer weights on an fp32 input '%s' (weight-only quantization): no integer kernel takes it",
                    g->values[n->inputs[0]].name);
      continue;
    }
    if (d->pair_sum_int16) check_saturation(r, g, i, g->nodes[src].q);
    if (d->bias_int32_only && n->param[QT_P_BIAS] >= 0 && !n->wq->qbias)
      add_violation(
          r, g, i, QT_VIOLATION_BIAS,
          "float bias; %s adds the bias as int32 in accumulator units (s_x * s_w), so the device rounds it "
          "and computes other numbers than this graph (quantize for it: its Quantizer, or quant.bias = int32)",
          d->name);
  }
  return 0;
}

void qt_backend_check_result_free(qt_backend_check_result *r) {
  free(r->items);
  free(r->notes);
  memset(r, 0, sizeof *r);
}

void qt_backend_check_print(const qt_backend_check_result *r, FILE *f) {
  fprintf(f, "backend check of %s against %s (%s): %d activation records, %d integer-weight layers\n", r->graph,
          r->backend, r->isa, r->n_records, r->n_layers);
  for (int i = 0; i < r->n; i++)
    fprintf(f, "  %s: [%s] %s\n", r->items[i].node_name, qt_violation_kind_name(r->items[i].kind), r->items[i].reason);
  for (int i = 0; i < r->n_notes; i++) fprintf(f, "  note: %s\n", r->notes[i]);
  if (!r->n) {
    fprintf(f, "PASS: no violations\n");
    return;
  }
  fprintf(f, "FAIL: %d violation%s (", r->n, r->n == 1 ? "" : "s");
  int first = 1;
  for (int k = 0; k < QT_VIOLATION_COUNT; k++)
    if (r->count[k]) {
      fprintf(f, "%s%s %d", first ? "" : ", ", qt_violation_kind_name((qt_violation_kind)k), r->count[k]);
      first = 0;
    }
  fprintf(f, ")\n");
}
