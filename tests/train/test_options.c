/* The typed options (train/options.h): every schema row lands in its own field (a non-default
 * value for each key changes that field and nothing else), the options round-trip through the
 * INI text stored in checkpoints, cross-key rules are refused, the resume comparison names the
 * key, and the fp32 recipe inherits the run's data and names the checkpoint's folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "train/options.h"

/* builtin_backend: quant.backend = xnnpack with the default quantizer; else a description file
 * with quant.quantizer = backend (which only that quantizer reads) */
static qt_config *base_config(const char *mode, int builtin_backend) {
  qt_config *c = qt_train_config_create();
  char err[QT_ERR_LEN], m[64];
  snprintf(m, sizeof m, "quant.mode=%s", mode);
  const char *keys[] = {m, builtin_backend ? "quant.backend=xnnpack" : "quant.backend=desc.ini",
                        builtin_backend ? "quant.quantizer=onednn" : "quant.quantizer=backend",
                        "data.train_path=train.h5", "data.test_path=test.h5"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (qt_config_apply_override(c, keys[i], err)) qt_test_fail("%s: %s", keys[i], err);
  return c;
}

/* A valid value other than the current one for row k. */
static void other_value(const qt_cfg_key *k, const char *cur, char *buf, size_t n) {
  switch (k->type) {
    case QT_CFG_INT: {
      long v = strtol(cur, NULL, 10);
      snprintf(buf, n, "%ld", (k->max != 0 && v + 1 > k->max) ? v - 1 : v + 1);
      break;
    }
    case QT_CFG_FLOAT: {
      double v = strtod(cur, NULL), w = v * 0.5 + (k->min + (k->max != 0 ? k->max : v + 2)) * 0.25;
      if (w == v) w = v + 0.5 * ((k->max != 0 ? k->max : v + 1) - v);
      snprintf(buf, n, "%.17g", w);
      break;
    }
    case QT_CFG_BOOL: snprintf(buf, n, "%s", strcmp(cur, "true") == 0 ? "false" : "true"); break;
    case QT_CFG_ENUM: {
      /* the next choice */
      const char *c = k->choices, *first = c;
      size_t len = strlen(cur);
      while (c && !(strncmp(c, cur, len) == 0 && (c[len] == '|' || !c[len])))
        c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
      const char *next = c && strchr(c, '|') ? strchr(c, '|') + 1 : first;
      snprintf(buf, n, "%.*s", (int)strcspn(next, "|"), next);
      break;
    }
    default: snprintf(buf, n, "%s_changed", cur[0] ? "x" : "y"); break;
  }
}

static void test_every_key_lands_in_its_field(void) {
  int n;
  const qt_cfg_key *schema = qt_train_schema(&n);
  static qt_options before, after;
  char err[QT_ERR_LEN];
  for (int i = 0; i < n; i++) {
    const qt_cfg_key *k = &schema[i];
    int done = 0;
    /* the last two bases turn on what a key may need (quant.learnable_weight_scale needs
     * quant.learnable_scale; quant.cle_relu6 has no effect without quant.cle, quant.adaround_unit
     * none without quant.adaround) */
    const char *modes[] = {"qat", "ptq", "qat", "ptq"};
    for (int m = 0; m < 4 && !done; m++) {
      qt_config *c = base_config(modes[m], m == 2);
      if (m == 2 && qt_config_apply_override(c, "quant.learnable_scale=true", err)) qt_test_fail("base 2: %s", err);
      if (m == 3 && (qt_config_apply_override(c, "quant.cle=true", err) ||
                     qt_config_apply_override(c, "quant.adaround=true", err)))
        qt_test_fail("the last base: %s", err);
      if (qt_options_resolve(c, &before, err)) qt_test_fail("base %s: %s", modes[m], err);
      char v[600];
      other_value(k, qt_config_value(c, k->section, k->key), v, sizeof v);
      if (qt_config_set(c, k->section, k->key, v, err)) qt_test_fail("%s.%s=%s: %s", k->section, k->key, v, err);
      if (qt_options_resolve(c, &after, err) == 0) {
        done = 1;
        const size_t off = qt_options_offset(i);
        size_t end = sizeof before;
        for (int j = 0; j < n; j++) /* the field ends where the next field (in memory) starts */
          if (qt_options_offset(j) > off && qt_options_offset(j) < end) end = qt_options_offset(j);
        if (memcmp((char *)&before + off, (char *)&after + off, end - off) == 0)
          qt_test_fail("%s.%s = %s did not change its field", k->section, k->key, v);
        if (memcmp(&before, &after, off) != 0 ||
            memcmp((char *)&before + end, (char *)&after + end, sizeof before - end) != 0)
          qt_test_fail("%s.%s = %s changed another field", k->section, k->key, v);
      }
      qt_config_free(c);
    }
    if (!done) qt_test_fail("%s.%s: no base config accepts a changed value", k->section, k->key);
  }
}

static void test_round_trip(void) {
  static qt_options a, b;
  char err[QT_ERR_LEN];
  const char *ov[] = {"quant.mode=qat",
                      "train.lr=0.0123456789",
                      "quant.layer_overrides=conv1=w8a8;fc2=fp32",
                      "train.optimizer=adamw",
                      "output.dir=/tmp/a \"quoted\" dir",
                      "quant.activation_observer=histogram",
                      "quant.activation_range=mse"};
  if (qt_options_load(NULL, (char *const *)ov, 7, &a, err)) qt_test_fail("load: %s", err);
  char *ini = qt_options_to_ini(&a);
  qt_config *c = qt_train_config_create();
  if (qt_config_load_string(c, ini, "stored", err) || qt_options_resolve(c, &b, err)) qt_test_fail("reload: %s", err);
  if (memcmp(&a, &b, sizeof a) != 0) qt_test_fail("options changed through their INI text:\n%s", ini);
  QT_CHECK(a.train.optimizer == QT_OPTIM_ADAMW && a.quant.activation_range == QT_RANGE_MSE);
  QT_CHECK(a.quant.activation_observer == QT_OBSERVER_HISTOGRAM && a.train.lr == 0.0123456789);
  qt_config_free(c);
  free(ini);
}

static void test_rules(void) {
  static qt_options o;
  char err[QT_ERR_LEN];
  struct {
    const char *a, *b, *want;
  } cases[] = {
      {"quant.mode=qat", "quant.qat_init=calibration", NULL},
      {"quant.mode=ptq", "quant.learnable_scale=true", "quant.learnable_scale needs quant.mode = qat"},
      {"quant.mode=qat", "quant.learnable_weight_scale=true", "quant.learnable_weight_scale = true needs quant.learnable_scale"},
      {"quant.mode=qat", "quant.learnable_weight_scale=auto", NULL},
      {"quant.mode=qat", "quant.cle=true", "quant.cle needs quant.mode = ptq"},
      {"quant.mode=ptq", "quant.cle=true", NULL},
      {"quant.mode=ptq", "quant.cle_relu6=relu", "quant.cle_relu6 = relu has no effect without quant.cle = true"},
      {"quant.mode=qat", "quant.bias_correction=empirical", "quant.bias_correction needs quant.mode = ptq"},
      {"quant.mode=ptq", "quant.bias_correction=empirical", NULL},
      {"quant.mode=ptq", "quant.bias_correction=analytical", NULL},
      {"quant.mode=qat", "quant.adaround=true", "quant.adaround needs quant.mode = ptq"},
      {"quant.mode=ptq", "quant.adaround=true", NULL},
      {"quant.mode=ptq", "quant.adaround_unit=block", "quant.adaround_unit = block has no effect without"},
      {"quant.mode=qat", "quant.quantizer=backend", "quant.quantizer = backend needs quant.backend"},
      {"quant.mode=ptq", "quant.backend=accel.ini", "a description file is read only with quant.quantizer = backend"},
      {"quant.mode=ptq", "quant.backend=xnnpack", NULL},
      {"data.format=folder", "data.train_path=x", "data.format = folder needs data.train_path and data.test_path"},
      {"quant.mode=qat", "analysis.mixed_precision_k=1", "analysis.mixed_precision_k is a PTQ debugging tool"},
      {"quant.mode=none", "analysis.layer_sqnr=true", "analysis.layer_sqnr needs quant.mode = ptq or qat"},
      {"quant.mode=qat", "analysis.layer_sqnr=true", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int calib = strcmp(cases[i].b, "quant.qat_init=calibration") == 0;
    const char *ov[] = {cases[i].a, cases[i].b, "quant.freeze_observers_after=1"};
    const int n = calib ? 3 : 2;
    const int rc = qt_options_load(NULL, (char *const *)ov, n, &o, err);
    const char *want = calib ? "has no effect with quant.qat_init = calibration" : cases[i].want;
    if (want && (rc == 0 || !strstr(err, want)))
      qt_test_fail("%s %s: want '%s', got rc %d '%s'", ov[0], ov[1], want, rc, rc ? err : "");
    if (!want && rc) qt_test_fail("%s %s refused: %s", ov[0], ov[1], err);
  }
  /* three keys: the analytical bias correction reads batch norms that equalization made stale */
  const char *ov[] = {"quant.mode=ptq", "quant.cle=true", "quant.bias_correction=analytical"};
  if (qt_options_load(NULL, (char *const *)ov, 3, &o, err) == 0 ||
      !strstr(err, "quant.bias_correction = analytical with quant.cle"))
    qt_test_fail("quant.cle with the analytical bias correction: not refused (%s)", err);
}

static void test_resume_and_recipe(void) {
  static qt_options a, b, f;
  char err[QT_ERR_LEN];
  const char *ov[] = {"quant.mode=qat",
                      "quant.weight_bits=4",
                      "quant.fp32_checkpoint=runs/x/checkpoint.h5",
                      "quant.fp32_config=/nonexistent.ini",
                      "data.mean=0.5",
                      "train.threads=1"};
  if (qt_options_load(NULL, (char *const *)ov, 6, &a, err)) qt_test_fail("%s", err);
  char *ini = qt_options_to_ini(&a);
  b = a;
  b.train.epochs = 9;      /* [train] may change */
  b.quant.check_batch = 7; /* so may check_batch */
  QT_CHECK(qt_options_resume_matches(&b, ini, "ck.h5", err) == 0);
  b.quant.weight_bits = 8;
  if (qt_options_resume_matches(&b, ini, "ck.h5", err) == 0 || !strstr(err, "quant.weight_bits = '4'") ||
      !strstr(err, "quant.weight_bits = '8'"))
    qt_test_fail("resume with other weight bits: '%s'", err);
  free(ini);
  /* the recipe file does not exist: a clear error naming it */
  char ck[QT_OPT_STR + 32], why[QT_ERR_LEN];
  if (qt_options_fp32_recipe(&a, &f, ck, sizeof ck, why, sizeof why, err) == 0 || !strstr(err, "/nonexistent.ini"))
    qt_test_fail("recipe: '%s'", err);
  /* a real recipe: the committed fp32 example */
  snprintf(a.quant.fp32_config, sizeof a.quant.fp32_config, "%s", qt_test_path("experiments/fashion_cnn_fp32.ini"));
  if (qt_options_fp32_recipe(&a, &f, ck, sizeof ck, why, sizeof why, err)) qt_test_fail("recipe: %s", err);
  QT_CHECK(strcmp(f.output.dir, "runs/x") == 0 && f.data.mean == 0.5 && f.train.threads == 1);
  QT_CHECK(f.quant.mode == QT_QUANT_NONE && f.train.epochs == 4);
  QT_CHECK(strcmp(ck, "runs/x/checkpoint.h5") == 0 && why[0] == 0); /* a folder of the run's own choosing */
  /* the fp32 config's own folder, which its every run shares: with other [data] (data.mean,
   * 0.5 here, 0.2860 there) the fp32 model goes under this run's output.dir instead */
  snprintf(a.quant.fp32_checkpoint, sizeof a.quant.fp32_checkpoint, "runs/fashion_cnn_fp32/checkpoint.h5");
  snprintf(a.output.dir, sizeof a.output.dir, "/tmp/trial");
  if (qt_options_fp32_recipe(&a, &f, ck, sizeof ck, why, sizeof why, err)) qt_test_fail("recipe: %s", err);
  QT_CHECK(strcmp(ck, "/tmp/trial/fp32/checkpoint.h5") == 0 && strcmp(f.output.dir, "/tmp/trial/fp32") == 0);
  if (!strstr(why, "data.") || !strstr(why, "fashion_cnn_fp32.ini")) qt_test_fail("recipe why: '%s'", why);
  /* with the fp32 config's own [data], its own folder */
  static qt_options own;
  if (qt_options_load(a.quant.fp32_config, NULL, 0, &own, err)) qt_test_fail("%s", err);
  a.data = own.data;
  if (qt_options_fp32_recipe(&a, &f, ck, sizeof ck, why, sizeof why, err)) qt_test_fail("recipe: %s", err);
  QT_CHECK(strcmp(ck, "runs/fashion_cnn_fp32/checkpoint.h5") == 0 && why[0] == 0 &&
           strcmp(f.output.dir, "runs/fashion_cnn_fp32") == 0);
  snprintf(a.quant.fp32_checkpoint, sizeof a.quant.fp32_checkpoint, "runs/x/other.h5");
  if (qt_options_fp32_recipe(&a, &f, ck, sizeof ck, why, sizeof why, err) == 0 || !strstr(err, "must be named"))
    qt_test_fail("recipe name: '%s'", err);
}

int main(void) {
  test_every_key_lands_in_its_field();
  test_round_trip();
  test_rules();
  test_resume_and_recipe();
  return qt_test_finish();
}
