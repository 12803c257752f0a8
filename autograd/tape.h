/* The tape's private interface, used by the op implementations in ops.c. */
#ifndef QT_TAPE_H
#define QT_TAPE_H

#include "autograd/autograd.h"

typedef void (*qt_backward_fn)(qt_ctx *ctx, void *saved);
typedef struct {
  qt_backward_fn fn;
  void *saved;
  qt_profile_op kind; /* the op that recorded it: the profile's backward bucket */
} qt_tape_entry;

/* The context, here rather than in tensor.c so that the ops read `profile` inline: with
 * profiling off an op pays one load and one branch. */
struct arena_block;
struct qt_ctx {
  struct arena_block *blocks; /* current block first */
  size_t capacity;            /* sum of block sizes */
  size_t used_total;          /* bytes handed out since reset, over all blocks */
  size_t peak;
  int grad_enabled;
  qt_tape_entry *tape;
  size_t tape_len, tape_cap;
  const qt_batch_sync *sync; /* the processes sharing the batch, or NULL */
  qt_profile *profile;       /* NULL: not profiling */
};

/* Appends a backward record of an op of this kind; returns `saved_bytes` of zeroed arena memory
 * for its state. */
void *qt_tape_push(qt_ctx *ctx, qt_profile_op kind, qt_backward_fn fn, size_t saved_bytes);
/* Whether an op on these inputs must be recorded (grad mode on and any input requires grad). */
int qt_tape_recording(const qt_ctx *ctx, const qt_tensor *a, const qt_tensor *b, const qt_tensor *c);

/* The profiler's bracket around one op, called only when ctx->profile is set: begin aborts if
 * another op or tape entry is being timed (nested timing would count time twice) and returns
 * the start time; end adds the elapsed time and a call to the op's forward bucket. */
double qt_profile_begin(qt_ctx *ctx, qt_profile_op op);
void qt_profile_end(qt_ctx *ctx, qt_profile_op op, double t0);

#endif
