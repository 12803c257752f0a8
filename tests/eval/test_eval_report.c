/* The three-stage report (eval/report.h) on FashionCNN (PyTorch's initialization, W8A8 PTQ
 * calibrated on synthetic images, converted, lowered) over a synthetic test set whose labels
 * are the fp32 model's top-1 on even images and its runner-up on odd ones (fp32 accuracy 1/2):
 * - every count is recomputed independently (the Q/DQ graph's exact reference, lowered run):
 *   accuracies (the float32 executor's within the images it disagrees with exact on), top-1
 *   agreement, the LSB histogram (sums to images x classes, max within the 2-LSB contract);
 * - the points: input, relu1..3, fc2 (the output) and the four weights, each measured; the
 *   input point's SQNR recomputed by hand from its qparams; the device identical at the input;
 *   a weight's SQNR recomputed from its integers;
 * - probes on the first 50 images only; without an fp32 model; ResCNN's conv -> bn points,
 *   read from the folded conv in the Q/DQ graph, compared with the fp32 graph's bn output;
 * - the verdict names the stage that lost accuracy (synthetic counts), flags > 2 LSB, and tells
 *   a partition over 1 LSB alone from rounding that grows (synthetic, and a device running a
 *   broken copy of conv2: only relu2's partition is named);
 * - every partition alone within 1 LSB on the W8A8 device;
 * - JSON holds the keys and no inf/nan; inference timing returns positive speeds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/exact.h"
#include "eval/report.h"
#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

enum { N_IMAGES = 200, BATCH = 64 };

static qt_loader_config loader_config(void) {
  qt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = BATCH;
  for (int c = 0; c < 4; c++) {
    lc.mean[c] = 0.2860f;
    lc.std[c] = 0.3530f;
  }
  return lc;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* Runs fn(state, x, n, labels) over the set's batches. */
typedef void (*batch_fn)(void *state, const float *x, int n, const int32_t *labels);
static void for_batches(const qt_dataset *ds, batch_fn fn, void *state) {
  char err[QT_ERR_LEN];
  qt_loader_config lc = loader_config();
  qt_loader *l = qt_loader_create(ds, &lc, err);
  QT_ASSERT(l, "%s", err);
  qt_loader_start_epoch(l, 0);
  const float *x;
  const int32_t *labels;
  int n;
  while ((n = qt_loader_next(l, &x, &labels)) > 0) fn(state, x, n, labels);
  qt_loader_free(l);
}

typedef struct {
  qt_graph *g;
  qt_ctx *ctx;
  int32_t *labels; /* label_from_model: written */
  int64_t seen, correct;
  qt_device *m;      /* count_device */
  qt_sqnr_sum input; /* input_sqnr */
  const qt_node *q;
} run_state;

static const float *forward(run_state *s, const float *x, int n) {
  qt_ctx_reset(s->ctx);
  const int64_t shape[4] = {n, 28, 28, 1};
  qt_tensor *y = qt_graph_forward(s->g, s->ctx, qt_tensor_wrap(s->ctx, QT_F32, 4, shape, (void *)x));
  QT_ASSERT(y, "%s", s->g->error);
  return qt_f32(y);
}

static void label_from_model(void *state, const float *x, int n, const int32_t *labels) {
  (void)labels;
  run_state *s = state;
  const float *y = forward(s, x, n);
  for (int i = 0; i < n; i++) {
    /* even images: the fp32 top-1; odd ones: its runner-up (fp32 accuracy exactly 1/2) */
    const float *o = y + i * 10;
    const int top = argmax(o, 10);
    int second = top == 0 ? 1 : 0;
    for (int k = 0; k < 10; k++)
      if (k != top && o[k] > o[second]) second = k;
    s->labels[s->seen + i] = (s->seen + i) % 2 ? second : top;
  }
  s->seen += n;
}

static void count_graph(void *state, const float *x, int n, const int32_t *labels) {
  run_state *s = state;
  const float *y = forward(s, x, n);
  for (int i = 0; i < n; i++) s->correct += argmax(y + i * 10, 10) == labels[i];
  s->seen += n;
}

static qt_exact *exact_ref; /* count_exact */
static int64_t exact_ties;  /* count_exact: images whose two largest logits are equal */
static void count_exact(void *state, const float *x, int n, const int32_t *labels) {
  run_state *s = state;
  char err[QT_ERR_LEN];
  float out[BATCH * 10];
  QT_ASSERT(qt_exact_run(exact_ref, out, x, n, err) == 0, "%s", err);
  for (int i = 0; i < n; i++) {
    const int k = argmax(out + i * 10, 10);
    s->correct += k == labels[i];
    int equal = 0;
    for (int j = 0; j < 10; j++) equal += j != k && out[i * 10 + j] == out[i * 10 + k];
    exact_ties += equal > 0;
  }
  s->seen += n;
}

static void count_device(void *state, const float *x, int n, const int32_t *labels) {
  run_state *s = state;
  char err[QT_ERR_LEN];
  float out[BATCH * 10];
  QT_ASSERT(qt_device_run(s->m, out, x, n, err) == 0, "%s", err);
  for (int i = 0; i < n; i++) s->correct += argmax(out + i * 10, 10) == labels[i];
  s->seen += n;
}

/* The input point by hand: quantize/dequantize the normalized images with its qparams. */
static void input_sqnr(void *state, const float *x, int n, const int32_t *labels) {
  (void)labels;
  run_state *s = state;
  const int64_t numel = (int64_t)n * 784;
  int32_t *q = malloc((size_t)numel * sizeof(int32_t));
  float *y = malloc((size_t)numel * sizeof(float));
  qt_quantize(q, x, numel, 1, 1, s->q->q->scale, s->q->q->zero_point, s->q->q->spec.qmin, s->q->q->spec.qmax);
  qt_dequantize(y, q, numel, 1, 1, s->q->q->scale, s->q->q->zero_point);
  qt_sqnr_add(&s->input, x, y, numel);
  free(q);
  free(y);
}

/* g PTQ W8A8 for oneDNN, calibrated on ds; the layer `fp32_layer` (unless NULL) left in fp32. */
static qt_graph *convert_w8a8(const qt_graph *g, const qt_dataset *ds, const char *fp32_layer) {
  char err[QT_ERR_LEN];
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  if (fp32_layer) {
    qc.n_overrides = 1;
    snprintf(qc.overrides[0].name, sizeof qc.overrides[0].name, "%s", fp32_layer);
    qc.overrides[0].fp32 = 1;
  }
  qt_graph *p = qt_test_prepare_onednn(g, &qc, QT_PREPARE_PTQ);
  run_state s = {p, qt_ctx_create(), NULL, 0, 0, NULL, {0, 0, 0}, NULL};
  qt_ctx_set_grad(s.ctx, 0);
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  for_batches(ds, count_graph, &s);
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  qt_ctx_free(s.ctx);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "%s", err);
  qt_graph_free(p);
  return c;
}

static const qt_report_point *find_point(const qt_report *r, const char *name) {
  for (int i = 0; i < r->n_points; i++)
    if (strcmp(r->points[i].name, name) == 0) return &r->points[i];
  qt_test_fail("report has no point '%s'", name);
  return NULL;
}

/* ResCNN has conv -> bn points without a relu: PTQ folds the bn into the conv, so the Q/DQ
 * graph reads the point from the folded conv. The point must be named and compared as the fp32
 * graph's bn output (non-trivial BN statistics make the two differ). block2.conv1 is left in fp32, so
 * the device has a fallback partition, which the report and its JSON list. */
static void check_folded_points(const qt_dataset *ds) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("res_cnn", err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 5);
  uint64_t seed = 11;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op != QT_OP_BATCH_NORM) continue;
    const int64_t C = g->tensors[n->param[QT_P_GAMMA]].numel;
    float *gamma = g->params + g->tensors[n->param[QT_P_GAMMA]].offset;
    float *beta = g->params + g->tensors[n->param[QT_P_BETA]].offset;
    float *mean = g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset;
    float *var = g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset;
    qt_test_fill_uniform(gamma, C, 0.5f, 1.5f, seed++);
    qt_test_fill_uniform(beta, C, -0.3f, 0.3f, seed++);
    qt_test_fill_uniform(mean, C, -0.5f, 0.5f, seed++);
    qt_test_fill_uniform(var, C, 0.2f, 0.6f, seed++);
  }
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_graph *qdq = convert_w8a8(g, ds, "block2.conv1"); /* one fp32 layer: a fallback partition */
  qt_device *m = qt_device_open(qdq, NULL, err);
  QT_ASSERT(m, "%s", err);
  qt_report r;
  qt_loader_config lc = loader_config();
  if (qt_report_run(g, qdq, m, ds, &lc, 64, &r, err)) {
    qt_test_fail("res_cnn report: %s", err);
  } else {
    int folded = 0;
    for (int i = 0; i < r.n_points; i++) {
      const qt_report_point *p = &r.points[i];
      if (p->kind != QT_POINT_ACTIVATION) continue;
      folded += strstr(p->name, ".bn2") != NULL;
      const double db = qt_sqnr_sum_db(&p->fp32_vs_qdq);
      if (p->fp32_vs_qdq.n == 0 || !(db > 25))
        qt_test_fail("res_cnn point %s: fp32 vs Q/DQ %.2f dB over %lld values", p->name, db,
                     (long long)p->fp32_vs_qdq.n);
    }
    if (folded != 2) qt_test_fail("res_cnn: %d points named after a folded bn (block*.bn2), want 2", folded);
    QT_CHECK(r.fallback_partitions > 0 && r.lsb.max_lsb <= 2.0);
    /* Every fallback partition listed with its nodes and reason, in the JSON too. */
    QT_CHECK(r.n_fallbacks == r.fallback_partitions);
    for (int i = 0; i < r.n_fallbacks; i++)
      if (!r.fallbacks[i].nodes[0] || !r.fallbacks[i].reason[0])
        qt_test_fail("res_cnn fallback %d: nodes '%s', reason '%s'", i, r.fallbacks[i].nodes, r.fallbacks[i].reason);
    char *json = qt_report_json(&r, "");
    char want[400];
    snprintf(want, sizeof want, "\"fallbacks\": [{\"nodes\": \"%s\", \"reason\": ", r.fallbacks[0].nodes);
    if (!strstr(json, want)) qt_test_fail("res_cnn JSON lacks %s:\n%s", want, json);
    free(json);
  }
  qt_device_free(m);
  qt_graph_free(qdq);
  qt_graph_free(g);
}

static void check_verdicts(void) {
  qt_report r;
  memset(&r, 0, sizeof r);
  r.images = 1000;
  r.has_fp32 = 1;
  r.fp32_correct = 900;
  r.qdq_correct = 876;
  r.device_correct = 876;
  r.output_scale = 0.1f;
  r.lsb.max_lsb = 1;
  char v[1536];
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v,
              "stage 1 (fp32 -> Q/DQ: quantization) lost 2.40 points; stage 2 (Q/DQ -> int8 device: lowering) "
              "lost 0.00 points") ||
      !strstr(v, "lost in stage 1"))
    qt_test_fail("verdict (stage 1): %s", v);
  r.qdq_correct = 900;
  r.device_correct = 890;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "stage 1 (fp32 -> Q/DQ: quantization) lost 0.00 points") || !strstr(v, "lowering) lost 1.00 points") ||
      !strstr(v, "lost in stage 2"))
    qt_test_fail("verdict (stage 2): %s", v);
  r.device_correct = 901;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "neither stage lost accuracy") || !strstr(v, "lost -0.10 points"))
    qt_test_fail("verdict (none): %s", v);
  if (strstr(v, "lowering bug")) qt_test_fail("verdict (1 LSB, the rule passes): %s", v);
  /* the device is judged by the agreement rule (within 1 output LSB, >= 99.9% identical top-1) */
  qt_device_agreement_init(&r.agreement, 0.1f);
  r.agreement.images = r.agreement.agree = 1000;
  r.lsb.max_lsb = r.agreement.max_lsb = 7;
  r.agreement.over_max_lsb = 3;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "7.0 output LSB") || !strstr(v, "lowering bug")) qt_test_fail("verdict (7 LSB): %s", v);
  r.lsb.max_lsb = r.agreement.max_lsb = 2;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "2.0 output LSB") || !strstr(v, "lowering bug")) qt_test_fail("verdict (2 LSB): %s", v);
  /* the float32 executor as far from the exact reference: fp32 ops near a rounding tie, not lowering */
  qt_device_agreement_init(&r.float_vs_exact, 0.1f);
  r.float_vs_exact.images = r.float_vs_exact.agree = 1000;
  r.float_vs_exact.max_lsb = 2;
  r.float_vs_exact.over_max_lsb = 1;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "as the float32 Q/DQ executor is (2.0 LSB, 100.00%)") || strstr(v, "a lowering bug"))
    qt_test_fail("verdict (2 LSB, the float32 executor too): %s", v);
  r.float_vs_exact.max_lsb = 1.999997; /* the same whole LSB count, up to float rounding (a ViT's PTQ run) */
  r.agreement.max_lsb = 2.000001;
  qt_report_verdict(&r, v, sizeof v);
  if (strstr(v, "a lowering bug")) qt_test_fail("verdict (2.000001 LSB, the float32 executor at 1.999997): %s", v);
  r.agreement.max_lsb = 2;
  r.float_vs_exact.max_lsb = 1; /* the executor closer: the device's own error */
  r.float_vs_exact.over_max_lsb = 0;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "a lowering bug")) qt_test_fail("verdict (2 LSB, the float32 executor at 1): %s", v);
  memset(&r.float_vs_exact, 0, sizeof r.float_vs_exact);
  r.lsb.max_lsb = r.agreement.max_lsb = 1;
  r.agreement.over_max_lsb = 0;
  r.agreement.agree = 998;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "99.80%") || !strstr(v, "lowering bug")) qt_test_fail("verdict (99.8%% top-1): %s", v);
  /* each partition judged alone: within 1 LSB everywhere, the difference is rounding growing */
  const int n_points = r.n_points;
  r.n_points = 3;
  memset(r.points, 0, 3 * sizeof r.points[0]);
  snprintf(r.points[0].name, sizeof r.points[0].name, "conv1");
  snprintf(r.points[1].name, sizeof r.points[1].name, "conv2.weight");
  r.points[1].kind = QT_POINT_WEIGHT;
  snprintf(r.points[2].name, sizeof r.points[2].name, "relu2");
  r.forced_images = 64;
  for (int i = 0; i < 3; i++)
    if (i != 1) r.points[i].forced_n = 640;
  r.points[2].forced_max = 1;
  r.points[2].forced_differ = 5;
  qt_report_verdict(&r, v, sizeof v);
  if (strstr(v, ": a lowering bug") || !strstr(v, "99.80% of images") ||
      !strstr(v,
              "every partition ending at a quantization point, judged alone on the device's own inputs (the "
              "first 64 images), keeps within 1 LSB of the exact reference: rounding that grows through the layers"))
    qt_test_fail("verdict (every partition within 1 LSB alone): %s", v);
  /* one partition alone over the rule: named, even when the device passes at the output */
  r.points[2].forced_max = 4;
  r.points[2].forced_over = 2;
  r.agreement.agree = 1000;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v,
              "the partition ending at 'relu2' is 4 LSB from the exact reference (2 of 640 integers more than 1 "
              "LSB apart): a lowering bug"))
    qt_test_fail("verdict (relu2 alone at 4 LSB): %s", v);
  memset(r.points, 0, 3 * sizeof r.points[0]);
  r.forced_images = 0;
  r.n_points = n_points;
  r.agreement.agree = 1000;
  r.has_fp32 = 0;
  r.lsb.max_lsb = r.agreement.max_lsb = 0;
  qt_report_verdict(&r, v, sizeof v);
  if (!strstr(v, "not measured")) qt_test_fail("verdict (no fp32): %s", v);
  if (!isnan(qt_report_stage1_loss(&r))) qt_test_fail("stage 1 loss without an fp32 model is not NaN");
}

/* A device that runs a broken copy of the Q/DQ graph (conv2's first output channel computed
 * with other integer weights): judged alone, the partition ending at relu2 is many LSB off and
 * named as a lowering bug, while the partitions before it and after it (on the device's own
 * inputs) stay within 1 LSB. */
static void check_broken_partition(const qt_graph *fp32, qt_graph *qdq, const qt_dataset *ds) {
  char err[QT_ERR_LEN];
  qt_graph *broken = qt_test_qdq_reload(qdq);
  const qt_node *conv2 = &broken->nodes[qt_graph_find_node(broken, "conv2")];
  QT_ASSERT(conv2->wq && conv2->wq->qweight, "conv2 has no integer weights");
  const int64_t per_channel = conv2->wq->n_qweight / conv2->attr.out_channels;
  for (int64_t k = 0; k < per_channel; k++) conv2->wq->qweight[k] = conv2->wq->qweight[k] > 0 ? -60 : 60;
  qt_device *m = qt_device_open(broken, NULL, err);
  QT_ASSERT(m, "%s", err);
  qt_report r;
  qt_loader_config lc = loader_config();
  if (qt_report_run((qt_graph *)fp32, qdq, m, ds, &lc, 64, &r, err)) {
    qt_test_fail("qt_report_run (broken conv2): %s", err);
  } else {
    char v[1536];
    qt_report_verdict(&r, v, sizeof v);
    printf("broken conv2: %s\n", v);
    if (!strstr(v, "the partition ending at 'relu2' is ") || !strstr(v, "a lowering bug"))
      qt_test_fail("verdict (broken conv2): %s", v);
    const char *fine[] = {"input", "relu1", "relu3", "fc2"};
    for (int i = 0; i < 4; i++) {
      const qt_report_point *p = find_point(&r, fine[i]);
      if (p && (p->forced_n == 0 || p->forced_max > 1))
        qt_test_fail("broken conv2: point %s alone: %lld integers, max %lld LSB", fine[i], (long long)p->forced_n,
                     (long long)p->forced_max);
    }
    const qt_report_point *p = find_point(&r, "relu2");
    if (p && !(p->forced_max > 10 && p->forced_over > 0))
      qt_test_fail("broken conv2: relu2 alone max %lld LSB, %lld over 1", (long long)p->forced_max,
                   (long long)p->forced_over);
  }
  qt_device_free(m);
  qt_graph_free(broken);
}

int main(void) {
  char err[QT_ERR_LEN];
  check_verdicts();

  qt_dataset ds;
  memset(&ds, 0, sizeof ds);
  ds.n = N_IMAGES;
  ds.h = ds.w = 28;
  ds.c = 1;
  ds.num_classes = 10;
  ds.images = malloc((size_t)N_IMAGES * 784);
  ds.labels = calloc(N_IMAGES, sizeof(int32_t));
  uint64_t seed = 7;
  for (int64_t i = 0; i < (int64_t)N_IMAGES * 784; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    /* mostly dark with bright strokes, like Fashion-MNIST */
    const uint32_t r = (uint32_t)(seed >> 33);
    ds.images[i] = (uint8_t)(r % 4 == 0 ? r % 256 : 0);
  }

  qt_graph *fp32 = qt_model_build("fashion_cnn", err);
  QT_ASSERT(fp32, "%s", err);
  qt_graph_init_params(fp32, 3);
  qt_graph_set_mode(fp32, QT_MODE_EVAL);
  int32_t *labels = malloc(N_IMAGES * sizeof(int32_t)); /* not ds.labels: the loader reads those */
  run_state s = {fp32, qt_ctx_create(), labels, 0, 0, NULL, {0, 0, 0}, NULL};
  qt_ctx_set_grad(s.ctx, 0);
  for_batches(&ds, label_from_model, &s);
  memcpy(ds.labels, labels, N_IMAGES * sizeof(int32_t));
  free(labels);
  qt_graph *qdq = convert_w8a8(fp32, &ds, NULL);
  qt_device *m = qt_device_open(qdq, NULL, err);
  QT_ASSERT(m, "%s", err);

  qt_report r;
  qt_loader_config lc = loader_config();
  if (qt_report_run(fp32, qdq, m, &ds, &lc, N_IMAGES, &r, err)) {
    qt_test_fail("qt_report_run: %s", err);
    return qt_test_finish();
  }
  /* Counts, recomputed. */
  QT_CHECK(r.images == N_IMAGES && r.has_fp32 && r.probe_images == N_IMAGES);
  QT_CHECK(r.fp32_correct == N_IMAGES / 2 && r.fp32_accuracy == 0.5);
  /* The Q/DQ graph's count is its exact reference's; the float32 executor's may differ by the
   * images whose top-1 differs between the two (float_vs_exact). */
  exact_ref = qt_exact_open(qdq, err);
  QT_ASSERT(exact_ref, "%s", err);
  run_state c = {NULL, NULL, NULL, 0, 0, NULL, {0, 0, 0}, NULL};
  for_batches(&ds, count_exact, &c);
  qt_exact_free(exact_ref);
  if (c.correct != r.qdq_correct)
    qt_test_fail("Q/DQ correct %lld, recomputed %lld", (long long)r.qdq_correct, (long long)c.correct);
  if (exact_ties != r.qdq_top2_ties)
    qt_test_fail("quantized logits with a top-2 tie: %lld, recomputed %lld", (long long)r.qdq_top2_ties,
                 (long long)exact_ties);
  printf("quantized logits with their two largest equal: %lld of %d images\n", (long long)exact_ties, N_IMAGES);
  { /* the report names ties and the remedy; none, no line */
    for (int ties = 0; ties <= 5; ties += 5) {
      qt_report *t = malloc(sizeof *t); /* large: not on the stack */
      QT_ASSERT(t, "out of memory");
      *t = r;
      t->qdq_top2_ties = ties;
      char *text = NULL;
      size_t len = 0;
      FILE *f = open_memstream(&text, &len);
      qt_report_print(t, f);
      fclose(f);
      free(t);
      char want[64];
      snprintf(want, sizeof want, "the two largest are equal on %d of %d images", ties, N_IMAGES);
      if (!!strstr(text, want) != (ties > 0) || !!strstr(text, "quant.fp32_output = true") != (ties > 0))
        qt_test_fail("report with %d tied images:\n%s", ties, text);
      free(text);
    }
  }
  run_state cf = {qdq, s.ctx, NULL, 0, 0, NULL, {0, 0, 0}, NULL};
  for_batches(&ds, count_graph, &cf);
  QT_CHECK(r.float_vs_exact.images == N_IMAGES && r.float_vs_exact.output_scale == r.output_scale);
  QT_CHECK(llabs(cf.correct - c.correct) <= r.float_vs_exact.images - r.float_vs_exact.agree);
  QT_CHECK(r.float_vs_exact.max_lsb <= 2.0 + 1e-4);
  printf("float32 executor vs exact: %lld of %lld logits differ, max %.2f LSB\n", (long long)r.float_vs_exact.differ,
         (long long)r.float_vs_exact.outputs, r.float_vs_exact.max_lsb);
  run_state d = {NULL, NULL, NULL, 0, 0, m, {0, 0, 0}, NULL};
  for_batches(&ds, count_device, &d);
  if (d.correct != r.device_correct)
    qt_test_fail("device correct %lld, recomputed %lld", (long long)r.device_correct, (long long)d.correct);
  QT_CHECK(fabs(r.device_accuracy - (double)d.correct / N_IMAGES) < 1e-12);
  QT_CHECK(r.top1_agreement >= 0.98 && r.top1_agreement <= 1.0);
  QT_CHECK(r.output_scale > 0);
  const int64_t hist = r.lsb.count[0] + r.lsb.count[1] + r.lsb.count[2] + r.lsb.count[3];
  if (hist != (int64_t)N_IMAGES * 10)
    qt_test_fail("LSB histogram holds %lld logits, want %d", (long long)hist, N_IMAGES * 10);
  if (!(r.lsb.max_lsb <= 2.0) || r.lsb.count[3] != 0)
    qt_test_fail("device vs Q/DQ: max %.3f LSB, %lld logits over 2 LSB", r.lsb.max_lsb, (long long)r.lsb.count[3]);
  QT_CHECK(fabs(r.max_abs_diff - r.lsb.max_lsb * r.output_scale) <= 1e-5 * (1 + r.max_abs_diff));
  QT_CHECK(r.int8_partitions > 0 && r.fallback_partitions == 0);
  {
    char v[1536];
    qt_report_verdict(&r, v, sizeof v);
    if (strstr(v, ": a lowering bug")) qt_test_fail("verdict: %s", v);
  }

  /* Points. */
  QT_CHECK(r.n_points == 9);
  const char *acts[] = {"input", "relu1", "relu2", "relu3", "fc2"};
  for (int i = 0; i < 5; i++) {
    const qt_report_point *p = find_point(&r, acts[i]);
    if (!p) continue;
    QT_CHECK(p->kind == QT_POINT_ACTIVATION);
    QT_CHECK(p->is_output == (i == 4));
    if (p->fp32_vs_qdq.n == 0 || p->qdq_vs_device.n == 0) qt_test_fail("point %s not measured on both stages", p->name);
    const double s1 = qt_sqnr_sum_db(&p->fp32_vs_qdq), s2 = qt_sqnr_sum_db(&p->qdq_vs_device);
    if (!(s1 > 10 && s1 < 100)) qt_test_fail("point %s: fp32 vs Q/DQ %.2f dB", p->name, s1);
    if (!(s2 > 30)) qt_test_fail("point %s: Q/DQ vs device %.2f dB (rounding only expected)", p->name, s2);
    /* each partition alone, on every image (200 <= QT_REPORT_FORCED_IMAGES): within 1 LSB */
    const int64_t numel = i == 0 ? 784 : i == 4 ? 10 : -1;
    if (p->forced_n == 0 || (numel > 0 && p->forced_n != N_IMAGES * numel) || p->forced_max > 1 || p->forced_over != 0)
      qt_test_fail("point %s alone: %lld integers, max %lld LSB, %lld over 1", p->name, (long long)p->forced_n,
                   (long long)p->forced_max, (long long)p->forced_over);
  }
  QT_CHECK(r.forced_images == N_IMAGES);
  const qt_report_point *in = find_point(&r, "input");
  if (in) {
    if (in->qdq_vs_device.noise != 0 || in->forced_differ != 0)
      qt_test_fail("input point: device differs from Q/DQ (noise %g, %lld integers alone)", in->qdq_vs_device.noise,
                   (long long)in->forced_differ);
    run_state h = {NULL, NULL, NULL, 0, 0, NULL, {0, 0, 0}, &qdq->nodes[qt_graph_find_node(qdq, "input.fq.quantize")]};
    for_batches(&ds, input_sqnr, &h);
    const double want = qt_sqnr_sum_db(&h.input), got = qt_sqnr_sum_db(&in->fp32_vs_qdq);
    if (!(fabs(got - want) < 1e-9)) qt_test_fail("input point: SQNR %.12f dB, by hand %.12f dB", got, want);
  }
  const char *weights[] = {"conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"};
  for (int i = 0; i < 4; i++) {
    const qt_report_point *p = find_point(&r, weights[i]);
    if (p) QT_CHECK(p->kind == QT_POINT_WEIGHT && p->fp32_vs_qdq.n > 0 && p->qdq_vs_device.n == 0);
  }
  {
    const qt_node *n = &qdq->nodes[qt_graph_find_node(qdq, "conv1")];
    const qt_param *t = &qdq->tensors[n->param[QT_P_WEIGHT]];
    float *deq = malloc((size_t)t->numel * sizeof(float));
    for (int64_t k = 0; k < t->numel; k++) {
      const int ch = (int)(k / (t->numel / n->wq->channels));
      deq[k] = (float)(n->wq->qweight[k] - n->wq->zero_point[ch]) * n->wq->scale[ch];
    }
    const double want = qt_sqnr_db(qdq->params + t->offset, deq, t->numel);
    const qt_report_point *p = find_point(&r, "conv1.weight");
    if (p && !(fabs(qt_sqnr_sum_db(&p->fp32_vs_qdq) - want) < 1e-9))
      qt_test_fail("conv1.weight: SQNR %.9f, by hand %.9f", qt_sqnr_sum_db(&p->fp32_vs_qdq), want);
    free(deq);
  }

  /* The text and JSON forms. */
  char *json = qt_report_json(&r, "  ");
  const char *keys[] = {"\"int8_vs_qdq\"",
                        "\"top1_agreement\"",
                        "\"max_lsb\"",
                        "\"lsb_histogram\"",
                        "\"sqnr_db\"",
                        "\"stage_loss_points\"",
                        "\"verdict\"",
                        "\"lowering\"",
                        "\"point\": \"relu2\"",
                        "\"qdq_reference\": \"exact\"",
                        "\"qdq_float_vs_exact\": {\"images\": 200",
                        "\"alone_images\": 200",
                        "\"alone\": {\"max_lsb\": "};
  for (int i = 0; i < 13; i++)
    if (!strstr(json, keys[i])) qt_test_fail("JSON lacks %s:\n%s", keys[i], json);
  if (strstr(json, "inf") || strstr(json, "nan")) qt_test_fail("JSON holds inf or nan:\n%s", json);
  QT_CHECK(strstr(json, "999.0") != NULL); /* the input point: identical on the device */
  free(json);
  FILE *devnull = fopen("/dev/null", "w");
  qt_report_print(&r, devnull);
  fclose(devnull);

  /* Without an fp32 model, and without probes. */
  qt_report r2;
  QT_CHECK(qt_report_run(NULL, qdq, m, &ds, &lc, 0, &r2, err) == 0);
  QT_CHECK(!r2.has_fp32 && r2.qdq_correct == r.qdq_correct && r2.device_correct == r.device_correct);
  for (int i = 0; i < r2.n_points; i++)
    QT_CHECK(r2.points[i].fp32_vs_qdq.n == 0 || r2.points[i].kind == QT_POINT_WEIGHT);
  const qt_report_point *relu1 = find_point(&r2, "relu1");
  if (relu1) QT_CHECK(relu1->qdq_vs_device.n == 0);
  /* Probes on a part of a batch: the first 50 images. */
  qt_report r3;
  QT_CHECK(qt_report_run(NULL, qdq, m, &ds, &lc, 50, &r3, err) == 0);
  relu1 = find_point(&r3, "relu1");
  QT_CHECK(r3.probe_images == 50 && r3.images == N_IMAGES);
  if (relu1) QT_CHECK(relu1->qdq_vs_device.n == 50 * 28 * 28 * 32);
  const qt_report_point *fc2 = find_point(&r3, "fc2");
  if (fc2) QT_CHECK(fc2->qdq_vs_device.n == N_IMAGES * 10); /* the output: every image */
  QT_CHECK(r3.forced_images == 50 && (!relu1 || relu1->forced_n == 50 * 28 * 28 * 32));
  QT_CHECK(r2.forced_images == 0 && (!find_point(&r2, "relu2") || find_point(&r2, "relu2")->forced_n == 0));
  check_broken_partition(fp32, qdq, &ds);

  /* Inference speed. */
  qt_inference_speed sp;
  if (qt_inference_measure(fp32, m, &ds, &lc, 32, 2, 1, &sp, err))
    qt_test_fail("qt_inference_measure: %s", err);
  else
    QT_CHECK(sp.batch == 32 && sp.images == 64 && sp.fp32_images_per_s > 0 && sp.int8_images_per_s > 0);

  qt_ctx_free(s.ctx);
  qt_device_free(m);
  qt_graph_free(qdq);
  qt_graph_free(fp32);
  check_folded_points(&ds);
  qt_dataset_free(&ds);
  return qt_test_finish();
}
