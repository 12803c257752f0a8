/* Training job end to end on 512 Fashion-MNIST images: checkpoints round-trip; a run
 * stopped after epoch 1 and resumed ends with bit-identical weights to an uninterrupted run;
 * a diverging run (absurd learning rate) stops with a message naming the loss and keeps the
 * last good checkpoint untouched; a corrupt checkpoint is refused with a clear message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/common/train_util.h"

static qt_config *config(const char *dir, const char *extra1, const char *extra2) {
  char err[QT_ERR_LEN], buf[512];
  qt_config *c = qt_train_config_create();
  const char *base[] = {"model.name=fashion_cnn", "data.train_limit=512", "data.test_limit=256",
                        "train.epochs=2",         "train.batch_size=64",  "output.progress=none",
                        "train.threads=2"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
    if (qt_config_apply_override(c, base[i], err)) qt_test_fail("override %s: %s", base[i], err);
  snprintf(buf, sizeof buf, "output.dir=%s", dir);
  if (qt_config_apply_override(c, buf, err)) qt_test_fail("%s", err);
  if (extra1 && qt_config_apply_override(c, extra1, err)) qt_test_fail("%s: %s", extra1, err);
  if (extra2 && qt_config_apply_override(c, extra2, err)) qt_test_fail("%s: %s", extra2, err);
  return c;
}

static int run(const char *dir, const char *e1, const char *e2, char *err) {
  qt_config *c = config(dir, e1, e2);
  int rc = qt_test_train_run(c, err);
  qt_config_free(c);
  return rc;
}

static qt_graph *load(const char *dir, qt_checkpoint_meta *meta) {
  char err[QT_ERR_LEN], path[512];
  snprintf(path, sizeof path, "%s/checkpoint.h5", dir);
  qt_graph *g = qt_model_build("fashion_cnn", err);
  if (qt_checkpoint_load(path, g, NULL, meta, err)) qt_test_fail("load %s: %s", path, err);
  return g;
}

int main(void) {
  char err[QT_ERR_LEN];
  if (system("rm -rf run_full run_split run_nan")) return 1;
  if (run("run_full", NULL, NULL, err)) qt_test_fail("uninterrupted run: %s", err);
  if (run("run_split", "train.stop_after_epochs=1", NULL, err)) qt_test_fail("first half: %s", err);
  qt_checkpoint_meta m1;
  qt_graph *half = load("run_split", &m1);
  QT_CHECK(m1.epoch == 1);
  free(m1.config_ini);
  if (run("run_split", "train.resume=true", NULL, err)) qt_test_fail("resumed half: %s", err);
  qt_checkpoint_meta ma, mb;
  qt_graph *a = load("run_full", &ma), *b = load("run_split", &mb);
  QT_CHECK(ma.epoch == 2 && mb.epoch == 2 && ma.step == mb.step);
  QT_CHECK(memcmp(a->params, b->params, (size_t)a->n_params * sizeof(float)) == 0);
  QT_CHECK(memcmp(a->buffers, b->buffers, (size_t)a->n_buffers * sizeof(float)) == 0);
  QT_CHECK(ma.config_ini && strstr(ma.config_ini, "batch_size") != NULL);
  free(ma.config_ini);
  free(mb.config_ini);

  /* A metrics.csv whose first row repeats (hand-edited, or an append after a kill) resumes
   * without writing past the rows of the run: one row per epoch in the end. */
  if (system("rm -rf run_dup && mkdir -p run_dup")) return 1;
  if (run("run_dup", "train.stop_after_epochs=1", NULL, err)) qt_test_fail("dup setup: %s", err);
  if (system("tail -n 1 run_dup/metrics.csv >> run_dup/metrics.csv && tail -n 1 run_dup/metrics.csv >> "
             "run_dup/metrics.csv"))
    return 1;
  if (run("run_dup", "train.resume=true", NULL, err)) qt_test_fail("resume after a repeated row: %s", err);
  FILE *csv = fopen("run_dup/metrics.csv", "r");
  int lines = 0;
  for (int ch; csv && (ch = fgetc(csv)) != EOF;) lines += ch == '\n';
  if (csv) fclose(csv);
  if (lines != 3) qt_test_fail("metrics.csv after resuming past a repeated row: %d lines, want header + 2", lines);

  /* summary.json has the documented keys */
  FILE *f = fopen("run_full/summary.json", "r");
  QT_CHECK(f != NULL);
  if (f) {
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    const char *keys[] = {"\"stages\"", "\"fp32\"", "\"test_accuracy\"", "\"images_per_s\"", "\"epoch_seconds\"",
                          "\"peak_rss_mb\""};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
      if (!strstr(text, keys[i])) qt_test_fail("summary.json lacks %s:\n%s", keys[i], text);
  }

  /* Divergence: epoch 1 fine, then an absurd learning rate from the resumed run. */
  if (run("run_nan", "train.stop_after_epochs=1", NULL, err)) qt_test_fail("nan setup: %s", err);
  int rc = run("run_nan", "train.resume=true", "train.lr=1e30", err);
  QT_CHECK(rc != 0);
  if (rc && !strstr(err, "diverged")) qt_test_fail("divergence message: %s", err);
  qt_checkpoint_meta mn;
  qt_graph *kept = load("run_nan", &mn);
  QT_CHECK(mn.epoch == 1);
  QT_CHECK(memcmp(kept->params, half->params, (size_t)half->n_params * sizeof(float)) == 0);
  free(mn.config_ini);

  /* A truncated checkpoint is refused, the graph untouched. */
  if (system("head -c 3000 run_full/checkpoint.h5 > truncated.h5")) qt_test_fail("truncating");
  rc = qt_checkpoint_load("truncated.h5", kept, NULL, NULL, err);
  QT_CHECK(rc != 0);
  if (rc && !strstr(err, "truncated.h5")) qt_test_fail("truncated message: %s", err);
  rc = qt_checkpoint_load("no_such_file.h5", kept, NULL, NULL, err);
  QT_CHECK(rc != 0 && strstr(err, "no_such_file.h5"));

  qt_graph_free(half);
  qt_graph_free(a);
  qt_graph_free(b);
  qt_graph_free(kept);
  return qt_test_finish();
}
