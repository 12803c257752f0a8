/* qat_train config.ini [section.key=value ...]: parse, run the training job, map the status
 * to the exit code (0 done, 1 the job failed, 2 bad command line, configuration or a
 * combination of settings the run cannot do). */
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--keys") == 0) {
    list_keys();
    return 0;
  }
  static qt_options o;
  qt_status st = {0};
  if (qt_options_load(argv[1], argv + 2, argc - 2, &o, st.msg)) {
    fprintf(stderr, "qat_train: %s\n", st.msg);
    return 2;
  }
  if (qt_train_run(&o, &st)) fprintf(stderr, "qat_train: %s\n", st.msg);
  return qt_status_exit_code(st.code);
}
