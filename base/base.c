/* The base library: panic, errors and status, string builder, files, time (base.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static qt_panic_hook panic_hook;

qt_panic_hook qt_panic_set_hook(qt_panic_hook hook) {
  qt_panic_hook old = panic_hook;
  panic_hook = hook;
  return old;
}

void qt_panic(const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  QT_VFORMAT(msg, fmt);
  fprintf(stderr, "%s:%d: internal error: %s\n", file, line, msg);
  fflush(stderr);
  if (panic_hook) panic_hook(msg);
  abort();
}

void *qt_grow(void *p, int *cap, int need, size_t elsize, const char *what) {
  if (need <= *cap) return p;
  int c = *cap ? *cap * 2 : 16;
  while (c < need) c *= 2;
  p = realloc(p, (size_t)c * elsize);
  QT_ASSERT(p, "out of memory growing %s", what);
  *cap = c;
  return p;
}

void qt_free_all(void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++) free(p[i]);
}

int qt_err(char *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, QT_ERR_LEN, fmt, ap);
    va_end(ap);
  }
  return -1;
}

int qt_status_set(qt_status *st, qt_status_code code, const char *fmt, ...) {
  QT_ASSERT(code != QT_OK && code < QT_STATUS_COUNT, "qt_status_set with code %d", (int)code);
  st->code = code;
  QT_VFORMAT(st->msg, fmt);
  return -1;
}

int qt_status_fail(qt_status *st, qt_status_code code) {
  QT_ASSERT(code != QT_OK && code < QT_STATUS_COUNT, "qt_status_fail with code %d", (int)code);
  st->code = code;
  if (!st->msg[0]) snprintf(st->msg, sizeof st->msg, "%s error", qt_status_name(code));
  return -1;
}

int qt_status_exit_code(qt_status_code code) { return code == QT_OK ? 0 : code == QT_STATUS_INPUT ? 2 : 1; }

const char *qt_status_name(qt_status_code code) {
  static const char *const names[] = {"ok", "input", "I/O", "format", "runtime", "out of memory"};
  _Static_assert(sizeof names / sizeof names[0] == QT_STATUS_COUNT, "a status code without a name");
  return (unsigned)code < QT_STATUS_COUNT ? names[code] : "?";
}

void qt_strbuf_printf(qt_strbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    const size_t room = b->cap - b->len;
    va_start(ap, fmt);
    const int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    QT_ASSERT(n >= 0, "formatting failed");
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap - b->len <= (size_t)n) cap *= 2;
    b->s = realloc(b->s, cap);
    QT_ASSERT(b->s, "out of memory");
    b->cap = cap;
  }
}

void qt_strbuf_json_string(qt_strbuf *b, const char *s) {
  qt_strbuf_printf(b, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      qt_strbuf_printf(b, "\\%c", *s);
    else if (*s == '\n')
      qt_strbuf_printf(b, "\\n");
    else if ((unsigned char)*s < 0x20)
      qt_strbuf_printf(b, "\\u%04x", (unsigned char)*s);
    else
      qt_strbuf_printf(b, "%c", *s);
  }
  qt_strbuf_printf(b, "\"");
}

double qt_now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int qt_mkdir_p(const char *path, char *err) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return qt_err(err, "cannot create directory '%.200s...': path too long", path);
  for (char *p = buf + 1;; p++) {
    const char c = *p;
    if (c == '/' || c == 0) {
      *p = 0;
      if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return qt_err(err, "cannot create directory '%s': %s", buf, strerror(errno));
      *p = c;
      if (!c) break;
    }
  }
  return 0;
}

int qt_mkdir_parent(const char *path, char *err) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = 0;
  return qt_mkdir_p(dir, err);
}

int qt_fsync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int r = fsync(fd);
  close(fd);
  return r;
}

/* The directory of path ("." without a '/'), for the fsync that makes a rename durable. */
static void parent_dir(const char *path, char *dir, size_t n) {
  snprintf(dir, n, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, n, ".");
  else if (slash == dir)
    dir[1] = 0;
  else
    *slash = 0;
}

int qt_file_commit(const char *tmp, const char *path, char *err) {
  /* rename() replaces whatever the path names: a symlink such as /dev/stdout, or a device, would
   * be replaced by a regular file. Only regular files (or nothing) are replaced. */
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    unlink(tmp);
    return qt_err(err, "cannot write '%s': it exists and is not a regular file (%s); only files are replaced", path,
                  S_ISLNK(st.st_mode)   ? "a symbolic link"
                  : S_ISDIR(st.st_mode) ? "a directory"
                                        : "a device or pipe");
  }
  if (qt_fsync_path(tmp) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return qt_err(err, "cannot write '%s': %s", path, strerror(e));
  }
  char dir[4096];
  parent_dir(path, dir, sizeof dir);
  qt_fsync_path(dir); /* best effort: some file systems refuse fsync on directories */
  return 0;
}

int qt_temp_create(const char *path, char *tmp, size_t n, char *err) {
  if (snprintf(tmp, n, "%s.tmp.XXXXXX", path) >= (int)n) return qt_err(err, "cannot write '%s': path too long", path);
  /* mkstemp: a new file under a name no one can predict, O_CREAT | O_EXCL (never through a
   * link another user planted); 0644 as fopen's files are under the usual umask */
  const int fd = mkstemp(tmp);
  if (fd < 0)
    return qt_err(err, "cannot write '%s': cannot create a temporary file beside it: %s", path, strerror(errno));
  if (fchmod(fd, 0644) != 0) {
    const int e = errno;
    close(fd);
    unlink(tmp);
    return qt_err(err, "cannot write '%s': %s", path, strerror(e));
  }
  return fd;
}

int qt_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int qt_file_in_dir(const char *file, const char *dir) {
  char a[PATH_MAX], b[PATH_MAX], parent[4096];
  snprintf(parent, sizeof parent, "%s", file);
  char *slash = strrchr(parent, '/');
  if (slash == parent)
    parent[1] = 0;
  else if (slash)
    *slash = 0;
  else
    snprintf(parent, sizeof parent, ".");
  if (realpath(parent, a) && realpath(dir, b)) return strcmp(a, b) == 0;
  return strcmp(parent, dir) == 0;
}

int qt_dir_trusted(const char *dir, char *err) {
  struct stat st;
  if (stat(dir, &st) != 0) return qt_err(err, "cannot use directory '%s': %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return qt_err(err, "'%s' is not a directory", dir);
  if (st.st_uid != geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)))
    return qt_err(err,
                  "will not write into '%s': it belongs to another user (uid %ld) and others can write to it (mode "
                  "%03o), so they could replace what this run writes; use a directory of your own",
                  dir, (long)st.st_uid, (unsigned)(st.st_mode & 0777));
  return 0;
}

int qt_write_file_atomic(const char *path, const char *text, size_t len, char *err) {
  char tmp[4200];
  const int fd = qt_temp_create(path, tmp, sizeof tmp, err);
  if (fd < 0) return -1;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    close(fd);
    unlink(tmp);
    return qt_err(err, "cannot write '%s': %s", path, strerror(e));
  }
  size_t w = fwrite(text, 1, len, f);
  int bad = w != len || fflush(f) != 0;
  bad |= fclose(f) != 0;
  if (bad) {
    int e = errno;
    unlink(tmp);
    return qt_err(err, "cannot write '%s': %s", path, strerror(e));
  }
  return qt_file_commit(tmp, path, err);
}

void qt_fault_point(const char *name) {
  static int calls;
  const char *f = getenv("QT_FAULT");
  const size_t n = strlen(name);
  if (!f || strncmp(f, name, n) != 0 || (f[n] != 0 && f[n] != ':')) return;
  const int k = f[n] == ':' ? atoi(f + n + 1) : 1;
  if (++calls >= k) {
    fprintf(stderr, "QT_FAULT=%s: killing the process at fault point '%s'\n", f, name);
    raise(SIGKILL);
  }
}

void qt_memory_policy_init(void) { mallopt(M_MMAP_THRESHOLD, 128 * 1024); }

/* VmHWM of /proc/self/status: this process image's own peak (Linux keeps ru_maxrss across
 * execve, so getrusage would report a large parent's peak for a child it started); getrusage
 * where /proc is not there. */
double qt_peak_rss_mb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f) {
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    if (kb >= 0) return (double)kb / 1024.0;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

int qt_name_index(const char *const *names, int n, const char *name) {
  for (int k = 0; name && k < n; k++)
    if (strcmp(name, names[k]) == 0) return k;
  return -1;
}

int64_t qt_argmax(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}
