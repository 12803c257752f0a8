/* The lowering skeleton shared by the oneDNN int8 backend (lower.c) and the XNNPACK backend
 * (xnnpack.c), private to the backend module (lowering.c).
 *
 * A lowered model is a program: a list of steps over buffers ("slots", sized per sample), its
 * partitions and the allocations it owns. Lowering walks the Q/DQ graph in topological order and
 * gives every value a representation: fp32 (a float buffer), or integers with the qparams that
 * turn them into the value the Q/DQ graph computes; 8-bit integers where the range fits the
 * backend's 8-bit type (u8 for oneDNN, int8 for XNNPACK), int32 otherwise. A dequantize is free
 * (it only records qparams on the integer buffer); its fp32 form is materialized by a boundary
 * step only when an fp32 consumer needs it. The skeleton lowers the graph input, quantize,
 * dequantize and flatten (a view of the same buffer) itself and hands every other node to the
 * backend (qt_lowering_ops.lower_node), which lowers a pattern starting there into its own
 * kernel steps or names the reason it cannot; the node then runs as a fallback partition: the
 * framework's fp32 node forward (qt_node_forward) on fp32 inputs. */
#ifndef QT_BACKEND_LOWERING_H
#define QT_BACKEND_LOWERING_H

#include <stddef.h>
#include <stdint.h>

#include "autograd/autograd.h"
#include "backend/runtimes.h"

/* ---- the program: steps over slots ----------------------------------------------------------- */
typedef enum {
  QT_STEP_QUANTIZE,   /* fp32 -> integers (the reference quantize) */
  QT_STEP_DEQUANTIZE, /* integers -> fp32 (the reference dequantize) */
  QT_STEP_FALLBACK,   /* a node of the Q/DQ graph in fp32, by qt_node_forward */
  QT_STEP_KERNEL      /* a backend's kernel: op_kind says which */
} qt_step_kind;

typedef struct {
  qt_step_kind kind;
  int in[QT_MAX_INPUTS], out; /* slots (kernels read in[0] and in[1]; fallbacks all of the node's) */
  int64_t in_numel;           /* per sample, of in[0] (quantize / dequantize: of both sides) */
  /* quantize / dequantize (and a backend's requantizing kernels) */
  int channels;
  float *scale;
  int32_t *zero_point;
  int qmin, qmax;
  int int8; /* the integer side is 8-bit (the backend's 8-bit type), else int32 */
  /* a backend kernel: its kind, its operator, the input's height and width (conv, pools) and
   * data the program keeps for it */
  int op_kind;
  void *op;
  int H, W;
  const void *aux;
  /* fallback: the node of the Q/DQ graph, run by qt_node_forward */
  int node;
  int in_ndim[QT_MAX_INPUTS];
  int64_t in_shape[QT_MAX_INPUTS][3];
} qt_step;

typedef struct {
  char name[QT_NAME_LEN];
  const qt_graph *g; /* the Q/DQ graph (borrowed): the fallbacks' nodes and parameters */
  int64_t out_numel;
  int input_slot, output_slot;
  qt_step *steps;
  int n_steps, cap_steps;
  size_t *slot_bytes; /* per slot, per sample */
  int n_slots, cap_slots;
  qt_part_list parts;
  void **kept; /* owned allocations (qparam copies, kernels' tables) */
  int n_kept, cap_kept;
  qt_ctx *ctx;
  void **bufs; /* per slot, during a run */
} qt_program;

/* A zeroed allocation owned by the program (freed by qt_program_free); a copy of src. */
void *qt_keep(qt_program *p, size_t bytes);
void *qt_keep_copy(qt_program *p, const void *src, size_t bytes);
int qt_new_slot(qt_program *p, size_t bytes_per_sample);
qt_step *qt_new_step(qt_program *p, qt_step_kind kind);
/* A kernel step reading in_slot (in_numel per sample) into a new slot of out_bytes per sample. */
qt_step *qt_kernel_step(qt_program *p, int op_kind, void *op, int in_slot, int64_t in_numel, size_t out_bytes);
/* Frees what the program owns (not its kernels' operators: the backend frees those first). */
void qt_program_free(qt_program *p);
/* A fallback step's inputs: its input slots wrapped as fp32 tensors of batch N. */
void qt_fallback_inputs(qt_program *p, const qt_step *s, int N, qt_tensor **ins);

/* ---- lowering ------------------------------------------------------------------------------- */
typedef enum { QT_REP_F32, QT_REP_INT8, QT_REP_I32 } qt_rep_kind;

typedef struct {
  qt_rep_kind kind;
  int slot;     /* buffer holding the value's representation */
  int f32_slot; /* its fp32 form once materialized, else -1 (QT_REP_F32: = slot) */
  int channels; /* integers: qparams (per tensor: 1) along the last axis */
  float *scale; /* owned by the program (kept list) */
  int32_t *zero_point;
  int qmin, qmax; /* integers: the range of the quantize that made them */
  int fallback;   /* fp32 made by a fallback partition: the partition whose reason is the
                   * first cause of the chain of fallbacks it ends, else -1 */
} qt_value_rep;

typedef struct qt_lowering qt_lowering;

/* What a backend fills the skeleton with. */
typedef struct {
  const char *prefix;                   /* of error messages: "lower", "device xnnpack" */
  const char *verb;                     /* what the user does with a Q/DQ graph: "lower", "deploy" */
  const char *int8_name;                /* the 8-bit integer type in partition details: "u8", "int8" */
  const char *int32_name;               /* the 32-bit one: "i32", "int32" */
  int (*fits_int8)(int qmin, int qmax); /* whether a range is held in the 8-bit type */
  /* NULL when the quantize q's range suits the backend's output, else the reason (L->why) */
  const char *(*output_range_problem)(qt_lowering *L, const qt_qstate *q);
  /* Lowers node i (any op but input, quantize, dequantize and flatten), possibly with the nodes
   * after it: NULL, or the reason node i runs as an fp32 fallback instead. */
  const char *(*lower_node)(qt_lowering *L, int i);
} qt_lowering_ops;

struct qt_lowering {
  const qt_graph *g;
  qt_program *p;
  const qt_lowering_ops *ops;
  qt_value_rep *rep; /* per value */
  int *consumer;     /* per value: its only consuming node, or -1 (none or several) */
  int *done;         /* per node: lowered as part of an earlier pattern */
  char why[320];     /* a reason formatted by a pattern */
  int cause;         /* the first cause (a partition) when that reason is an fp32 input, else -1 */
};

/* 0 when g is a finalized Q/DQ graph with fp32 output, else -1 with err (ops' prefix and verb). */
int qt_lowering_check(const qt_graph *g, const qt_lowering_ops *ops, char *err);
/* Lowers the checked graph g into p (zeroed): the walk, the output's fp32 form, the run context. */
void qt_lowering_build(qt_program *p, const qt_graph *g, const qt_lowering_ops *ops);

const float *qt_param_data(const qt_graph *g, int t);
/* The fp32 form of value v, materializing it with a dequantize step on first use. */
int qt_f32_slot(qt_lowering *L, int v);
/* Records q's qparams (copies kept by the program) and range on r. */
void qt_set_qparams(qt_lowering *L, qt_value_rep *r, const qt_qstate *q);
/* The quantize that ends node i's unit: i [-> relu | relu6] -> q, per tensor, with a range
 * output_range_problem accepts. Fills act (the relu / relu6 node or -1) and quant; NULL, or the
 * reason. */
const char *qt_match_output(qt_lowering *L, int i, int *act, int *quant);
/* The unit first [-> act] -> quant is lowered: the quantize's value is 8-bit integers in `slot`
 * with its qparams, and the unit's nodes are done. */
void qt_unit_done(qt_lowering *L, int first, int act, int quant, int slot);
/* The unit's nodes for its partition: "x -> first [-> act] -> quant", with n_in inputs of first
 * joined by " + ". */
void qt_unit_nodes(const qt_lowering *L, int first, int n_in, int act, int quant, char *buf, size_t n);
/* Node i's output keeps its input's representation and qparams, in `slot`. */
void qt_same_qparams(qt_lowering *L, int i, int slot);
/* The first input of node n whose integers lie on another grid than input 0's (scale, zero point
 * or range), or -1 when all share one. */
int qt_off_grid_input(const qt_lowering *L, const qt_node *n);
/* The kernel step `kind` of concat node i whose inputs share one grid: it reads every input's
 * slot and writes a new one holding input 0's qparams; C[k] and off[k] receive input k's
 * channels and their offset in the output's *Y. */
qt_step *qt_concat_copy_step(qt_lowering *L, int i, int kind, int64_t *C, int64_t *off, int64_t *Y);
/* The kernel step `kind` of resize node i (nearest, by 2) on 8-bit integers: a copy of each pixel
 * into a 2 x 2 block, the input's qparams kept (exact); qt_resize_nearest_rows runs it. */
qt_step *qt_resize_nearest_step(qt_lowering *L, int i, int kind);
/* Output rows [r0, r1) (of 2 H per image) of such a step, from its input `in` of bytes. */
void qt_resize_nearest_rows(const qt_step *s, void *out, const void *in, int64_t r0, int64_t r1);

#endif
