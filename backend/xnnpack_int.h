/* Private to the XNNPACK backend (backend.h), shared by its two parts, both built only with
 * XNNPACK (QT_HAVE_XNNPACK):
 *   xnnpack.c      lowering a Q/DQ graph onto XNNPACK's operators: the steps of a lowered model
 *   xnnpack_run.c  the runtime that executes them, and the lowered model's queries
 * A lowered model is a program of the lowering skeleton (lowering.h): steps over buffers. */
#ifndef QT_BACKEND_XNNPACK_INT_H
#define QT_BACKEND_XNNPACK_INT_H

#include <pthreadpool.h>
#include <xnnpack.h>

#include "backend/lowering.h"

/* The kernels of QT_STEP_KERNEL steps (qt_step.op_kind; qt_step.op is the xnn_operator_t). */
typedef enum {
  XK_CONV,
  XK_FC,
  XK_MAX_POOL,
  XK_GAVG_POOL,
  XK_ADD,
  XK_CLAMP,
  XK_SIGMOID,
  XK_TANH,
  XK_ELU,
  XK_MUL,
  XK_SHUFFLE,
  XK_COPY,   /* channels [H, H + copy's channels) of each row of in_numel / W channels (a slice) */
  XK_CONCAT, /* ours (XNNPACK has no concatenation here): aux an xnn_concat, inputs in[0..n) */
  XK_RESIZE, /* ours: nearest by 2 (qt_resize_nearest_rows) */
  XK_RESIZE_BILINEAR,
  /* qu8 operators (none in qs8 here) on int8 data: each int8 value x is the uint8 x + 128 with
   * the zero point + 128, the same real number; the runtime flips the top bit of the input into
   * a scratch buffer, runs the operator and flips the output's */
  XK_LEAKY_RELU_U8,
  XK_AVG_POOL_U8
} xnn_kind;

/* A concat of inputs on one grid: input k's C[k] channels per row go to channels [off[k], off[k] +
 * C[k]) of the output's Y. */
typedef struct {
  int n;
  int64_t C[QT_MAX_INPUTS], off[QT_MAX_INPUTS], Y;
} xnn_concat;

struct qt_xnnpack {
  qt_program prog; /* the steps, with 8-bit integers as int8 */
  pthreadpool_t pool;
  int fallback_threads; /* OpenMP threads of a fallback step: 1, or 0 = OpenMP's own count */
};

/* XNNPACK's status as text, for messages. */
const char *qt_xnn_status_name(enum xnn_status s);

#endif
