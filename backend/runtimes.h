/* The three runtimes behind qt_device (backend/device.c), private to the backend module. */
#ifndef QT_BACKEND_RUNTIMES_H
#define QT_BACKEND_RUNTIMES_H

#include "backend/backend.h"

/* ---- partition lists (parts.c): what a runtime reports as its partitions ---------------------- */
typedef struct {
  qt_partition_kind kind;
  char nodes[256];  /* the Q/DQ graph's nodes, "a -> b -> c" */
  char detail[320]; /* the kernels, or for a fallback the reason */
} qt_part;

typedef struct {
  qt_part *parts;
  int n, cap;
} qt_part_list;

/* Appends a partition whose detail is formatted (truncated to the field). */
void qt_part_add(qt_part_list *l, qt_partition_kind kind, const char *nodes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Partition i (0 <= i < l->n): its kind, and nodes / detail when not NULL. */
qt_partition_kind qt_part_get(const qt_part_list *l, int i, const char **nodes, const char **detail);
int qt_part_count(const qt_part_list *l, qt_partition_kind k);
/* One line per partition: "  <i> <kind> <nodes> <detail>". */
void qt_part_print(const qt_part_list *l, FILE *f);
void qt_part_list_free(qt_part_list *l);

/* ---- oneDNN int8 lowering (lower.c) ---------------------------------------------------------- */
typedef struct qt_lowered qt_lowered;

/* Lowers a finalized Q/DQ graph. g must outlive the lowered model and stay unchanged: fallback
 * partitions run its nodes with qt_node_forward (nn.h), reading their parameters from g.
 * NULL with err set for a graph that is not a Q/DQ graph (fake_quant / conv_bn nodes or
 * weights without integers: a prepared graph, convert it first). */
qt_lowered *qt_lower(const qt_graph *g, char *err);
void qt_lowered_free(qt_lowered *m);

/* Runs the model on input (n, H, W, C) fp32 NHWC; writes out (n, qt_lowered_output_numel)
 * fp32: the graph output as the Q/DQ graph defines it (the dequantized integers when the
 * output is a dq). Returns 0, or -1 with err set (shape mismatch). */
int qt_lowered_run(qt_lowered *m, float *out, const float *input, int n, char *err);
int64_t qt_lowered_output_numel(const qt_lowered *m);
void qt_lowered_input_shape(const qt_lowered *m, int *h, int *w, int *c);

/* Partitions in execution order: kind, the Q/DQ graph nodes covered ("a -> b -> c") and a
 * detail (the kernel, or for a fallback the reason). */
int qt_lowered_partition_count(const qt_lowered *m);
qt_partition_kind qt_lowered_partition(const qt_lowered *m, int i, const char **nodes, const char **detail);
/* Number of partitions of a kind. */
int qt_lowered_count(const qt_lowered *m, qt_partition_kind k);
/* The report: a header line, then one line per partition. */
void qt_lowered_report(const qt_lowered *m, FILE *f);

/* ---- the accelerator simulator (accel.c) ----------------------------------------------------- */
typedef struct qt_accel qt_accel; /* opaque */

/* g must outlive the model and stay unchanged (its parameters are read at run time).
 * NULL with err for a graph that is not a finalized Q/DQ graph. */
qt_accel *qt_accel_partition(const qt_graph *g, const qt_backend_desc *d, char *err);
void qt_accel_free(qt_accel *a);
/* Runs on input (n, H, W, C) fp32 NHWC; out (n, qt_accel_output_numel) fp32. */
int qt_accel_run(qt_accel *a, float *out, const float *input, int n, char *err);
int64_t qt_accel_output_numel(const qt_accel *a);

/* Partitions in execution order: QT_PART_INT8 = on the accelerator (detail: its kernels, one
 * per line), QT_PART_FALLBACK = on the CPU (detail: "node: reason", one per line),
 * QT_PART_BOUNDARY = a transfer (quantize on the way in, dequantize on the way out). Nodes are
 * listed "a -> b -> c" in execution order. */
int qt_accel_partition_count(const qt_accel *a);
qt_partition_kind qt_accel_partition_get(const qt_accel *a, int i, const char **nodes, const char **detail);
int qt_accel_count(const qt_accel *a, qt_partition_kind k);
/* Where node `name` runs: 1 accelerator, 0 CPU (reason set), -1 no such node. */
int qt_accel_node_on_accel(const qt_accel *a, const char *name, const char **reason);
/* The report: a header line, then one line per partition. */
void qt_accel_report(const qt_accel *a, FILE *f);

/* ---- XNNPACK (xnnpack.c) --------------------------------------------------------------------- */
typedef struct qt_xnnpack qt_xnnpack; /* opaque */

/* Lowers a finalized Q/DQ graph onto XNNPACK operators with fp32 fallback partitions; a
 * pthreadpool of omp_get_max_threads() threads. g must outlive the model and stay unchanged.
 * NULL with err for a graph that is not a Q/DQ graph, or a build without XNNPACK. */
qt_xnnpack *qt_xnnpack_lower(const qt_graph *g, char *err);
void qt_xnnpack_free(qt_xnnpack *m);
/* Runs on input (n, H, W, C) fp32 NHWC; out (n, output numel) fp32. 0, or -1 with err. */
int qt_xnnpack_run(qt_xnnpack *m, float *out, const float *input, int n, char *err);
/* Partitions in execution order, as qt_lowered_partition. */
int qt_xnnpack_partition_count(const qt_xnnpack *m);
qt_partition_kind qt_xnnpack_partition(const qt_xnnpack *m, int i, const char **nodes, const char **detail);
void qt_xnnpack_report(const qt_xnnpack *m, FILE *f);
/* 0 when XNNPACK is built in and initializes on this CPU, else -1 with err saying why. */
int qt_xnnpack_available(char *err);

#endif
