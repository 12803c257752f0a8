/* Replay mode of a fuzz target (the normal build's fuzz_replay_<target> tests): runs every file
 * named on the command line, and every file of every folder named (sorted, names starting with
 * '.' skipped), through the target's LLVMFuzzerTestOneInput, as libFuzzer would run one input.
 * A crash, a sanitizer report or a broken contract (abort) fails the test, and so does an input
 * that takes more than QT_FUZZ_CPU_SECONDS (default 3) of CPU time: what libFuzzer reports as a
 * timeout (CPU rather than wall time, so a busy machine does not fail it; the seeds take
 * milliseconds). The failing input is named. Quiet on success unless QT_FUZZ_VERBOSE is set. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "fuzz/fuzz_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define QT_REPLAY_ASAN 1
#include <sanitizer/common_interface_defs.h>
#endif

static const char *current = "";

/* Names the input that crashed (async-signal-safe), then dies of the same signal. */
static void on_signal(int sig) {
  static const char msg[] = "\nfuzz replay: crashed on input ";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  ignored = write(2, current, strlen(current));
  ignored = write(2, "\n", 1);
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}

#ifdef QT_REPLAY_ASAN
/* A sanitizer report ends the process without a signal: name the input after it. */
static void on_death(void) { fprintf(stderr, "\nfuzz replay: failed on input %s\n", current); }
#endif

/* SIGPROF: the input used up its CPU time. */
static void on_cpu_limit(int sig) {
  (void)sig;
  static const char msg[] = "\nfuzz replay: CPU time limit (QT_FUZZ_CPU_SECONDS) exceeded: a hang on input ";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  ignored = write(2, current, strlen(current));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(1);
}

static double cpu_seconds = 3;

static void set_cpu_limit(double seconds) {
  struct itimerval t = {{0, 0}, {(time_t)seconds, (suseconds_t)((seconds - (double)(time_t)seconds) * 1e6)}};
  setitimer(ITIMER_PROF, &t, NULL);
}

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz replay: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      uint8_t *bigger = realloc(buf, cap *= 2);
      if (!bigger) free(buf);
      buf = bigger;
    }
  }
  const int bad = ferror(f) || !buf;
  fclose(f);
  if (bad) {
    fprintf(stderr, "fuzz replay: cannot read %s\n", path);
    free(buf);
    return -1;
  }
  current = path;
  if (getenv("QT_FUZZ_VERBOSE")) fprintf(stderr, "fuzz replay: %s (%zu bytes)\n", path, n);
  /* libFuzzer hands the target a buffer of exactly n bytes; so does this copy. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  set_cpu_limit(cpu_seconds);
  LLVMFuzzerTestOneInput(exact, n);
  set_cpu_limit(0);
  free(exact);
  current = "";
  return 0;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Runs one file, or every regular file of a folder in name order. Adds the inputs run to *count. */
static int run_path(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    (*count)++;
    return run_file(path);
  }
  DIR *d = opendir(path);
  if (!d) {
    fprintf(stderr, "fuzz replay: cannot open folder %s: %s\n", path, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      char **bigger = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
      if (!bigger)
        rc = -1;
      else
        names = bigger;
    }
    if (rc == 0) {
      size_t len = strlen(path) + strlen(e->d_name) + 2;
      names[n] = malloc(len);
      if (!names[n])
        rc = -1;
      else
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, compare_names);
  for (size_t i = 0; i < n; i++) {
    if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
      (*count)++;
      rc = run_file(names[i]);
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|FOLDER...\n  runs each input through the fuzz target once\n", argv[0]);
    return 2;
  }
#ifdef QT_REPLAY_ASAN
  __sanitizer_set_death_callback(on_death);
  signal(SIGABRT, on_signal); /* the sanitizers keep their own SEGV handlers */
#else
  signal(SIGSEGV, on_signal);
  signal(SIGABRT, on_signal);
  signal(SIGBUS, on_signal);
  signal(SIGFPE, on_signal);
#endif
  signal(SIGPROF, on_cpu_limit);
  if (getenv("QT_FUZZ_CPU_SECONDS")) cpu_seconds = atof(getenv("QT_FUZZ_CPU_SECONDS"));
  if (!(cpu_seconds > 0)) cpu_seconds = 3;
  LLVMFuzzerInitialize(&argc, &argv);
  int count = 0;
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i], &count) != 0) return 1;
  if (getenv("QT_FUZZ_VERBOSE")) fprintf(stderr, "fuzz replay: %d inputs ran\n", count);
  return 0;
}
