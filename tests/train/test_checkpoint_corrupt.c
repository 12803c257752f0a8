/* Corrupt checkpoints. (1) Checksummed checkpoints: a bit flip must never load as other numbers
 * without a word. Two real checkpoints are written by short runs: an fp32 one and a
 * QAT one (LSQ, histogram observers: /quant with qparams, observer state and histograms), both
 * with optimizer state. For each, 200 single-bit flips at seeded random positions are loaded
 * with qt_checkpoint_load into the run's graph and optimizer; a load that succeeds is saved
 * again and must give the original file's bytes (saving is deterministic), i.e. the flip was
 * in bytes that carry nothing (padding, free space). A flip that loads as a different state is
 * a silent load: the test wants 0 of them, and prints how many flips were refused and how many
 * were harmless. Every load, refused or not, leaves no HDF5 object open. (2) Crafted observer
 * state in the QAT checkpoint (a NaN or -inf histogram range would write out of bounds on the
 * next update, an inverted one loop forever):
 * /usr/bin/python3 + h5py rewrites one value of the first activation observer (a histogram
 * observer) and the load must refuse it naming the observer and the value. (3) A NaN or inf
 * parameter, buffer or optimizer state, or a negative BN running variance, written the same way
 * into the fp32 checkpoint: refused naming the tensor, element and value. Exit 77 (skipped)
 * when /usr/bin/python3 has no h5py. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/common/train_util.h"

#define FLIPS 200

static unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  QT_ASSERT(b, "out of memory");
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  QT_ASSERT(f && fwrite(b, 1, n, f) == n, "cannot write %s", path);
  fclose(f);
}

static qt_config *config(const char *const *overrides, int n) {
  char err[QT_ERR_LEN];
  qt_config *c = qt_train_config_create();
  for (int i = 0; i < n; i++)
    if (qt_config_apply_override(c, overrides[i], err)) qt_test_fail("override %s: %s", overrides[i], err);
  return c;
}

static const char *const fp32_run[] = {"model.name=fashion_cnn", "data.train_limit=256", "data.test_limit=128",
                                       "train.epochs=1",         "train.batch_size=64",  "train.threads=2",
                                       "output.progress=none",   "output.dot=false",     "output.dir=flip_fp32"};
static const char *const qat_run[] = {"model.name=fashion_cnn",
                                      "data.train_limit=256",
                                      "data.test_limit=128",
                                      "train.epochs=1",
                                      "train.batch_size=64",
                                      "train.threads=2",
                                      "output.progress=none",
                                      "output.dot=false",
                                      "output.timing=false",
                                      "output.dir=flip_qat",
                                      "quant.mode=qat",
                                      "quant.weight_bits=4",
                                      "quant.activation_bits=4",
                                      "quant.learnable_scale=true",
                                      "quant.activation_observer=histogram",
                                      "quant.check_batch=64",
                                      "quant.fp32_checkpoint=flip_fp32/checkpoint.h5"};
#define N_OF(a) ((int)(sizeof a / sizeof a[0]))

/* The run's graph (prepared for the QAT run) and an optimizer like the run's. */
static qt_graph *run_graph(int quantized, qt_optim **opt) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  QT_ASSERT(g, "%s", err);
  if (quantized) {
    qt_config *c = config(qat_run, N_OF(qat_run));
    qt_graph *p = qt_test_prepare(c, g, err);
    qt_config_free(c);
    QT_ASSERT(p, "prepare: %s", err);
    qt_graph_free(g);
    g = p;
  }
  qt_optim_config oc = {0};
  oc.kind = QT_OPTIM_SGD;
  oc.momentum = 0.9f;
  *opt = qt_optim_create(&oc, g->n_params);
  return g;
}

static void flip_campaign(const char *name, const char *path, int quantized, uint64_t seed) {
  char err[QT_ERR_LEN];
  size_t n = 0, m = 0;
  unsigned char *orig = read_bytes(path, &n);
  if (!orig) {
    qt_test_fail("%s: cannot read %s", name, path);
    return;
  }
  qt_optim *opt;
  qt_graph *g = run_graph(quantized, &opt);
  qt_checkpoint_meta meta = {0};
  /* Saving what was loaded gives the same bytes: the comparison below can detect any change. */
  if (qt_checkpoint_load(path, g, opt, &meta, err)) qt_test_fail("%s: load %s: %s", name, path, err);
  if (qt_checkpoint_save("flip_resaved.h5", g, opt, &meta, err)) qt_test_fail("%s: save: %s", name, err);
  free(meta.config_ini);
  unsigned char *again = read_bytes("flip_resaved.h5", &m);
  if (!again || m != n || memcmp(again, orig, n) != 0)
    qt_test_fail("%s: saving the loaded checkpoint does not reproduce its bytes (%zu vs %zu bytes)", name, m, n);
  free(again);

  int refused = 0, harmless = 0, silent = 0;
  uint64_t s = seed;
  for (int k = 0; k < FLIPS; k++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t bit = (size_t)((s >> 11) % ((uint64_t)n * 8));
    orig[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    write_bytes("flip_case.h5", orig, n);
    orig[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    qt_checkpoint_meta got = {0};
    const int rc = qt_checkpoint_load("flip_case.h5", g, opt, &got, err);
    if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0)
      qt_test_fail("%s: flip at byte %zu: the load left %lld HDF5 objects open", name, bit / 8,
                   (long long)H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL));
    if (rc) {
      refused++;
      if (!strstr(err, "flip_case.h5")) qt_test_fail("%s: flip at byte %zu: message lacks the file: %s", name, bit / 8, err);
      continue;
    }
    if (qt_checkpoint_save("flip_resaved.h5", g, opt, &got, err)) qt_test_fail("%s: save: %s", name, err);
    free(got.config_ini);
    again = read_bytes("flip_resaved.h5", &m);
    if (again && m == n && memcmp(again, orig, n) == 0) {
      harmless++;
    } else {
      silent++;
      qt_test_fail("%s: the flip of bit %zu (byte %zu of %zu) loaded silently as a different state", name, bit % 8,
                   bit / 8, n);
      /* Back to the original state for the next flip. */
      if (qt_checkpoint_load(path, g, opt, NULL, err)) qt_test_fail("%s: reload: %s", name, err);
    }
    free(again);
  }
  printf("%s checkpoint (%zu bytes): %d flips refused, %d harmless (bytes that carry nothing), %d loaded silently\n",
         name, n, refused, harmless, silent);
  QT_CHECK(refused > FLIPS / 2);
  qt_graph_free(g);
  qt_optim_free(opt);
  free(orig);
}

/* Copies the fp32 (quantized = 0) or QAT checkpoint to flip_case.h5, runs `setup` and `stmt` on
 * it with `f` the open file (h5py, which writes the checksums again), and loads it into that
 * run's graph and optimizer: it must be refused with a message holding `needle` and `needle2`
 * (when given), and the graph keep its values. */
static void expect_refused(int quantized, const char *setup, const char *stmt, const char *needle,
                           const char *needle2) {
  char cmd[2048], err[QT_ERR_LEN] = "";
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c \"import h5py, shutil, numpy as np; shutil.copyfile('%s/checkpoint.h5', "
           "'flip_case.h5'); f = h5py.File('flip_case.h5', 'r+'); %s%s; f.close()\"",
           quantized ? "flip_qat" : "flip_fp32", setup, stmt);
  if (system(cmd) != 0) {
    qt_test_fail("python could not craft the case: %s", stmt);
    return;
  }
  qt_optim *opt;
  qt_graph *g = run_graph(quantized, &opt);
  float *before = qt_test_copy_f32(g->params, g->n_params);
  int rc = qt_checkpoint_load("flip_case.h5", g, opt, NULL, err);
  if (rc != -1) qt_test_fail("%s: load returned %d, want -1", stmt, rc);
  else if (!strstr(err, needle) || (needle2 && !strstr(err, needle2)))
    qt_test_fail("%s: message '%s' lacks '%s'%s%s", stmt, err, needle, needle2 ? " or " : "", needle2 ? needle2 : "");
  if (memcmp(before, g->params, (size_t)g->n_params * sizeof(float)) != 0) qt_test_fail("%s: the graph changed", stmt);
  free(before);
  qt_graph_free(g);
  qt_optim_free(opt);
}

/* A value of the fp32 checkpoint. (Resumed, such a checkpoint trained on to NaN losses without a
 * word.) */
static void expect_values_refused(const char *stmt, const char *needle) { expect_refused(0, "", stmt, needle, NULL); }

/* With `o` the QAT checkpoint's first activation record's observer group (a histogram observer):
 * the message names the observer too. */
static void expect_observer_refused(const char *stmt, const char *needle) {
  expect_refused(1,
                 "r = f['quant/activation']; o = r[sorted(r.keys())[0]]['observer']; "
                 "assert o.attrs['kind'] == b'histogram'; ",
                 stmt, needle, "/observer");
}

int main(void) {
  char err[QT_ERR_LEN];
  /* No HDF5 free lists: a block HDF5 leaks on a corrupt object header (lsan_hdf5.supp) then
   * shows where it leaked, not the unrelated allocation that first used the recycled memory. */
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  if (system("/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null") != 0) {
    printf("skipped: /usr/bin/python3 cannot import h5py and numpy\n");
    return 77;
  }
  qt_config *c = config(fp32_run, N_OF(fp32_run));
  if (qt_test_train_run(c, err)) qt_test_fail("fp32 run: %s", err);
  qt_config_free(c);
  c = config(qat_run, N_OF(qat_run));
  if (qt_test_train_run(c, err)) qt_test_fail("qat run: %s", err);
  qt_config_free(c);
  flip_campaign("fp32", "flip_fp32/checkpoint.h5", 0, 1);
  flip_campaign("qat", "flip_qat/checkpoint.h5", 1, 2);

  expect_observer_refused("o.attrs['hist_min'] = np.float32('nan')", "histogram range [nan");
  expect_observer_refused("o.attrs['hist_max'] = np.float32('-inf')", "-inf] is not a finite range");
  expect_observer_refused("o.attrs['hist_min'] = np.float32(5); o.attrs['hist_max'] = np.float32(-5)",
                          "histogram range [5, -5] is not a finite range");
  expect_observer_refused("o['min'][0] = np.float32('nan')", "channel 0: min nan");
  expect_observer_refused("o['min'][0] = np.float32(3); o['max'][0] = np.float32(-3)", "min 3, max -3");
  expect_observer_refused("h = o['hist'][...]; h[0] = 2**62; h[1] = 2**62; o['hist'][...] = h", "add up to more than");
  expect_observer_refused("o['hist'][3] = -1", "hist[3] = -1 is negative");
  expect_observer_refused("o.attrs['initialized'] = np.int32(0)", "has seen no data");
  expect_values_refused("f['params/conv1.weight'][0, 0, 1, 2] = np.float32('nan')",
                        "conv1.weight[5] is nan (not finite)");
  expect_values_refused("f['params/fc2.bias'][3] = np.float32('-inf')", "fc2.bias[3] is -inf (not finite)");
  expect_values_refused("f['buffers/bn1.running_var'][7] = np.float32(-0.5)",
                        "bn1.running_var[7] is -0.5 (a negative variance)");
  expect_values_refused("k = sorted(f['optim'].keys())[0]; f['optim'][k][11] = np.float32('inf')",
                        "the optimizer state of conv1.weight[11] is inf (not finite)");
  return qt_test_finish();
}
