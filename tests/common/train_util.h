/* Tests that drive the training pipeline from a config built with overrides: resolve it into
 * options, then call the stage (header-only; link qt_train). */
#ifndef QT_TEST_TRAIN_UTIL_H
#define QT_TEST_TRAIN_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "train/pipeline.h"

/* qt_train_run on the options cfg resolves to; err gets the message. */
static inline int qt_test_train_run(const qt_config *cfg, char *err) {
  qt_options *o = malloc(sizeof *o);
  QT_ASSERT(o, "out of memory");
  qt_status st = {0};
  int rc = qt_options_resolve(cfg, o, err);
  if (!rc && (rc = qt_train_run(o, &st)) != 0) snprintf(err, QT_ERR_LEN, "%s", st.msg);
  free(o);
  return rc;
}

/* qt_stage_prepare on the options cfg resolves to. */
static inline qt_graph *qt_test_prepare(const qt_config *cfg, const qt_graph *g, char *err) {
  qt_options *o = malloc(sizeof *o);
  QT_ASSERT(o, "out of memory");
  qt_status st = {0};
  qt_graph *p = NULL;
  if (!qt_options_resolve(cfg, o, err) && !(p = qt_stage_prepare(o, g, NULL, NULL, &st))) snprintf(err, QT_ERR_LEN, "%s", st.msg);
  free(o);
  return p;
}

#endif
