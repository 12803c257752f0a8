/* The tape's private interface, used by the op implementations in ops.c. */
#ifndef QT_TAPE_H
#define QT_TAPE_H

#include "autograd/autograd.h"

typedef void (*qt_backward_fn)(qt_ctx *ctx, void *saved);
typedef struct {
  qt_backward_fn fn;
  void *saved;
  qt_profile_op kind; /* the op that recorded it: the profile's backward bucket */
  qt_tensor *out;     /* the op's output: its gradient is dead once this entry has run */
} qt_tape_entry;

/* The context, here rather than in tensor.c so that the ops read `profile` inline: with
 * profiling off an op pays one load and one branch. */
struct arena_block;
struct arena_range;
struct qt_ctx {
  struct arena_block *blocks; /* current block first */
  size_t capacity;            /* sum of block sizes */
  struct arena_block *small;  /* the same for allocations of at most ARENA_SMALL bytes */
  size_t small_capacity;
  size_t used_total; /* bytes bump-allocated since reset, over all blocks (the arena's extent) */
  size_t peak;
  struct arena_range *free; /* ranges handed back by qt_arena_free, by address; emptied by reset */
  int n_free, cap_free;
  int backward_frees; /* qt_ctx_set_backward_frees */
  int grad_enabled;
  int conv_winograd;   /* qt_ctx_set_conv_winograd */
  int blocked_handoff; /* qt_ctx_set_blocked_handoff */
  qt_tape_entry *tape;
  size_t tape_len, tape_cap;
  const qt_batch_sync *sync; /* the processes sharing the batch, or NULL */
  uint64_t random_seed;      /* qt_ctx_set_random */
  int64_t random_row0;
  qt_profile *profile;            /* NULL: not profiling */
  qt_backward_hook backward_hook; /* qt_ctx_set_backward_hook, or NULL */
  void *backward_hook_user;
};

/* Appends a backward record of an op of this kind whose output is `out`; returns `saved_bytes`
 * of zeroed arena memory for its state. A backward function that hands out->grad to an input
 * (in place) sets out->grad to NULL: the buffer then belongs to the input. */
void *qt_tape_push(qt_ctx *ctx, qt_profile_op kind, qt_backward_fn fn, size_t saved_bytes, qt_tensor *out);
/* Whether an op on these inputs must be recorded (grad mode on and any input requires grad). */
int qt_tape_recording(const qt_ctx *ctx, const qt_tensor *a, const qt_tensor *b, const qt_tensor *c);

/* The profiler's bracket around one op, called only when ctx->profile is set: begin aborts if
 * another op or tape entry is being timed (nested timing would count time twice) and returns
 * the start time; end adds the elapsed time and a call to the op's forward bucket. */
double qt_profile_begin(qt_ctx *ctx, qt_profile_op op);
void qt_profile_end(qt_ctx *ctx, qt_profile_op op, double t0);

#endif
