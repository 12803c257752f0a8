/* Every key `qat_train` accepts and where it lands in qt_options (train/options.h): adding a key
 * is adding a row here and a field there. The resolver (qt_options_resolve) is the only code
 * that looks keys up by section and name; every rule across keys is checked there too.
 * Choices that a library names (models, optimizers, schedules, observers, range methods) are
 * taken from that library's name table, so each exists once. */
#include "train/options.h"
#include "base/base.h"

#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "nn/nn.h"
#include "train/analysis.h"

#define FASHION "/usr/share/datasets/fashion-mnist/"

typedef struct {
  qt_cfg_key key;
  size_t offset;                /* of the field in qt_options */
  size_t size;                  /* of the field (checked against the type) */
  int enum_as_string;           /* an ENUM row stored as its text (model.name) */
  const char *(*choices)(void); /* ENUM choices from a library's name table, else NULL */
} option_row;

/* "a|b|c" from a name table, built once into buf. */
static const char *join_names(char *buf, size_t n, const char *(*name)(int), int count) {
  if (buf[0]) return buf;
  size_t k = 0;
  for (int i = 0; i < count; i++) k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? "|" : "", name(i));
  QT_ASSERT(k < n, "choice list too long");
  return buf;
}
static const char *optim_name(int i) { return qt_optim_kind_name((qt_optim_kind)i); }
static const char *lr_name(int i) { return qt_lr_kind_name((qt_lr_kind)i); }
static const char *observer_name(int i) { return qt_observer_kind_name((qt_observer_kind)i); }
static const char *range_name(int i) { return qt_range_method_name((qt_range_method)i); }
static const char *model_choices(void) { return qt_model_names(); }
static const char *optimizer_choices(void) {
  static char buf[128];
  return join_names(buf, sizeof buf, optim_name, QT_OPTIM_COUNT);
}
static const char *schedule_choices(void) {
  static char buf[128];
  return join_names(buf, sizeof buf, lr_name, QT_LR_COUNT);
}
static const char *observer_choices(void) {
  static char buf[128];
  return join_names(buf, sizeof buf, observer_name, QT_OBSERVER_COUNT);
}
static const char *range_choices(void) {
  static char buf[128];
  return join_names(buf, sizeof buf, range_name, QT_RANGE_COUNT);
}

#define FIELD(sec, key) offsetof(qt_options, sec.key), sizeof(((qt_options *)0)->sec.key)
/* ROW(section, key, type, default, min, max, choices, help) */
#define ROW(sec, key, type, def, lo, hi, choices, help) \
  { {#sec, #key, type, def, lo, hi, choices, help}, FIELD(sec, key), 0, NULL }
#define STRING_ENUM_ROW(sec, key, type, def, lo, hi, choices, help) \
  { {#sec, #key, type, def, lo, hi, NULL, help}, FIELD(sec, key), 1, choices }
#define ROWC(sec, key, type, def, lo, hi, choices, help) \
  { {#sec, #key, type, def, lo, hi, NULL, help}, FIELD(sec, key), 0, choices }

static const option_row rows[] = {
    STRING_ENUM_ROW(model, name, QT_CFG_ENUM, "fashion_cnn", 0, 0, model_choices, "model preset"),
    ROW(model, onnx, QT_CFG_STRING, "", 0, 0, NULL,
        "fp32 ONNX model to import instead of model.name (torch.onnx.export of torch 1.13 or 2.x: IR 6-10, "
        "opsets 11-22, weights inside the file or in a side file; initializers become the parameters)"),

    ROW(data, format, QT_CFG_ENUM, "idx", 0, 0, "idx|hdf5|folder",
        "idx: gzip'd MNIST-format files; hdf5: images/labels datasets; folder: root/<class>/*.png|jpg"),
    ROW(data, train_images, QT_CFG_STRING, FASHION "train-images-idx3-ubyte.gz", 0, 0, NULL, "idx training images"),
    ROW(data, train_labels, QT_CFG_STRING, FASHION "train-labels-idx1-ubyte.gz", 0, 0, NULL, "idx training labels"),
    ROW(data, test_images, QT_CFG_STRING, FASHION "t10k-images-idx3-ubyte.gz", 0, 0, NULL, "idx test images"),
    ROW(data, test_labels, QT_CFG_STRING, FASHION "t10k-labels-idx1-ubyte.gz", 0, 0, NULL, "idx test labels"),
    ROW(data, train_path, QT_CFG_STRING, "", 0, 0, NULL, "hdf5 file or image folder root (training)"),
    ROW(data, test_path, QT_CFG_STRING, "", 0, 0, NULL, "hdf5 file or image folder root (test)"),
    ROW(data, channels, QT_CFG_INT, "1", 1, 3, NULL, "channels to decode image folders to (1 or 3)"),
    ROW(data, train_limit, QT_CFG_INT, "0", 0, 1e9, NULL, "use only the first N training images (0 = all)"),
    ROW(data, test_limit, QT_CFG_INT, "0", 0, 1e9, NULL, "use only the first N test images (0 = all)"),
    ROW(data, mean, QT_CFG_FLOAT, "0.2860", -10, 10, NULL, "normalization mean (pixel/255 scale)"),
    ROW(data, std, QT_CFG_FLOAT, "0.3530", 1e-6, 100, NULL, "normalization std (pixel/255 scale)"),
    ROW(data, crop_pad, QT_CFG_INT, "0", 0, 64, NULL, "random-crop augmentation padding (0 = off)"),
    ROW(data, flip, QT_CFG_BOOL, "false", 0, 0, NULL, "random horizontal flip augmentation"),
    ROW(data, storage, QT_CFG_ENUM, "file", 0, 0, "file|memory",
        "where the decoded images stay during a run: file = an unlinked scratch file in data.scratch_dir, read "
        "a batch at a time (the kernel's page cache holds it, not this process); memory = in this process"),
    ROW(data, scratch_dir, QT_CFG_STRING, "", 0, 0, NULL,
        "directory of data.storage = file's scratch file (\"\" = $TMPDIR, else /var/tmp); on a tmpfs the "
        "images stay in memory"),

    ROW(train, epochs, QT_CFG_INT, "4", 1, 100000, NULL, "training epochs"),
    ROW(train, batch_size, QT_CFG_INT, "128", 2, 65536, NULL, "training batch size"),
    ROW(train, eval_batch_size, QT_CFG_INT, "256", 1, 65536, NULL, "evaluation batch size"),
    ROWC(train, optimizer, QT_CFG_ENUM, "sgd", 0, 0, optimizer_choices, "optimizer"),
    ROW(train, lr, QT_CFG_FLOAT, "0.05", 0, 1e30, NULL, "base learning rate"),
    ROW(train, min_lr, QT_CFG_FLOAT, "0", 0, 1e30, NULL, "final learning rate of cosine/linear schedules"),
    ROWC(train, schedule, QT_CFG_ENUM, "cosine", 0, 0, schedule_choices, "learning-rate schedule (per step)"),
    ROW(train, warmup_epochs, QT_CFG_FLOAT, "0", 0, 1000, NULL, "linear warmup length in epochs"),
    ROW(train, step_epochs, QT_CFG_FLOAT, "1", 1e-6, 1e6, NULL, "step schedule: epochs between decays"),
    ROW(train, gamma, QT_CFG_FLOAT, "0.1", 0, 1, NULL, "step schedule: decay factor"),
    ROW(train, momentum, QT_CFG_FLOAT, "0.9", 0, 0.999999, NULL, "SGD momentum"),
    ROW(train, nesterov, QT_CFG_BOOL, "false", 0, 0, NULL, "SGD Nesterov momentum"),
    ROW(train, weight_decay, QT_CFG_FLOAT, "5e-4", 0, 1, NULL, "weight decay (SGD: L2; AdamW: decoupled)"),
    ROW(train, beta1, QT_CFG_FLOAT, "0.9", 0, 0.999999, NULL, "AdamW beta1"),
    ROW(train, beta2, QT_CFG_FLOAT, "0.999", 0, 0.999999, NULL, "AdamW beta2"),
    ROW(train, adam_eps, QT_CFG_FLOAT, "1e-8", 0, 1, NULL, "AdamW epsilon"),
    ROW(train, seed, QT_CFG_INT, "0", 0, 2147483647, NULL, "seed of initialization, shuffling and augmentation"),
    ROW(train, threads, QT_CFG_INT, "0", 0, 1024, NULL, "OpenMP threads (0 = all cores)"),
    ROW(train, conv_algorithm, QT_CFG_ENUM, "winograd", 0, 0, "winograd|direct",
        "convolutions of the training steps: winograd = oneDNN's Winograd F(4x4,3x3) kernels where oneDNN has "
        "them (3x3, stride 1, at least 16 input and output channels, an output of at least 4x4, AVX-512; about twice "
        "as fast, relative rounding "
        "~1e-6), direct elsewhere; direct = "
        "always direct. Evaluation, calibration, the check and the report always run direct convolutions"),
    ROW(train, resume, QT_CFG_BOOL, "false", 0, 0, NULL, "continue from output.dir's checkpoint if present"),
    ROW(train, stop_after_epochs, QT_CFG_INT, "0", 0, 100000, NULL,
        "stop this run after N epochs as if interrupted (0 = run to the end); resume continues"),

    ROW(dist, bucket_mb, QT_CFG_FLOAT, "1", 0, 1024, NULL,
        "under mpirun: sum the gradients across processes in buckets of this many MB, each started as soon as the "
        "backward has written it (0 = one sum after the backward; the same bits either way)"),
    ROW(dist, timeout, QT_CFG_FLOAT, "30", 0, 1e6, NULL,
        "under mpirun: end the job when a process's training loop makes no progress for this many seconds, or for "
        "10 times its slowest step when that is longer (a host lost in a network partition; MPI waits for ever "
        "otherwise); 0 = wait for ever"),

    ROW(quant, mode, QT_CFG_ENUM, "none", 0, 0, "none|ptq|qat",
        "none: fp32 training; ptq: calibrate then convert; qat: fine-tune with fake quant then convert"),
    ROW(quant, quantizer, QT_CFG_ENUM, "onednn", 0, 0, "onednn|backend",
        "the Quantizer: onednn (built in) or derived from the description in quant.backend"),
    ROW(quant, backend, QT_CFG_STRING, "", 0, 0, NULL,
        "the backend: xnnpack or onednn (built in; the Quantizer and the deployment follow it), or a backend "
        "description INI (e.g. experiments/accel_fictional.ini) when quant.quantizer = backend"),
    ROW(quant, weight_bits, QT_CFG_INT, "8", 2, 8, NULL, "weight bit width"),
    ROW(quant, activation_bits, QT_CFG_INT, "8", 2, 8, NULL, "activation bit width"),
    ROW(quant, isa, QT_CFG_ENUM, "auto", 0, 0, "auto|vnni|no_vnni",
        "CPU ISA the quantizer targets (auto: read from oneDNN); no_vnni restricts 8-bit weights to 7 bits"),
    ROW(quant, bias, QT_CFG_ENUM, "auto", 0, 0, "auto|int32|float",
        "conv/linear biases: int32 (quantized at input scale x weight scale, as integer kernels add them; "
        "training fake-quantizes them), float (kept fp32), auto (int32 where the backend requires it: xnnpack)"),
    ROW(quant, weight_observer, QT_CFG_ENUM, "auto", 0, 0, "auto|minmax|moving_average",
        "per-channel weight observer (auto: minmax for PTQ, moving_average for QAT)"),
    ROWC(quant, activation_observer, QT_CFG_ENUM, "moving_average", 0, 0, observer_choices, "activation observer"),
    ROWC(quant, activation_range, QT_CFG_ENUM, "minmax", 0, 0, range_choices,
         "histogram observer: how the range is chosen"),
    ROW(quant, percentile, QT_CFG_FLOAT, "99.99", 50, 100, NULL, "histogram + percentile: the percentile kept"),
    ROW(quant, learnable_scale, QT_CFG_BOOL, "false", 0, 0, NULL,
        "QAT: LSQ, scales are trained parameters (initialized by the observers on the first batch)"),
    ROW(quant, learnable_weight_scale, QT_CFG_ENUM, "auto", 0, 0, "auto|true|false",
        "with quant.learnable_scale: the weights' scales are trained too (true), follow the weight observer "
        "every step as PT2E's QAT does (false), or auto: trained below 8 bits (a layer's own bits), observed at 8, "
        "where learned scales lost whole channels (docs/experiments.md, \"LSQ at 8 bits\")"),
    ROW(quant, fuse_add, QT_CFG_BOOL, "false", 0, 0, NULL,
        "a conv whose output goes only to an add joins the add (and a relu after it) in one unit: no "
        "quantization point on the conv's output, as PT2E's X86 Inductor quantizer fuses conv + add (onednn)"),
    ROW(quant, fuse_gate, QT_CFG_BOOL, "false", 0, 0, NULL,
        "a conv or linear -> activation -> mul (a squeeze-excite gate) is one unit: no quantization point on "
        "the layer's or the activation's output (onednn)"),
    ROW(quant, fp32_output, QT_CFG_BOOL, "false", 0, 0, NULL,
        "the model's output (the logits) stays fp32: the last unit's output is no quantization point, the "
        "int8 layer writes real values (oneDNN's f32 destination), as PT2E's X86 Inductor quantizer leaves it"),
    ROW(quant, layer_overrides, QT_CFG_STRING, "", 0, 0, NULL,
        "per-layer settings by node name, e.g. conv1=w8a8;fc2=fp32 (mixed precision); * = every other layer"),
    ROW(quant, fp32_checkpoint, QT_CFG_STRING, "", 0, 0, NULL,
        "fp32 checkpoint to quantize (empty: from the initialization)"),
    ROW(quant, fp32_config, QT_CFG_STRING, "", 0, 0, NULL,
        "config that trains fp32_checkpoint when it does not exist yet"),
    ROW(quant, fp32_reuse, QT_CFG_ENUM, "check", 0, 0, "check|retrain|any",
        "an existing fp32_checkpoint whose stored config is not fp32_config's recipe (with this run's [data]): "
        "check = stop (exit 2) naming the first differing key, retrain = train it again, any = use it anyway"),
    ROW(quant, cle, QT_CFG_BOOL, "false", 0, 0, NULL,
        "PTQ: cross-layer equalization before calibration: the per-channel weight ranges of consecutive "
        "conv/linear layers (through ReLU and pooling) made equal, leaving the fp32 function unchanged "
        "(docs/quantization.md)"),
    ROW(quant, cle_relu6, QT_CFG_ENUM, "keep", 0, 0, "keep|relu",
        "with quant.cle: keep = chains through relu6 are not equalized (relu6 clips at 6, so a scale does not "
        "pass it); relu = such a relu6 becomes a relu and the chain is equalized (as AIMET does for "
        "MobileNetV2; the model then differs where an activation exceeded 6)"),
    ROW(quant, bias_correction, QT_CFG_ENUM, "none", 0, 0, "none|empirical|analytical",
        "PTQ: after calibration, each conv/linear bias absorbs the mean shift quantization causes in its "
        "outputs: empirical = measured on quant.bias_correction_images training images; analytical = the "
        "weights' part, from the batch norms before each layer (no data; docs/quantization.md)"),
    ROW(quant, bias_correction_images, QT_CFG_INT, "512", 1, 1000000, NULL,
        "PTQ with quant.bias_correction = empirical: the first training images it measures on"),
    ROW(quant, adaround, QT_CFG_BOOL, "false", 0, 0, NULL,
        "PTQ: after calibration, each conv/linear weight is rounded up or down as minimizes its layer's "
        "output error on quant.adaround_images training images (AdaRound; docs/quantization.md)"),
    ROW(quant, adaround_unit, QT_CFG_ENUM, "layer", 0, 0, "layer|block",
        "with quant.adaround: layer = each conv/linear layer's output reconstructed alone (AdaRound); block = "
        "each block's (a residual block, a layer group up to its output's quantization) with its activation "
        "scales learned too (BRECQ), activation quantization dropped at random (QDrop, quant.adaround_qdrop)"),
    ROW(quant, adaround_qdrop, QT_CFG_FLOAT, "0.5", 0, 1, NULL,
        "with quant.adaround_unit = block: the probability of an activation staying float during "
        "reconstruction (QDrop; 0 = BRECQ)"),
    ROW(quant, adaround_images, QT_CFG_INT, "1024", 1, 1000000, NULL,
        "PTQ with quant.adaround: the first training images it reconstructs the layers' outputs on"),
    ROW(quant, adaround_iterations, QT_CFG_INT, "2000", 1, 10000000, NULL,
        "PTQ with quant.adaround: optimizer steps per layer (the paper: 10000)"),
    ROW(quant, adaround_batch, QT_CFG_INT, "32", 1, 65536, NULL, "PTQ with quant.adaround: images per optimizer step"),
    ROW(quant, adaround_lr, QT_CFG_FLOAT, "0.001", 1e-9, 100, NULL,
        "PTQ with quant.adaround: Adam's learning rate for the rounding variables"),
    ROW(quant, adaround_lambda, QT_CFG_FLOAT, "0.01", 0, 1000, NULL,
        "PTQ with quant.adaround: weight of the rounding regularizer against the output error"),
    ROW(quant, calibration_batches, QT_CFG_INT, "32", 1, 100000, NULL,
        "PTQ (and QAT with quant.qat_init = calibration): training batches to calibrate on"),
    ROW(quant, qat_init, QT_CFG_ENUM, "observers", 0, 0, "observers|calibration",
        "QAT: where the qparams start: observers (they track the training batches; LSQ scales are "
        "initialized on the first batch) or calibration (PTQ calibration on quant.calibration_batches "
        "batches first; the qparams then stay fixed, or are learned with LSQ)"),
    ROW(quant, freeze_observers_after, QT_CFG_FLOAT, "0", 0, 100000, NULL,
        "QAT: disable observers (freeze the qparams) after this many epochs, fractions allowed (0 = never)"),
    ROW(quant, freeze_bn_after, QT_CFG_FLOAT, "0", 0, 100000, NULL,
        "QAT: freeze BN running statistics after this many epochs, fractions allowed (0 = never)"),
    ROW(quant, check_batch, QT_CFG_INT, "128", 1, 100000, NULL,
        "test images the training-graph = convert-graph check runs on"),

    ROW(analysis, calibration_methods, QT_CFG_STRING, "", 0, 0, NULL,
        "PTQ debugging: activation calibration methods to compare, e.g. minmax,moving_average,percentile,mse "
        "(empty = no comparison)"),
    ROW(analysis, calibration_batches, QT_CFG_STRING, "", 0, 0, NULL,
        "PTQ debugging: ascending calibration batch counts to compare, e.g. 1,8,32 (empty = "
        "quant.calibration_batches)"),
    ROW(analysis, layer_sqnr, QT_CFG_BOOL, "false", 0, 0, NULL,
        "PTQ debugging: SQNR between the fp32 and the fake-quant model, node by node"),
    ROW(analysis, sensitivity, QT_CFG_BOOL, "false", 0, 0, NULL,
        "PTQ debugging: accuracy when only one layer is quantized, for each conv/linear layer"),
    ROW(analysis, mixed_precision_k, QT_CFG_STRING, "", 0, 0, NULL,
        "PTQ debugging: keep the k most sensitive layers at analysis.mixed_precision_keep, e.g. 0,1,2,3"),
    ROW(analysis, mixed_precision_keep, QT_CFG_ENUM, "w8a8", 0, 0, "w8a8|fp32",
        "PTQ debugging: what the k most sensitive layers are kept at"),
    ROW(analysis, images, QT_CFG_INT, "2000", 0, 1e9, NULL,
        "PTQ debugging: test images every analysis variant is evaluated on (0 = all)"),

    ROW(output, dir, QT_CFG_STRING, "runs/default", 0, 0, NULL, "output directory (created)"),
    ROW(output, progress, QT_CFG_ENUM, "auto", 0, 0, "auto|bar|lines|none",
        "auto: a progress bar on a terminal, one line per epoch otherwise"),
    ROW(output, dot, QT_CFG_BOOL, "true", 0, 0, NULL, "write the model graph as model.dot"),
    ROW(output, timing, QT_CFG_BOOL, "true", 0, 0, NULL,
        "quantized runs: time fp32 and int8 inference after the report (batch 256, best of 3 rounds; "
        "summary.inference); false skips it"),
};

enum { N_ROWS = (int)(sizeof rows / sizeof rows[0]) };

static qt_cfg_key schema[N_ROWS];

/* The schema rows with their library-named choices filled in; the field of each row is checked
 * against its type once (a row whose field has another size is a programming error). */
static void schema_init(void) {
  if (schema[0].section) return;
  for (int i = 0; i < N_ROWS; i++) {
    const option_row *r = &rows[i];
    schema[i] = r->key;
    if (r->choices) schema[i].choices = r->choices();
    size_t want = 0;
    switch (r->key.type) {
      case QT_CFG_INT:
      case QT_CFG_BOOL: want = sizeof(int); break;
      case QT_CFG_FLOAT: want = sizeof(double); break;
      case QT_CFG_STRING: want = QT_OPT_STR; break;
      case QT_CFG_ENUM: want = r->enum_as_string ? QT_OPT_STR : sizeof(int); break;
      default: break;
    }
    QT_ASSERT(want == r->size, "option %s.%s: field of %zu bytes for a %d key", r->key.section, r->key.key, r->size,
              (int)r->key.type);
  }
}

const qt_cfg_key *qt_train_schema(int *n_keys) {
  schema_init();
  *n_keys = N_ROWS;
  return schema;
}

size_t qt_options_offset(int row) {
  QT_ASSERT(row >= 0 && row < N_ROWS, "option row %d", row);
  return rows[row].offset;
}

qt_config *qt_train_config_create(void) {
  schema_init();
  return qt_config_create(schema, N_ROWS);
}

/* Rules across keys, before any work. */
static int check_rules(const qt_options *o, char *err) {
  const qt_quant_options *q = &o->quant;
  /* more threads than a few per core makes no progress (OpenMP threads spin and wait) */
  const int cores = omp_get_num_procs(), max_threads = 4 * cores > 8 ? 4 * cores : 8;
  if (o->train.threads > max_threads)
    return qt_err(err, "train.threads = %d: this machine has %d cores; at most %d threads (0 = one per core)",
                  o->train.threads, cores, max_threads);
  if (!(q->percentile > 50))
    return qt_err(err, "quant.percentile = %g: expected a percentile in (50, 100] (the share of values kept)",
                  q->percentile);
  if (o->data.format != QT_DATA_IDX && (!o->data.train_path[0] || !o->data.test_path[0]))
    return qt_err(err, "data.format = %s needs data.train_path and data.test_path",
                  o->data.format == QT_DATA_HDF5 ? "hdf5" : "folder");
  if (q->mode == QT_QUANT_NONE) return qt_analysis_check_mode(o, err);
  if (q->mode == QT_QUANT_QAT && q->qat_init == QT_QAT_INIT_CALIBRATION && q->freeze_observers_after > 0)
    return qt_err(err,
                  "quant.freeze_observers_after = %g has no effect with quant.qat_init = calibration: the calibrated "
                  "qparams stay fixed (or are learned with LSQ) from the start",
                  q->freeze_observers_after);
  if (q->bias_correction != QT_BIAS_CORRECTION_NONE && q->mode != QT_QUANT_PTQ)
    return qt_err(err, "quant.bias_correction needs quant.mode = ptq (QAT trains the biases)");
  if (q->adaround && q->mode != QT_QUANT_PTQ)
    return qt_err(err, "quant.adaround needs quant.mode = ptq (QAT trains the weights)");
  if (!q->adaround && q->adaround_unit != QT_ADAROUND_UNIT_LAYER)
    return qt_err(err, "quant.adaround_unit = block has no effect without quant.adaround = true");
  if (q->cle_relu6 != QT_CLE_RELU6_KEEP && !q->cle)
    return qt_err(err, "quant.cle_relu6 = relu has no effect without quant.cle = true");
  if (q->bias_correction == QT_BIAS_CORRECTION_ANALYTICAL && q->cle)
    return qt_err(err,
                  "quant.bias_correction = analytical with quant.cle = true: the batch norms' statistics no "
                  "longer describe the equalized layers' inputs; use quant.bias_correction = empirical");
  if (q->cle && q->mode != QT_QUANT_PTQ)
    return qt_err(err,
                  "quant.cle needs quant.mode = ptq (QAT keeps batch norm unfolded until convert, and "
                  "equalization needs it folded)");
  if (q->learnable_scale && q->mode != QT_QUANT_QAT)
    return qt_err(err, "quant.learnable_scale needs quant.mode = qat (PTQ learns nothing)");
  if (q->learnable_weight_scale != QT_LSQW_AUTO && !q->learnable_scale)
    return qt_err(err, "quant.learnable_weight_scale = %s needs quant.learnable_scale = true",
                  q->learnable_weight_scale == QT_LSQW_TRUE ? "true" : "false");
  if (q->quantizer == QT_QUANTIZER_BACKEND && !q->backend[0])
    return qt_err(err, "quant.quantizer = backend needs quant.backend (a backend description file)");
  if (q->quantizer != QT_QUANTIZER_BACKEND && q->backend[0] && strcmp(q->backend, "xnnpack") != 0 &&
      strcmp(q->backend, "onednn") != 0 && strcmp(q->backend, "onednn_cpu") != 0)
    return qt_err(err,
                  "quant.backend = %s: a description file is read only with quant.quantizer = backend (quantize "
                  "for it and deploy to it); with quant.quantizer = onednn it would be ignored",
                  q->backend);
  return qt_analysis_check_mode(o, err);
}

int qt_options_resolve(const qt_config *cfg, qt_options *o, char *err) {
  schema_init();
  memset(o, 0, sizeof *o);
  for (int i = 0; i < N_ROWS; i++) {
    const option_row *r = &rows[i];
    const char *sec = r->key.section, *key = r->key.key;
    char *field = (char *)o + r->offset;
    switch (r->key.type) {
      case QT_CFG_INT: *(int *)field = qt_config_int(cfg, sec, key); break;
      case QT_CFG_BOOL: *(int *)field = qt_config_bool(cfg, sec, key); break;
      case QT_CFG_FLOAT: *(double *)field = qt_config_float(cfg, sec, key); break;
      case QT_CFG_ENUM:
        if (!r->enum_as_string) {
          *(int *)field = qt_config_enum(cfg, sec, key);
          break;
        }
        /* fall through */
      case QT_CFG_STRING: {
        const char *v = qt_config_string(cfg, sec, key);
        if (strlen(v) >= QT_OPT_STR)
          return qt_err(err, "config: %s.%s: value of %zu characters, at most %d allowed (%s)", sec, key, strlen(v),
                        QT_OPT_STR - 1, qt_config_origin(cfg, sec, key));
        memcpy(field, v, strlen(v) + 1);
        break;
      }
      default: QT_ASSERT(0, "option %s.%s: type %d", sec, key, (int)r->key.type);
    }
  }
  if (o->model.onnx[0] && strcmp(qt_config_origin(cfg, "model", "name"), "default") != 0)
    return qt_err(err, "model.name = %s (%s) and model.onnx = %s (%s) both name the model: set one", o->model.name,
                  qt_config_origin(cfg, "model", "name"), o->model.onnx, qt_config_origin(cfg, "model", "onnx"));
  return check_rules(o, err);
}

int qt_options_load(const char *path, char *const *overrides, int n_overrides, qt_options *o, char *err) {
  qt_config *cfg = qt_train_config_create();
  QT_ASSERT(cfg, "out of memory");
  int rc = path ? qt_config_load_file(cfg, path, err) : 0;
  for (int i = 0; i < n_overrides && !rc; i++) rc = qt_config_apply_override(cfg, overrides[i], err);
  if (!rc) rc = qt_options_resolve(cfg, o, err);
  qt_config_free(cfg);
  return rc;
}

/* Row i's value in o as config text. */
static void field_text(const qt_options *o, int i, char *buf, size_t n) {
  const option_row *r = &rows[i];
  const char *field = (const char *)o + r->offset;
  switch (r->key.type) {
    case QT_CFG_INT: snprintf(buf, n, "%d", *(const int *)field); break;
    case QT_CFG_BOOL: snprintf(buf, n, "%s", *(const int *)field ? "true" : "false"); break;
    case QT_CFG_FLOAT: { /* the shortest text that reads back as the same double */
      const double v = *(const double *)field;
      for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
      }
      break;
    }
    case QT_CFG_ENUM:
      if (!r->enum_as_string) {
        const char *c = schema[i].choices;
        int k = *(const int *)field;
        for (int j = 0; j < k && c; j++) c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
        QT_ASSERT(c, "option %s.%s: enum value %d out of range", r->key.section, r->key.key, k);
        size_t len = strcspn(c, "|");
        snprintf(buf, n, "%.*s", (int)len, c);
        break;
      }
      /* fall through */
    default: snprintf(buf, n, "%s", field);
  }
}

static qt_config *options_config(const qt_options *o) {
  qt_config *c = qt_train_config_create();
  QT_ASSERT(c, "out of memory");
  char v[QT_OPT_STR + 32], err[QT_ERR_LEN];
  for (int i = 0; i < N_ROWS; i++) {
    field_text(o, i, v, sizeof v);
    if (qt_config_set(c, rows[i].key.section, rows[i].key.key, v, err))
      qt_panic(__FILE__, __LINE__, "options do not round-trip: %s", err);
  }
  return c;
}

char *qt_options_to_ini(const qt_options *o) {
  qt_config *c = options_config(o);
  char *s = qt_config_to_ini_string(c);
  qt_config_free(c);
  return s;
}

int qt_options_resume_matches(const qt_options *o, const char *ini, const char *path, char *err) {
  if (!ini || !ini[0]) {
    fprintf(stderr, "warning: %s stores no config; comparing its graph with this run's only\n", path);
    return 0;
  }
  qt_config *oldc = qt_train_config_create();
  char lerr[QT_ERR_LEN];
  if (qt_config_load_string(oldc, ini, path, lerr)) {
    fprintf(stderr, "warning: cannot read the config stored in %s (%s); comparing its graph with this run's only\n",
            path, lerr);
    qt_config_free(oldc);
    return 0;
  }
  /* resolved without the rules: they were checked when that run started */
  qt_options *old = calloc(1, sizeof *old);
  QT_ASSERT(old, "out of memory");
  char rerr[QT_ERR_LEN];
  qt_options_resolve(oldc, old, rerr);
  qt_config_free(oldc);
  const int quant = o->quant.mode != QT_QUANT_NONE;
  int rc = 0;
  for (int i = 0; i < N_ROWS && !rc; i++) {
    const qt_cfg_key *k = &rows[i].key;
    if (strcmp(k->section, "quant") != 0 || (!quant && strcmp(k->key, "mode") != 0) ||
        strcmp(k->key, "check_batch") == 0 || strcmp(k->key, "fp32_config") == 0 || strcmp(k->key, "fp32_reuse") == 0)
      continue;
    char a[QT_OPT_STR + 32], b[QT_OPT_STR + 32];
    field_text(old, i, a, sizeof a);
    field_text(o, i, b, sizeof b);
    if (strcmp(a, b) != 0) /* the values as text: string fields may differ past their end */
      rc = qt_err(err,
                  "train.resume: checkpoint '%s' was written with quant.%s = '%s', this run has quant.%s = '%s'; a "
                  "resumed run keeps its [quant] settings (restore the setting, or start again in another output.dir)",
                  path, k->key, a, k->key, b);
  }
  free(old);
  return rc;
}

/* Which keys first_difference compares. */
typedef enum {
  DIFF_RECIPE, /* [model], [data] and [train], but the train keys that do not change what is trained */
  DIFF_DATA,   /* [data] */
  DIFF_RANKS   /* every key but those a process of a job may set for itself (output.dir, .progress, train.threads) */
} diff_keys;

static int diff_compares(const qt_cfg_key *k, diff_keys which) {
  const int train = !strcmp(k->section, "train"), data = !strcmp(k->section, "data");
  if (which == DIFF_DATA) return data;
  if (which == DIFF_RANKS)
    return !(train && !strcmp(k->key, "threads")) &&
           !(!strcmp(k->section, "output") && (!strcmp(k->key, "dir") || !strcmp(k->key, "progress")));
  static const char *const skip[] = {"threads", "resume", "stop_after_epochs", "conv_algorithm"};
  if (!train) return data || !strcmp(k->section, "model");
  for (size_t s = 0; s < sizeof skip / sizeof skip[0]; s++)
    if (!strcmp(k->key, skip[s])) return 0;
  return 1;
}

/* The first key of the kind which whose value differs between a and b: its row, or -1. at and
 * bt receive the two values. */
static int first_difference(const qt_options *a, const qt_options *b, diff_keys which, char *at, char *bt, size_t n) {
  for (int i = 0; i < N_ROWS; i++) {
    if (!diff_compares(&rows[i].key, which)) continue;
    field_text(a, i, at, n);
    field_text(b, i, bt, n);
    if (strcmp(at, bt) != 0) return i;
  }
  return -1;
}

int qt_options_fp32_recipe(const qt_options *o, qt_options *fp32, char *ck_out, size_t ck_n, char *why, size_t why_n,
                           char *err) {
  const char *ck = o->quant.fp32_checkpoint, *fc = o->quant.fp32_config;
  if (why_n) why[0] = 0;
  if (!fc[0])
    return qt_err(err, "quant.fp32_checkpoint '%s' does not exist (set quant.fp32_config to train it first)", ck);
  const char *base = strrchr(ck, '/') ? strrchr(ck, '/') + 1 : ck;
  if (strcmp(base, "checkpoint.h5") != 0)
    return qt_err(err,
                  "quant.fp32_checkpoint '%s': to train it from quant.fp32_config it must be named "
                  "<output dir>/checkpoint.h5",
                  ck);
  if (qt_options_load(fc, NULL, 0, fp32, err)) return -1;
  if (fp32->quant.mode != QT_QUANT_NONE)
    return qt_err(err, "quant.fp32_config '%s' is itself a quantized run (quant.mode = %s)", fc,
                  fp32->quant.mode == QT_QUANT_PTQ ? "ptq" : "qat");
  if (strcmp(fp32->model.onnx, o->model.onnx) != 0 || (!o->model.onnx[0] && strcmp(fp32->model.name, o->model.name)))
    return qt_err(
        err, "quant.fp32_config '%s' trains %s %s, but this run quantizes %s %s: the checkpoint would not fit", fc,
        fp32->model.onnx[0] ? "model.onnx" : "model.name", fp32->model.onnx[0] ? fp32->model.onnx : fp32->model.name,
        o->model.onnx[0] ? "model.onnx" : "model.name", o->model.onnx[0] ? o->model.onnx : o->model.name);
  /* A run whose [data] is not the fp32 config's own (a quick trial with data.train_limit, say)
   * does not write its fp32 model to the fp32 config's own output.dir, which every run of that
   * config shares: it goes under this run's output.dir. */
  char at[QT_OPT_STR + 32], bt[QT_OPT_STR + 32];
  const int diff = first_difference(o, fp32, DIFF_DATA, at, bt, sizeof at);
  if (diff >= 0 && qt_file_in_dir(ck, fp32->output.dir)) {
    snprintf(ck_out, ck_n, "%s/fp32/checkpoint.h5", o->output.dir);
    snprintf(why, why_n, "%s.%s is '%s' here, '%s' in %s", rows[diff].key.section, rows[diff].key.key, at, bt, fc);
  } else {
    snprintf(ck_out, ck_n, "%s", ck);
  }
  /* the same data, threads and terminal as this run; the fp32 recipe from its config */
  fp32->data = o->data;
  fp32->train.threads = o->train.threads;
  fp32->output.progress = o->output.progress;
  const char *slash = strrchr(ck_out, '/');
  const size_t dir_len = slash ? (size_t)(slash - ck_out) : 0;
  if (!slash)
    snprintf(fp32->output.dir, sizeof fp32->output.dir, ".");
  else if (dir_len == 0)
    snprintf(fp32->output.dir, sizeof fp32->output.dir, "/");
  else
    snprintf(fp32->output.dir, sizeof fp32->output.dir, "%.*s", (int)dir_len, ck_out);
  return 0;
}

int qt_options_stored(const char *ini, qt_options *o, char *err) {
  qt_config *c = qt_train_config_create();
  char lerr[QT_ERR_LEN];
  if (!ini || !ini[0] || qt_config_load_string(c, ini, "checkpoint", lerr)) {
    qt_config_free(c);
    return qt_err(err, "its stored config cannot be read (%s)", ini && ini[0] ? lerr : "none stored");
  }
  char rerr[QT_ERR_LEN];
  qt_options_resolve(c, o, rerr); /* without the rules: they were checked when that run started */
  qt_config_free(c);
  return 0;
}

int qt_options_fp32_matches(const qt_options *recipe, const char *ini, char *what, size_t n) {
  qt_options *old = calloc(1, sizeof *old);
  QT_ASSERT(old, "out of memory");
  char err[QT_ERR_LEN];
  if (qt_options_stored(ini, old, err)) {
    snprintf(what, n, "%s", err);
    free(old);
    return -1;
  }
  char at[QT_OPT_STR + 32], bt[QT_OPT_STR + 32];
  const int i = first_difference(old, recipe, DIFF_RECIPE, at, bt, sizeof at);
  if (i >= 0)
    snprintf(what, n, "%s.%s: '%s' in the checkpoint, '%s' in the recipe", rows[i].key.section, rows[i].key.key, at,
             bt);
  const int rc = i >= 0;
  free(old);
  return rc;
}

qt_observer_kind qt_options_weight_observer(const qt_quant_options *q) {
  switch (q->weight_observer) {
    case QT_WOBS_MINMAX: return QT_OBSERVER_MINMAX;
    case QT_WOBS_MOVING_AVERAGE: return QT_OBSERVER_MOVING_AVERAGE;
    default: return q->mode == QT_QUANT_QAT ? QT_OBSERVER_MOVING_AVERAGE : QT_OBSERVER_MINMAX;
  }
}

/* The INI text of the options a job's processes must share: those DIFF_RANKS compares, the
 * others (each process's own) blanked. */
static char *ranks_text(const qt_options *o) {
  qt_options *shared = malloc(sizeof *shared);
  QT_ASSERT(shared, "out of memory");
  *shared = *o;
  shared->output.dir[0] = 0;
  shared->output.progress = QT_PROGRESS_AUTO;
  shared->train.threads = 0;
  char *text = qt_options_to_ini(shared);
  free(shared);
  return text;
}

int qt_options_ranks_agree(const qt_options *o, char *err) {
  if (qt_dist_size() == 1) return 0;
  char *text = ranks_text(o);
  const size_t len = strlen(text);
  const int other = qt_dist_first_differing(qt_dist_hash(QT_DIST_HASH_INIT, text, len), NULL, NULL);
  if (other < 0) {
    free(text);
    return 0;
  }
  /* every process learns rank 0's and the first differing rank's options, then names the key */
  char *texts[2] = {NULL, NULL};
  const int from[2] = {0, other};
  for (int t = 0; t < 2; t++) {
    uint64_t n = qt_dist_rank() == from[t] ? (uint64_t)len : 0;
    qt_dist_broadcast(&n, sizeof n, from[t]);
    texts[t] = malloc((size_t)n + 1);
    QT_ASSERT(texts[t], "out of memory");
    if (qt_dist_rank() == from[t]) memcpy(texts[t], text, (size_t)n);
    qt_dist_broadcast(texts[t], (size_t)n, from[t]);
    texts[t][n] = 0;
  }
  free(text);
  qt_options *opt = calloc(2, sizeof *opt);
  QT_ASSERT(opt, "out of memory");
  char lerr[QT_ERR_LEN], at[QT_OPT_STR + 32], bt[QT_OPT_STR + 32];
  int i = -1;
  if (qt_options_stored(texts[0], &opt[0], lerr) == 0 && qt_options_stored(texts[1], &opt[1], lerr) == 0)
    i = first_difference(&opt[0], &opt[1], DIFF_RANKS, at, bt, sizeof at);
  if (i >= 0)
    qt_err(err,
           "the processes of this job run different configs: %s.%s is '%s' on process 0 but '%s' on process %d "
           "(every host must hold the same config file and overrides)",
           rows[i].key.section, rows[i].key.key, at, bt, other);
  else
    qt_err(err, "the processes of this job run different configs (process 0 and process %d)", other);
  QT_FREE_ALL(opt, texts[0], texts[1]);
  return -1;
}
