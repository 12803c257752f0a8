/* Tensors, the step arena and the tape. */
#include "autograd/autograd.h"
#include "base/base.h"
#include "autograd/tape.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under AddressSanitizer, memory handed back to the arena is poisoned until it is handed out
 * again: a kernel reading a value after it was freed (a missing qt_tensor.saved, a gradient read
 * after backward handed it back) is reported where it happens instead of reading whatever
 * reused the range. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static const char *const dtype_names[] = {"float32", "int8", "uint8", "int32"};
static const size_t dtype_sizes[] = {4, 1, 1, 4};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == QT_DTYPE_COUNT, "dtype name table");
_Static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == QT_DTYPE_COUNT, "dtype size table");

const char *qt_dtype_name(qt_dtype t) { return (unsigned)t < QT_DTYPE_COUNT ? dtype_names[t] : "?"; }
size_t qt_dtype_size(qt_dtype t) {
  QT_ASSERT((unsigned)t < QT_DTYPE_COUNT, "bad dtype %d", (int)t);
  return dtype_sizes[t];
}

int64_t qt_tensor_numel(const qt_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* ---- arena ------------------------------------------------------------------------------ */
typedef struct arena_block {
  struct arena_block *next;
  size_t size, used;
  unsigned char *mem;
} arena_block;

/* struct qt_ctx: tape.h */

#define ARENA_ALIGN 64
/* Above glibc's largest mmap threshold (32 MB on 64-bit), so that every block is its own mapping
 * and goes back to the system when freed (qt_ctx_reset merging a step's blocks, qt_ctx_release).
 * Smaller blocks come from the heap once a freed mapping has raised the dynamic threshold, and
 * the heap keeps them: a training step's first blocks then stayed resident beside the merged one.
 * Pages never touched cost nothing, so a small arena's large block is only address space. */
#define ARENA_MIN_BLOCK ((size_t)40 << 20)
/* Tensor headers, tape records, per-channel statistics: bump-allocated from blocks of their own
 * and never handed back, so that they do not sit between activations and split the ranges
 * qt_arena_free merges. */
#define ARENA_SMALL 4096
#define ARENA_SMALL_MIN_BLOCK ((size_t)256 << 10)

static arena_block *block_new(size_t size) {
  arena_block *b = malloc(sizeof *b);
  QT_ASSERT(b, "out of memory allocating an arena block header");
  b->mem = aligned_alloc(ARENA_ALIGN, size);
  QT_ASSERT(b->mem, "out of memory: arena needed a block of %zu bytes", size);
  b->size = size;
  b->used = 0;
  b->next = NULL;
  return b;
}

static void blocks_free(arena_block *b) {
  while (b) {
    arena_block *n = b->next;
    ARENA_UNPOISON(b->mem, b->size);
    free(b->mem);
    free(b);
    b = n;
  }
}

/* Memory handed back (qt_arena_free): ranges sorted by address, neighbours in one block merged,
 * and a range that ends at the current block's bump pointer returned to it. Allocations take
 * the smallest range that fits before bumping. Only the no-grad executor (nn/exec.c, values
 * after their last consumer) and backward (gradients after their producer's entry, with
 * qt_ctx_set_backward_frees) hand memory back, a few dozen ranges per step, so a linear
 * scan is enough. */
typedef struct arena_range {
  unsigned char *p;
  size_t n;
  arena_block *block;
} arena_range;

qt_ctx *qt_ctx_create(void) {
  qt_ctx *ctx = calloc(1, sizeof *ctx);
  QT_ASSERT(ctx, "out of memory");
  ctx->grad_enabled = 1;
  ctx->blocked_handoff = 1;
  return ctx;
}

void qt_ctx_free(qt_ctx *ctx) {
  if (!ctx) return;
  blocks_free(ctx->blocks);
  blocks_free(ctx->small);
  QT_FREE_ALL(ctx->free, ctx->tape, ctx);
}

/* After a step that needed several blocks, replace them by one block that fits the whole step,
 * so steady-state steps bump-allocate from a single block. */
static void chain_rewind(arena_block **blocks, size_t capacity) {
  if (*blocks && (*blocks)->next) {
    blocks_free(*blocks);
    *blocks = block_new(capacity);
  } else if (*blocks) {
    (*blocks)->used = 0;
  }
}

void qt_ctx_reset(qt_ctx *ctx) {
  chain_rewind(&ctx->blocks, ctx->capacity);
  chain_rewind(&ctx->small, ctx->small_capacity);
  ctx->used_total = 0;
  ctx->n_free = 0;
  ctx->tape_len = 0;
}

void qt_ctx_release(qt_ctx *ctx) {
  blocks_free(ctx->blocks);
  blocks_free(ctx->small);
  ctx->blocks = ctx->small = NULL;
  ctx->capacity = ctx->small_capacity = 0;
  ctx->used_total = 0;
  ctx->n_free = 0;
  ctx->tape_len = 0;
}

void qt_ctx_set_grad(qt_ctx *ctx, int enabled) { ctx->grad_enabled = enabled; }
int qt_ctx_grad_enabled(const qt_ctx *ctx) { return ctx->grad_enabled; }
void qt_ctx_set_conv_winograd(qt_ctx *ctx, int enabled) { ctx->conv_winograd = enabled; }
int qt_ctx_conv_winograd(const qt_ctx *ctx) { return ctx->conv_winograd; }
void qt_ctx_set_blocked_handoff(qt_ctx *ctx, int enabled) { ctx->blocked_handoff = enabled; }
size_t qt_ctx_peak_bytes(const qt_ctx *ctx) { return ctx->peak; }
void qt_ctx_set_backward_frees(qt_ctx *ctx, int enabled) { ctx->backward_frees = enabled; }
int qt_ctx_backward_frees(const qt_ctx *ctx) { return ctx->backward_frees; }

static size_t arena_round(size_t bytes) {
  size_t need = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  return need ? need : ARENA_ALIGN;
}

static void range_remove(qt_ctx *ctx, int i) {
  memmove(&ctx->free[i], &ctx->free[i + 1], (size_t)(ctx->n_free - i - 1) * sizeof *ctx->free);
  ctx->n_free--;
}

void *qt_arena_alloc(qt_ctx *ctx, size_t bytes) {
  const size_t need = arena_round(bytes);
  const int small = need <= ARENA_SMALL;
  if (!small && ctx->n_free > 0) {
    int best = -1;
    for (int i = 0; i < ctx->n_free; i++)
      if (ctx->free[i].n >= need && (best < 0 || ctx->free[i].n < ctx->free[best].n)) best = i;
    if (best >= 0) {
      arena_range *r = &ctx->free[best];
      void *p = r->p;
      r->p += need;
      r->n -= need;
      if (r->n == 0) range_remove(ctx, best);
      ARENA_UNPOISON(p, need);
      return p;
    }
  }
  arena_block **blocks = small ? &ctx->small : &ctx->blocks;
  size_t *capacity = small ? &ctx->small_capacity : &ctx->capacity;
  const size_t min_block = small ? ARENA_SMALL_MIN_BLOCK : ARENA_MIN_BLOCK;
  arena_block *b = *blocks;
  if (!b || b->size - b->used < need) {
    size_t size = *capacity > min_block ? *capacity : min_block;
    if (size < need) size = need;
    arena_block *nb = block_new(size);
    nb->next = *blocks;
    *blocks = nb;
    *capacity += size;
    b = nb;
  }
  void *p = b->mem + b->used;
  ARENA_UNPOISON(p, need);
  b->used += need;
  ctx->used_total += need;
  if (ctx->used_total > ctx->peak) ctx->peak = ctx->used_total;
  return p;
}

static int chain_holds(const arena_block *b, const unsigned char *c) {
  for (; b; b = b->next)
    if (c >= b->mem && c < b->mem + b->used) return 1;
  return 0;
}

int qt_arena_owns(const qt_ctx *ctx, const void *p) {
  return chain_holds(ctx->blocks, p) || chain_holds(ctx->small, p);
}

void qt_arena_free(qt_ctx *ctx, void *p, size_t bytes) {
  const size_t n = arena_round(bytes);
  unsigned char *c = p;
  if (n <= ARENA_SMALL && chain_holds(ctx->small, c)) return; /* small blocks are only rewound */
  arena_block *b = ctx->blocks;
  while (b && !(c >= b->mem && c < b->mem + b->used)) b = b->next;
  QT_ASSERT(b && c + n <= b->mem + b->used && ((size_t)(c - b->mem) % ARENA_ALIGN) == 0,
            "arena free of %zu bytes at %p: not memory this arena handed out", bytes, p);
  int i = 0;
  while (i < ctx->n_free && ctx->free[i].p < c) i++;
  QT_ASSERT((i == 0 || ctx->free[i - 1].p + ctx->free[i - 1].n <= c) && (i == ctx->n_free || c + n <= ctx->free[i].p),
            "arena free of %zu bytes at %p: overlaps memory already handed back", bytes, p);
  ARENA_POISON(c, n);
  if (i > 0 && ctx->free[i - 1].block == b && ctx->free[i - 1].p + ctx->free[i - 1].n == c) {
    i--; /* grows the range before it */
    ctx->free[i].n += n;
  } else {
    if (ctx->n_free == ctx->cap_free) {
      int cap = ctx->cap_free ? 2 * ctx->cap_free : 32;
      arena_range *f = realloc(ctx->free, (size_t)cap * sizeof *f);
      QT_ASSERT(f, "out of memory growing the arena's free list to %d ranges", cap);
      ctx->free = f;
      ctx->cap_free = cap;
    }
    memmove(&ctx->free[i + 1], &ctx->free[i], (size_t)(ctx->n_free - i) * sizeof *ctx->free);
    ctx->free[i] = (arena_range){c, n, b};
    ctx->n_free++;
  }
  if (i + 1 < ctx->n_free && ctx->free[i + 1].block == b && ctx->free[i].p + ctx->free[i].n == ctx->free[i + 1].p) {
    ctx->free[i].n += ctx->free[i + 1].n;
    range_remove(ctx, i + 1);
  }
  /* the top of the current block: back to the bump pointer */
  arena_range *r = &ctx->free[i];
  if (b == ctx->blocks && r->p + r->n == b->mem + b->used) {
    b->used -= r->n;
    ctx->used_total -= r->n;
    range_remove(ctx, i);
  }
}

void qt_tensor_free(qt_ctx *ctx, qt_tensor *t) {
  qt_arena_free(ctx, t->data, (size_t)qt_tensor_numel(t) * qt_dtype_size(t->dtype));
  t->data = NULL;
  t->owns_data = 0;
}

void *qt_arena_calloc(qt_ctx *ctx, size_t bytes) {
  void *p = qt_arena_alloc(ctx, bytes);
  memset(p, 0, bytes);
  return p;
}

qt_tensor *qt_tensor_wrap(qt_ctx *ctx, qt_dtype dtype, int ndim, const int64_t *shape, void *data) {
  QT_ASSERT(ndim >= 1 && ndim <= QT_MAX_DIMS, "tensor rank %d outside 1..%d", ndim, QT_MAX_DIMS);
  qt_tensor *t = qt_arena_alloc(ctx, sizeof *t);
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    QT_ASSERT(shape[i] >= 0, "negative dimension %lld", (long long)shape[i]);
    t->shape[i] = shape[i];
  }
  t->data = data;
  return t;
}

qt_tensor *qt_tensor_new(qt_ctx *ctx, qt_dtype dtype, int ndim, const int64_t *shape) {
  qt_tensor *t = qt_tensor_wrap(ctx, dtype, ndim, shape, NULL);
  t->data = qt_arena_alloc(ctx, (size_t)qt_tensor_numel(t) * qt_dtype_size(dtype));
  t->owns_data = 1;
  return t;
}

float *qt_tensor_grad(qt_ctx *ctx, qt_tensor *t) {
  QT_ASSERT(t->dtype == QT_F32, "gradient of a %s tensor", qt_dtype_name(t->dtype));
  if (!t->grad) t->grad = qt_arena_calloc(ctx, (size_t)qt_tensor_numel(t) * sizeof(float));
  return t->grad;
}

float *qt_tensor_grad_for_write(qt_ctx *ctx, qt_tensor *t, int *fresh) {
  QT_ASSERT(t->dtype == QT_F32, "gradient of a %s tensor", qt_dtype_name(t->dtype));
  *fresh = !t->grad;
  if (!t->grad) t->grad = qt_arena_alloc(ctx, (size_t)qt_tensor_numel(t) * sizeof(float));
  return t->grad;
}

/* ---- tape ------------------------------------------------------------------------------- */
void *qt_tape_push(qt_ctx *ctx, qt_profile_op kind, qt_backward_fn fn, size_t saved_bytes, qt_tensor *out) {
  if (ctx->tape_len == ctx->tape_cap) {
    size_t cap = ctx->tape_cap ? ctx->tape_cap * 2 : 64;
    qt_tape_entry *t = realloc(ctx->tape, cap * sizeof *t);
    QT_ASSERT(t, "out of memory growing the tape to %zu entries", cap);
    ctx->tape = t;
    ctx->tape_cap = cap;
  }
  void *saved = qt_arena_calloc(ctx, saved_bytes);
  ctx->tape[ctx->tape_len].fn = fn;
  ctx->tape[ctx->tape_len].saved = saved;
  ctx->tape[ctx->tape_len].kind = kind;
  ctx->tape[ctx->tape_len].out = out;
  ctx->tape_len++;
  return saved;
}

int qt_tape_recording(const qt_ctx *ctx, const qt_tensor *a, const qt_tensor *b, const qt_tensor *c) {
  if (!ctx->grad_enabled) return 0;
  return (a && a->requires_grad) || (b && b->requires_grad) || (c && c->requires_grad);
}

void qt_ctx_set_batch_sync(qt_ctx *ctx, const qt_batch_sync *sync) { ctx->sync = sync; }
const qt_batch_sync *qt_ctx_batch_sync(const qt_ctx *ctx) { return ctx->sync; }
void qt_ctx_set_random(qt_ctx *ctx, uint64_t seed, int64_t row0) {
  ctx->random_seed = seed;
  ctx->random_row0 = row0;
}
uint64_t qt_ctx_random_seed(const qt_ctx *ctx) { return ctx->random_seed; }
int64_t qt_ctx_random_row0(const qt_ctx *ctx) { return ctx->random_row0; }
size_t qt_ctx_tape_length(const qt_ctx *ctx) { return ctx->tape_len; }
void qt_ctx_set_backward_hook(qt_ctx *ctx, qt_backward_hook fn, void *user) {
  ctx->backward_hook = fn;
  ctx->backward_hook_user = user;
}

void qt_backward(qt_ctx *ctx, qt_tensor *loss) { qt_backward_seeded(ctx, loss, 1.0f); }

void qt_backward_seeded(qt_ctx *ctx, qt_tensor *loss, float seed) {
  QT_ASSERT(qt_tensor_numel(loss) == 1, "backward from a loss of %lld elements (want 1)",
            (long long)qt_tensor_numel(loss));
  QT_ASSERT(loss->requires_grad, "backward from a loss that does not require grad");
  qt_tensor_grad(ctx, loss)[0] = seed;
  qt_profile *p = ctx->profile;
  for (size_t i = ctx->tape_len; i-- > 0;) {
    const qt_profile_op kind = ctx->tape[i].kind;
    /* Tape entries run one after another and call kernels, never ops (begin's check would
     * abort), so each entry's time is its own. */
    const double t0 = p ? qt_profile_begin(ctx, kind) : 0;
    ctx->tape[i].fn(ctx, ctx->tape[i].saved);
    if (p) {
      p->active = 0;
      p->backward[kind].seconds += qt_now_seconds() - t0;
      p->backward[kind].calls++;
    }
    /* Its consumers' entries ran before this one, which has now passed the output's gradient
     * to the inputs: nothing reads the output or its gradient again, and the next gradients
     * may take their memory. A view or in-place output (wrapped) leaves the buffer to its
     * owner. */
    qt_tensor *out = ctx->tape[i].out;
    if (ctx->backward_frees && out) {
      if (out->grad && qt_arena_owns(ctx, out->grad)) {
        qt_arena_free(ctx, out->grad, (size_t)qt_tensor_numel(out) * sizeof(float));
        out->grad = NULL;
      }
      if (out->owns_data && out->data) qt_tensor_free(ctx, out);
    }
    if (ctx->backward_hook) ctx->backward_hook(ctx->backward_hook_user, i);
  }
  ctx->tape_len = 0;
}

/* ---- profiling ---------------------------------------------------------------------------- */
static const char *const profile_op_names[] = {"conv2d",
                                               "batch_norm",
                                               "relu",
                                               "relu6",
                                               "max_pool2d",
                                               "avg_pool2d",
                                               "global_avg_pool",
                                               "flatten",
                                               "linear",
                                               "add",
                                               "cross_entropy",
                                               "fake_quant",
                                               "fake_quant_lsq",
                                               "lsq_max_pool2d",
                                               "fake_quant_max_pool2d",
                                               "conv2d_lsq_input",
                                               "channel_scale",
                                               "channel_add",
                                               "bn_scale_factor",
                                               "bn_relu_max_pool2d",
                                               "conv1_bn_relu_max_pool2d",
                                               "adaround_weight",
                                               "adaround_round_loss",
                                               "squared_error",
                                               "qdrop",
                                               "dropout",
                                               "activation",
                                               "mul",
                                               "concat",
                                               "channels",
                                               "layer_norm",
                                               "attention"};
_Static_assert(sizeof profile_op_names / sizeof profile_op_names[0] == QT_PROFILE_OP_COUNT, "profile op names");
static const char *const profile_phase_names[] = {"data", "zero_grad", "optimizer", "observer", "grad_sum", "step"};
_Static_assert(sizeof profile_phase_names / sizeof profile_phase_names[0] == QT_PROFILE_PHASE_COUNT,
               "profile phase names");

const char *qt_profile_op_name(qt_profile_op op) {
  return (unsigned)op < QT_PROFILE_OP_COUNT ? profile_op_names[op] : "?";
}
const char *qt_profile_phase_name(qt_profile_phase ph) {
  return (unsigned)ph < QT_PROFILE_PHASE_COUNT ? profile_phase_names[ph] : "?";
}

void qt_profile_clear(qt_profile *p) { memset(p, 0, sizeof *p); }

void qt_profile_add_phase(qt_profile *p, qt_profile_phase ph, double seconds) {
  if (!p) return;
  QT_ASSERT((unsigned)ph < QT_PROFILE_PHASE_COUNT, "bad profile phase %d", (int)ph);
  p->phase[ph].seconds += seconds;
  p->phase[ph].calls++;
}

void qt_ctx_set_profile(qt_ctx *ctx, qt_profile *p) { ctx->profile = p; }
qt_profile *qt_ctx_profile(const qt_ctx *ctx) { return ctx->profile; }

double qt_profile_begin(qt_ctx *ctx, qt_profile_op op) {
  QT_ASSERT((unsigned)op < QT_PROFILE_OP_COUNT, "bad profile op %d", (int)op);
  QT_ASSERT(!ctx->profile->active,
            "profiling: op %s started inside another timed op or tape entry (its time would "
            "be counted twice)",
            profile_op_names[op]);
  ctx->profile->active = 1;
  return qt_now_seconds();
}

void qt_profile_end(qt_ctx *ctx, qt_profile_op op, double t0) {
  qt_profile *p = ctx->profile;
  p->forward[op].seconds += qt_now_seconds() - t0;
  p->forward[op].calls++;
  p->active = 0;
}
