/* qat_train config.ini [section.key=value ...]: parse, run the training job, map the status
 * to the exit code (0 done, 1 the job failed, 2 bad command line, configuration or a
 * combination of settings the run cannot do). Under mpirun each process runs this (dist.h):
 * a process that fails ends the whole job with its message, its rank and its exit code. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"
#include "train/pipeline.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: qat_train CONFIG.ini [section.key=value ...]\n"
          "       qat_train --keys        list every configuration key with its default\n"
          "Trains the model CONFIG describes; overrides after the path replace its values,\n"
          "e.g. qat_train experiments/fashion_cnn_fp32.ini train.epochs=1 output.dir=/tmp/run\n");
}

static void list_keys(void) {
  int n;
  const qt_cfg_key *k = qt_train_schema(&n);
  const char *section = "";
  for (int i = 0; i < n; i++) {
    if (strcmp(section, k[i].section) != 0) printf("%s[%s]\n", i ? "\n" : "", section = k[i].section);
    printf("%-18s = %-28s ; %s%s%s%s\n", k[i].key, k[i].default_value, k[i].help, k[i].choices ? " (" : "",
           k[i].choices ? k[i].choices : "", k[i].choices ? ")" : "");
  }
}

/* The job's end for this process: alone, print and return the exit status; with other processes,
 * a failure ends them all (they may be waiting for this one in a collective). */
static int finish(int code, const char *msg) {
  if (code && qt_dist_size() > 1) {
    /* A failure every process meets (a bad config, missing data) is reported once, by process 0,
     * whose abort ends the others during this pause; one process's own failure a second later. */
    if (qt_dist_rank() > 0) sleep(1);
    qt_dist_abort(code, "qat_train: process %d of %d: %s", qt_dist_rank(), qt_dist_size(), msg ? msg : "usage");
  }
  if (code && msg) fprintf(stderr, "qat_train: %s\n", msg);
  qt_dist_finalize();
  return code;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  char err[QT_ERR_LEN];
  if (qt_dist_init(&argc, &argv, err)) {
    fprintf(stderr, "qat_train: %s\n", err);
    return 2;
  }
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return finish(argc < 2 ? 2 : 0, NULL);
  }
  if (strcmp(argv[1], "--keys") == 0) {
    list_keys();
    return finish(0, NULL);
  }
  static qt_options o;
  qt_status st = {0};
  if (qt_options_load(argv[1], argv + 2, argc - 2, &o, st.msg)) return finish(2, st.msg);
  qt_train_run(&o, &st);
  return finish(qt_status_exit_code(st.code), st.msg);
}
