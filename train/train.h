/* The training job behind `qat_train config.ini`: the configuration schema, data loading,
 * the training loop with progress, CSV log and summary.json, evaluation, and HDF5
 * checkpoints (atomic) with resume. The library never exits; it returns 0 or -1 with a
 * message in err. */
#ifndef QT_TRAIN_H
#define QT_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "autograd/autograd.h"
#include "config/config.h"
#include "data/data.h"
#include "nn/nn.h"
#include "optim/optim.h"

#include "base/base.h"

/* The schema of every key `qat_train` accepts (section, key, type, default, range, help). */
const qt_cfg_key *qt_train_schema(int *n_keys);
/* A config holding the schema's defaults. */
qt_config *qt_train_config_create(void);

/* Loads the training and test sets the config's [data] section describes (limits applied). */
int qt_train_load_data(const qt_config *cfg, qt_dataset *train, qt_dataset *test, char *err);
/* The loader settings of a run's config: batch, train.seed, data.mean/std; with augment also
 * data.crop_pad and data.flip. */
qt_loader_config qt_train_loader_config(const qt_config *cfg, int batch, int shuffle, int augment);

/* Runs the whole job described by cfg (train, evaluate, checkpoint, summary). */
int qt_train_run(qt_config *cfg, char *err);

/* ---- evaluation -------------------------------------------------------------------------- */
typedef struct {
  double accuracy;   /* top-1, in [0, 1] */
  double loss;       /* mean cross-entropy */
  int64_t n;
  double seconds;
} qt_eval_result;
/* Eval mode, no grad, in batches; the graph is left in training mode afterwards. ctx: an
 * arena to reuse (the training loop's, so the two share memory), or NULL for a private one. */
int qt_evaluate(qt_graph *g, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc, qt_eval_result *out,
                char *err);

/* ---- checkpoints (HDF5) ------------------------------------------------------------------ */
typedef struct {
  int epoch;            /* epochs completed */
  int64_t step;         /* optimizer steps taken */
  uint64_t seed;
  char *config_ini;     /* resolved config text (malloc'd on load) */
} qt_checkpoint_meta;

/* Writes parameters, buffers, optimizer state (if opt) and meta to path atomically
 * (path.tmp, fsync, rename). A prepared (quantized) graph also gets its quantization training
 * state: qparams, observer state, enable flags, LSQ links and bn_frozen flags (/quant,
 * qat/qstate_file.h), so that a QAT run resumes bit for bit. */
int qt_checkpoint_save(const char *path, const qt_graph *g, qt_optim *opt, const qt_checkpoint_meta *meta,
                       char *err);
/* Loads into an already built graph of the same architecture (every tensor must be present
 * with the same shape); optimizer state only if opt is not NULL. meta may be NULL. A prepared
 * graph needs a checkpoint with /quant whose records match its own (same points, bit widths,
 * ranges, observers, LSQ), and an fp32 graph one without; otherwise the load is refused with
 * a message naming the file and the mismatch. All or nothing: on error g is untouched. */
int qt_checkpoint_load(const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err);
/* Only the meta (epoch, step, seed, config text), without a graph. */
int qt_checkpoint_read_meta(const char *path, qt_checkpoint_meta *meta, char *err);


#endif
