/* The typed options of a run: the config (config/config.h, schema in train/schema.c) resolved
 * once into a struct, one struct per section and C enums for every choice, with every rule
 * that involves more than one key checked here. Library code takes these structs; string
 * lookups by section and key exist only in the resolver (train/schema.c). */
#ifndef QT_OPTIONS_H
#define QT_OPTIONS_H

#include <stdint.h>

#include "base/base.h"
#include "config/config.h"
#include "optim/optim.h"
#include "quant/quant.h"

/* Longest string value (a path, a list); the parser limits lines to less than this. */
#define QT_OPT_STR 512

typedef enum { QT_DATA_IDX, QT_DATA_HDF5, QT_DATA_FOLDER, QT_DATA_FORMAT_COUNT } qt_data_format;
typedef enum { QT_STORAGE_FILE, QT_STORAGE_MEMORY, QT_STORAGE_COUNT } qt_data_storage;
/* train.conv_algorithm: the training steps' convolutions (qt_ctx_set_conv_winograd) */
typedef enum { QT_CONV_WINOGRAD, QT_CONV_DIRECT, QT_CONV_ALGORITHM_COUNT } qt_conv_algorithm;
typedef enum { QT_QUANT_NONE, QT_QUANT_PTQ, QT_QUANT_QAT, QT_QUANT_MODE_COUNT } qt_quant_mode;
typedef enum { QT_QUANTIZER_ONEDNN, QT_QUANTIZER_BACKEND, QT_QUANTIZER_COUNT } qt_quantizer_choice;
typedef enum { QT_QUANT_ISA_AUTO, QT_QUANT_ISA_VNNI, QT_QUANT_ISA_NO_VNNI, QT_QUANT_ISA_COUNT } qt_quant_isa;
/* quant.bias: auto = int32 where the backend takes its biases as int32 only (XNNPACK). */
typedef enum { QT_QUANT_BIAS_AUTO, QT_QUANT_BIAS_INT32, QT_QUANT_BIAS_FLOAT, QT_QUANT_BIAS_COUNT } qt_quant_bias;
/* quant.weight_observer: auto = minmax for PTQ, moving_average for QAT. */
typedef enum { QT_WOBS_AUTO, QT_WOBS_MINMAX, QT_WOBS_MOVING_AVERAGE, QT_WOBS_COUNT } qt_weight_observer_choice;
/* quant.learnable_weight_scale: with LSQ, auto = weights of fewer than 8 bits learn their scales */
typedef enum { QT_LSQW_AUTO, QT_LSQW_TRUE, QT_LSQW_FALSE, QT_LSQW_COUNT } qt_learnable_weight_scale;
typedef enum { QT_QAT_INIT_OBSERVERS, QT_QAT_INIT_CALIBRATION, QT_QAT_INIT_COUNT } qt_qat_init;
typedef enum { QT_KEEP_W8A8, QT_KEEP_FP32, QT_KEEP_COUNT } qt_mixed_keep;
/* quant.cle_relu6: chains through relu6 left alone, or the relu6 made relu and equalized */
typedef enum { QT_CLE_RELU6_KEEP, QT_CLE_RELU6_RELU } qt_cle_relu6;
/* quant.adaround_unit: each layer (AdaRound) or each block (BRECQ / QDrop) */
typedef enum { QT_ADAROUND_UNIT_LAYER, QT_ADAROUND_UNIT_BLOCK } qt_adaround_unit_choice;
/* quant.bias_correction: none, the empirical form (qt_bias_correct) or the analytical one
 * (qt_bias_correct_analytical) */
typedef enum {
  QT_BIAS_CORRECTION_NONE,
  QT_BIAS_CORRECTION_EMPIRICAL,
  QT_BIAS_CORRECTION_ANALYTICAL
} qt_bias_correction_choice;
/* quant.fp32_reuse: an existing fp32 checkpoint whose recipe differs from quant.fp32_config's */
typedef enum { QT_FP32_REUSE_CHECK, QT_FP32_REUSE_RETRAIN, QT_FP32_REUSE_ANY, QT_FP32_REUSE_COUNT } qt_fp32_reuse;
typedef enum { QT_PROGRESS_AUTO, QT_PROGRESS_BAR, QT_PROGRESS_LINES, QT_PROGRESS_NONE, QT_PROGRESS_COUNT } qt_progress;

typedef struct {
  char name[QT_OPT_STR]; /* a preset of nn/models.c (qt_model_names) */
  char onnx[QT_OPT_STR]; /* an ONNX file to import instead (onnx/onnx_import.h); "" = the preset */
} qt_model_options;

typedef struct {
  qt_data_format format;
  char train_images[QT_OPT_STR], train_labels[QT_OPT_STR], test_images[QT_OPT_STR], test_labels[QT_OPT_STR];
  char train_path[QT_OPT_STR], test_path[QT_OPT_STR]; /* hdf5 file or image-folder root */
  int channels;                                       /* image folders: decode to 1 or 3 */
  int train_limit, test_limit;                        /* first N images, 0 = all */
  double mean, std;                                   /* normalization of pixel/255 values */
  int crop_pad, flip;                                 /* augmentation of training batches */
  qt_data_storage storage;                            /* where decoded images live during a run */
  char scratch_dir[QT_OPT_STR];                       /* storage = file: its directory ("" = default) */
} qt_data_options;

typedef struct {
  int epochs, batch_size, eval_batch_size;
  qt_optim_kind optimizer;
  double lr, min_lr;
  qt_lr_kind schedule;
  double warmup_epochs, step_epochs, gamma;
  double momentum;
  int nesterov;
  double weight_decay, beta1, beta2, adam_eps;
  int seed, threads, resume, stop_after_epochs;
  qt_conv_algorithm conv_algorithm;
} qt_train_options;

typedef struct {
  double bucket_mb; /* gradient sums in buckets of this many MB during the backward; 0: one sum after it */
  double timeout;   /* the training loop's watchdog (qt_dist_watchdog_start), seconds; 0: none */
} qt_dist_options;

typedef struct {
  qt_quant_mode mode;
  qt_quantizer_choice quantizer;
  char backend[QT_OPT_STR];
  int weight_bits, activation_bits;
  qt_quant_isa isa;
  qt_quant_bias bias;
  qt_weight_observer_choice weight_observer;
  qt_observer_kind activation_observer;
  qt_range_method activation_range;
  double percentile;
  int learnable_scale;
  qt_learnable_weight_scale learnable_weight_scale;
  int fuse_add;    /* a conv feeding only an add joins the add's unit (onednn_cpu) */
  int fuse_gate;   /* a conv / linear -> activation -> mul is one unit (onednn_cpu) */
  int fp32_output; /* the graph's output is no quantization point (real values) */
  int cle;         /* PTQ: cross-layer equalization before calibration */
  qt_cle_relu6 cle_relu6;
  qt_bias_correction_choice bias_correction;
  int bias_correction_images;
  int adaround; /* PTQ: AdaRound after calibration (qt_adaround) */
  qt_adaround_unit_choice adaround_unit;
  int adaround_images, adaround_iterations, adaround_batch;
  double adaround_lambda, adaround_lr, adaround_qdrop;
  char layer_overrides[QT_OPT_STR];
  char fp32_checkpoint[QT_OPT_STR], fp32_config[QT_OPT_STR];
  qt_fp32_reuse fp32_reuse;
  int calibration_batches;
  qt_qat_init qat_init;
  double freeze_observers_after, freeze_bn_after;
  int check_batch;
} qt_quant_options;

typedef struct {
  char calibration_methods[QT_OPT_STR], calibration_batches[QT_OPT_STR];
  int layer_sqnr, sensitivity;
  char mixed_precision_k[QT_OPT_STR];
  qt_mixed_keep mixed_precision_keep;
  int images;
} qt_analysis_options;

typedef struct {
  char dir[QT_OPT_STR];
  qt_progress progress;
  int dot;
  int timing; /* time fp32 and int8 inference after the report (summary.inference) */
} qt_output_options;

typedef struct {
  qt_model_options model;
  qt_data_options data;
  qt_train_options train;
  qt_dist_options dist;
  qt_quant_options quant;
  qt_analysis_options analysis;
  qt_output_options output;
} qt_options;

/* The schema of every key `qat_train` accepts (section, key, type, default, range, help), in
 * the order of the option structs. */
const qt_cfg_key *qt_train_schema(int *n_keys);
/* Where row i of the schema is stored in qt_options (byte offset). */
size_t qt_options_offset(int row);
/* A config holding the schema's defaults. */
qt_config *qt_train_config_create(void);

/* Resolves cfg into *o and checks every cross-key rule (e.g. quant.qat_init = calibration
 * with quant.freeze_observers_after; analysis keys the mode cannot do; model.name given as well
 * as model.onnx). -1 with err naming the keys when the combination is refused. */
int qt_options_resolve(const qt_config *cfg, qt_options *o, char *err);
/* The options a config file gives (defaults, then the file, then the overrides), resolved: the
 * one way a program turns a config file into options. path may be NULL (defaults only). */
int qt_options_load(const char *path, char *const *overrides, int n_overrides, qt_options *o, char *err);
/* The options as INI text (every key, with origins as comments), malloc'd: stored in checkpoints. */
char *qt_options_to_ini(const qt_options *o);

/* train.resume: whether the config stored in a checkpoint (INI text) keeps this run's [quant]
 * settings (all but check_batch and fp32_config; only mode for fp32 runs). -1 with err naming
 * the key and both values when not; a stored config that cannot be read is warned about. */
int qt_options_resume_matches(const qt_options *o, const char *stored_ini, const char *path, char *err);

/* The fp32 recipe that trains this run's fp32 checkpoint: quant.fp32_config's options with this
 * run's [data], train.threads and output.progress, output.dir the checkpoint's folder. ck
 * receives the checkpoint: quant.fp32_checkpoint, but <output.dir>/fp32/checkpoint.h5 when this
 * run's [data] is not the fp32 config's own and quant.fp32_checkpoint lies in the fp32 config's
 * output.dir (a folder every run of that config shares); why then names the first differing
 * [data] key with both values (else it is empty). -1 with err when the config cannot be loaded,
 * is itself quantized, trains another model (model.name or model.onnx) than this run's, or the
 * checkpoint is not named <dir>/checkpoint.h5. */
int qt_options_fp32_recipe(const qt_options *o, qt_options *fp32, char *ck, size_t ck_n, char *why, size_t why_n,
                           char *err);
/* Whether every process of the job (under mpirun) runs the same options, all but those a
 * process may set for itself (output.dir, output.progress, train.threads): 0 when they do; -1
 * with err naming the first differing key with process 0's value and the first differing
 * process's. Collective: every process calls it, before any other collective. */
int qt_options_ranks_agree(const qt_options *o, char *err);
/* The options of a config stored in a checkpoint (INI text), resolved without the cross-key
 * rules (they were checked when that run started). -1 with err when it cannot be read. */
int qt_options_stored(const char *ini, qt_options *o, char *err);
/* Whether the config stored in an fp32 checkpoint (INI text) is the fp32 recipe: every [model],
 * [data] and [train] key the same but train.threads, train.resume, train.stop_after_epochs and
 * train.conv_algorithm (which do not change what is trained). 0 when it is; 1 with what
 * ("<section>.<key>: '<stored>' in the checkpoint, '<recipe>' in the recipe", the first key
 * that differs) when not; -1 with what when the stored text cannot be read. */
int qt_options_fp32_matches(const qt_options *recipe, const char *stored_ini, char *what, size_t n);

/* The quant.weight_observer actually used (auto resolved by mode). */
qt_observer_kind qt_options_weight_observer(const qt_quant_options *q);

#endif
