/* Fuzz target: the checkpoint reader (train/train.h qt_checkpoint_read_meta and
 * qt_checkpoint_load), into an fp32 graph with SGD state and into a QAT-prepared graph (W4A4,
 * histogram observers, LSQ) with AdamW state, so that /quant (qat/qstate_file.h) is read too.
 *
 * Input: an HDF5 checkpoint; its checksums are recomputed first (fuzz_util.h). Every call must
 * succeed or fail with a message naming the file, close every HDF5 object, and on failure leave
 * the graph and optimizer untouched (all or nothing). An odd-sized input is also loaded into
 * the fp32 graph without optimizer or meta. After a successful load into the prepared graph,
 * one training-mode forward pass (observers and fake quant running on the loaded state) must
 * succeed or fail with a message: a checkpoint that loads is one training continues from. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_graphs.h"
#include "fuzz/fuzz_util.h"
#include "train/train.h"

typedef struct {
  const char *what;
  qt_graph *g;
  qt_optim *opt;
  float *params, *buffers, *state[4]; /* snapshots before a load */
} subject;

static subject fp32, qat;
static qt_ctx *ctx;

static qt_optim *make_optim(qt_optim_kind kind, int64_t n) {
  qt_optim_config oc = {
      .kind = kind, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_optim_config_check(&oc, err) == 0, "%s", err);
  qt_optim *o = qt_optim_create(&oc, n);
  QT_ASSERT(o, "out of memory");
  return o;
}

static void subject_init(subject *s, const char *what, qt_graph *g, qt_optim_kind kind) {
  s->what = what;
  s->g = g;
  s->opt = make_optim(kind, g->n_params);
  s->params = malloc((size_t)g->n_params * sizeof(float) + 1);
  s->buffers = malloc((size_t)g->n_buffers * sizeof(float) + 1);
  QT_ASSERT(s->params && s->buffers && qt_optim_state_count(s->opt) <= 4, "out of memory");
  for (int i = 0; i < qt_optim_state_count(s->opt); i++) {
    s->state[i] = malloc((size_t)g->n_params * sizeof(float) + 1);
    QT_ASSERT(s->state[i], "out of memory");
  }
}

static void snapshot(subject *s) {
  memcpy(s->params, s->g->params, (size_t)s->g->n_params * sizeof(float));
  memcpy(s->buffers, s->g->buffers, (size_t)s->g->n_buffers * sizeof(float));
  for (int i = 0; i < qt_optim_state_count(s->opt); i++) {
    const char *name;
    memcpy(s->state[i], qt_optim_state(s->opt, i, &name), (size_t)s->g->n_params * sizeof(float));
  }
}

static void expect_untouched(const subject *s) {
  QT_ASSERT(!memcmp(s->params, s->g->params, (size_t)s->g->n_params * sizeof(float)) &&
                !memcmp(s->buffers, s->g->buffers, (size_t)s->g->n_buffers * sizeof(float)),
            "%s: a failed load changed the graph", s->what);
  for (int i = 0; i < qt_optim_state_count(s->opt); i++) {
    const char *name;
    QT_ASSERT(!memcmp(s->state[i], qt_optim_state(s->opt, i, &name), (size_t)s->g->n_params * sizeof(float)),
              "%s: a failed load changed the optimizer state %s", s->what, name);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  qt_fuzz_h5_init();
  ctx = qt_ctx_create();
  QT_ASSERT(ctx, "out of memory");
  qt_graph *g = qt_fuzz_tiny_graph();
  const qt_quantizer_config qc = qt_fuzz_qat_config();
  subject_init(&qat, "prepared graph", qt_fuzz_prepare(g, &qc, QT_PREPARE_QAT), QT_OPTIM_ADAMW);
  subject_init(&fp32, "fp32 graph", g, QT_OPTIM_SGD);
  return 0;
}

/* One load into s; checks the contract and returns the status. */
static int load(subject *s, const char *path, int with_optim) {
  char err[QT_ERR_LEN] = "";
  qt_checkpoint_meta meta;
  memset(&meta, 0, sizeof meta);
  snapshot(s);
  const int rc = qt_checkpoint_load(path, s->g, with_optim ? s->opt : NULL, with_optim ? &meta : NULL, err);
  qt_fuzz_h5_expect_closed("qt_checkpoint_load");
  QT_ASSERT(rc == 0 || rc == -1, "%s: status %d", s->what, rc);
  if (rc) {
    QT_ASSERT(strstr(err, path), "%s: refused without naming the file: '%s'", s->what, err);
    expect_untouched(s);
  } else {
    QT_ASSERT(meta.epoch >= 0 && meta.step >= 0, "%s: epoch %d, step %lld", s->what, meta.epoch, (long long)meta.step);
  }
  free(meta.config_ini);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  uint8_t *buf = malloc(size ? size : 1);
  QT_ASSERT(buf, "out of memory");
  memcpy(buf, data, size);
  qt_fuzz_h5_fix_checksums(buf, size);
  const char *path = qt_fuzz_path(0, "checkpoint.h5");
  qt_fuzz_write_file(path, buf, size);
  free(buf);

  char err[QT_ERR_LEN] = "";
  qt_checkpoint_meta meta;
  memset(&meta, 0, sizeof meta);
  const int rc = qt_checkpoint_read_meta(path, &meta, err);
  qt_fuzz_h5_expect_closed("qt_checkpoint_read_meta");
  QT_ASSERT(rc == 0 ? meta.epoch >= 0 && meta.step >= 0 : strstr(err, path) != NULL,
            "read_meta: status %d, epoch %d, step %lld, message '%s'", rc, meta.epoch, (long long)meta.step, err);
  free(meta.config_ini);

  load(&fp32, path, 1);
  if (size % 2) load(&fp32, path, 0);
  if (load(&qat, path, 1) == 0) {
    qt_graph_set_mode(qat.g, QT_MODE_TRAIN);
    if (qt_fuzz_forward(qat.g, ctx, 2) != 0) QT_ASSERT(qat.g->error[0], "forward failed without a message");
    qt_ctx_reset(ctx);
  }
  return 0;
}
