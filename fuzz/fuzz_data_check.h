/* The invariants every dataset loader promises on success (data/data.h), checked by the IDX,
 * HDF5 and image-folder targets. Header only. */
#ifndef QT_FUZZ_DATA_CHECK_H
#define QT_FUZZ_DATA_CHECK_H

#include <string.h>

#include "data/data.h"

/* A loaded dataset is well formed; a failed load left it zeroed with a message. Then frees it
 * after shrinking it with qt_dataset_limit (exercised on every loaded set). */
static inline void qt_fuzz_check_dataset(qt_dataset *ds, int rc, const char *err) {
  if (rc != 0) {
    static const qt_dataset zero;
    QT_ASSERT(rc == -1 && err[0], "failed load: status %d, message '%s'", rc, err);
    QT_ASSERT(memcmp(ds, &zero, sizeof zero) == 0, "a failed load left data in the dataset");
    return;
  }
  QT_ASSERT(ds->n > 0 && ds->h > 0 && ds->w > 0 && ds->c >= 1 && ds->c <= 4, "shape (%lld, %d, %d, %d)",
            (long long)ds->n, ds->h, ds->w, ds->c);
  QT_ASSERT(ds->images && ds->labels && ds->num_classes > 0, "missing buffers or classes");
  for (int64_t i = 0; i < ds->n; i++)
    QT_ASSERT(ds->labels[i] >= 0 && ds->labels[i] < ds->num_classes, "label[%lld] = %d outside [0, %d)", (long long)i,
              ds->labels[i], ds->num_classes);
  /* Touch every pixel: ASan sees a buffer shorter than n*h*w*c. */
  const size_t bytes = (size_t)ds->n * (size_t)ds->h * (size_t)ds->w * (size_t)ds->c;
  volatile unsigned sum = 0;
  for (size_t i = 0; i < bytes; i++) sum += ds->images[i];
  (void)sum;
  qt_dataset_limit(ds, (ds->n + 1) / 2);
  qt_dataset_free(ds);
}

#endif
