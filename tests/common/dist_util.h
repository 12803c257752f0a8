/* The frame of a test run under mpirun (header-only; link qt_dist): join the job and require a
 * process count, and at the end one verdict for every process. */
#ifndef QT_TEST_DIST_UTIL_H
#define QT_TEST_DIST_UTIL_H

#include <stdio.h>

#include "dist/dist.h"
#include "tests/common/testutil.h"

/* Joins the job; 0 when it has 2..max_procs processes (max_procs 0: no upper bound), else 1
 * after a message naming the test (the caller returns it as the exit status). */
static inline int qt_test_dist_begin(int *argc, char ***argv, const char *name, int max_procs) {
  char err[QT_ERR_LEN];
  if (qt_dist_init(argc, argv, err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    return 1;
  }
  const int R = qt_dist_size(), me = qt_dist_rank();
  if (R < 2 || (max_procs > 0 && R > max_procs)) {
    if (max_procs > 0)
      fprintf(stderr, "%s: run it under mpirun with 2 to %d processes (this is %d of %d)\n", name, max_procs, me, R);
    else
      fprintf(stderr, "%s: run it under mpirun with 2 or more processes (this is %d of %d)\n", name, me, R);
    qt_dist_finalize();
    return 1;
  }
  return 0;
}

/* The exit status of every process: nonzero when any process failed a check (the failures are
 * summed over the job), so that all exit alike; leaves the job. */
static inline int qt_test_dist_finish(void) {
  double failures = qt_test_failures();
  qt_dist_sum_f64(&failures, 1);
  const int rc = qt_test_finish() || failures > 0;
  qt_dist_finalize();
  return rc;
}

#endif
