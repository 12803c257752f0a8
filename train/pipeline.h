/* The pipeline as library calls (docs/design.md: pipeline): each stage of `qat_train` is one function taking
 * typed options (train/options.h), so that every program is argument parsing plus stage calls.
 *
 *   load data -> build model -> [obtain fp32 -> prepare -> calibrate] -> train epochs ->
 *   [convert + check + save -> deploy + compare] -> summary
 *
 * Stages report failures through qt_status: QT_STATUS_INPUT for what the user gave (a
 * contradictory setting, a model that does not fit the data), QT_STATUS_IO / FORMAT for files,
 * QT_STATUS_RUNTIME for a job that failed while running (a diverging loss, a failed check). */
#ifndef QT_PIPELINE_H
#define QT_PIPELINE_H

#include <stdio.h>

#include "eval/report.h"
#include "qat/qat.h"
#include "train/options.h"
#include "train/train.h"

/* ---- data ------------------------------------------------------------------------------------ */
typedef enum { QT_SPLIT_TRAIN = 1, QT_SPLIT_TEST = 2, QT_SPLIT_BOTH = 3 } qt_split;
/* Loads the splits [data] describes (limits applied); a split not asked for is left empty.
 * With both, their image shapes must agree. */
int qt_stage_load_data(const qt_data_options *d, qt_split which, qt_dataset *train, qt_dataset *test, qt_status *st);

/* For the programs that evaluate a model file (qat_check, qat_run, qat_report,
 * qat_backend_check): the options of config_path (NULL: the defaults, Fashion-MNIST), its test
 * split cut to `images` (0 = all), and its evaluation loader settings at `batch` (0 =
 * train.eval_batch_size). A bad config is QT_STATUS_INPUT, missing data QT_STATUS_IO. */
int qt_stage_test_data(const char *config_path, int images, int batch, qt_options *o, qt_dataset *test,
                       qt_loader_config *lc, qt_status *st);

/* What a loader is for: training batches (train.batch_size, shuffled, augmented), calibration
 * batches (the same batches: PTQ calibrates on what QAT would train on) and evaluation
 * (train.eval_batch_size, in order, no augmentation). The one place options become loader
 * settings (normalization included). Under mpirun (dist/dist.h) training and calibration
 * loaders give each process its shard of every batch. */
typedef enum { QT_LOADER_TRAIN, QT_LOADER_CALIBRATE, QT_LOADER_EVAL } qt_loader_purpose;
qt_loader_config qt_stage_loader_config(const qt_options *o, qt_loader_purpose purpose);

/* The first n images of ds (n clipped to its size) as one evaluation batch: *images points into
 * the returned loader's buffer (free it with qt_loader_free when done); *got is the count. */
qt_loader *qt_stage_first_images(const qt_options *o, const qt_dataset *ds, int n, const float **images, int *got,
                                 qt_status *st);

/* ---- model ----------------------------------------------------------------------------------- */
/* Builds model.name (initialized from train.seed) or imports model.onnx (its initializers; dims
 * it leaves dynamic come from data's images, or the test split's when data is NULL), checks that
 * it takes data's images and has an output per class, and records the input preprocessing
 * (data.mean / data.std: the model files carry it). data may be NULL (no check). A model that
 * cannot be built or imported is QT_STATUS_INPUT, its message naming the file and node. */
qt_graph *qt_stage_build_model(const qt_options *o, const qt_dataset *data, qt_status *st);
/* The check qt_stage_build_model makes: g takes data's images and has an output per class. */
int qt_stage_model_fits(const qt_options *o, const qt_graph *g, const qt_dataset *data, qt_status *st);
/* Where a quantized run's fp32 model came from (summary.json "fp32_model"). */
typedef struct {
  int from_checkpoint;              /* 0: quant.fp32_checkpoint empty, the model's initialization */
  char checkpoint[QT_OPT_STR + 32]; /* the file (see qt_options_fp32_recipe) */
  const char *how;                  /* "trained" (by this run, with the recipe), "reused" (its stored config is
                                     * the recipe), "reused, not compared" (no quant.fp32_config), "reused with
                                     * quant.fp32_reuse = any" (it differs) */
  int epochs;                       /* fp32 epochs the checkpoint holds */
  int train_limit;                  /* its stored data.train_limit (0: the whole training set; -1: unknown) */
  char train_images[QT_OPT_STR];    /* its stored data.train_images (or data.path) */
} qt_fp32_origin;

/* Makes sure the fp32 checkpoint is the model quant.fp32_config trains with this run's [data]
 * (its stored config against the recipe; a difference is refused with QT_STATUS_INPUT naming
 * the key, or decided by quant.fp32_reuse), training it first when it does not exist yet (a
 * sub-run in this process, before this run loads its own data), then loads it into g. Without
 * quant.fp32_checkpoint g keeps its initialization. origin (may be NULL) receives where it
 * came from. */
int qt_stage_obtain_fp32(const qt_options *o, qt_graph *g, int verbose, qt_fp32_origin *origin, qt_status *st);

/* ---- quantization ---------------------------------------------------------------------------- */
/* The Quantizer quant.quantizer names (with quant.backend's description), then prepare for
 * quant.mode (PTQ folds BN; QAT keeps conv_bn), then with quant.cle cross-layer equalization of
 * the prepared graph (qt_cross_layer_equalize; its outcome in *cle, which may be NULL). Writes
 * what the Quantizer decided, and the equalized pairs, to report (may be NULL). */
qt_graph *qt_stage_prepare(const qt_options *o, const qt_graph *fp32, FILE *report, qt_cle_result *cle, qt_status *st);
/* quant.adaround: qt_adaround of the calibrated p on the first quant.adaround_images images of
 * train (evaluation preprocessing), one line per layer to stderr when verbose, its outcome in *res,
 * and in *reference a copy of p's parameters from before (the float model, which a later bias
 * correction measures against; the caller frees it). Nothing otherwise (res zeroed, *reference
 * NULL). */
int qt_stage_adaround(const qt_options *o, qt_graph *p, const qt_dataset *train, qt_ctx *ctx, qt_adaround_result *res,
                      float **reference, int verbose, qt_status *st);
/* quant.bias_correction = empirical: qt_bias_correct of the calibrated p on the first
 * quant.bias_correction_images images of train (evaluation preprocessing) against the float model
 * in reference (NULL: p's own parameters; after AdaRound, qt_stage_adaround's copy);
 * analytical: qt_bias_correct_analytical from the batch norms of fp32, the graph p was prepared
 * from. Its outcome in *res; nothing (res zeroed) with none. */
int qt_stage_bias_correct(const qt_options *o, const qt_graph *fp32, qt_graph *p, const qt_dataset *train, qt_ctx *ctx,
                          const float *reference, qt_bias_correction_result *res, int verbose, qt_status *st);
/* Calibrates p on quant.calibration_batches calibration batches of train (epoch 0; fewer when
 * the epoch ends first: *batches, may be NULL, gets the count), then freezes its observers
 * (the qparams stay fixed) and leaves it in QT_MODE_TRAIN. Under mpirun every process observes
 * its shard of each batch and the observers combine them (the same qparams on all). */
int qt_stage_calibrate(const qt_options *o, qt_graph *p, const qt_dataset *train, qt_ctx *ctx, int *batches,
                       int verbose, qt_status *st);
/* Calibrates p on the next batches of the started loader l (QT_MODE_CALIBRATE) until *done
 * (counted across calls) reaches `until` or the epoch ends, then as qt_stage_calibrate. */
int qt_calibrate_until(qt_graph *p, qt_loader *l, const qt_dataset *train, qt_ctx *ctx, int until, int *done,
                       char *err);
/* PTQ from an fp32 checkpoint to a saved Q/DQ file, the stages above in order (build, obtain
 * fp32, prepare, calibrate, convert, save): qat_backend_check --quantize. report (may be NULL)
 * gets the Quantizer's decisions and a closing line "calibrated on N batches; wrote PATH". */
int qt_stage_ptq_to_file(const qt_options *o, const char *out_path, FILE *report, qt_status *st);

/* ---- training -------------------------------------------------------------------------------- */
typedef struct qt_trainer qt_trainer; /* optimizer, LR schedule, training loader, step count */
typedef struct {
  int epoch; /* 1-based */
  double lr, train_loss, train_acc, test_loss, test_acc, images_per_s, seconds;
  int64_t images;
} qt_epoch_stats;
/* Trains g (fp32 or prepared) on train with [train] (and [quant]'s freeze schedules). */
qt_trainer *qt_trainer_create(const qt_options *o, qt_graph *g, const qt_dataset *train, qt_status *st);
void qt_trainer_free(qt_trainer *t);
qt_optim *qt_trainer_optim(qt_trainer *t);
int64_t qt_trainer_batches(const qt_trainer *t);
int64_t qt_trainer_step(const qt_trainer *t);
void qt_trainer_set_step(qt_trainer *t, int64_t step);
/* Called after every step of qt_trainer_epoch with the epoch's 0-based batch index and this
 * process's rows of it (the step's profile phases, when ctx has a profile, already added); a
 * nonzero return ends the epoch after that step (bench/bench_profile.c runs a few steps). NULL:
 * none (the default). */
typedef int (*qt_step_hook)(void *user, int64_t batch, int rows);
void qt_trainer_set_step_hook(qt_trainer *t, qt_step_hook fn, void *user);
/* One epoch (0-based `epoch`): the freeze schedules checked before every step, the NaN stop
 * inside (the graph is not updated by a non-finite loss; the message names epoch, batch, step
 * and lr). Fills the training half of *out; progress is drawn on stderr per output.progress.
 * When ctx has a profile (qt_ctx_set_profile), each step adds its phases to it: data, zero_grad,
 * optimizer, grad_sum (data parallel: the gradient sum after the backward or, with buckets
 * summed during it (dist.bucket_mb), the wait for them left after it) and the whole step; the
 * ops add their own. */
int qt_trainer_epoch(qt_trainer *t, qt_ctx *ctx, int epoch, qt_epoch_stats *out, qt_status *st);

/* What the PTQ methods did before convert (summary.json's "quant"). */
typedef struct {
  qt_cle_result cle; /* quant.cle: the equalized pairs */
  qt_adaround_result adaround;
  qt_bias_correction_result bias_correction;
} qt_ptq_methods;

/* ---- convert, check, deploy ------------------------------------------------------------------ */
typedef struct {
  qt_eval_result fake_quant, qdq;
  char qdq_path[4200];
  char trained_path[4200];
  char onnx_path[4200]; /* model_qdq.onnx: the Q/DQ graph as QDQ ONNX (onnx/onnx_export.h);
                         * "" when the export refused the graph (onnx_error says why) */
  char onnx_error[QT_ERR_LEN];
  qt_check_report check;
  int lost_channels;      /* qt_lost_weight_channels of the convert graph */
  char lost_detail[1024]; /* its per-layer lines */
  /* qt_stage_deploy: the lowered Q/DQ graph on the test set and inference speed */
  int deployed;
  qt_report report;
  qt_inference_speed speed;
  char report_path[4200];
} qt_quant_result;
/* Evaluates the trained prepared graph p, converts it, saves model_trained.h5 and model_qdq.h5
 * into dir, exports the saved Q/DQ file as model_qdq.onnx (QDQ ONNX), evaluates the saved Q/DQ
 * file and runs the check (training graph = convert graph) on quant.check_batch test images. A
 * failed check is not an error here: res->check says it. An export that cannot be written is
 * QT_STATUS_IO, a graph the export cannot express QT_STATUS_RUNTIME. */
int qt_stage_convert(const qt_options *o, qt_graph *p, const qt_dataset *test, qt_ctx *ctx, const char *dir,
                     qt_quant_result *res, int verbose, qt_status *st);
/* The backend the quant.* settings name (qt_backend_desc_named): quant.backend = xnnpack or
 * onednn selects that built-in backend; quant.quantizer = backend takes quant.backend as a name
 * or a description file; otherwise oneDNN with quant.isa. The Quantizer is derived from it and
 * the model deploys on it. origin (may be NULL): "built in" or the file. 0, or -1 with err. */
int qt_stage_backend_desc(const qt_quant_options *q, qt_backend_desc *d, const char **origin, char *err);

/* Lowers the saved Q/DQ graph (res->qdq_path) on the backend it was quantized for, runs the three-stage report (fp32
 * graph, Q/DQ graph, int8 device) on the test set, times fp32 and int8 inference at batch 256, writes <dir>/report.txt
 * (printed when verbose). */
int qt_stage_deploy(const qt_options *o, qt_graph *fp32, const qt_dataset *test, const char *dir, qt_quant_result *res,
                    int verbose, qt_status *st);

/* The deployed model against the Q/DQ graph on a config's test set (qt_stage_test_data), judged
 * by the one agreement rule and printed to stdout with qt_device_agreement_print: 0 passes,
 * 1 fails, -1 on an error (st set). */
int qt_stage_compare_device(const char *config_path, int images, int batch, qt_device *dev, qt_graph *qdq,
                            const char *prefix, qt_status *st);

/* ---- the whole job --------------------------------------------------------------------------- */
/* `qat_train`: train (fp32 or QAT) or calibrate (PTQ), evaluate, checkpoint, convert, check,
 * deploy, report and write summary.json into output.dir. */
int qt_train_run(const qt_options *o, qt_status *st);

#endif
