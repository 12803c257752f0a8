/* The schema shared by the config tests: one row of each type, bounded, one-sided and
 * unbounded ranges, keys with the same name in two sections. */
#ifndef QT_TEST_CONFIG_SCHEMA_H
#define QT_TEST_CONFIG_SCHEMA_H

#include "config/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const qt_cfg_key test_schema[] = {
    {"train", "epochs", QT_CFG_INT, "4", 1, 100000, NULL, "Passes over the training set."},
    {"train", "batch_size", QT_CFG_INT, "128", 1, 65536, NULL, "Images per batch."},
    {"train", "seed", QT_CFG_INT, "0", 0, 0, NULL, "Random seed (any integer)."},
    {"train", "max_images", QT_CFG_INT, "10000000000", 0, INFINITY, NULL, "Stop after this many images."},
    {"train", "augment", QT_CFG_BOOL, "false", 0, 0, NULL, "Random crops and flips."},
    {"train", "checkpoint", QT_CFG_STRING, "", 0, 0, NULL,
     "Where to write checkpoints; empty for none. This help text is deliberately long so that the written "
     "configuration has to wrap it over several comment lines, which must still load."},
    {"optim", "kind", QT_CFG_ENUM, "sgd", 0, 0, "sgd|adamw", "Optimizer."},
    {"optim", "lr", QT_CFG_FLOAT, "0.05", 0, 10, NULL, "Base learning rate."},
    {"optim", "momentum", QT_CFG_FLOAT, "0.9", 0, 1, NULL, "SGD momentum."},
    {"optim", "weight_decay", QT_CFG_FLOAT, "5e-4", 0, INFINITY, NULL, "Weight decay."},
    {"optim", "shift", QT_CFG_FLOAT, "-0.25", -INFINITY, 0, NULL, "A parameter that must be <= 0."},
    {"schedule", "kind", QT_CFG_ENUM, "cosine", 0, 0, "constant|step|cosine|linear", "LR schedule."},
    {"schedule", "warmup_steps", QT_CFG_INT, "0", 0, INFINITY, NULL, "Linear warmup steps."},
    {"data", "path", QT_CFG_STRING, "/usr/share/fashion-mnist", 0, 0, NULL, NULL},
};
#define TEST_SCHEMA_N ((int)(sizeof test_schema / sizeof test_schema[0]))

/* Writes text to path (in the test's working directory); aborts the test if it cannot. */
static inline void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
    fprintf(stderr, "test: cannot write %s\n", path);
    exit(1);
  }
}

#endif
