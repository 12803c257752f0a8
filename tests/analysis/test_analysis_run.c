/* The [analysis] keys end to end: a PTQ run of FashionCNN (from the initialization, 512
 * training / 256 test images) with every analysis on writes analysis.md and analysis.json and
 * names the latter in summary.json; the tables have the expected rows; the cumulative
 * calibration sweep (one pass per method, evaluated at 1 and then 2 batches) gives at 2 batches
 * the accuracy of a fresh 2-batch calibration with the same settings (the mixed-precision row
 * k = 0 and the SQNR section); model size grows with k; bad keys are refused with a message.
 * A QAT run with analysis.layer_sqnr writes the QAT-debugging SQNR table; PTQ-only tools are refused there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/common/train_util.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  s[n] = 0;
  fclose(f);
  return s;
}

static int run_keys(const char *dir, const char *const *keys, size_t n_keys, const char *extra, char *err) {
  char buf[512];
  qt_config *c = qt_train_config_create();
  int rc = 0;
  for (size_t i = 0; i < n_keys && !rc; i++) rc = qt_config_apply_override(c, keys[i], err);
  snprintf(buf, sizeof buf, "output.dir=%s", dir);
  if (!rc) rc = qt_config_apply_override(c, buf, err);
  if (!rc && extra) rc = qt_config_apply_override(c, extra, err);
  if (!rc) rc = qt_test_train_run(c, err);
  qt_config_free(c);
  return rc;
}

static int run(const char *dir, const char *extra, char *err) {
  static const char *const keys[] = {"model.name=fashion_cnn", "data.train_limit=512", "data.test_limit=256", "train.batch_size=64",
                        "output.progress=none", "output.dot=false", "output.timing=false", "train.threads=2",
                        "quant.mode=ptq",
                        "quant.weight_bits=4", "quant.activation_bits=4", "quant.calibration_batches=2",
                        "analysis.calibration_methods=minmax,moving_average,percentile,mse",
                        "analysis.calibration_batches=1,2", "analysis.layer_sqnr=true", "analysis.sensitivity=true",
                        "analysis.mixed_precision_k=0,1,4", "analysis.images=200"};
  return run_keys(dir, keys, sizeof keys / sizeof keys[0], extra, err);
}

/* A one-epoch QAT run with analysis.layer_sqnr (QAT debugging). */
static int run_qat(const char *dir, const char *extra, char *err) {
  static const char *const keys[] = {"model.name=fashion_cnn", "data.train_limit=512", "data.test_limit=256",
                                     "train.batch_size=64", "train.epochs=1", "train.lr=0.01", "output.progress=none",
                                     "output.dot=false", "output.timing=false", "train.threads=2", "quant.mode=qat",
                                     "quant.weight_bits=4",
                                     "quant.activation_bits=4", "analysis.layer_sqnr=true", "analysis.images=200"};
  return run_keys(dir, keys, sizeof keys / sizeof keys[0], extra, err);
}

/* The number after `key` in the first object of s containing `anchor`. */
static double number_after(const char *s, const char *anchor, const char *key) {
  const char *a = s ? strstr(s, anchor) : NULL;
  const char *k = a ? strstr(a, key) : NULL;
  if (!k) {
    qt_test_fail("analysis.json: no %s after %s", key, anchor);
    return -1;
  }
  return atof(k + strlen(key));
}

static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, needle)); p++) n++;
  return n;
}

int main(void) {
  char err[QT_ERR_LEN] = "";
  if (system("rm -rf run_analysis run_bad")) return 1;
  if (run("run_analysis", NULL, err)) {
    qt_test_fail("run: %s", err);
    return qt_test_finish();
  }
  char *summary = slurp("run_analysis/summary.json"), *js = slurp("run_analysis/analysis.json"),
       *md = slurp("run_analysis/analysis.md");
  QT_CHECK(summary && js && md);
  if (!summary || !js || !md) return qt_test_finish();
  QT_CHECK(strstr(summary, "\"analysis\": \"run_analysis/analysis.json\"") != NULL);
  QT_CHECK(count(js, "\"method\":") == 8);
  QT_CHECK(count(js, "\"layer\":") == 4); /* conv1, conv2, fc1, fc2 */
  QT_CHECK(count(js, "\"k\":") == 3);
  QT_CHECK(count(js, "\"node\":") >= 8);
  QT_CHECK(strstr(js, "\"images\": 200") != NULL);
  QT_CHECK(strstr(md, "| minmax |") && strstr(md, "| mse |") && strstr(md, "## Per-node SQNR") &&
           strstr(md, "## Sensitivity") && strstr(md, "## Mixed precision"));

  /* cumulative sweep at 2 batches == fresh 2-batch calibration (quant.activation_observer is
   * moving_average by default) */
  double sweep = number_after(js, "\"method\": \"moving_average\", \"batches\": 2", "\"accuracy\": ");
  double k0 = number_after(js, "{\"k\": 0", "\"accuracy\": ");
  double sq = number_after(js, "\"sqnr\": {", "\"accuracy\": ");
  if (!(sweep == k0 && k0 == sq)) qt_test_fail("2-batch accuracy: sweep %.6f, k=0 %.6f, sqnr %.6f", sweep, k0, sq);
  /* sizes: k = 4 (every layer at 8 bits) > k = 1 >= k = 0 */
  double b0 = number_after(js, "{\"k\": 0", "\"model_bytes\": "), b1 = number_after(js, "{\"k\": 1", "\"model_bytes\": "),
         b4 = number_after(js, "{\"k\": 4", "\"model_bytes\": "), fp = number_after(js, "\"fp32_model_bytes\"", ": ");
  if (!(b0 <= b1 && b1 < b4 && b4 < fp)) qt_test_fail("model bytes: k=0 %.0f, k=1 %.0f, k=4 %.0f, fp32 %.0f", b0, b1, b4, fp);

  if (run("run_bad", "analysis.calibration_methods=minmax,bogus", err) == 0)
    qt_test_fail("an unknown calibration method was accepted");
  else if (!strstr(err, "bogus")) qt_test_fail("unknown method: message does not name it: %s", err);
  free(summary);
  free(js);
  free(md);

  /* QAT: per-node SQNR of the trained model, fake quant off vs on; the PTQ tools are refused */
  if (system("rm -rf run_analysis_qat")) return 1;
  if (run_qat("run_analysis_qat", NULL, err)) {
    qt_test_fail("QAT run: %s", err);
    return qt_test_finish();
  }
  summary = slurp("run_analysis_qat/summary.json");
  js = slurp("run_analysis_qat/analysis.json");
  md = slurp("run_analysis_qat/analysis.md");
  QT_CHECK(summary && js && md);
  if (!summary || !js || !md) return qt_test_finish();
  QT_CHECK(strstr(summary, "\"analysis\": \"run_analysis_qat/analysis.json\"") != NULL);
  QT_CHECK(strstr(md, "# QAT debugging: fashion_cnn, W4A4") && strstr(md, "## Per-node SQNR") &&
           strstr(md, "| conv1 | conv_bn |") && strstr(md, "| fc2 | linear |"));
  QT_CHECK(count(js, "\"node\":") >= 8 && strstr(js, "\"mode\": \"qat\"") && strstr(js, "\"images\": 200"));
  double on = number_after(js, "\"mode\"", "\"accuracy\": "), off = number_after(js, "\"mode\"", "\"float_accuracy\": ");
  if (!(on >= 0 && on <= 1 && off >= 0 && off <= 1)) qt_test_fail("QAT accuracies %.6f / %.6f", on, off);
  if (run_qat("run_bad", "analysis.sensitivity=true", err) == 0)
    qt_test_fail("analysis.sensitivity was accepted on a QAT run");
  else if (!strstr(err, "analysis.sensitivity") || !strstr(err, "quant.mode = ptq"))
    qt_test_fail("sensitivity on QAT: unclear message: %s", err);
  free(summary);
  free(js);
  free(md);
  return qt_test_finish();
}
