/* Quantization-aware training passes over the graph IR (docs/design.md):
 *
 *   fp32 graph --quantizer--> annotations --prepare--> prepared graph (observers, fake quant,
 *   QAT conv_bn with delayed folding, or PTQ with BN folded) --calibrate | train--> --convert-->
 *   Q/DQ graph (quantize/dequantize pairs, integer weights, BN folded) --check--> verdict
 *
 * The Quantizer is the contract between a model and a backend: it says which edges and
 * weights are quantized and how, and it is one function of the graph, the backend's
 * description (qt_backend_desc, below) and the user's settings. The backend module builds the
 * descriptions: oneDNN's int8 kernels on this CPU (u8 affine activations, s8 per-channel
 * symmetric weights, 7-bit weights when the CPU lacks VNNI, docs/design.md: no VNNI) and accelerators
 * described by an INI file. */
#ifndef QT_QAT_H
#define QT_QAT_H

#include <stdio.h>

#include "nn/nn.h"
#include "quant/quant.h"

#define QT_MAX_OVERRIDES 64
/* The override name that applies to every layer without one of its own ("*=fp32;conv1=w8a8":
 * only conv1's unit quantized). Other names with *, ? or [...] are shell patterns (fnmatch) that
 * name every layer they match ("*.scale_activation=fp32"): a layer's own name comes first, then
 * the first pattern that matches it, then "*". */
#define QT_OVERRIDE_ANY "*"

typedef struct {
  char name[QT_NAME_LEN]; /* node name (conv/linear) */
  int fp32;               /* leave the layer in fp32 */
  int weight_bits;        /* 0 = the default */
  int activation_bits;    /* 0 = the default (the unit's output) */
} qt_layer_override;

typedef enum { QT_BIAS_AUTO, QT_BIAS_INT32, QT_BIAS_FLOAT } qt_bias_choice;

/* With learnable_scale, which weight quantizers learn their scales; the others follow their
 * observer every step (as PT2E's QAT does). BELOW_8: those of fewer than 8 bits (a layer's own
 * bits, after overrides). Learned 8-bit weight scales lost whole channels in 3 of 7 W8A8 runs
 * (grown past the channel's range, or collapsed to the FLT_EPSILON clamp), observed ones in none
 * (docs/experiments.md, "LSQ at 8 bits"). */
typedef enum { QT_LSQ_WEIGHTS_ALL, QT_LSQ_WEIGHTS_BELOW_8, QT_LSQ_WEIGHTS_NONE } qt_lsq_weights;

typedef struct {
  int weight_bits;                  /* 2..8 */
  int activation_bits;              /* 2..8 */
  qt_observer_kind weight_observer; /* per channel: minmax or moving_average */
  qt_observer_kind activation_observer;
  qt_range_method activation_method; /* histogram: percentile / mse */
  float percentile;
  int learnable_scale; /* LSQ: activations learn their scales (QAT), and weights as learnable_weights says */
  qt_lsq_weights learnable_weights;
  qt_bias_choice bias; /* conv/linear biases: int32 at s_x * s_w, or float; auto:
                        * int32 where the backend requires it (bias_int32_only) */
  int fuse_add;        /* a quantized conv2d whose output goes only to an add joins the add's
                        * unit (and a relu after it): no point on the conv's output, as PT2E's X86
                        * Inductor quantizer fuses conv + add; needs the backend's conv_add */
  int fuse_gate;       /* a quantized conv2d / linear -> activation -> mul (a squeeze-excite gate:
                        * the layer's output activated, times another tensor) is one unit: no
                        * point on the layer's or the activation's output; needs gate_mul */
  int fp32_output;     /* the graph's output is no quantization point: the last unit hands on real
                        * values (its int8 layer dequantizes into fp32), as PT2E's X86 Inductor
                        * quantizer leaves a model's logits */
  int n_overrides;
  qt_layer_override overrides[QT_MAX_OVERRIDES];
} qt_quantizer_config;

/* Defaults: W8A8, min-max weights, moving-average activations. */
void qt_quantizer_config_default(qt_quantizer_config *c);
/* Parses "conv1=fp32;fc1=w4a8;fc2=w8" into overrides; "*=..." sets every other layer. */
int qt_parse_overrides(qt_quantizer_config *c, const char *text, char *err);

/* The Quantizer's output: per value, whether it is quantized (and how) or shares another
 * value's qparams; per node, the weight spec; per node, the unit it belongs to. */
typedef struct {
  int n_values, n_nodes;
  int *act; /* per value: 1 = a quantization point */
  qt_qspec *act_spec;
  int *share;  /* per value: value whose qparams it shares, or -1 */
  int *tie;    /* per value: for a point, the earlier point whose state its fake quant uses (one set of
                * qparams for a concat's inputs: PT2E's SharedQuantizationSpec), or -1 */
  int *weight; /* per node: 1 = weight quantized */
  qt_qspec *weight_spec;
  int *unit; /* per node: id of the first node of its unit (itself if alone) */
} qt_annotations;

/* ---- backend descriptions and the Quantizer ------------------------------------------------- */
/* What a backend's integer kernels accept: the contract a Quantizer is written from and the
 * check pass (backend/backend.h, qt_backend_check) verifies a Q/DQ graph against. It lives
 * here, beside the Quantizer, because the Quantizer reads it; the backend module builds and
 * loads descriptions (the built-in onednn_cpu one, an accelerator's from an INI file). */
typedef enum { QT_SIGN_ANY, QT_SIGN_UNSIGNED, QT_SIGN_SIGNED, QT_SIGN_COUNT } qt_signedness;
const char *qt_signedness_name(qt_signedness s);
/* A bit-width mask (bit b set: b bits allowed, 2..8) as text, "2<sep>4<sep>8", or "none". */
void qt_bits_mask_str(unsigned mask, const char *sep, char *buf, size_t n);

typedef struct {
  char name[QT_NAME_LEN];
  unsigned char ops[QT_OP_COUNT]; /* 1: the backend runs this op on integers */
  unsigned act_kinds;             /* activation: the kinds it runs on integers, bit k for qt_act_kind k;
                                   * 0 = every kind */
  unsigned fused_act_kinds;       /* activations (bit k for qt_act_kind k) it runs fused after a
                                   * quantized conv2d or linear, on the layer's output before the
                                   * requantization: no quantization point between the two (onednn_cpu:
                                   * SiLU and hard swish, as PT2E's X86 Inductor quantizer fuses them) */
  unsigned fixed_act_kinds;       /* activations (bit k) whose integer operator takes only fixed output
                                   * qparams for their known range (XNNPACK's qs8 sigmoid and tanh,
                                   * TFLite's convention): the Quantizer gives their outputs those
                                   * (qt_fixed_act_qparams) instead of observed ones */
  int concat_shared;              /* it runs concat only as a copy of inputs on one grid: the Quantizer
                                   * ties a concat's inputs to one point, the output sharing it */
  int resize_tied;                /* it runs a bilinear resize only on its input's grid (XNNPACK's s8
                                   * resize): the Quantizer ties the output's point to the input's */
  int conv_add;                   /* it runs a quantized conv2d's output added to a quantized tensor
                                   * [-> relu] before the requantization, as one unit (quant.fuse_add) */
  int gate_mul;                   /* it runs a quantized conv2d's / linear's output through an
                                   * activation and multiplies a quantized tensor by it before the
                                   * requantization, as one unit (quant.fuse_gate) */
  unsigned weight_bits;           /* allowed widths: bit b set for b-bit (2..8) */
  unsigned activation_bits;
  qt_signedness weight_sign, activation_sign;
  int weight_symmetric; /* zero point 0 required */
  int activation_symmetric;
  int weight_per_tensor_only;                       /* per-channel weights refused */
  unsigned char weight_per_tensor_ops[QT_OP_COUNT]; /* 1: this op's weights take one scale per
                                                     * tensor even where other ops take one per channel
                                                     * (XNNPACK's qs8 fully connected: per-channel conv
                                                     * weights, per-tensor linear weights) */
  int activation_per_tensor_only;                   /* per-channel activations refused */
  int pow2_scales;                                  /* every scale a power of two */
  int max_channels;                                 /* output channels (conv2d) / features (linear); 0 = any */
  int pair_sum_int16;                               /* u8 x s8 products summed in pairs into a saturating int16
                                                     * (x86 AVX2 without VNNI, docs/design.md: no VNNI) */
  int weight_8bit_as_7bit;                          /* 8-bit weights are given 7 bits, [-64, 63] (oneDNN without
                                                     * VNNI: exact whatever the activation width) */
  int bias_int32_only;                              /* the kernels take a bias only as int32 in accumulator units
                                                     * (XNNPACK): the Quantizer quantizes every bias (qspec
                                                     * bias_int32); otherwise the user chooses (quant.bias), float
                                                     * by default */
  unsigned char fallback_quantized[QT_OP_COUNT];    /* 1: not run on integers, but the Quantizer
                                                     * still quantizes its input and output, so the op runs
                                                     * as dq -> fp32 op -> q between integer kernels (onednn_cpu:
                                                     * avg_pool2d) */
  char isa[32];                                     /* informative: "avx2", "avx512_core_vnni", "accelerator" */
  int onednn_runtime;                               /* 1: deployed by lowering to oneDNN's int8 kernels (the
                                                     * built-in onednn_cpu); 0: simulated as an accelerator */
  int xnnpack_runtime;                              /* 1: deployed by lowering to XNNPACK's operators (the
                                                     * built-in xnnpack, backend/xnnpack.c) */
} qt_backend_desc;

/* Whether the backend runs node n's op on integers (for an activation: its kind too). */
static inline int qt_backend_runs(const qt_backend_desc *d, const qt_node *n) {
  return d->ops[n->op] && (n->op != QT_OP_ACTIVATION || !d->act_kinds || (d->act_kinds >> n->attr.act & 1u));
}

/* The Quantizer: annotations for g from the backend description d and the settings cfg.
 * Units (no quantization inside): conv -> bn (folded), and a relu or relu6 after a conv, linear
 * or add when the backend runs that op, or an activation of a kind in fused_act_kinds after a
 * quantized conv or linear; with cfg->fuse_add (and d->conv_add), a quantized conv whose output
 * goes only to an add, the add and a relu / relu6 after it (the add's other input a point); with
 * cfg->fuse_gate (and d->gate_mul), a quantized conv or linear -> activation -> mul (the mul's
 * other input a point). A conv2d / linear is
 * quantized when its op is listed and its output channels fit max_channels (and no override leaves it fp32); an add /
 * avg_pool2d / global_avg_pool / activation / prelu / mul / concat when listed in ops or fallback_quantized (its inputs
 * and output quantization points); everything else stays fp32 (its quantized consumers get a quantized input). The
 * outputs of max-pool, flatten, relu, channel_shuffle and channel_slice share their input's qparams when the backend
 * runs them. Weights: signed unless the backend says unsigned, symmetric when required (else affine), per channel
 * unless per-tensor only, 8-bit given 7 bits with weight_8bit_as_7bit, per tensor for the ops in weight_per_tensor_ops,
 * and otherwise with pair_sum_int16 narrowed so that 2 * max|w| * max(a) fits int16; activations: unsigned affine,
 * signed affine when the backend asks for signed ones (XNNPACK's qs8), signed symmetric when it asks for symmetric
 * ones; per tensor; power-of-two scales when required. Bit widths come from cfg (and its overrides) and must be allowed
 * by d. LSQ is refused with power-of-two scales. The output of an activation whose kind is in d->fixed_act_kinds gets
 * fixed qparams (qt_fixed_act_qparams), neither observed nor learned. With d->concat_shared a concat's inputs are
 * points tied (out->tie) to one leader, the point an input already shares or else the input quantized first, and the
 * output shares it; the concat keeps its own point when that cannot be done (two inputs sharing different points, and
 * the like). With d->resize_tied a bilinear resize's output point is tied to its input's. Returns 0, or -1 with err
 * naming the setting and the backend. */
int qt_quantizer(const qt_graph *g, const qt_backend_desc *d, const qt_quantizer_config *cfg, qt_annotations *out,
                 char *err);
/* The fixed output qparams of an activation of known range on the integers [qmin, qmax] of a spec with 2^bits levels
 * (PyTorch's FixedQParams convention; XNNPACK's qs8 operators at 8 bits): sigmoid's [0, 1) at scale 2^-bits, zero point
 * qmin (signed 8-bit: 1/256, -128); tanh's [-1, 1) at scale 2^(1-bits), zero point qmin + 2^(bits-1) (signed 8-bit:
 * 1/128, 0). Returns 1 with *scale, *zero_point set, or 0 when the kind has no fixed range. */
int qt_fixed_act_qparams(int act_kind, const qt_qspec *s, float *scale, int *zero_point);
void qt_annotations_free(qt_annotations *a);
/* One line per quantization point and weight, for humans and the run's report. */
void qt_annotations_print(const qt_graph *g, const qt_annotations *a, FILE *f);

/* ---- prepare ------------------------------------------------------------------------------ */
typedef enum { QT_PREPARE_PTQ, QT_PREPARE_QAT } qt_prepare_mode;

/* A new graph with fake-quant nodes at the annotated points and weight quantization on the
 * annotated layers. PTQ folds each conv->bn into the conv (weights and a bias) first; QAT
 * turns each conv->bn into a conv_bn node (delayed folding, docs/design.md: delayed folding). Parameters, buffers
 * and names are carried over (conv_bn's BN tensors are "<conv>.bn.weight" etc.). A weight
 * shared by two conv->bn chains is refused. */
qt_graph *qt_prepare(const qt_graph *g, const qt_annotations *a, qt_prepare_mode mode, char *err);

/* The one mode call, for fp32, prepared and Q/DQ graphs alike (docs/design.md: modes):
 *   QT_MODE_TRAIN      every stateful node in training mode, fake quant on (observers keep
 *                      their enable flag: the freeze schedules own it)
 *   QT_MODE_EVAL       every node in eval mode, fake quant on (observers do not observe in eval)
 *   QT_MODE_EVAL_FLOAT eval mode with fake quant off: a prepared graph as the float model it trains
 *   QT_MODE_CALIBRATE  PTQ calibration: observers on and observing, fake quant off, BN and
 *                      everything else as in eval
 * A calibration that should leave fixed qparams ends with qt_set_observers(g, 0). */
typedef enum { QT_MODE_TRAIN, QT_MODE_EVAL, QT_MODE_EVAL_FLOAT, QT_MODE_CALIBRATE } qt_graph_mode;
void qt_graph_set_mode(qt_graph *g, qt_graph_mode mode);

/* Schedules (docs/design.md: modes): observers on/off (freezing the qparams), fake quant on/off, BN
 * statistics frozen. */
void qt_set_observers(qt_graph *g, int enabled);
void qt_set_fake_quant(qt_graph *g, int enabled);
void qt_freeze_bn(qt_graph *g, int frozen);

/* The BN fold: qt_bn_fold (autograd/autograd.h). */

/* ---- convert ------------------------------------------------------------------------------ */
/* The Q/DQ graph: each fake quant becomes quantize -> dequantize with the same qparams
 * (named "<fq>.quantize", "<fq>.dequantize"); conv_bn becomes a conv2d with the folded weight
 * W * sf and bias beta + (b - running_mean) * sf; every quantized weight is stored as
 * integers with its scales (the float weight it quantized is kept in the slab for audits). */
qt_graph *qt_convert(const qt_graph *prepared, char *err);

/* Weight channels of a convert graph that quantization lost: the dequantized integers differ
 * from the float weight they quantized by at least as much as QT_LOST_CHANNEL_DB says (channel
 * SQNR 10 log10(sum w^2 / sum (w_q - w)^2) <= 1 dB: the error keeps 80% of the channel's power
 * or more). A learned LSQ scale far from the channel's range does this (all integers at the
 * zero point, or all clipped at a scale near zero); a sane channel at 2 bits keeps more than
 * 1 dB. Returns their number over all layers; detail (may be NULL) gets one line per affected
 * layer, "<layer>: N of C channels (worst c: SQNR x dB, scale s, max |w| m)", truncated to cap. */
#define QT_LOST_CHANNEL_DB 1.0
int qt_lost_weight_channels(const qt_graph *converted, char *detail, size_t cap);

/* ---- the consistency check ----------------------------------------------------------------- */
typedef struct {
  int ok;
  int n_checked_points, n_checked_weights;
  double max_lsb;         /* largest output difference, in LSB, over all Q/DQ points */
  int64_t tie_mismatches; /* 1-LSB differences explained by a rounding tie */
  char reason[4096];      /* first failures, one per line: node and reason */
} qt_check_report;

/* Structural and numerical comparison of the eval-mode training graph with the convert graph
 * on `batch` (N, H, W, C). Both graphs are put in eval mode. */
int qt_check(qt_graph *trained, qt_graph *converted, const float *batch, int n, qt_check_report *r, char *err);

/* ---- the Q/DQ graph file (HDF5, docs/qdq_format.md) ----------------------------------------- */
int qt_qdq_save(const char *path, const qt_graph *g, char *err);
qt_graph *qt_qdq_load(const char *path, char *err);

/* ---- cross-layer equalization (qat/cle.c) ------------------------------------------------- */
#define QT_CLE_MAX_LISTED 64
#define QT_CLE_TOLERANCE 1e-6 /* stop when no scale moves more than this (|log s|) */
#define QT_CLE_MAX_ITERATIONS 100
typedef struct {
  int pairs;                                                                 /* layer pairs equalized */
  int iterations;                                                            /* passes over the pairs */
  double last_change;                                                        /* the last pass's largest |log s| */
  int relu6_replaced;                                                        /* relu6 nodes made relu (relu6_as_relu) */
  char a[QT_CLE_MAX_LISTED][QT_NAME_LEN], b[QT_CLE_MAX_LISTED][QT_NAME_LEN]; /* the first pairs */
} qt_cle_result;
/* Cross-layer equalization of g (a graph without batch norm: fp32 with BN folded, or prepared for
 * PTQ and not calibrated yet), in place: every conv/linear layer A whose output reaches one
 * conv/linear layer B only through ReLU, pooling, flatten and fake quant nodes gets its output
 * channels scaled by 1/s and B's matching input channels by s, s_i = sqrt(r1_i / r2_i) from the
 * channels' largest |weight|, pair by pair until the scales settle. The function g computes is
 * unchanged (up to float rounding). Layers whose weight or bias another node shares, and chains
 * through add or batch norm, are left alone; so are chains through relu6 (which clips at 6, so a
 * scale does not commute with it) unless relu6_as_relu, which makes every relu6 of an equalized
 * chain a relu first (as AIMET does for MobileNetV2: the function then changes where an
 * activation exceeded 6). -1 with err for a graph with batch norm or calibrated qparams. */
int qt_cross_layer_equalize(qt_graph *g, int relu6_as_relu, qt_cle_result *res, char *err);

/* ---- bias correction (qat/bias_correction.c) ----------------------------------------------- */
typedef struct {
  int layers;                    /* conv/linear layers with a bias, corrected */
  int skipped;                   /* analytical: layers whose input no batch norm describes */
  double before, after;          /* the largest |E[float output] - E[quantized output]| of a channel
                                  * (analytical: the expected shift from the weights' rounding, which
                                  * the correction removes; after 0) */
  char worst_after[QT_NAME_LEN]; /* empirical: the layer where `after` is */
} qt_bias_correction_result;
/* Empirical bias correction of a calibrated prepared graph g, in place: for each conv/linear layer
 * with a bias, in graph order, b_c += E[y_c] with fake quant off - E[y_c] with it on, the means
 * taken over the n images (NHWC, the graph input's shape, preprocessed) in batches of `batch`,
 * each layer's output before its activation, measured after the layers before it are corrected.
 * The float model is g with fake quant off, or with the parameters in `reference` (g->n_params
 * floats) when not NULL: g's own before AdaRound (qt_adaround) put its weights on their grid.
 * Leaves g in QT_MODE_TRAIN (as calibration does). -1 with err when a forward fails. */
int qt_bias_correct(qt_graph *g, qt_ctx *ctx, const float *reference, const float *images, int n, int batch,
                    qt_bias_correction_result *res, char *err);
/* Analytical bias correction (data-free): for each conv/linear layer of the calibrated prepared
 * graph p with a bias and quantized weights whose input is, in the fp32 graph it was prepared from,
 * the output of a conv/linear -> batch norm (-> relu | relu6), reached through fake quants,
 * average pools and a flatten only, the input of channel c is taken as N(beta_c, gamma_c^2) before
 * the activation, so E[x_c] = mu Phi(mu / sigma) + sigma phi(mu / sigma) after a relu (and the
 * difference of two such terms after a relu6, which clips at 6), and
 *     b[oc] -= sum over the weights of output channel oc of (W_q - W) E[x_channel]
 * (W_q the weights as fake quant rounds them; W from `reference` when not NULL: the float weights
 * before AdaRound). Padding is ignored, as in the paper. Other layers are counted in skipped. */
int qt_bias_correct_analytical(const qt_graph *fp32, qt_graph *p, const float *reference,
                               qt_bias_correction_result *res, char *err);

/* ---- AdaRound and block reconstruction (qat/adaround.c) ----------------------------------- */
/* What one reconstruction learns at a time: a conv/linear layer (with its relu / relu6: AdaRound)
 * or a block of the graph between two single-value cuts (BRECQ, with QDrop's dropping when
 * drop > 0): a residual or inverted-residual block, or a conv/linear group up to and including its
 * output's fake quant. */
typedef enum { QT_RECON_LAYER, QT_RECON_BLOCK } qt_recon_unit;
typedef struct {
  qt_recon_unit unit;
  int iterations;             /* optimizer steps per unit */
  int batch;                  /* images per step */
  float lambda;               /* weight of the rounding regularizer */
  float beta_start, beta_end; /* its exponent, annealed linearly after the warm start */
  float warm_start;           /* fraction of the steps without the regularizer */
  float lr;                   /* Adam's learning rate for v */
  float scale_lr;             /* blocks: Adam's learning rate for the activation scales (LSQ) */
  float drop;                 /* blocks: QDrop's probability of an activation staying float */
  uint64_t seed;              /* the steps' image sampling and QDrop's draws */
} qt_adaround_config;
/* The published settings (Nagel et al., 2020; AIMET's and BRECQ's defaults): layers, lambda 0.01,
 * beta 20 -> 2 after a warm start of 20% of the steps, Adam at 1e-3 for v and 4e-5 for activation
 * scales, 32 images per step, QDrop's 0.5; the step count is this project's default
 * (docs/quantization.md). */
void qt_adaround_config_default(qt_adaround_config *c);

#define QT_ADAROUND_MAX_LISTED 128
typedef struct {
  char name[2 * QT_NAME_LEN + 4]; /* a layer's name; a block's "first..last" node */
  int layers;                     /* weight layers rounded */
  int activations;                /* activation scales learned (blocks) */
  int64_t weights;
  double flipped; /* fraction of the weights rounded the other way than to nearest */
  /* SQNR of the unit's output against the float model's on the calibration images,
   * 10 log10(sum y^2 / sum (y_q - y)^2), its input taken from the quantized model: rounded to
   * nearest with the calibrated scales, then as reconstructed */
  double sqnr_nearest_db, sqnr_adaround_db;
  double seconds;
} qt_adaround_unit;
typedef struct {
  int units, layers;
  double seconds;
  int listed; /* entries of unit[] filled (the first QT_ADAROUND_MAX_LISTED) */
  qt_adaround_unit unit[QT_ADAROUND_MAX_LISTED];
} qt_adaround_result;

/* AdaRound (cfg->unit = QT_RECON_LAYER) or BRECQ / QDrop (QT_RECON_BLOCK) of a calibrated prepared
 * PTQ graph g, in place. Unit by unit, in graph order, v (one per weight of the unit's layers) is
 * trained with Adam to minimize
 *     sum over the unit's outputs of (F~(x~) - F(x))^2 / (outputs / channels)
 *       + lambda * sum over its weights (1 - |2 h(v) - 1|^beta)
 * (qt_adaround_weight, qt_squared_error, qt_adaround_round_loss): F the unit in the float model
 * (the parameters in `reference`, g->n_params floats; NULL: g's own as they are) and x its input
 * there; F~ the unit with the soft-quantized weights W~(v) and x~ its input in the quantized model
 * (fake quant on, the earlier units already reconstructed): the paper's asymmetric
 * reconstruction. A layer's unit ends at its relu / relu6 when its output goes only there. In a
 * block, the fake quants' scales are learned too (LSQ; not power-of-two ones), and with drop > 0
 * every activation quantization in it, its input included, is dropped element by element with
 * that probability (x instead of x~ at the input). The n images (NHWC, the graph input's shape,
 * preprocessed) are the calibration set; each step draws cfg->batch of them. Then each weight is
 * frozen on its grid point, w = (clamp(floor(w / s) + [v >= 0] + zp, qmin, qmax) - zp) * s, which
 * fake quant and convert reproduce exactly; learned activation scales replace the calibrated
 * ones. One line per unit goes to progress (may be NULL). Leaves g in QT_MODE_TRAIN. -1 with err
 * for a graph not calibrated, learned (LSQ) weight scales, an op a block cannot train through, or
 * a failing forward. */
int qt_adaround(qt_graph *g, qt_ctx *ctx, const float *reference, const float *images, int n,
                const qt_adaround_config *cfg, qt_adaround_result *res, FILE *progress, char *err);

#endif
