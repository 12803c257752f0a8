/* Private to the XNNPACK backend (backend.h), shared by its two parts, both built only with
 * XNNPACK (QT_HAVE_XNNPACK):
 *   xnnpack.c      lowering a Q/DQ graph onto XNNPACK's operators: the steps of a lowered model
 *   xnnpack_run.c  the runtime that executes them, and the lowered model's queries
 * A lowered model is a list of steps over buffers ("slots", sized per sample). */
#ifndef QT_BACKEND_XNNPACK_INT_H
#define QT_BACKEND_XNNPACK_INT_H

#include <pthreadpool.h>
#include <xnnpack.h>

#include "autograd/autograd.h"
#include "backend/runtimes.h"

typedef enum { ST_QUANTIZE, ST_DEQUANTIZE, ST_XNN, ST_FALLBACK } step_kind;
typedef enum { XK_CONV, XK_FC, XK_MAX_POOL, XK_GAVG_POOL, XK_ADD, XK_CLAMP } xnn_kind;

typedef struct {
  step_kind kind;
  int in[2], out;   /* slots */
  int64_t in_numel; /* per sample, of in[0] (quantize / dequantize: of both sides) */
  /* quantize / dequantize */
  int channels;
  float *scale;
  int32_t *zero_point;
  int qmin, qmax;
  int int8; /* the integer side is int8 (else int32) */
  /* an XNNPACK operator */
  xnn_kind xk;
  xnn_operator_t op;
  int H, W; /* conv, pools: input height and width */
  /* fallback: the node of the Q/DQ graph, run by qt_node_forward */
  int node;
  int in_ndim[2];
  int64_t in_shape[2][3];
} step;

struct qt_xnnpack {
  char name[QT_NAME_LEN];
  int64_t out_numel;
  int input_slot, output_slot;
  step *steps;
  int n_steps, cap_steps;
  size_t *slot_bytes; /* per slot, per sample */
  int n_slots, cap_slots;
  qt_part_list parts;
  void **kept; /* owned allocations (qparam copies) */
  int n_kept, cap_kept;
  qt_ctx *ctx;
  void **bufs; /* per slot, during a run */
  pthreadpool_t pool;
  int fallback_threads; /* OpenMP threads of a fallback step: 1, or 0 = OpenMP's own count */
  const qt_graph *g;    /* the Q/DQ graph (borrowed): the fallbacks' nodes and parameters */
};

/* XNNPACK's status as text, for messages. */
const char *qt_xnn_status_name(enum xnn_status s);

#endif
