/* The tape's private interface, used by the op implementations in ops.c. */
#ifndef QT_TAPE_H
#define QT_TAPE_H

#include "autograd/autograd.h"

typedef void (*qt_backward_fn)(qt_ctx *ctx, void *saved);
typedef struct {
  qt_backward_fn fn;
  void *saved;
} qt_tape_entry;

/* Appends a backward record; returns `saved_bytes` of zeroed arena memory for its state. */
void *qt_tape_push(qt_ctx *ctx, qt_backward_fn fn, size_t saved_bytes);
/* Whether an op on these inputs must be recorded (grad mode on and any input requires grad). */
int qt_tape_recording(const qt_ctx *ctx, const qt_tensor *a, const qt_tensor *b, const qt_tensor *c);

#endif
