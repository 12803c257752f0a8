/* The QAT passes pinned against PyTorch 1.13 (reference: tests/ref/make_ref_qat.py -> qat.h5):
 *
 * 1. A conv -> BN -> ReLU unit prepared for QAT (conv_bn, delayed folding, docs/design.md: delayed folding) against
 *    FX's ConvBnReLU2d with a per-channel symmetric weight FakeQuantize (4-bit, and full-range
 *    8-bit with bias): one forward + backward in training mode (batch statistics), in eval mode
 *    (running statistics, observers off) and in training mode with BN frozen. Activation fake
 *    quant is off on both sides (observers still run), so the output is a continuous function
 *    of the conv and the comparison is tight; the weight fake quant is on, and its input W * sf
 *    and per-channel scales must agree bit for bit (same float32 operations), so the quantized
 *    weights are identical and only conv/BN summation order differs.
 *    Tolerances (measured differences are 1-4 float32 ulps, 20x or more below them): weight
 *    scales exact; output and loss 1e-6 abs + 1e-5 rel; running stats 1e-6 abs + 1e-5 rel;
 *    gradients 1e-6 abs + 1e-4 rel (the largest input gradient is 5e-3; BN backward sums 144
 *    float32 terms per channel; the conv bias gradient under batch statistics is 0 up to 1e-8).
 *    LSQ (quant.learnable_scale), training mode, 4-bit without bias and full-range 8-bit with
 *    bias, against a weight fake quant _LearnableFakeQuantize (per-channel symmetric,
 *    use_grad_scaling): both set the learned scales from the observer in this forward (exact,
 *    as above), and PyTorch's grad_factor must be 1 / sqrt(numel * qmax) with numel the whole
 *    weight tensor's. Output, loss, gradients and running stats with the tolerances above
 *    (measured at most 0.05 of them; output 4.8e-7, loss exact). The learned scales' gradient
 *    is a 27-term float32 sum per channel of grad_factor * dy * (round(x/s) - x/s), qmin or
 *    qmax in place of the bracket where clipped, with dy the conv weight gradient (ulps apart):
 *    within 3e-5 of the channel's sum |term| (float64, from the reference); measured 1.5e-6
 *    (activation LSQ scales are not compared: their fake quant is off). With N = one
 *    channel's count (before 9027479) every term is sqrt(8) = 2.83 times larger: the gradients
 *    move by at least 0.16 of sum |term| here, 5000x the tolerance (the test checks that each
 *    channel's would move by over 10x; with the old N it fails on all 16 channels).
 *    Then the same unit with every fake quant on, three forwards: observe, then fake-quantize
 *    with the fresh qparams (tolerances at sequence()).
 * 2. BN folding. PTQ prepare vs torch.nn.utils.fusion.fuse_conv_bn_eval and QAT convert vs
 *    convert_fx / convert_to_reference_fx (observers disabled first) on the post-step unit
 *    state. We fold with sf = gamma / sqrt(var + eps), the scale training used (docs/design.md: delayed folding);
 *    PyTorch's fold uses gamma * rsqrt(var + eps), up to 3 roundings away: folded weights agree
 *    within 4e-7 relative (about 7 units of roundoff; measured at most 0.5 of it), biases
 *    within 4e-7 * (|beta| + |(b - mean) * sf|); our PTQ-folded weight equals
 *    W * (gamma / sqrt(var + eps)) as PyTorch computes it during QAT, exactly. Integer weights:
 *    ours = clamp(PyTorch's, qmin, qmax) exactly (PyTorch's qint8 convert does not clamp to a
 *    4-bit range: the w4 case holds three 8s); weight scales exact.
 * 3. FashionCNN QAT W4A8, 10 SGD steps from fashion_cnn_steps.h5's init, against FX
 *    prepare_qat_fx with one FakeQuantize per quantization point (the script removes FX's extra
 *    calls after max_pool2d/permute/flatten; see it). Float32 rounding moves activation scales
 *    by ~1e-5, which flips fake-quant roundings of whole tensors: PyTorch's own float32 reruns
 *    (2-4 threads, with and without mkldnn) differ from each other by 5e-4 in the first loss
 *    and by up to 6e-3 after 10 steps, and their first-step gradients by 2-4% (relative L2).
 *    Ours is one more such rerun. So the loss of step s must agree within 1e-5 relative + 3x
 *    the largest drift of steps 0..s (chaos only grows); activation observer ranges and scales
 *    within 1e-6 relative + 3x their drift, zero points exactly (one off only where PyTorch's
 *    min / scale lies within 3x its drift of a rounding tie); weight scales within 1e-6
 *    relative + 5x drift (the max over 128 channels of fc1 is the spikiest statistic: ours
 *    sits at 1.8x PyTorch's largest rerun difference); step-0 gradients within relative L2
 *    distance 0.01 + 3x drift. A wrong observer order, averaging constant or qparams formula
 *    moves the activation scales far more: FX's unmodified graph, which updates the conv units'
 *    observers two and three times per step, moves relu1's scale by 0.2% (100x its tolerance)
 *    and relu2's by 3%; its losses stay within the chaos (3.4e-3), so the losses alone would
 *    not tell. Fake-quantizing with the previous step's qparams is invisible here (the
 *    observers see the same data); the sequence in part 1 catches it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"
#include "qat/qat.h"
#include "tests/common/graph_util.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

static char ref[4096];

static float *load(const char *name, int64_t *n) { return qt_test_load_f32_n(ref, name, n); }

/* Index of graph tensor `tensor`; -1 after a failed check when g has none. */
static int tensor_index(const qt_graph *g, const char *tensor) {
  int t = qt_graph_find_tensor(g, tensor);
  if (t < 0) qt_test_fail("graph %s has no tensor %s", g->name, tensor);
  return t;
}

static float load1(const char *name) {
  float *v = load(name, NULL);
  float x = v[0];
  free(v);
  return x;
}

/* Copies reference dataset `name` into graph tensor `tensor`, checking the element count. */
static void load_into(qt_graph *g, const char *tensor, const char *name) {
  int t = tensor_index(g, tensor);
  if (t < 0) return;
  int64_t n;
  float *v = load(name, &n);
  if (n != g->tensors[t].numel)
    qt_test_fail("%s: %lld elements in %s, tensor %s has %lld", name, (long long)n, ref, tensor,
                 (long long)g->tensors[t].numel);
  else
    memcpy(qt_graph_tensor_data(g, t), v, (size_t)n * sizeof(float));
  free(v);
}

/* Compares graph tensor `tensor` (its gradient when grad) with reference dataset `name`. */
static void close_data(qt_graph *g, const char *tensor, const char *name, float atol, float rtol, int grad) {
  int t = tensor_index(g, tensor);
  if (t < 0) return;
  int64_t n;
  float *want = load(name, &n);
  const float *got = grad ? g->grads + g->tensors[t].offset : qt_graph_tensor_data(g, t);
  if (n != g->tensors[t].numel)
    qt_test_fail("%s: %lld elements, want %lld", name, (long long)g->tensors[t].numel, (long long)n);
  else
    qt_test_close(name, got, want, n, atol, rtol);
  free(want);
}
static void close_tensor(qt_graph *g, const char *tensor, const char *name, float atol, float rtol) {
  close_data(g, tensor, name, atol, rtol, 0);
}
static void close_grad(qt_graph *g, const char *tensor, const char *name, float atol, float rtol) {
  close_data(g, tensor, name, atol, rtol, 1);
}

/* The scales of q equal reference dataset `name` to the bit (one per channel). */
static void same_scales(const char *what, const qt_qstate *q, const char *name) {
  int64_t n;
  float *want = load(name, &n);
  if (n != q->channels) qt_test_fail("%s: %lld scales, want %d", what, (long long)n, q->channels);
  else qt_test_close(what, q->scale, want, n, 0, 0);
  free(want);
}

static qt_node *node(qt_graph *g, const char *name) {
  int i = qt_graph_find_node(g, name);
  QT_ASSERT(i >= 0, "graph %s has no node %s", g->name, name);
  return &g->nodes[i];
}

static qt_quantizer_config qat_config(int wbits, int abits) {
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qc.weight_observer = QT_OBSERVER_MOVING_AVERAGE;
  qc.activation_observer = QT_OBSERVER_MOVING_AVERAGE;
  return qc;
}

/* g prepared as the oneDNN quantizer annotates it; lsq: quant.learnable_scale (every quantizer
 * learns its scales, LSQ). */
static qt_graph *prepare_lsq(qt_graph *g, int wbits, int abits, qt_prepare_mode mode, int lsq) {
  char err[QT_ERR_LEN];
  qt_quantizer_config qc = qat_config(wbits, abits);
  qc.learnable_scale = lsq;
  qt_annotations a;
  /* VNNI: 8-bit weights use the full range [-128, 127], as the PyTorch qconfig */
  if (qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err)) {
    qt_test_fail("quantizer: %s", err);
    return NULL;
  }
  qt_graph *p = qt_prepare(g, &a, mode, err);
  if (!p) qt_test_fail("prepare %s: %s", g->name, err);
  qt_annotations_free(&a);
  return p;
}

static qt_graph *prepare(qt_graph *g, int wbits, int abits, qt_prepare_mode mode) {
  return prepare_lsq(g, wbits, abits, mode, 0);
}

/* ---- 1. the conv -> BN -> ReLU unit ------------------------------------------------------- */
enum { UN = 4, UH = 6, UW = 6, UC = 3, UOC = 8 };

/* input -> conv (3 -> 8, 3x3, pad 1) -> bn -> relu -> global average pool: the pool makes
 * per-class logits for the cross-entropy (PyTorch: y.mean((2, 3))). */
static qt_graph *unit_graph(int bias) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("unit");
  int x = qt_graph_input(g, "input", UH, UW, UC);
  x = qt_graph_conv2d(g, "conv", x, UOC, 3, 1, 1, 1, bias);
  x = qt_graph_batch_norm(g, "bn", x);
  x = qt_graph_relu(g, "relu", x);
  x = qt_graph_global_avg_pool(g, "gap", x);
  if (qt_graph_finalize(g, x, err)) {
    qt_test_fail("unit graph: %s", err);
    qt_graph_free(g);
    return NULL;
  }
  return g;
}

/* Loads unit/<c>/init/{conv.weight, conv.bias, bn.*} into the prepared unit (conv_bn names). */
static void unit_load_init(qt_graph *p, const char *c, int bias) {
  static const char *const bn[] = {"weight", "bias", "running_mean", "running_var"};
  char t[128], d[256];
  snprintf(d, sizeof d, "unit/%s/init/conv.weight", c);
  load_into(p, "conv.weight", d);
  if (bias) {
    snprintf(d, sizeof d, "unit/%s/init/conv.bias", c);
    load_into(p, "conv.bias", d);
  }
  for (int k = 0; k < 4; k++) {
    snprintf(t, sizeof t, "conv.bn.%s", bn[k]);
    snprintf(d, sizeof d, "unit/%s/init/bn.%s", c, bn[k]);
    load_into(p, t, d);
  }
}

/* LSQ: the gradient of the learned weight scales (tensor conv.weight_scale) against PyTorch's
 * _LearnableFakeQuantize, per channel within 3e-5 of the sum of |per-element term|; and the
 * comparison must tell LSQ's N = the whole weight tensor's count from one channel's count
 * (which makes every term sqrt(channels) times larger): that N must move every channel's
 * gradient by more than 10x its tolerance. */
static void unit_lsq_scale_grad(qt_graph *p, const char *c) {
  char d[256];
  qt_node *cb = node(p, "conv");
  const qt_qstate *q = cb->wq;
  const int t = tensor_index(p, "conv.weight_scale");
  if (t < 0) return;
  QT_CHECK(q->scale_param == t && q->channels == UOC && p->tensors[t].numel == UOC && !p->tensors[t].is_buffer);
  /* the learned scales started from the observer: PyTorch's, to the bit */
  snprintf(d, sizeof d, "unit/%s/wscale", c);
  close_tensor(p, "conv.weight_scale", d, 0, 0);
  /* PyTorch's grad_factor is 1 / sqrt(numel * quant_max) of the whole weight tensor */
  const int64_t numel = p->tensors[cb->param[QT_P_WEIGHT]].numel;
  snprintf(d, sizeof d, "unit/%s/lsq_grad_factor", c);
  const double gf = load1(d), ours = 1.0 / sqrt((double)numel * q->spec.qmax);
  if (!(numel == UOC * UC * 9 && fabs(gf - ours) <= 1e-6 * ours))
    qt_test_fail("unit %s: PyTorch's LSQ grad_factor %.9g, 1 / sqrt(%lld * %d) = %.9g", c, gf, (long long)numel,
                 q->spec.qmax, ours);
  int64_t n, nm;
  snprintf(d, sizeof d, "unit/%s/grad/weight_scale", c);
  float *want = load(d, &n);
  snprintf(d, sizeof d, "unit/%s/grad/weight_scale_mag", c);
  float *mag = load(d, &nm);
  const float *got = p->grads + p->tensors[t].offset;
  if (n != UOC || nm != UOC) {
    qt_test_fail("unit %s: %lld weight scale gradients and %lld magnitudes, want %d", c, (long long)n, (long long)nm,
                 UOC);
  } else {
    int distinguishing = 0;
    double worst = 0, worst_abs = 0;
    for (int k = 0; k < UOC; k++) {
      const double tol = 3e-5 * mag[k] + 1e-30, diff = fabs((double)got[k] - want[k]);
      if (diff / tol > worst) worst = diff / tol;
      if (diff > worst_abs) worst_abs = diff;
      if (!(diff <= tol))
        qt_test_fail("unit %s: gradient of learned weight scale %d: %.9g, PyTorch %.9g (|diff| %.3g > %.3g)", c, k,
                     got[k], want[k], diff, tol);
      distinguishing += (sqrt((double)UOC) - 1.0) * fabs(want[k]) > 10 * tol;
    }
    if (getenv("QT_TEST_VERBOSE"))
      fprintf(stderr, "unit %s: weight scale gradients: max |diff| %.3g, worst |diff| / sum |term| %.3g\n", c,
              worst_abs, worst * 3e-5);
    if (distinguishing != UOC)
      qt_test_fail("unit %s: only %d of %d weight scale gradients would tell N = numel from N = numel / channels", c,
                   distinguishing, UOC);
  }
  free(want);
  free(mag);
}

/* One forward + backward of the prepared unit on unit/<c>/x, compared with PyTorch (lsq: the
 * weight quantizer learns its scales). */
static void unit_step(qt_graph *p, const char *c, int lsq) {
  char d[256];
  snprintf(d, sizeof d, "unit/%s/meta", c);
  int64_t ms[8];
  int nd;
  int32_t *meta = qt_test_load_i32(ref, d, ms, &nd);
  const int bias = meta[0], qmin = meta[1], qmax = meta[2], mode = meta[3];
  free(meta);
  qt_node *cb = node(p, "conv");
  QT_CHECK(cb->op == QT_OP_CONV_BN && cb->wq && cb->wq->spec.qmin == qmin && cb->wq->spec.qmax == qmax);
  QT_CHECK((cb->param[QT_P_BIAS] >= 0) == bias);
  QT_CHECK((cb->wq->scale_param >= 0) == lsq);
  qt_graph_set_training(p, mode != 1);
  qt_freeze_bn(p, mode == 2);

  int64_t n;
  snprintf(d, sizeof d, "unit/%s/x", c);
  float *x = load(d, &n);
  QT_CHECK(n == UN * UH * UW * UC);
  snprintf(d, sizeof d, "unit/%s/labels", c);
  int32_t *labels = qt_test_load_i32(ref, d, ms, &nd);
  qt_ctx *ctx = qt_ctx_create();
  int64_t shape[4] = {UN, UH, UW, UC};
  qt_tensor *in = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
  in->requires_grad = 1;
  qt_tensor **vals = NULL;
  qt_tensor *out = qt_graph_forward_values(p, ctx, in, &vals);
  if (!out) {
    qt_test_fail("unit %s: forward: %s", c, p->error);
  } else {
    char what[256];
    /* the unit's output: the relu value (its fake quant is off) */
    snprintf(d, sizeof d, "unit/%s/y", c);
    float *y = load(d, &n);
    snprintf(what, sizeof what, "unit %s: output", c);
    qt_test_close(what, qt_f32(vals[node(p, "relu")->output]), y, n, 1e-6f, 1e-5f);
    free(y);
    /* the weight fake quant's scales: same observer on bit-identical W * sf */
    snprintf(d, sizeof d, "unit/%s/wscale", c);
    snprintf(what, sizeof what, "unit %s: weight scales", c);
    same_scales(what, cb->wq, d);

    qt_tensor *loss = qt_cross_entropy(ctx, out, labels, NULL);
    snprintf(d, sizeof d, "unit/%s/loss", c);
    float want = load1(d);
    snprintf(what, sizeof what, "unit %s: loss", c);
    qt_test_close(what, qt_f32(loss), &want, 1, 1e-6f, 1e-5f);
    qt_graph_zero_grad(p);
    qt_backward(ctx, loss);
    snprintf(d, sizeof d, "unit/%s/dx", c);
    float *dx = load(d, &n);
    snprintf(what, sizeof what, "unit %s: input gradient", c);
    if (!in->grad)
      qt_test_fail("%s: none", what);
    else
      qt_test_close(what, in->grad, dx, n, 1e-6f, 1e-4f);
    free(dx);
    static const char *const grads[][2] = {{"conv.weight", "conv.weight"},
                                           {"conv.bias", "conv.bias"},
                                           {"conv.bn.weight", "bn.weight"},
                                           {"conv.bn.bias", "bn.bias"}};
    for (int k = 0; k < 4; k++) {
      if (k == 1 && !bias) continue;
      snprintf(d, sizeof d, "unit/%s/grad/%s", c, grads[k][1]);
      close_grad(p, grads[k][0], d, 1e-6f, 1e-4f);
    }
    snprintf(d, sizeof d, "unit/%s/after/bn.running_mean", c);
    close_tensor(p, "conv.bn.running_mean", d, 1e-6f, 1e-5f);
    snprintf(d, sizeof d, "unit/%s/after/bn.running_var", c);
    close_tensor(p, "conv.bn.running_var", d, 1e-6f, 1e-5f);
    if (lsq) unit_lsq_scale_grad(p, c);
  }
  qt_ctx_free(ctx);
  free(labels);
  free(x);
}

/* Three training forwards with every fake quant on but gap.fq (PyTorch has no pool): each fake
 * quant must observe, then quantize with the qparams it just computed (a fake quant with the
 * previous call's qparams shifts the input grid by the range's 0.5-1.5% move and flips a
 * quarter of the outputs). Our conv output differs from PyTorch's by float32 ulps, so the
 * output qparams agree within 1e-5 relative and the outputs within 1 LSB on at most 1% of the
 * elements (near rounding ties); input qparams exactly (same input); weight scales 1e-5
 * relative (W * sf with running_var 1 ulp apart). */
static void sequence(void) {
  char d[256], what[128];
  qt_graph *g = unit_graph(1);
  if (!g) return;
  qt_graph *p = prepare(g, 4, 8, QT_PREPARE_QAT);
  qt_graph_free(g);
  if (!p) return;
  node(p, "gap.fq")->q->fake_quant = 0;
  static const char *const names[][2] = {{"conv.weight", "conv.weight"},
                                         {"conv.bias", "conv.bias"},
                                         {"conv.bn.weight", "bn.weight"},
                                         {"conv.bn.bias", "bn.bias"},
                                         {"conv.bn.running_mean", "bn.running_mean"},
                                         {"conv.bn.running_var", "bn.running_var"}};
  for (int k = 0; k < 6; k++) {
    snprintf(d, sizeof d, "seq/init/%s", names[k][1]);
    load_into(p, names[k][0], d);
  }
  qt_graph_set_training(p, 1);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_qstate *qin = node(p, "input.fq")->q, *qout = node(p, "relu.fq")->q, *wq = node(p, "conv")->wq;
  for (int step = 0; step < 3; step++) {
    int64_t n;
    snprintf(d, sizeof d, "seq/%d/x", step);
    float *x = load(d, &n);
    qt_ctx_reset(ctx);
    int64_t shape[4] = {UN, UH, UW, UC};
    qt_tensor **vals = NULL;
    if (!qt_graph_forward_values(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x), &vals)) {
      qt_test_fail("sequence step %d: forward: %s", step, p->error);
      free(x);
      break;
    }
    float *qp = NULL;
    snprintf(d, sizeof d, "seq/%d/input_qparams", step);
    qp = load(d, NULL);
    if (qin->scale[0] != qp[0] || qin->zero_point[0] != (int32_t)qp[1])
      qt_test_fail("sequence step %d: input.fq scale %.9g zero point %d, PyTorch %.9g %d", step, qin->scale[0],
                   qin->zero_point[0], qp[0], (int)qp[1]);
    free(qp);
    snprintf(d, sizeof d, "seq/%d/output_qparams", step);
    qp = load(d, NULL);
    const float s_out = qp[0];
    if (!(fabsf(qout->scale[0] - qp[0]) <= 1e-5f * qp[0]) || qout->zero_point[0] != (int32_t)qp[1])
      qt_test_fail("sequence step %d: relu.fq scale %.9g zero point %d, PyTorch %.9g %d", step, qout->scale[0],
                   qout->zero_point[0], qp[0], (int)qp[1]);
    free(qp);
    snprintf(d, sizeof d, "seq/%d/wscale", step);
    float *ws = load(d, &n);
    snprintf(what, sizeof what, "sequence step %d: weight scales", step);
    qt_test_close(what, wq->scale, ws, n, 0, 1e-5f);
    free(ws);
    snprintf(d, sizeof d, "seq/%d/running_var", step);
    close_tensor(p, "conv.bn.running_var", d, 1e-6f, 1e-5f);
    snprintf(d, sizeof d, "seq/%d/y", step);
    float *y = load(d, &n);
    const float *got = qt_f32(vals[node(p, "relu.fq")->output]);
    int64_t flips = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double diff = fabs((double)got[i] - y[i]);
      worst = diff > worst ? diff : worst;
      flips += diff > 0.5 * s_out;
    }
    if (flips > n / 100 || worst > 1.01 * s_out)
      qt_test_fail(
          "sequence step %d: %lld of %lld outputs of relu.fq differ from PyTorch by a step (allowed %lld), "
          "largest difference %.3g = %.2f LSB (allowed 1)",
          step, (long long)flips, (long long)n, (long long)(n / 100), worst, worst / s_out);
    free(y);
    free(x);
  }
  qt_ctx_free(ctx);
  qt_graph_free(p);
}

/* ---- 2. BN folding ---------------------------------------------------------------------- */
/* |got - want| <= 4e-7 * scale[i] elementwise (scale: the magnitude of the terms). */
static void close_scaled(const char *what, const float *got, const float *want, const double *scale, int64_t n) {
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double diff = fabs((double)got[i] - want[i]), tol = 4e-7 * scale[i];
    if (diff / scale[i] > worst) worst = diff / scale[i];
    if (!(diff <= tol)) {
      if (bad < 5)
        fprintf(stderr, "%s: mismatch at %lld: got %.9g want %.9g (tolerance %.3g)\n", what, (long long)i, got[i],
                want[i], tol);
      bad++;
    }
  }
  if (bad)
    qt_test_fail("%s: %lld of %lld differ, worst %.3g of the terms' magnitude", what, (long long)bad, (long long)n,
                 worst);
}

/* Checks a folded conv (weight Wf, bias bf) against PyTorch's fold of the same parameters:
 * Wf within 4e-7 relative of `want_w`; bf within 4e-7 of |beta| + |(b - mean) * sf|. */
static void check_fold(const char *what, const float *Wf, const float *bf, const float *want_w, const float *want_b,
                       const float *b, const float *gamma, const float *beta, const float *mean, const float *var) {
  const int64_t inner = UC * 9;
  double wmag[UOC * UC * 9], bmag[UOC];
  for (int o = 0; o < UOC; o++) {
    double sf = (double)gamma[o] / sqrt((double)var[o] + 1e-5);
    for (int64_t k = 0; k < inner; k++) wmag[o * inner + k] = fabs((double)want_w[o * inner + k]) + 1e-30;
    bmag[o] = fabs((double)beta[o]) + fabs(((b ? b[o] : 0.0) - mean[o]) * sf) + 1e-30;
  }
  char w[256];
  snprintf(w, sizeof w, "%s: folded weight", what);
  close_scaled(w, Wf, want_w, wmag, UOC * inner);
  snprintf(w, sizeof w, "%s: folded bias", what);
  close_scaled(w, bf, want_b, bmag, UOC);
}

static void fold_ptq(const char *c, int bias) {
  char d[256], what[128];
  qt_graph *g = unit_graph(bias);
  if (!g) return;
  static const char *const names[] = {"conv.weight", "conv.bias",       "bn.weight",
                                      "bn.bias",     "bn.running_mean", "bn.running_var"};
  float *v[6] = {0};
  for (int k = 0; k < 6; k++) {
    if (k == 1 && !bias) continue;
    snprintf(d, sizeof d, "fold/%s/init/%s", c, names[k]);
    load_into(g, names[k], d);
    v[k] = load(d, NULL);
  }
  qt_graph *p = prepare(g, 8, 8, QT_PREPARE_PTQ);
  if (p) {
    qt_node *cv = node(p, "conv");
    QT_CHECK(cv->op == QT_OP_CONV2D && cv->param[QT_P_BIAS] >= 0 && qt_graph_find_node(p, "bn") < 0);
    const float *Wf = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.weight"));
    const float *bf = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bias"));
    snprintf(d, sizeof d, "fold/%s/fused/weight", c);
    float *fw = load(d, NULL);
    snprintf(d, sizeof d, "fold/%s/fused/bias", c);
    float *fb = load(d, NULL);
    snprintf(what, sizeof what, "PTQ fold (%s) vs fuse_conv_bn_eval", c);
    check_fold(what, Wf, bf, fw, fb, v[1], v[2], v[3], v[4], v[5]);
    snprintf(d, sizeof d, "fold/%s/train_formula/weight", c);
    float *tw = load(d, NULL);
    snprintf(what, sizeof what, "PTQ fold (%s) vs W * (gamma / sqrt(var + eps))", c);
    qt_test_close(what, Wf, tw, UOC * UC * 9, 0, 0);
    free(fw);
    free(fb);
    free(tw);
  }
  for (int k = 0; k < 6; k++) free(v[k]);
  qt_graph_free(p);
  qt_graph_free(g);
}

/* The convert of a unit that just ran unit/<c>'s step, against convert_fx. The running stats
 * are first set to PyTorch's post-step values (compared by unit_step), so both fold the same
 * numbers and only the fold formula differs. */
static void fold_qat_convert(qt_graph *p, const char *c, int bias) {
  char d[256], what[128], err[QT_ERR_LEN];
  snprintf(d, sizeof d, "unit/%s/after/bn.running_mean", c);
  load_into(p, "conv.bn.running_mean", d);
  snprintf(d, sizeof d, "unit/%s/after/bn.running_var", c);
  load_into(p, "conv.bn.running_var", d);
  qt_graph *cg = qt_convert(p, err);
  if (!cg) {
    qt_test_fail("convert unit %s: %s", c, err);
    return;
  }
  const float *b = bias ? qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bias")) : NULL;
  const float *gamma = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bn.weight"));
  const float *beta = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bn.bias"));
  const float *mean = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bn.running_mean"));
  const float *var = qt_graph_tensor_data(p, qt_graph_find_tensor(p, "conv.bn.running_var"));
  qt_node *cv = node(cg, "conv");
  QT_CHECK(cv->op == QT_OP_CONV2D && cv->wq && cv->wq->qweight);
  const float *Wf = qt_graph_tensor_data(cg, cv->param[QT_P_WEIGHT]);
  const float *bf = qt_graph_tensor_data(cg, cv->param[QT_P_BIAS]);
  snprintf(d, sizeof d, "unit/%s/convert/weight", c);
  float *fw = load(d, NULL);
  snprintf(d, sizeof d, "unit/%s/convert/bias", c);
  float *fb = load(d, NULL);
  snprintf(what, sizeof what, "QAT convert (%s) vs convert_to_reference_fx", c);
  check_fold(what, Wf, bf, fw, fb, b, gamma, beta, mean, var);
  /* integers: ours are PyTorch's clamped to the trained range; scales exact */
  int64_t ms[8];
  int nd;
  snprintf(d, sizeof d, "unit/%s/convert/qweight", c);
  int32_t *qw = qt_test_load_i32(ref, d, ms, &nd);
  const int qmin = cv->wq->spec.qmin, qmax = cv->wq->spec.qmax;
  int64_t bad = 0, n = qt_test_numel(ms, nd);
  QT_CHECK(n == cv->wq->n_qweight);
  for (int64_t i = 0; i < n && n == cv->wq->n_qweight; i++) {
    int32_t want = qw[i] < qmin ? qmin : qw[i] > qmax ? qmax : qw[i];
    if (cv->wq->qweight[i] != want && bad++ < 5)
      fprintf(stderr, "QAT convert (%s): integer weight %lld is %d, PyTorch %d (clamped %d)\n", c, (long long)i,
              cv->wq->qweight[i], qw[i], want);
  }
  if (bad)
    qt_test_fail("QAT convert (%s): %lld of %lld integer weights differ from convert_fx", c, (long long)bad,
                 (long long)n);
  snprintf(d, sizeof d, "unit/%s/convert/wscale", c);
  snprintf(what, sizeof what, "QAT convert (%s): weight scales", c);
  same_scales(what, cv->wq, d);
  free(qw);
  free(fw);
  free(fb);
  qt_graph_free(cg);
}

static void units(void) {
  static const struct {
    const char *first, *then; /* `then` continues from `first`'s step */
    int bias, wbits, convert, lsq;
  } cases[] = {{"w4_train", NULL, 0, 4, 1, 0},
               {"w8b_train", "w8b_eval", 1, 8, 1, 0},
               {"w4b_frozen", NULL, 1, 4, 0, 0},
               {"w4_lsq_train", NULL, 0, 4, 0, 1},
               {"w8b_lsq_train", NULL, 1, 8, 0, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    qt_graph *g = unit_graph(cases[k].bias);
    if (!g) continue;
    qt_graph *p = prepare_lsq(g, cases[k].wbits, 8, QT_PREPARE_QAT, cases[k].lsq);
    qt_graph_free(g);
    if (!p) continue;
    /* activation fake quant off (observers on), weight fake quant on */
    int n_fq = 0;
    for (int i = 0; i < p->n_nodes; i++)
      if (p->nodes[i].op == QT_OP_FAKE_QUANT) {
        p->nodes[i].q->fake_quant = 0;
        n_fq++;
      }
    QT_CHECK(n_fq == 3); /* input.fq, relu.fq, gap.fq */
    unit_load_init(p, cases[k].first, cases[k].bias);
    unit_step(p, cases[k].first, cases[k].lsq);
    if (cases[k].convert) fold_qat_convert(p, cases[k].first, cases[k].bias);
    if (cases[k].then) {
      /* the same prepared unit (its weight observer state), PyTorch's post-step parameters and
       * running statistics */
      unit_load_init(p, cases[k].then, cases[k].bias);
      unit_step(p, cases[k].then, cases[k].lsq);
    }
    qt_graph_free(p);
  }
}

/* ---- 3. FashionCNN QAT steps ------------------------------------------------------------ */
#define STEPS 10
#define BATCH 32

static const char *const points[] = {"input", "relu1", "relu2", "relu3", "fc2"};

/* Relative L2 distance of got from want. */
static double rel_l2(const float *got, const float *want, int64_t n) {
  double d = 0, w = 0;
  for (int64_t i = 0; i < n; i++) {
    d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    w += (double)want[i] * want[i];
  }
  return sqrt(d / (w > 0 ? w : 1));
}

static void check_range(const char *what, double got, double want, double drift) {
  double tol = 1e-6 * fabs(want) + 3.0 * drift;
  if (!(fabs(got - want) <= tol))
    qt_test_fail("%s: %.9g, PyTorch %.9g (difference %.3g, tolerance %.3g: 3x PyTorch's own float32 drift %.3g)", what,
                 got, want, fabs(got - want), tol, drift);
}

static void fashion_cnn_steps(void) {
  char steps_ref[4096], err[QT_ERR_LEN], name[256];
  snprintf(steps_ref, sizeof steps_ref, "%s", qt_test_path("tests/ref/fashion_cnn_steps.h5"));
  qt_graph *g = qt_model_build("fashion_cnn", err);
  if (!g) {
    qt_test_fail("fashion_cnn: %s", err);
    return;
  }
  qt_test_load_graph_tensors(g, steps_ref, "init/");
  double checksum = 0;
  const int w1 = qt_graph_find_tensor(g, "conv1.weight");
  for (int64_t k = 0; w1 >= 0 && k < g->tensors[w1].numel; k++) checksum += qt_graph_tensor_data(g, w1)[k];
  float want_sum = load1("fx/init_checksum");
  if (!(fabs(checksum - want_sum) <= 1e-5 * fabs(want_sum) + 1e-6))
    qt_test_fail(
        "fashion_cnn_steps.h5's init differs from the one qat.h5 was made from (conv1.weight sums %.9g vs "
        "%.9g): rerun tests/ref/make_ref_qat.py",
        checksum, want_sum);
  qt_graph *p = prepare(g, 4, 8, QT_PREPARE_QAT);
  qt_graph_free(g);
  if (!p) return;
  int n_fq = 0;
  for (int i = 0; i < p->n_nodes; i++) n_fq += p->nodes[i].op == QT_OP_FAKE_QUANT;
  QT_CHECK(n_fq == 5); /* the FX reference's five points */

  int64_t ishape[8], lshape[8];
  int nd;
  float *images = qt_test_load_f32(steps_ref, "images", ishape, &nd);
  int32_t *labels = qt_test_load_i32(steps_ref, "labels", lshape, &nd);
  QT_CHECK(ishape[0] >= STEPS * BATCH);
  float *losses = load("fx/losses", NULL), *drift = load("fx/drift", NULL);

  qt_optim_config oc = {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .weight_decay = 5e-4f};
  qt_optim *opt = qt_optim_create(&oc, p->n_params);
  qt_ctx *ctx = qt_ctx_create();
  float got[STEPS];
  float *x = malloc(sizeof(float) * BATCH * 784);
  int ok = 1;
  for (int s = 0; s < STEPS && ok; s++) {
    for (int i = 0; i < BATCH * 784; i++) x[i] = (images[s * BATCH * 784 + i] / 255.0f - 0.2860f) / 0.3530f;
    qt_ctx_reset(ctx);
    int64_t shape[4] = {BATCH, 28, 28, 1};
    qt_tensor *logits = qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
    if (!logits) {
      qt_test_fail("fashion_cnn QAT step %d: %s", s, p->error);
      ok = 0;
      break;
    }
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels + s * BATCH, NULL);
    got[s] = qt_f32(loss)[0];
    qt_graph_zero_grad(p);
    qt_backward(ctx, loss);
    if (s == 0)
      for (int i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].is_buffer) continue;
        const char *tn = p->tensors[i].name;
        int fc1 = strcmp(tn, "fc1.weight") == 0;
        int64_t n;
        snprintf(name, sizeof name, "fx/grad0/%s", fc1 ? "fc1.weight_rows0to7" : tn);
        float *want = load(name, &n);
        snprintf(name, sizeof name, "fx/grad0_drift/%s", fc1 ? "fc1.weight_rows0to7" : tn);
        double tol = 0.01 + 3.0 * load1(name);
        double d = rel_l2(p->grads + p->tensors[i].offset, want, n);
        if (!(d <= tol))
          qt_test_fail("step 0 gradient of %s: relative L2 distance %.3g from PyTorch, tolerance %.3g", tn, d, tol);
        free(want);
      }
    qt_optim_step(opt, p->params, p->grads, 0.005f);
  }
  float drift_so_far = 0;
  for (int s = 0; s < STEPS && ok; s++) {
    drift_so_far = drift[s] > drift_so_far ? drift[s] : drift_so_far;
    float tol = 1e-5f * fabsf(losses[s]) + 3.0f * drift_so_far;
    if (!(fabsf(got[s] - losses[s]) <= tol))
      qt_test_fail(
          "QAT step %d: loss %.6f, PyTorch FX %.6f (difference %.2g, tolerance %.2g: 3x PyTorch's float32 "
          "drift %.2g)",
          s, got[s], losses[s], fabsf(got[s] - losses[s]), tol, drift_so_far);
  }
  for (int k = 0; ok && k < 5; k++) {
    snprintf(name, sizeof name, "%s.fq", points[k]);
    int id = qt_graph_find_node(p, name);
    if (id < 0 || !p->nodes[id].q) {
      qt_test_fail("prepared fashion_cnn has no fake quant %s", name);
      continue;
    }
    qt_qstate *q = p->nodes[id].q;
    char what[128], d[128];
    static const char *const fields[] = {"min", "max", "scale"};
    double mine[3] = {q->obs.min[0], q->obs.max[0], q->scale[0]};
    for (int f = 0; f < 3; f++) {
      snprintf(d, sizeof d, "fx/act/%s_%s", points[k], fields[f]);
      double want = load1(d);
      snprintf(d, sizeof d, "fx/act_drift/%s_%s", points[k], fields[f]);
      double dr = load1(d);
      snprintf(what, sizeof what, "%s after %d steps: observer %s", name, STEPS, fields[f]);
      check_range(what, mine[f], want, dr);
    }
    snprintf(d, sizeof d, "fx/act/%s_zp", points[k]);
    int64_t zs[8];
    int32_t *zp = qt_test_load_i32(ref, d, zs, &nd);
    /* zero point = qmin - round(min / scale): exact unless PyTorch's min / scale lies within
     * 3x its float32 drift of a rounding tie */
    double v[4];
    static const char *const zf[] = {"act/%s_min", "act/%s_scale", "act_drift/%s_min", "act_drift/%s_scale"};
    for (int f = 0; f < 4; f++) {
      char fmt[64];
      snprintf(fmt, sizeof fmt, "fx/%s", zf[f]);
      snprintf(d, sizeof d, fmt, points[k]);
      v[f] = load1(d);
    }
    double r = v[0] / v[1], margin = 3.0 * (v[2] / v[1] + fabs(r) * v[3] / v[1]);
    int tie = fabs(r - floor(r) - 0.5) <= margin;
    if (q->zero_point[0] != zp[0] && !(tie && abs(q->zero_point[0] - zp[0]) == 1))
      qt_test_fail("%s after %d steps: zero point %d, PyTorch %d", name, STEPS, q->zero_point[0], zp[0]);
    free(zp);
  }
  static const char *const layers[] = {"conv1", "conv2", "fc1", "fc2"};
  for (int k = 0; ok && k < 4; k++) {
    qt_node *n = node(p, layers[k]);
    int64_t cnt;
    snprintf(name, sizeof name, "fx/wscale/%s", layers[k]);
    float *want = load(name, &cnt);
    snprintf(name, sizeof name, "fx/wscale_drift/%s", layers[k]);
    float dr = load1(name);
    snprintf(name, sizeof name, "%s weight scales after %d steps", layers[k], STEPS);
    QT_CHECK(n->wq && n->wq->channels == cnt);
    if (n->wq && n->wq->channels == cnt) qt_test_close(name, n->wq->scale, want, cnt, 5.0f * dr, 1e-6f);
    free(want);
  }
  free(x);
  free(images);
  free(labels);
  free(losses);
  free(drift);
  qt_ctx_free(ctx);
  qt_optim_free(opt);
  qt_graph_free(p);
}

int main(void) {
  snprintf(ref, sizeof ref, "%s", qt_test_path("tests/ref/qat.h5"));
  units();
  sequence();
  fold_ptq("nobias", 0);
  fold_ptq("bias", 1);
  fashion_cnn_steps();
  return qt_test_finish();
}
