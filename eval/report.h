/* The three-stage accuracy report (docs/deployment.md) and inference
 * speed. The same test images go through three engines:
 *
 *   fp32 graph  --stage 1: quantization-->  Q/DQ graph  --stage 2: lowering-->  int8 device
 *
 * and the report says where accuracy went: test accuracy of each, top-1 agreement between the
 * Q/DQ graph and the device, the device's output differences from the Q/DQ graph in output
 * LSB (max and a histogram), and per-point SQNR (fp32 vs Q/DQ, Q/DQ vs device) at every
 * quantization point, matched by value name across the graphs (a point is the value a
 * "<value>.fq.quantize" node reads; its Q/DQ-side value is what the dequantize returns).
 * Stage 1 belongs to the algorithm (quantizer settings, QAT); stage 2 to the backend, and the
 * device must pass the one agreement rule below (qt_device_agreement_pass).
 *
 * "The Q/DQ graph" in accuracies, stage losses and every device comparison is its exact
 * reference (eval/exact.h: integer arithmetic where the math is integer, float64 elsewhere), so
 * stage 2 measures lowering alone. The float32 Q/DQ executor (qt_graph_forward), whose sums
 * depend on their order, is itself measured against the exact reference (float_vs_exact), and
 * serves the intermediate points' SQNR.
 *
 * The library never exits or prints unless asked; functions return 0 or -1 with err set. */
#ifndef QT_REPORT_H
#define QT_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "data/data.h"
#include "nn/nn.h"

/* ---- metrics ------------------------------------------------------------------------------- */

/* Signal-to-quantization-noise ratio of y against the reference x, in dB:
 * 10 * log10(sum x^2 / sum (x - y)^2), sums in double. +INFINITY when y equals x (no noise, zeros
 * included), -INFINITY when x is all zeros but y is not, NAN for n == 0. */
double qt_sqnr_db(const float *x, const float *y, int64_t n);

/* The same ratio accumulated over batches (the sums, not a mean of per-batch dB). */
typedef struct {
  double signal, noise; /* sum x^2, sum (x - y)^2 */
  int64_t n;
} qt_sqnr_sum;
void qt_sqnr_add(qt_sqnr_sum *s, const float *x, const float *y, int64_t n);
double qt_sqnr_sum_db(const qt_sqnr_sum *s);

/* Output differences in units of the output scale (LSB): |a - b| / lsb, binned by the nearest
 * integer into 0, 1, 2 and more than 2. */
enum { QT_LSB_BINS = 4 };
typedef struct {
  int64_t count[QT_LSB_BINS]; /* 0, 1, 2, >2 LSB */
  int64_t n;
  double max_lsb; /* the largest |a - b| / lsb seen (not rounded) */
} qt_lsb_histogram;
/* lsb must be > 0. */
void qt_lsb_histogram_add(qt_lsb_histogram *h, const float *a, const float *b, int64_t n, float lsb);

/* ---- the device against the Q/DQ graph: the one pass rule ---------------------------------- */
/* A device agrees with the Q/DQ graph it runs when no output differs from the Q/DQ reference
 * interpreter by more than QT_AGREEMENT_MAX_LSB output LSB (the final dequantize's per-tensor
 * scale; integer rounding of float scales may flip one LSB, more is a lowering bug) and at
 * least QT_AGREEMENT_MIN_TOP1 of the images have the same top-1. A graph whose output is fp32
 * (no final dequantize) has no output LSB: it is judged on the top-1 agreement alone, and the
 * largest absolute difference is reported. qat_run --compare, qat_backend_check --run and the
 * three-stage report's verdict all judge with qt_device_agreement_pass. */
#define QT_AGREEMENT_MAX_LSB 1.0
#define QT_AGREEMENT_MIN_TOP1 0.999

typedef struct {
  int64_t images, outputs; /* images compared, and output values (images x classes) */
  int64_t device_correct, qdq_correct, agree;
  float output_scale;    /* the output LSB; 0: fp32 output */
  double max_lsb;        /* largest |device - Q/DQ| / output_scale (0 for an fp32 output) */
  int64_t over_max_lsb;  /* outputs more than QT_AGREEMENT_MAX_LSB apart */
  int64_t differ;        /* outputs that differ at all */
  double max_abs_diff;   /* largest |device - Q/DQ| */
  double device_seconds; /* model time of the device runs (qt_device_compare) */
} qt_device_agreement;

/* The output LSB of a Q/DQ graph: the per-tensor scale of a final dequantize, else 0. */
float qt_output_lsb(const qt_graph *qdq);
/* Starts an empty comparison for outputs on the scale output_scale (0: fp32 output). */
void qt_device_agreement_init(qt_device_agreement *a, float output_scale);
/* Adds n images: device and Q/DQ outputs (n, classes), labels (n) or NULL. */
void qt_device_agreement_add(qt_device_agreement *a, const float *device, const float *qdq, const int32_t *labels,
                             int n, int64_t classes);
double qt_device_agreement_top1(const qt_device_agreement *a); /* identical top-1, fraction of images */
/* The rule: 1 when the device agrees, 0 when it does not. */
int qt_device_agreement_pass(const qt_device_agreement *a);
/* The rule in words, for messages: "within 1 output LSB of the Q/DQ graph, with identical top-1 on
 * >= 99.9% of images (...)". */
const char *qt_device_agreement_rule(void);
/* The comparison as the programs print it (prefix: the program's name):
 *   "<prefix>: N test images: device top-1 A%, Q/DQ reference top-1 B%; outputs: max difference
 *    X LSB, K of M logits differ, L logits over 1 LSB; identical top-1 on P%"
 * (an fp32 output: "max difference X (absolute; fp32 output (no output LSB))"), then, when the
 * device fails the rule, "<prefix>: FAIL: the device must stay <rule>". Returns 1 when it passes. */
int qt_device_agreement_print(const qt_device_agreement *a, const char *prefix, FILE *f);

/* Runs the test set (ds in lc's batches, in order, no augmentation) through the device and,
 * when qdq is not NULL, the Q/DQ graph's exact reference (eval/exact.h), and fills a: device
 * accuracy and model time always (the first batch is run once more before, untimed: kernels
 * are created on first use), the comparison with qdq. Returns -1 with err on a shape mismatch
 * or a failing run. */
int qt_device_compare(qt_device *dev, qt_graph *qdq, const qt_dataset *ds, const qt_loader_config *lc,
                      qt_device_agreement *a, char *err);

/* Writes what the device computes on the test set (ds in lc's batches, in order, no
 * augmentation) to the HDF5 file path, atomically (a qt_temp_create file, then renamed): "logits" (N,
 * output shape), "labels" (N) int32, and one dataset per name in values (a value or node name of
 * the device's Q/DQ graph, qt_device_read_value), (N, value shape) fp32. reference != 0: what the
 * exact integer reference of the device's Q/DQ graph computes instead (qt_exact_run_values: at a
 * quantize point its integers, dequantized as a device returns them). Returns -1 with err. */
int qt_device_write_outputs(qt_device *dev, int reference, const qt_dataset *ds, const qt_loader_config *lc,
                            const char *const *values, int n_values, const char *path, char *err);

/* ---- the three-stage report --------------------------------------------------------------- */

typedef enum {
  QT_POINT_ACTIVATION, /* a quantize -> dequantize pair on an activation */
  QT_POINT_WEIGHT,     /* a layer's integer weights against the float weight convert quantized */
  QT_POINT_OUTPUT,     /* the graph output when it is not itself a quantization point (fp32 layer) */
  QT_POINT_KIND_COUNT
} qt_point_kind;
const char *qt_point_kind_name(qt_point_kind k);

typedef struct {
  char name[2 * QT_NAME_LEN]; /* the value ("relu1") or weight tensor ("conv1.weight") */
  qt_point_kind kind;
  int is_output;             /* the graph output (an activation point or QT_POINT_OUTPUT) */
  qt_sqnr_sum fp32_vs_qdq;   /* n == 0: not measured (no fp32 model or no value of that name) */
  qt_sqnr_sum qdq_vs_device; /* n == 0: not measured (weights: the device runs the same integers) */
  /* The partition ending here, judged alone (an activation point, over the first forced_images
   * images): the device's integers at the point against what the exact reference makes of the
   * device's own integers at the points before it (qt_exact_run_forced). forced_n == 0: not
   * measured. */
  int64_t forced_n;      /* integers compared */
  int64_t forced_over;   /* of them more than QT_AGREEMENT_MAX_LSB apart */
  int64_t forced_differ; /* of them apart at all */
  int64_t forced_max;    /* the largest |device - exact| (integers: LSB of the point) */
} qt_report_point;

/* Each partition is judged alone on the first probe images, at most this many, and at most as
 * many as keep QT_REPORT_FORCED_VALUES of the device's integers (4 bytes each) in memory. */
#define QT_REPORT_FORCED_IMAGES 256
#define QT_REPORT_FORCED_VALUES ((int64_t)1 << 25)
#define QT_REPORT_MAX_POINTS 2048 /* quantization points and weights: ResNet-152 has about 310 */
#define QT_REPORT_MAX_FALLBACKS 16

/* A partition the device runs on the CPU in fp32 (QT_PART_FALLBACK), as the device lists it. */
typedef struct {
  char nodes[256];  /* the Q/DQ graph nodes it covers, "a -> b" (cut short if longer) */
  char reason[320]; /* why they are not on the backend's integer kernels (the partition's detail) */
} qt_report_fallback;

typedef struct {
  int64_t images;
  int has_fp32; /* an fp32 model was given: stage 1 measured */
  int64_t fp32_correct, qdq_correct, device_correct, agree;
  double fp32_accuracy, qdq_accuracy, device_accuracy; /* top-1 in [0, 1] */
  double top1_agreement;                               /* Q/DQ vs device: fraction of images with the same top-1 */
  float output_scale;                 /* the output's LSB (its per-tensor dequantize scale); 0 = fp32 output */
  int64_t qdq_top2_ties;              /* images whose quantized Q/DQ logits have their two largest equal
                                       * (the arg max takes the first; 0 for an fp32 output) */
  qt_lsb_histogram lsb;               /* device vs Q/DQ output logits (empty when output_scale is 0) */
  double max_abs_diff;                /* device vs Q/DQ output logits, absolute */
  qt_device_agreement agreement;      /* the same comparison judged by the pass rule (verdict) */
  qt_device_agreement float_vs_exact; /* the float32 Q/DQ executor against the exact reference */
  int64_t probe_images;               /* images the device was read on at intermediate points (0: not) */
  int64_t forced_images;              /* images each partition was judged alone on (0: not) */
  int int8_partitions, fallback_partitions;
  int n_fallbacks; /* fallback partitions listed below: the first QT_REPORT_MAX_FALLBACKS */
  qt_report_fallback fallbacks[QT_REPORT_MAX_FALLBACKS];
  char backend[QT_NAME_LEN]; /* the device's backend (its description's name) */
  int n_points;
  qt_report_point points[QT_REPORT_MAX_POINTS];
} qt_report;

/* Runs the test set (ds in lc's batches; shuffling and augmentation are turned off) through
 * the fp32 graph (NULL: stage 1 is not measured), the Q/DQ graph and the device deployed from
 * it (qt_device_open of qdq) and fills r. Both graphs are run in eval mode and left in it.
 * Accuracies, agreement, the LSB histogram, fp32-vs-Q/DQ SQNR and the output's
 * Q/DQ-vs-device SQNR cover the whole set. Q/DQ-vs-device SQNR at intermediate points covers
 * the first probe_images images (0: not measured), read with qt_device_read_value one point
 * at a time; the same reads judge each partition alone (forced_*, on the first forced_images of
 * them). Returns -1 with err on a shape mismatch or a failing forward. */
int qt_report_run(qt_graph *fp32, qt_graph *qdq, qt_device *device, const qt_dataset *ds, const qt_loader_config *lc,
                  int64_t probe_images, qt_report *r, char *err);

/* Accuracy lost by each stage, in percentage points (negative: gained). NAN when unmeasured. */
double qt_report_stage1_loss(const qt_report *r);
double qt_report_stage2_loss(const qt_report *r);
/* One line: what each stage lost and which of the two lost the accuracy, e.g. "stage 1
 * (fp32 -> Q/DQ: quantization) lost 2.40 points; stage 2 (Q/DQ -> int8 device: lowering)
 * lost 0.00 points: the accuracy was lost in stage 1 (quantization)". When a partition judged
 * alone is more than QT_AGREEMENT_MAX_LSB from the exact reference, it names the first such
 * point: a lowering bug. When the device fails the agreement rule (qt_device_agreement_pass)
 * while every partition alone keeps within it, the difference is rounding that grows through the
 * layers, and the line says so; without the partitions judged alone (no probes), a device that
 * fails the rule is a lowering bug unless the float32 executor is as far from the exact
 * reference. */
void qt_report_verdict(const qt_report *r, char *buf, size_t len);
/* The whole report for humans. */
void qt_report_print(const qt_report *r, FILE *f);

/* The report as JSON members (no enclosing braces): "int8_vs_qdq", "sqnr_db",
 * "stage_loss_points", "verdict", "lowering" (partition counts, and "fallbacks": the fp32
 * fallback partitions, each {"nodes", "reason"}); each line starts with `indent`. SQNR of identical
 * tensors is written as 999.0 (JSON has no infinity), an unmeasured one as null. */
char *qt_report_json(const qt_report *r, const char *indent);

/* ---- inference speed ---------------------------------------------------------------------- */

typedef struct {
  int batch;
  int64_t images;           /* images timed per engine per round */
  double fp32_images_per_s; /* 0 when no fp32 graph was given */
  double int8_images_per_s;
} qt_inference_speed;

/* Times the fp32 graph (eval mode, no gradients, the framework's executor; NULL to skip) and
 * the device on one batch of `batch` test images (the first ones, repeated if the set is
 * smaller). Two warm-up runs per engine, then `rounds` rounds that alternate the engines, each
 * timing `batches` runs; each engine keeps its best round (on a shared machine other processes
 * slow single measurements down, never up). The fp32 graph is left in eval mode. */
int qt_inference_measure(qt_graph *fp32, qt_device *device, const qt_dataset *ds, const qt_loader_config *lc, int batch,
                         int batches, int rounds, qt_inference_speed *out, char *err);

#endif
