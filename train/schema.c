/* Every key `qat_train` accepts. Adding a key = adding a row here (and reading it). */
#include "train/train.h"

#define FASHION "/usr/share/datasets/fashion-mnist/"

static const qt_cfg_key schema[] = {
    {"model", "name", QT_CFG_ENUM, "fashion_cnn", 0, 0, "fashion_cnn|fashion_mlp|res_cnn", "model preset"},

    {"data", "format", QT_CFG_ENUM, "idx", 0, 0, "idx|hdf5|folder",
     "idx: gzip'd MNIST-format files; hdf5: images/labels datasets; folder: root/<class>/*.png|jpg"},
    {"data", "train_images", QT_CFG_STRING, FASHION "train-images-idx3-ubyte.gz", 0, 0, NULL, "idx training images"},
    {"data", "train_labels", QT_CFG_STRING, FASHION "train-labels-idx1-ubyte.gz", 0, 0, NULL, "idx training labels"},
    {"data", "test_images", QT_CFG_STRING, FASHION "t10k-images-idx3-ubyte.gz", 0, 0, NULL, "idx test images"},
    {"data", "test_labels", QT_CFG_STRING, FASHION "t10k-labels-idx1-ubyte.gz", 0, 0, NULL, "idx test labels"},
    {"data", "train_path", QT_CFG_STRING, "", 0, 0, NULL, "hdf5 file or image folder root (training)"},
    {"data", "test_path", QT_CFG_STRING, "", 0, 0, NULL, "hdf5 file or image folder root (test)"},
    {"data", "channels", QT_CFG_INT, "1", 1, 3, NULL, "channels to decode image folders to (1 or 3)"},
    {"data", "train_limit", QT_CFG_INT, "0", 0, 1e9, NULL, "use only the first N training images (0 = all)"},
    {"data", "test_limit", QT_CFG_INT, "0", 0, 1e9, NULL, "use only the first N test images (0 = all)"},
    {"data", "mean", QT_CFG_FLOAT, "0.2860", -10, 10, NULL, "normalization mean (pixel/255 scale)"},
    {"data", "std", QT_CFG_FLOAT, "0.3530", 1e-6, 100, NULL, "normalization std (pixel/255 scale)"},
    {"data", "crop_pad", QT_CFG_INT, "0", 0, 64, NULL, "random-crop augmentation padding (0 = off)"},
    {"data", "flip", QT_CFG_BOOL, "false", 0, 0, NULL, "random horizontal flip augmentation"},

    {"train", "epochs", QT_CFG_INT, "4", 1, 100000, NULL, "training epochs"},
    {"train", "batch_size", QT_CFG_INT, "128", 2, 65536, NULL, "training batch size"},
    {"train", "eval_batch_size", QT_CFG_INT, "256", 1, 65536, NULL, "evaluation batch size"},
    {"train", "optimizer", QT_CFG_ENUM, "sgd", 0, 0, "sgd|adamw", "optimizer"},
    {"train", "lr", QT_CFG_FLOAT, "0.05", 0, 1e30, NULL, "base learning rate"},
    {"train", "min_lr", QT_CFG_FLOAT, "0", 0, 1e30, NULL, "final learning rate of cosine/linear schedules"},
    {"train", "schedule", QT_CFG_ENUM, "cosine", 0, 0, "constant|step|cosine|linear", "learning-rate schedule (per step)"},
    {"train", "warmup_epochs", QT_CFG_FLOAT, "0", 0, 1000, NULL, "linear warmup length in epochs"},
    {"train", "step_epochs", QT_CFG_FLOAT, "1", 1e-6, 1e6, NULL, "step schedule: epochs between decays"},
    {"train", "gamma", QT_CFG_FLOAT, "0.1", 0, 1, NULL, "step schedule: decay factor"},
    {"train", "momentum", QT_CFG_FLOAT, "0.9", 0, 0.999999, NULL, "SGD momentum"},
    {"train", "nesterov", QT_CFG_BOOL, "false", 0, 0, NULL, "SGD Nesterov momentum"},
    {"train", "weight_decay", QT_CFG_FLOAT, "5e-4", 0, 1, NULL, "weight decay (SGD: L2; AdamW: decoupled)"},
    {"train", "beta1", QT_CFG_FLOAT, "0.9", 0, 0.999999, NULL, "AdamW beta1"},
    {"train", "beta2", QT_CFG_FLOAT, "0.999", 0, 0.999999, NULL, "AdamW beta2"},
    {"train", "adam_eps", QT_CFG_FLOAT, "1e-8", 0, 1, NULL, "AdamW epsilon"},
    {"train", "seed", QT_CFG_INT, "0", 0, 2147483647, NULL, "seed of initialization, shuffling and augmentation"},
    {"train", "threads", QT_CFG_INT, "0", 0, 1024, NULL, "OpenMP threads (0 = all cores)"},
    {"train", "resume", QT_CFG_BOOL, "false", 0, 0, NULL, "continue from output.dir's checkpoint if present"},
    {"train", "stop_after_epochs", QT_CFG_INT, "0", 0, 100000, NULL,
     "stop this run after N epochs as if interrupted (0 = run to the end); resume continues"},

    {"quant", "mode", QT_CFG_ENUM, "none", 0, 0, "none|ptq|qat",
     "none: fp32 training; ptq: calibrate then convert; qat: fine-tune with fake quant then convert"},
    {"quant", "quantizer", QT_CFG_ENUM, "onednn", 0, 0, "onednn|backend",
     "the Quantizer: onednn (built in) or derived from the description in quant.backend"},
    {"quant", "backend", QT_CFG_STRING, "", 0, 0, NULL,
     "backend description INI (e.g. experiments/accel_fictional.ini) when quant.quantizer = backend"},
    {"quant", "weight_bits", QT_CFG_INT, "8", 2, 8, NULL, "weight bit width"},
    {"quant", "activation_bits", QT_CFG_INT, "8", 2, 8, NULL, "activation bit width"},
    {"quant", "isa", QT_CFG_ENUM, "auto", 0, 0, "auto|vnni|no_vnni",
     "CPU ISA the quantizer targets (auto: read from oneDNN); no_vnni restricts 8-bit weights to 7 bits"},
    {"quant", "weight_observer", QT_CFG_ENUM, "auto", 0, 0, "auto|minmax|moving_average",
     "per-channel weight observer (auto: minmax for PTQ, moving_average for QAT)"},
    {"quant", "activation_observer", QT_CFG_ENUM, "moving_average", 0, 0, "minmax|moving_average|histogram",
     "activation observer"},
    {"quant", "activation_range", QT_CFG_ENUM, "minmax", 0, 0, "minmax|percentile|mse",
     "histogram observer: how the range is chosen"},
    {"quant", "percentile", QT_CFG_FLOAT, "99.99", 50, 100, NULL, "histogram + percentile: the percentile kept"},
    {"quant", "learnable_scale", QT_CFG_BOOL, "false", 0, 0, NULL,
     "QAT: LSQ, scales are trained parameters (initialized by the observers on the first batch)"},
    {"quant", "layer_overrides", QT_CFG_STRING, "", 0, 0, NULL,
     "per-layer settings by node name, e.g. conv1=w8a8;fc2=fp32 (mixed precision)"},
    {"quant", "fp32_checkpoint", QT_CFG_STRING, "", 0, 0, NULL,
     "fp32 checkpoint to quantize (empty: from the initialization)"},
    {"quant", "fp32_config", QT_CFG_STRING, "", 0, 0, NULL,
     "config that trains fp32_checkpoint when it does not exist yet"},
    {"quant", "calibration_batches", QT_CFG_INT, "32", 1, 100000, NULL, "PTQ (and QAT with quant.qat_init = calibration): training batches to calibrate on"},
    {"quant", "qat_init", QT_CFG_ENUM, "observers", 0, 0, "observers|calibration",
     "QAT: where the qparams start: observers (they track the training batches; LSQ scales are "
     "initialized on the first batch) or calibration (PTQ calibration on quant.calibration_batches "
     "batches first; the qparams then stay fixed, or are learned with LSQ)"},
    {"quant", "freeze_observers_after", QT_CFG_FLOAT, "0", 0, 100000, NULL,
     "QAT: disable observers (freeze the qparams) after this many epochs, fractions allowed (0 = never)"},
    {"quant", "freeze_bn_after", QT_CFG_FLOAT, "0", 0, 100000, NULL,
     "QAT: freeze BN running statistics after this many epochs, fractions allowed (0 = never)"},
    {"quant", "check_batch", QT_CFG_INT, "128", 1, 100000, NULL,
     "test images the training-graph = convert-graph check runs on"},

    {"analysis", "calibration_methods", QT_CFG_STRING, "", 0, 0, NULL,
     "PTQ debugging: activation calibration methods to compare, e.g. minmax,moving_average,percentile,mse "
     "(empty = no comparison)"},
    {"analysis", "calibration_batches", QT_CFG_STRING, "", 0, 0, NULL,
     "PTQ debugging: ascending calibration batch counts to compare, e.g. 1,8,32 (empty = quant.calibration_batches)"},
    {"analysis", "layer_sqnr", QT_CFG_BOOL, "false", 0, 0, NULL,
     "PTQ debugging: SQNR between the fp32 and the fake-quant model, node by node"},
    {"analysis", "sensitivity", QT_CFG_BOOL, "false", 0, 0, NULL,
     "PTQ debugging: accuracy when only one layer is quantized, for each conv/linear layer"},
    {"analysis", "mixed_precision_k", QT_CFG_STRING, "", 0, 0, NULL,
     "PTQ debugging: keep the k most sensitive layers at analysis.mixed_precision_keep, e.g. 0,1,2,3"},
    {"analysis", "mixed_precision_keep", QT_CFG_ENUM, "w8a8", 0, 0, "w8a8|fp32",
     "PTQ debugging: what the k most sensitive layers are kept at"},
    {"analysis", "images", QT_CFG_INT, "2000", 0, 1e9, NULL,
     "PTQ debugging: test images every analysis variant is evaluated on (0 = all)"},

    {"output", "dir", QT_CFG_STRING, "runs/default", 0, 0, NULL, "output directory (created)"},
    {"output", "progress", QT_CFG_ENUM, "auto", 0, 0, "auto|bar|lines|none",
     "auto: a progress bar on a terminal, one line per epoch otherwise"},
    {"output", "dot", QT_CFG_BOOL, "true", 0, 0, NULL, "write the model graph as model.dot"},
};

const qt_cfg_key *qt_train_schema(int *n_keys) {
  *n_keys = (int)(sizeof schema / sizeof schema[0]);
  return schema;
}

qt_config *qt_train_config_create(void) {
  int n;
  const qt_cfg_key *s = qt_train_schema(&n);
  return qt_config_create(s, n);
}
