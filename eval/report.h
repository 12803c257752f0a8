/* The three-stage accuracy report (DESIGN 1, "Three-stage accuracy split") and inference
 * speed. The same test images go through three engines:
 *
 *   fp32 graph  --stage 1: quantization-->  Q/DQ graph  --stage 2: lowering-->  int8 device
 *
 * and the report says where accuracy went: test accuracy of each, top-1 agreement between the
 * Q/DQ graph and the device, the device's output differences from the Q/DQ graph in output
 * LSB (max and a histogram), and per-point SQNR (fp32 vs Q/DQ, Q/DQ vs device) at every
 * quantization point, matched by value name across the graphs (a point is the value a
 * "<value>.fq.quantize" node reads; its Q/DQ-side value is what the dequantize returns).
 * Stage 1 belongs to the algorithm (quantizer settings, QAT); stage 2 to the backend and
 * should stay within 1-2 output LSB of integer rounding.
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
  double max_lsb;             /* the largest |a - b| / lsb seen (not rounded) */
} qt_lsb_histogram;
/* lsb must be > 0. */
void qt_lsb_histogram_add(qt_lsb_histogram *h, const float *a, const float *b, int64_t n, float lsb);

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
  int is_output;              /* the graph output (an activation point or QT_POINT_OUTPUT) */
  qt_sqnr_sum fp32_vs_qdq;    /* n == 0: not measured (no fp32 model or no value of that name) */
  qt_sqnr_sum qdq_vs_device;  /* n == 0: not measured (weights: the device runs the same integers) */
} qt_report_point;

#define QT_REPORT_MAX_POINTS 96

typedef struct {
  int64_t images;
  int has_fp32;                   /* an fp32 model was given: stage 1 measured */
  int64_t fp32_correct, qdq_correct, device_correct, agree;
  double fp32_accuracy, qdq_accuracy, device_accuracy; /* top-1 in [0, 1] */
  double top1_agreement;          /* Q/DQ vs device: fraction of images with the same top-1 */
  float output_scale;             /* the output's LSB (its per-tensor dequantize scale); 0 = fp32 output */
  qt_lsb_histogram lsb;           /* device vs Q/DQ output logits (empty when output_scale is 0) */
  double max_abs_diff;            /* device vs Q/DQ output logits, absolute */
  int64_t probe_images;           /* images the device was read on at intermediate points (0: not) */
  int int8_partitions, fallback_partitions;
  int n_points;
  qt_report_point points[QT_REPORT_MAX_POINTS];
} qt_report;

/* Runs the test set (ds in lc's batches; shuffling and augmentation are turned off) through
 * the fp32 graph (NULL: stage 1 is not measured), the Q/DQ graph and the lowered model
 * `device` (qt_lower of qdq) and fills r. Both graphs are run in eval mode and left in it.
 * Accuracies, agreement, the LSB histogram, fp32-vs-Q/DQ SQNR and the output's
 * Q/DQ-vs-device SQNR cover the whole set. Q/DQ-vs-device SQNR at intermediate points covers
 * the first probe_images images (0: not measured): the runtime (backend.h) exposes only the
 * graph output, so each point is read by lowering the same Q/DQ graph with that point's
 * dequantize as the output (qt_lower copies the graph; every node lowers as before, the probe
 * additionally returns that value), one point at a time. Returns -1 with err on a shape
 * mismatch or a failing forward. */
int qt_report_run(qt_graph *fp32, qt_graph *qdq, qt_lowered *device, const qt_dataset *ds, const qt_loader_config *lc,
                  int64_t probe_images, qt_report *r, char *err);

/* Accuracy lost by each stage, in percentage points (negative: gained). NAN when unmeasured. */
double qt_report_stage1_loss(const qt_report *r);
double qt_report_stage2_loss(const qt_report *r);
/* One line: what each stage lost and which of the two lost the accuracy, e.g. "stage 1
 * (fp32 -> Q/DQ: quantization) lost 2.40 points; stage 2 (Q/DQ -> int8 device: lowering)
 * lost 0.00 points: the accuracy was lost in stage 1 (quantization)". */
void qt_report_verdict(const qt_report *r, char *buf, size_t len);
/* The whole report for humans. */
void qt_report_print(const qt_report *r, FILE *f);

/* The report as JSON members (no enclosing braces): "int8_vs_qdq", "sqnr_db",
 * "stage_loss_points", "verdict", "lowering"; each line starts with `indent`. SQNR of identical
 * tensors is written as 999.0 (JSON has no infinity), an unmeasured one as null. */
char *qt_report_json(const qt_report *r, const char *indent);

/* ---- inference speed ---------------------------------------------------------------------- */

typedef struct {
  int batch;
  int64_t images;             /* images timed per engine per round */
  double fp32_images_per_s;   /* 0 when no fp32 graph was given */
  double int8_images_per_s;
} qt_inference_speed;

/* Times the fp32 graph (eval mode, no gradients, the framework's executor; NULL to skip) and
 * the lowered model on one batch of `batch` test images (the first ones, repeated if the set is
 * smaller). Two warm-up runs per engine, then `rounds` rounds that alternate the engines, each
 * timing `batches` runs; each engine keeps its best round (on a shared machine other processes
 * slow single measurements down, never up). The fp32 graph is left in eval mode. */
int qt_inference_measure(qt_graph *fp32, qt_lowered *device, const qt_dataset *ds, const qt_loader_config *lc,
                         int batch, int batches, int rounds, qt_inference_speed *out, char *err);

#endif
