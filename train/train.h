/* The training library's building blocks: evaluation and HDF5 checkpoints (atomic) with
 * resume. The typed options are in train/options.h, the pipeline stages and the whole job in
 * train/pipeline.h. The library never exits; it returns 0 or -1 with a message. */
#ifndef QT_TRAIN_H
#define QT_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "autograd/autograd.h"
#include "data/data.h"
#include "nn/nn.h"
#include "optim/optim.h"

#include "base/base.h"

/* ---- evaluation -------------------------------------------------------------------------- */
typedef struct {
  double accuracy; /* top-1, in [0, 1] */
  double loss;     /* mean cross-entropy */
  int64_t n;
  double seconds;
} qt_eval_result;
/* Eval mode, no grad, in batches; the graph's modes are restored afterwards (fake quant and
 * observers stay as the caller set them). ctx: an
 * arena to reuse (the training loop's, so the two share memory), or NULL for a private one. */
int qt_evaluate(qt_graph *g, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc, qt_eval_result *out,
                char *err);
/* qt_evaluate with the samples split across the job's processes (dist/dist.h: contiguous ranges
 * in rank order) and the results combined: every process must call it, and every process gets
 * the whole set's accuracy, mean loss and count. Alone: exactly qt_evaluate. */
int qt_evaluate_distributed(qt_graph *g, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc,
                            qt_eval_result *out, char *err);

/* ---- checkpoints (HDF5) ------------------------------------------------------------------ */
typedef struct {
  int epoch;    /* epochs completed */
  int64_t step; /* optimizer steps taken */
  uint64_t seed;
  char *config_ini; /* resolved config text (malloc'd on load) */
} qt_checkpoint_meta;

/* Writes parameters, buffers, optimizer state (if opt) and meta to path atomically
 * (a qt_temp_create file, fsync, rename). A prepared (quantized) graph also gets its quantization training
 * state: qparams, observer state, enable flags, LSQ links and bn_frozen flags (/quant,
 * qat/qstate_file.h), so that a QAT run resumes bit for bit. */
int qt_checkpoint_save(const char *path, const qt_graph *g, qt_optim *opt, const qt_checkpoint_meta *meta, char *err);
/* Loads into an already built graph of the same architecture (every tensor must be present
 * with the same shape); optimizer state only if opt is not NULL. meta may be NULL. A prepared
 * graph needs a checkpoint with /quant whose records match its own (same points, bit widths,
 * ranges, observers, LSQ), and an fp32 graph one without; otherwise the load is refused with
 * a message naming the file and the mismatch. All or nothing: on error g is untouched. */
int qt_checkpoint_load(const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err);
/* The same from a checkpoint file's bytes in memory; name (its path) labels the messages. */
int qt_checkpoint_load_image(const void *bytes, size_t n, const char *name, qt_graph *g, qt_optim *opt,
                             qt_checkpoint_meta *meta, char *err);
/* Data parallel (dist/dist.h): process 0 reads path and every process loads its bytes, so that
 * all start from the same state without the file on every host. Alone: qt_checkpoint_load.
 * Every process must call it; all fail together when process 0 cannot read the file. */
int qt_checkpoint_load_shared(const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err);
/* Only the meta (epoch, step, seed, config text), without a graph. */
int qt_checkpoint_read_meta(const char *path, qt_checkpoint_meta *meta, char *err);

#endif
