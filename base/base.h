/* The base library, linked by every other library: the abort path for broken invariants (with a
 * hook), the status type that carries a bad-input or environment failure with its message and
 * maps it to an exit code, the error buffer length, a growable string with a JSON escaper,
 * a monotonic clock, `mkdir -p`, atomic file writes with fsync, argmax and peak RSS.
 *
 * Two kinds of failure (STYLE.md): a broken invariant aborts through qt_panic with file:line;
 * bad input or environment returns -1 with a message (QT_ERR_LEN bytes) naming what and where.
 * Library functions take `char *err`; the stage functions and the programs carry a qt_status,
 * whose code says which kind of failure it was (and so the exit status). */
#ifndef QT_BASE_H
#define QT_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Every error buffer in the project holds QT_ERR_LEN bytes. */
#define QT_ERR_LEN 512

/* ---- invariant checks (always on) ------------------------------------------------------------ */
/* Prints "file:line: internal error: <message>" to stderr, calls the hook (if set) with the
 * message, then aborts. */
void qt_panic(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
#define QT_ASSERT(cond, ...)                                \
  do {                                                      \
    if (!(cond)) qt_panic(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
/* Called by qt_panic before abort() with the whole message (e.g. to flush a log, or, in a test,
 * to longjmp out and check that an invariant fired). Returns the previous hook. */
typedef void (*qt_panic_hook)(const char *message);
qt_panic_hook qt_panic_set_hook(qt_panic_hook hook);

/* ---- random numbers ---------------------------------------------------------------------------- */
/* splitmix64's output of state z (z advanced by the golden-ratio increment, then mixed): the
 * counter-based generator behind every random draw of a run (the loader's order and augmentation,
 * dropout's masks, QDrop's choices), each a function of a key and a counter alone. */
static inline uint64_t qt_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---- errors ----------------------------------------------------------------------------------- */
/* The one error formatter: writes the message to err (QT_ERR_LEN bytes; may be NULL) and returns
 * -1, so that `return qt_err(err, "...", ...);` reports and fails in one statement. */
int qt_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Formats the variadic arguments of the enclosing function, whose last named parameter is fmt,
 * into buf: a char array (not a pointer), whose size bounds the text. For message helpers. */
#define QT_VFORMAT(buf, fmt)                  \
  do {                                        \
    va_list qt_ap_;                           \
    va_start(qt_ap_, fmt);                    \
    vsnprintf(buf, sizeof(buf), fmt, qt_ap_); \
    va_end(qt_ap_);                           \
  } while (0)

/* Frees each of the n pointers (NULL ones do nothing). QT_FREE_ALL(x->a, x->b, ...) frees a list. */
void qt_free_all(void *const *p, size_t n);
#define QT_FREE_ALL(...) \
  qt_free_all((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

/* A growing array: p (NULL or from realloc) with room for *cap elements of elsize bytes, enlarged
 * (doubling, at least 16) to hold `need`; returns the (possibly moved) array. Out of memory is
 * fatal, naming `what`. */
void *qt_grow(void *p, int *cap, int need, size_t elsize, const char *what);

/* What kind of failure a status is (SQLite style). */
typedef enum {
  QT_OK = 0,
  QT_STATUS_INPUT,   /* bad input from the user: config, option, file name, model/data mismatch */
  QT_STATUS_IO,      /* the environment: cannot read or write a file, disk full */
  QT_STATUS_FORMAT,  /* a file exists but is not what it claims (corrupt or foreign) */
  QT_STATUS_RUNTIME, /* the job failed while running: loss diverged, a check disagreed */
  QT_STATUS_NOMEM,   /* out of memory */
  QT_STATUS_COUNT
} qt_status_code;

typedef struct {
  qt_status_code code;
  char msg[QT_ERR_LEN];
} qt_status;

/* Sets code and message; returns -1. */
int qt_status_set(qt_status *st, qt_status_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Gives a message already written into st->msg (by a `char *err` function) its code; returns -1. */
int qt_status_fail(qt_status *st, qt_status_code code);
/* The programs' exit status: 0 for QT_OK, 2 for bad input (QT_STATUS_INPUT), 1 for the rest. */
int qt_status_exit_code(qt_status_code code);
const char *qt_status_name(qt_status_code code);

/* ---- a growable string (reports, JSON, CSV) --------------------------------------------------- */
typedef struct {
  char *s; /* NUL-terminated once anything was printed; free() it */
  size_t len, cap;
} qt_strbuf;
/* Appends printf-style text, growing the buffer (out of memory aborts). */
void qt_strbuf_printf(qt_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a quoted JSON string (", \ and control characters escaped). */
void qt_strbuf_json_string(qt_strbuf *b, const char *s);

/* ---- time, files, memory ---------------------------------------------------------------------- */
/* Seconds on the monotonic clock. */
double qt_now_seconds(void);
/* mkdir -p path. -1 with err ("cannot create directory 'a/b': <reason>") on failure. */
int qt_mkdir_p(const char *path, char *err);
/* mkdir -p of the directory that holds the file path (nothing when path has no '/'). */
int qt_mkdir_parent(const char *path, char *err);
/* fsync of a file or directory by path: 0, or -1 with errno set. */
int qt_fsync_path(const char *path);
/* Makes a fully written temporary file the real one: fsync(tmp), rename(tmp, path), fsync of
 * the directory. On failure tmp is removed, path is untouched and err names path. A path that
 * exists and is not a regular file (a symlink such as /dev/stdout, a directory, a device) is
 * refused, never replaced. */
int qt_file_commit(const char *tmp, const char *path, char *err);
/* Creates a new temporary file beside path, "<path>.tmp.XXXXXX" with a random part, by
 * mkstemp (O_CREAT | O_EXCL: never through a symbolic link or onto a file someone planted),
 * mode 0644; tmp (n bytes) receives its name. Returns the open descriptor, or -1 with err. */
int qt_temp_create(const char *path, char *tmp, size_t n, char *err);
/* Whether paths a and b name the same existing file (device and inode). */
int qt_same_file(const char *a, const char *b);
/* Whether file's folder is dir: the same directory when both exist, else the same text. */
int qt_file_in_dir(const char *file, const char *dir);
/* 0 when dir is a directory this process may trust with its outputs; -1 with err when another
 * user owns it and group or others may write to it (as ssh refuses a key file it cannot trust:
 * they could replace or redirect what is written there). */
int qt_dir_trusted(const char *dir, char *err);
/* Writes `text` to `path` atomically (a qt_temp_create file, fsync, rename). */
int qt_write_file_atomic(const char *path, const char *text, size_t len, char *err);
/* Fault injection for tests of crash safety: when the environment variable QT_FAULT is
 * "<name>" or "<name>:<k>", the k-th (default: first) call of qt_fault_point(name) kills the
 * process with SIGKILL, as a crash, a kill -9 or a power cut at that point would. Without
 * QT_FAULT it does nothing. */
void qt_fault_point(const char *name);
/* Peak resident set size of this process so far, in MB. */
double qt_peak_rss_mb(void);
/* Keeps glibc's mmap threshold at its default, 128 KiB, for the rest of the process: blocks that
 * large are mapped and go back to the system when freed. glibc otherwise raises the threshold to
 * the size of any mapped block that is freed, after which large allocations come from the heap
 * and stay resident once freed (measured: fp32 training's peak RSS 89.5 -> 78.1 MB, the QAT W4A4
 * example's 141.8 -> 134.8 MB, at the same speed). The programs call it first thing. */
void qt_memory_policy_init(void);

/* ---- name tables ------------------------------------------------------------------------------ */
/* The index of `name` in names[0..n), -1 when absent (or name is NULL): parses an enum whose
 * values have a name table. */
int qt_name_index(const char *const *names, int n, const char *name);
/* Defines an enum's name and parse functions over its name table (one name per value, checked
 * at compile time): `const char *name_fn(type v)` ("?" out of range) and
 * `int parse_fn(const char *s, type *out)` (0, or -1 for an unknown name). */
#define QT_DEFINE_NAMES(type, count, name_fn, parse_fn, ...)                                          \
  static const char *const name_fn##_table[] = {__VA_ARGS__};                                         \
  _Static_assert(sizeof name_fn##_table / sizeof name_fn##_table[0] == (count), #type " name table"); \
  const char *name_fn(type v) { return (unsigned)v < (unsigned)(count) ? name_fn##_table[v] : "?"; }  \
  int parse_fn(const char *s, type *out) {                                                            \
    const int k = qt_name_index(name_fn##_table, (count), s);                                         \
    if (k >= 0) *out = (type)k;                                                                       \
    return k < 0 ? -1 : 0;                                                                            \
  }

/* ---- a batch split across processes ----------------------------------------------------------- */
/* Data-parallel training: each process runs the graph on its own slice of a batch, and what
 * computes statistics over the batch (batch norm in training mode, observers) combines every
 * slice's through these collectives, so that each process gets the whole batch's. The functions
 * must be called by every process in the same order and return identical results on all of them
 * (dist/dist.h provides such; autograd's ctx carries them: qt_ctx_set_batch_sync). */
typedef struct qt_batch_sync {
  int size; /* processes sharing the batch; <= 1: none (everything stays local) */
  int rank; /* this process, 0 .. size-1 */
  /* recv (size * n) = every process's send (n), in process order */
  void (*allgather_f64)(const double *send, int64_t n, double *recv);
  /* buf (n) = the elementwise sum over the processes, in a fixed order */
  void (*sum_f64)(double *buf, int64_t n);
} qt_batch_sync;

/* ---- small numerics --------------------------------------------------------------------------- */
/* Index of the largest of x[0..n-1]; the first one on ties (the top-1 tie rule everywhere). */
int64_t qt_argmax(const float *x, int64_t n);

#endif
