/* Crafted checkpoint attributes: epoch/step/seed/model/config are read only after their shape and
 * type are checked (an array attribute would overflow a buffer, and a variable-length string,
 * h5py's default for attrs['x'] = 'text', would be read as a raw pointer). A checkpoint is saved,
 * /usr/bin/python3 + h5py rewrites one root attribute at a time, and qt_checkpoint_load and
 * qt_checkpoint_read_meta must either read it correctly (variable-length strings) or return -1
 * with a message naming the file, the attribute and what was expected and found.
 * Exit 77 (skipped) when /usr/bin/python3 has no h5py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "train/train.h"

static const char *const base_path = "ckpt_attrs_base.h5", *case_path = "ckpt_attrs_case.h5";

/* Copies the base checkpoint to case_path and runs `stmt` on it (h5py file object `f`). */
static void craft(const char *stmt) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c \"import h5py, shutil, numpy as np; shutil.copyfile('%s', '%s'); "
           "f = h5py.File('%s', 'r+'); %s; f.close()\"",
           base_path, case_path, case_path, stmt);
  if (system(cmd) != 0) qt_test_fail("python could not craft the case: %s", stmt);
}

static void expect_refused(const char *stmt, const char *needle) {
  craft(stmt);
  char err[QT_ERR_LEN] = "";
  char model_err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_mlp", model_err);
  QT_ASSERT(g, "%s", model_err);
  qt_checkpoint_meta meta = {0};
  int rc = qt_checkpoint_load(case_path, g, NULL, &meta, err);
  if (rc != -1) qt_test_fail("%s: load returned %d, want -1", stmt, rc);
  else if (!strstr(err, needle) || !strstr(err, case_path))
    qt_test_fail("%s: load message '%s' lacks '%s' or the file name", stmt, err, needle);
  free(meta.config_ini);
  qt_graph_free(g);
}

static void expect_meta_refused(const char *stmt, const char *needle) {
  craft(stmt);
  char err[QT_ERR_LEN] = "";
  qt_checkpoint_meta meta = {0};
  int rc = qt_checkpoint_read_meta(case_path, &meta, err);
  if (rc != -1) qt_test_fail("%s: read_meta returned %d, want -1", stmt, rc);
  else if (!strstr(err, needle)) qt_test_fail("%s: read_meta message '%s' lacks '%s'", stmt, err, needle);
  free(meta.config_ini);
}

int main(void) {
  if (system("/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null") != 0) {
    printf("skipped: /usr/bin/python3 cannot import h5py and numpy\n");
    return 77;
  }
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_mlp", err);
  QT_ASSERT(g, "%s", err);
  qt_checkpoint_meta meta = {.epoch = 3, .step = 1234, .seed = 7, .config_ini = "[train]\nepochs = 4\n"};
  QT_ASSERT(qt_checkpoint_save(base_path, g, NULL, &meta, err) == 0, "%s", err);
  qt_graph_free(g);

  /* Arrays where scalars belong: refused before reading (an array once overflowed). */
  expect_refused("del f.attrs['epoch']; f.attrs['epoch'] = np.arange(64, dtype=np.int64)",
                 "/: attribute 'epoch' has 64 elements, expected 1..1");
  expect_refused("del f.attrs['step']; f.attrs['step'] = np.array([1, 2], dtype=np.int64)",
                 "attribute 'step' has 2 elements");
  expect_meta_refused("del f.attrs['seed']; f.attrs['seed'] = np.zeros(1000, dtype=np.int64)",
                      "attribute 'seed' has 1000 elements");
  expect_refused("del f.attrs['model']; f.attrs['model'] = np.array([b'fashion_mlp'] * 40)",
                 "attribute 'model' has 40 elements");
  expect_meta_refused("del f.attrs['config']; f.attrs['config'] = np.array([b'a', b'b'])",
                      "attribute 'config' has 2 elements");
  /* Wrong types. */
  expect_refused("del f.attrs['epoch']; f.attrs['epoch'] = 2.5", "attribute 'epoch' is not an integer, expected an integer, found a 64-bit float");
  expect_refused("del f.attrs['step']; f.attrs['step'] = 'many'", "attribute 'step' is not an integer");
  expect_refused("del f.attrs['model']; f.attrs['model'] = 5", "attribute 'model' is not a string");
  expect_meta_refused("del f.attrs['epoch']; f.attrs['epoch'] = -3", "epoch -3");
  expect_meta_refused("del f.attrs['step']; f.attrs['step'] = np.int64(-1)", "step -1");
  expect_refused("del f.attrs['step']; f.attrs['step'] = np.int64(-5)", "step -5, expected non-negative counts");
  /* A variable-length string too long for the model name. */
  expect_refused("del f.attrs['model']; f.attrs['model'] = 'x' * 300", "attribute 'model' is longer than 63 characters");

  /* Variable-length strings (h5py's default) are read as strings. */
  craft("del f.attrs['model']; f.attrs['model'] = 'fashion_mlp'; del f.attrs['config']; "
        "f.attrs['config'] = '[train]\\\\nepochs = 9\\\\n'");
  g = qt_model_build("fashion_mlp", err);
  QT_ASSERT(g, "%s", err);
  qt_checkpoint_meta got = {0};
  if (qt_checkpoint_load(case_path, g, NULL, &got, err)) {
    qt_test_fail("variable-length model/config: %s", err);
  } else {
    QT_CHECK(got.epoch == 3 && got.step == 1234 && got.seed == 7);
    if (!got.config_ini || strcmp(got.config_ini, "[train]\nepochs = 9\n") != 0)
      qt_test_fail("variable-length config read as '%s'", got.config_ini ? got.config_ini : "(null)");
  }
  free(got.config_ini);
  /* The writer's own file loads with its metadata. */
  memset(&got, 0, sizeof got);
  if (qt_checkpoint_load(base_path, g, NULL, &got, err)) qt_test_fail("base checkpoint: %s", err);
  else QT_CHECK(got.epoch == 3 && got.step == 1234 && got.config_ini && strcmp(got.config_ini, meta.config_ini) == 0);
  free(got.config_ini);
  qt_graph_free(g);
  return qt_test_finish();
}
