/* A run whose parameters stop being finite while its loss stays finite is stopped at that step.
 *
 * Under fake quant a NaN weight goes unseen by the loss: the quantize clamps it to a bound of the
 * integer range, so the forward stays finite while the optimizer keeps the NaN (and spreads it).
 * A QAT run (LSQ from a calibration) with one NaN weight in conv1 must stop at its first step with "training diverged"
 * naming conv1.weight[0], even though the loss of that graph is finite (checked here first). A
 * loss that is not finite (fp32 weights scaled until the logits overflow) stops before the update.
 * And qt_optim_step counts the non-finite parameters it leaves, in every loop (SGD's first and
 * later steps, with and without momentum, and AdamW), on a slab large enough to run in parallel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/common/train_util.h"

static void optimizer_counts(void) {
  const int64_t n = 40000;
  float *p = calloc((size_t)n, sizeof *p), *g = calloc((size_t)n, sizeof *g);
  QT_ASSERT(p && g, "out of memory");
  const qt_optim_config cfgs[] = {
      {.kind = QT_OPTIM_SGD},
      {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .weight_decay = 1e-4f},
      {.kind = QT_OPTIM_SGD, .momentum = 0.9f, .nesterov = 1},
      {.kind = QT_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
    qt_optim *o = qt_optim_create(&cfgs[k], n);
    QT_ASSERT(o, "out of memory");
    for (int64_t i = 0; i < n; i++) p[i] = 0.5f, g[i] = 0.25f;
    int64_t bad = qt_optim_step(o, p, g, 0.1f); /* first step: finite */
    if (bad != 0) qt_test_fail("optimizer %zu: %lld non-finite after a finite step", k, (long long)bad);
    g[7] = NAN;       /* a NaN gradient */
    g[n - 3] = 1e38f; /* a gradient that overflows the update (SGD: p - lr * g stays finite; AdamW normalizes) */
    p[20000] = INFINITY;
    bad = qt_optim_step(o, p, g, 0.1f); /* the later steps' loop */
    if (bad != 2)
      qt_test_fail("optimizer %zu: %lld non-finite parameters counted, want 2 (NaN grad, Inf param)", k,
                   (long long)bad);
    if (!isnan(p[7]) || isfinite(p[20000])) qt_test_fail("optimizer %zu: the step did not update as expected", k);
    qt_optim_free(o);
  }
  free(p);
  free(g);
}

int main(void) {
  optimizer_counts();

  char err[QT_ERR_LEN];
  if (system("rm -rf run_diverged")) return 1;
  qt_config *c = qt_train_config_create();
  const char *ov[] = {"model.name=fashion_cnn",
                      "data.train_limit=256",
                      "data.test_limit=64",
                      "train.epochs=1",
                      "train.batch_size=64",
                      "train.lr=0.01",
                      "train.threads=2",
                      "output.progress=none",
                      "output.dir=run_diverged",
                      "quant.mode=qat",
                      "quant.weight_bits=8",
                      "quant.activation_bits=8",
                      "quant.learnable_scale=true",
                      "quant.qat_init=calibration",
                      "quant.calibration_batches=2"};
  for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++)
    if (qt_config_apply_override(c, ov[i], err)) qt_test_fail("override %s: %s", ov[i], err);
  qt_options *o = malloc(sizeof *o);
  QT_ASSERT(o, "out of memory");
  qt_status st = {0};
  if (qt_options_resolve(c, o, err)) qt_test_fail("options: %s", err);
  qt_dataset train = {0}, test = {0};
  qt_graph *g = NULL, *p = NULL;
  if (qt_stage_load_data(&o->data, QT_SPLIT_TRAIN, &train, &test, &st) || !(g = qt_stage_build_model(o, &train, &st)) ||
      !(p = qt_stage_prepare(o, g, NULL, NULL, &st))) {
    qt_test_fail("setup: %s", st.msg);
    return qt_test_finish();
  }
  /* LSQ from a calibration, as the zoo trains: the scales are parameters, no observer runs in the
   * steps, so nothing looks at the weights' values */
  qt_ctx *ctx = qt_ctx_create();
  if (qt_stage_calibrate(o, p, &train, ctx, NULL, 0, &st)) qt_test_fail("calibrate: %s", st.msg);
  const int w = qt_graph_find_tensor(p, "conv1.weight");
  QT_CHECK(w >= 0);
  p->params[p->tensors[w].offset] = NAN;

  /* the loss of the poisoned graph is finite: a loss check alone would let it train on */
  qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_EVAL);
  qt_eval_result ev;
  if (qt_evaluate(p, NULL, &train, &lc, &ev, err)) qt_test_fail("evaluate: %s", err);
  if (!isfinite(ev.loss)) qt_test_fail("the poisoned graph's loss is %g: the test no longer poisons unseen", ev.loss);

  qt_trainer *t = qt_trainer_create(o, p, &train, &st);
  if (!t) qt_test_fail("trainer: %s", st.msg);
  qt_epoch_stats es;
  const int rc = t ? qt_trainer_epoch(t, ctx, 0, &es, &st) : -1;
  QT_CHECK(rc != 0);
  const char *want[] = {"training diverged", "parameter conv1.weight[0] is NaN", "epoch 1, batch 1 (step 0",
                        "checkpoint (none written yet)", "train.lr"};
  for (size_t i = 0; rc && i < sizeof want / sizeof want[0]; i++)
    if (!strstr(st.msg, want[i])) qt_test_fail("message lacks \"%s\": %s", want[i], st.msg);
  if (t) QT_CHECK(qt_trainer_step(t) == 0);

  qt_trainer_free(t);

  /* A loss that is not finite stops before the update: fc1's and fc2's weights scaled by 1e30
   * (finite) overflow the logits at the first step, and the parameters are left as they were. */
  const char *fcs[] = {"fc1.weight", "fc2.weight"};
  for (int k = 0; k < 2; k++) {
    const int fw = qt_graph_find_tensor(g, fcs[k]);
    QT_ASSERT(fw >= 0, "no %s", fcs[k]);
    float *fwv = g->params + g->tensors[fw].offset;
    for (int64_t i = 0; i < g->tensors[fw].numel; i++) fwv[i] *= 1e30f;
  }
  float *before = malloc((size_t)g->n_params * sizeof(float));
  QT_ASSERT(before, "out of memory");
  memcpy(before, g->params, (size_t)g->n_params * sizeof(float));
  o->quant.mode = QT_QUANT_NONE;
  qt_trainer *tf = qt_trainer_create(o, g, &train, &st);
  if (!tf) qt_test_fail("fp32 trainer: %s", st.msg);
  const int rf = tf ? qt_trainer_epoch(tf, ctx, 0, &es, &st) : -1;
  QT_CHECK(rf != 0);
  if (rf && (!strstr(st.msg, "training diverged: loss is NaN at epoch 1, batch 1 (step 0") ||
             !strstr(st.msg, "stopped without updating")))
    qt_test_fail("loss message: %s", st.msg);
  QT_CHECK(memcmp(before, g->params, (size_t)g->n_params * sizeof(float)) == 0);
  free(before);
  qt_trainer_free(tf);

  qt_ctx_free(ctx);
  qt_graph_free(p);
  qt_graph_free(g);
  qt_dataset_free(&train);
  free(o);
  qt_config_free(c);
  return qt_test_finish();
}
