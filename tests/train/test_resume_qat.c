/* QAT resume end to end on 512 Fashion-MNIST images (W4A4 from a 1-epoch fp32 checkpoint, 2
 * QAT epochs): a run stopped after epoch 1 and resumed must equal an uninterrupted run bit for
 * bit: parameters, BN buffers, optimizer state, every quantization state in the checkpoint
 * (qparams, enable flags, observer min/max and histograms, bn_frozen), the saved
 * model_trained.h5, model_qdq.h5 and model_qdq.onnx byte for byte, metrics.csv (timing columns
 * aside) and the summary's accuracies and check. Three recipes: (a) LSQ with histogram/MSE observers and BN
 * frozen after epoch 1, (b) STE with moving-average observers frozen at epoch 1.5, (c) STE
 * from a PTQ calibration (quant.qat_init = calibration, BN frozen at 0.5: the resumed run must
 * take the calibrated qparams from the checkpoint). Mismatches are refused with a message
 * naming the checkpoint: other [quant] settings, an fp32 checkpoint resumed as QAT and back,
 * and (below the config check) a checkpoint loaded into a differently prepared graph. With LSQ,
 * quantizer.txt marks the learned scales: 4-bit weights learn theirs, 8-bit ones do not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/common/train_util.h"

#define MAX_EXTRA 8

static qt_config *config(const char *dir, const char *const *extra) {
  char err[QT_ERR_LEN], buf[512];
  qt_config *c = qt_train_config_create();
  const char *base[] = {"model.name=fashion_cnn",
                        "data.train_limit=512",
                        "data.test_limit=256",
                        "train.epochs=2",
                        "train.batch_size=64",
                        "train.lr=0.005",
                        "train.threads=2",
                        "output.progress=none",
                        "output.dot=false",
                        "quant.mode=qat",
                        "quant.weight_bits=4",
                        "quant.activation_bits=4",
                        "quant.fp32_checkpoint=fp32/checkpoint.h5",
                        "quant.check_batch=64",
                        "output.timing=false"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
    if (qt_config_apply_override(c, base[i], err)) qt_test_fail("override %s: %s", base[i], err);
  snprintf(buf, sizeof buf, "output.dir=%s", dir);
  if (qt_config_apply_override(c, buf, err)) qt_test_fail("%s", err);
  for (int i = 0; extra && extra[i]; i++)
    if (qt_config_apply_override(c, extra[i], err)) qt_test_fail("override %s: %s", extra[i], err);
  return c;
}

/* Runs with the recipe's overrides plus up to two more. */
static int run(const char *dir, const char *const *recipe, const char *more1, const char *more2, char *err) {
  const char *extra[MAX_EXTRA + 3] = {0};
  int n = 0;
  for (int i = 0; recipe && recipe[i]; i++) extra[n++] = recipe[i];
  if (more1) extra[n++] = more1;
  if (more2) extra[n++] = more2;
  qt_config *c = config(dir, extra);
  int rc = qt_test_train_run(c, err);
  qt_config_free(c);
  return rc;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    qt_test_fail("cannot open %s", path);
    return calloc(1, 1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

/* quantizer.txt of a run with LSQ: every activation point learns its scale, the weights as
 * quant.learnable_weight_scale = auto decides (learned below 8 bits, observed at 8). */
static void check_learned_marks(const char *dir, int weights_learned) {
  char path[256];
  snprintf(path, sizeof path, "%s/quantizer.txt", dir);
  char *text = read_text(path);
  int w = 0, wl = 0, a = 0, al = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    const int learned = strstr(line, "learned scale (LSQ)") != NULL;
    if (strncmp(line, "  weight ", 9) == 0) {
      w++;
      wl += learned;
    } else if (strncmp(line, "  activation ", 13) == 0 && !strstr(line, " shares ") && !strstr(line, " tied to ")) {
      a++;
      al += learned;
    }
  }
  if (!w || !a || wl != (weights_learned ? w : 0) || al != a)
    qt_test_fail("%s: %d of %d weight scales and %d of %d activation scales learned; want %d and %d", path, wl, w, al, a,
                 weights_learned ? w : 0, a);
  free(text);
}

static int same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

/* metrics.csv without the timing columns 6 and 7 (images_per_s, epoch_seconds). */
static void csv_untimed(const char *path, char *out, size_t cap) {
  char *s = read_text(path), *save = NULL;
  size_t k = 0;
  out[0] = 0;
  for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    int col = 0;
    for (char *p = line; *p; p++) {
      if (*p == ',') col++;
      if ((col == 6 || col == 7) || k + 2 >= cap) continue; /* the comma opening column 8 stays */
      out[k++] = *p;
    }
    out[k++] = '\n';
  }
  out[k] = 0;
  free(s);
}

/* The summary's results: every test_accuracy / test_loss / top1_agreement figure and the
 * check line, in order. */
static void summary_results(const char *path, char *out, size_t cap) {
  char *s = read_text(path), *save = NULL;
  size_t k = 0;
  out[0] = 0;
  const char *keys[] = {"\"test_accuracy\"", "\"test_loss\"", "\"top1_agreement\"", "\"check\""};
  for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
      if (strstr(line, keys[i]) && k + strlen(line) + 2 < cap) {
        k += (size_t)snprintf(out + k, cap - k, "%s\n", line);
        break;
      }
  free(s);
}

/* The recipe's prepared graph, with the checkpoint of dir loaded (optimizer state in *opt). */
static qt_graph *load_prepared(const char *dir, const char *const *recipe, qt_graph **fp32, qt_optim **opt,
                               qt_checkpoint_meta *meta) {
  char err[QT_ERR_LEN], path[512];
  qt_config *c = config(dir, recipe);
  *fp32 = qt_model_build("fashion_cnn", err);
  qt_graph *p = qt_test_prepare(c, *fp32, err);
  qt_config_free(c);
  if (!p) {
    qt_test_fail("prepare: %s", err);
    return NULL;
  }
  qt_optim_config oc = {0};
  oc.kind = QT_OPTIM_SGD;
  oc.momentum = 0.9f;
  *opt = qt_optim_create(&oc, p->n_params);
  snprintf(path, sizeof path, "%s/checkpoint.h5", dir);
  if (qt_checkpoint_load(path, p, *opt, meta, err)) qt_test_fail("load %s: %s", path, err);
  return p;
}

static int same_qstate(const char *what, const char *node, const qt_qstate *a, const qt_qstate *b) {
  if (!a || !b) return !a && !b;
  const size_t ch = (size_t)a->channels;
  const qt_observer *oa = &a->obs, *ob = &b->obs;
  int same = a->channels == b->channels && memcmp(a->scale, b->scale, ch * sizeof(float)) == 0 &&
             memcmp(a->zero_point, b->zero_point, ch * sizeof(int32_t)) == 0 && a->observe == b->observe &&
             a->fake_quant == b->fake_quant && a->calibrated == b->calibrated && oa->initialized == ob->initialized &&
             memcmp(oa->min, ob->min, ch * sizeof(float)) == 0 && memcmp(oa->max, ob->max, ch * sizeof(float)) == 0 &&
             oa->hist_min == ob->hist_min && oa->hist_max == ob->hist_max && !oa->hist == !ob->hist &&
             (!oa->hist || memcmp(oa->hist, ob->hist, (size_t)oa->bins * sizeof(int64_t)) == 0);
  if (!same) qt_test_fail("%s: quantization state of %s differs", what, node);
  return same;
}

/* (full run) == (stopped after epoch 1, then resumed), bit for bit. */
static void check_recipe(const char *name, const char *const *recipe) {
  char err[QT_ERR_LEN], full[64], split[64], a[600], b[600];
  snprintf(full, sizeof full, "%s_full", name);
  snprintf(split, sizeof split, "%s_split", name);
  if (run(full, recipe, NULL, NULL, err)) qt_test_fail("%s uninterrupted: %s", name, err);
  if (run(split, recipe, "train.stop_after_epochs=1", NULL, err)) qt_test_fail("%s first epoch: %s", name, err);
  if (run(split, recipe, "train.resume=true", NULL, err)) qt_test_fail("%s resumed: %s", name, err);

  qt_checkpoint_meta ma, mb;
  qt_graph *fa, *fb;
  qt_optim *oa, *ob;
  qt_graph *pa = load_prepared(full, recipe, &fa, &oa, &ma), *pb = load_prepared(split, recipe, &fb, &ob, &mb);
  if (pa && pb) {
    QT_CHECK(ma.epoch == 2 && mb.epoch == 2 && ma.step == mb.step);
    if (memcmp(pa->params, pb->params, (size_t)pa->n_params * sizeof(float)) != 0)
      qt_test_fail("%s: parameters differ after resume", name);
    if (memcmp(pa->buffers, pb->buffers, (size_t)pa->n_buffers * sizeof(float)) != 0)
      qt_test_fail("%s: BN buffers differ after resume", name);
    for (int i = 0; i < qt_optim_state_count(oa); i++) {
      const char *sn;
      if (memcmp(qt_optim_state(oa, i, &sn), qt_optim_state(ob, i, &sn), (size_t)pa->n_params * sizeof(float)) != 0)
        qt_test_fail("%s: optimizer state %s differs after resume", name, sn);
    }
    QT_CHECK(qt_optim_steps(oa) == qt_optim_steps(ob));
    int n_states = 0;
    for (int i = 0; i < pa->n_nodes; i++) {
      const qt_node *x = &pa->nodes[i], *y = &pb->nodes[i];
      same_qstate(name, x->name, x->q, y->q);
      same_qstate(name, x->name, x->wq, y->wq);
      n_states += (x->q != NULL) + (x->wq != NULL);
      if (x->bn_frozen != y->bn_frozen) qt_test_fail("%s: bn_frozen of %s differs", name, x->name);
    }
    QT_CHECK(n_states == 9); /* fashion_cnn: 5 activation points, 4 weights */
  }
  free(ma.config_ini);
  free(mb.config_ini);
  qt_graph_free(pa);
  qt_graph_free(pb);
  qt_graph_free(fa);
  qt_graph_free(fb);
  qt_optim_free(oa);
  qt_optim_free(ob);

  const char *files[] = {"model_trained.h5", "model_qdq.h5", "model_qdq.onnx"};
  for (int i = 0; i < 3; i++) {
    snprintf(a, sizeof a, "%s/%s", full, files[i]);
    snprintf(b, sizeof b, "%s/%s", split, files[i]);
    if (!same_file(a, b)) qt_test_fail("%s: %s and %s differ", name, a, b);
  }
  static char ta[8192], tb[8192];
  snprintf(a, sizeof a, "%s/metrics.csv", full);
  snprintf(b, sizeof b, "%s/metrics.csv", split);
  csv_untimed(a, ta, sizeof ta);
  csv_untimed(b, tb, sizeof tb);
  if (strcmp(ta, tb) != 0 || !strstr(ta, "\n2,")) qt_test_fail("%s: metrics.csv rows differ:\n%s---\n%s", name, ta, tb);
  snprintf(a, sizeof a, "%s/summary.json", full);
  snprintf(b, sizeof b, "%s/summary.json", split);
  summary_results(a, ta, sizeof ta);
  summary_results(b, tb, sizeof tb);
  if (strcmp(ta, tb) != 0 || !strstr(ta, "\"fake_quant\"") || !strstr(ta, "\"int8\"") || !strstr(ta, "\"ok\": true"))
    qt_test_fail("%s: summary results differ:\n%s---\n%s", name, ta, tb);
}

static void expect_refused(const char *what, int rc, const char *err, const char *want1, const char *want2) {
  if (rc == 0) {
    qt_test_fail("%s: accepted, want a refusal", what);
    return;
  }
  if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
    qt_test_fail("%s: message lacks '%s'%s%s: %s", what, want1, want2 ? " / " : "", want2 ? want2 : "", err);
}

int main(void) {
  char err[QT_ERR_LEN];
  if (system("rm -rf fp32 lsq_* ste_* cal_* mismatch")) return 1;
  {
    qt_config *c = qt_train_config_create();
    const char *fp[] = {"model.name=fashion_cnn", "data.train_limit=512", "data.test_limit=256", "train.epochs=1",
                        "train.batch_size=64",    "train.threads=2",      "output.progress=none", "output.dot=false",
                        "output.dir=fp32"};
    for (size_t i = 0; i < sizeof fp / sizeof fp[0]; i++)
      if (qt_config_apply_override(c, fp[i], err)) qt_test_fail("%s", err);
    if (qt_test_train_run(c, err)) qt_test_fail("fp32 run: %s", err);
    qt_config_free(c);
  }
  const char *lsq[] = {"quant.learnable_scale=true", "quant.activation_observer=histogram",
                       "quant.activation_range=mse", "quant.freeze_bn_after=1", NULL};
  const char *ste[] = {"quant.activation_observer=moving_average", "quant.freeze_observers_after=1.5", NULL};
  const char *cal[] = {"quant.qat_init=calibration", "quant.calibration_batches=3", "quant.freeze_bn_after=0.5", NULL};
  check_recipe("lsq", lsq);
  check_recipe("ste", ste);
  check_recipe("cal", cal);

  /* Other [quant] settings than the checkpoint's: refused before any work, naming the file. */
  int rc = run("ste_split", ste, "train.resume=true", "quant.weight_bits=8", err);
  expect_refused("other weight_bits", rc, err, "ste_split/checkpoint.h5", "quant.weight_bits");
  rc = run("ste_split", ste, "train.resume=true", "quant.activation_observer=minmax", err);
  expect_refused("other activation observer", rc, err, "ste_split/checkpoint.h5", "quant.activation_observer");
  rc = run("lsq_split", lsq, "train.resume=true", "quant.learnable_scale=false", err);
  expect_refused("LSQ off", rc, err, "lsq_split/checkpoint.h5", "quant.learnable_scale");
  rc = run("lsq_split", lsq, "train.resume=true", "quant.learnable_weight_scale=false", err);
  expect_refused("weight scales observed", rc, err, "lsq_split/checkpoint.h5", "quant.learnable_weight_scale");
  /* qat_train's default: learned 4-bit weight scales, observed 8-bit ones */
  check_learned_marks("lsq_split", 1);
  if (run("lsq_w8", lsq, "quant.weight_bits=8", "quant.activation_bits=8", err)) qt_test_fail("lsq_w8: %s", err);
  check_learned_marks("lsq_w8", 0);
  /* An fp32 run's checkpoint resumed as QAT, and a QAT checkpoint resumed as fp32. */
  rc = run("fp32", ste, "train.resume=true", NULL, err);
  expect_refused("fp32 checkpoint resumed as QAT", rc, err, "fp32/checkpoint.h5", "quant.mode");
  rc = run("ste_split", ste, "train.resume=true", "quant.mode=none", err);
  expect_refused("QAT checkpoint resumed as fp32", rc, err, "ste_split/checkpoint.h5", "quant.mode");

  /* Below the config check: the graph itself is compared when loading, all or nothing. */
  {
    const char *w8[] = {"quant.activation_observer=moving_average", "quant.weight_bits=8", NULL};
    qt_config *c = config("mismatch", w8);
    qt_graph *g = qt_model_build("fashion_cnn", err);
    qt_graph_init_params(g, 1);
    qt_graph *p = qt_test_prepare(c, g, err);
    QT_CHECK(p != NULL);
    if (p) {
      float *before = malloc((size_t)p->n_params * sizeof(float));
      memcpy(before, p->params, (size_t)p->n_params * sizeof(float));
      rc = qt_checkpoint_load("ste_split/checkpoint.h5", p, NULL, NULL, err);
      expect_refused("W8 graph from a W4 checkpoint", rc, err, "ste_split/checkpoint.h5", "bits is 4");
      QT_CHECK(memcmp(before, p->params, (size_t)p->n_params * sizeof(float)) == 0);
      rc = qt_checkpoint_load("fp32/checkpoint.h5", p, NULL, NULL, err);
      expect_refused("prepared graph from an fp32 checkpoint", rc, err, "fp32/checkpoint.h5", "fp32 run");
      free(before);
    }
    rc = qt_checkpoint_load("ste_split/checkpoint.h5", g, NULL, NULL, err);
    expect_refused("fp32 model from a QAT checkpoint", rc, err, "ste_split/checkpoint.h5", "quantized run");
    QT_CHECK(qt_checkpoint_load("fp32/checkpoint.h5", g, NULL, NULL, err) == 0);
    qt_graph_free(p);
    qt_graph_free(g);
    qt_config_free(c);
  }
  return qt_test_finish();
}
