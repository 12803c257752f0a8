/* The device against the Q/DQ graph (report.h): the one pass rule, the run that measures it on
 * a test set, and the writer of what the device computes (logits and any intermediate value). */
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/exact.h"
#include "eval/report.h"

/* The LSB ratio is computed in float: an exact 1-LSB difference may read 1.00003. */
#define LSB_SLACK 1e-4

float qt_output_lsb(const qt_graph *qdq) {
  const qt_node *n = &qdq->nodes[qdq->values[qdq->output].producer];
  return n->op == QT_OP_DEQUANTIZE && n->q->channels == 1 ? n->q->scale[0] : 0.0f;
}

void qt_device_agreement_init(qt_device_agreement *a, float output_scale) {
  memset(a, 0, sizeof *a);
  a->output_scale = output_scale;
}

void qt_device_agreement_add(qt_device_agreement *a, const float *device, const float *qdq, const int32_t *labels,
                             int n, int64_t classes) {
  for (int i = 0; i < n; i++) {
    const float *o = device + (int64_t)i * classes, *r = qdq + (int64_t)i * classes;
    const int64_t p = qt_argmax(o, classes), pr = qt_argmax(r, classes);
    if (labels) {
      a->device_correct += p == labels[i];
      a->qdq_correct += pr == labels[i];
    }
    a->agree += p == pr;
    for (int64_t k = 0; k < classes; k++) {
      const double d = fabs((double)o[k] - (double)r[k]);
      a->differ += d > 0;
      if (d > a->max_abs_diff || d != d) a->max_abs_diff = d;
      if (a->output_scale > 0) {
        const double lsb = d / a->output_scale;
        if (lsb > a->max_lsb || lsb != lsb) a->max_lsb = lsb;
        a->over_max_lsb += !(lsb <= QT_AGREEMENT_MAX_LSB + LSB_SLACK);
      }
    }
  }
  a->images += n;
  a->outputs += (int64_t)n * classes;
}

double qt_device_agreement_top1(const qt_device_agreement *a) {
  return a->images ? (double)a->agree / (double)a->images : 1.0;
}

int qt_device_agreement_pass(const qt_device_agreement *a) {
  return a->over_max_lsb == 0 && qt_device_agreement_top1(a) >= QT_AGREEMENT_MIN_TOP1;
}

const char *qt_device_agreement_rule(void) {
  return "within 1 output LSB of the Q/DQ graph, with identical top-1 on >= 99.9% of images (an fp32 output: "
         "identical top-1 alone)";
}

/* The test set's loader, in order and without augmentation, after checking the image shape. */
static qt_loader *test_loader(const qt_device *dev, const qt_dataset *ds, const qt_loader_config *lc, char *err) {
  int h, w, c;
  qt_device_input_shape(dev, &h, &w, &c);
  if (ds->h != h || ds->w != w || ds->c != c) {
    qt_err(err, "model %s wants %dx%dx%d images, the test set holds %dx%dx%d", qt_device_graph(dev)->name, h, w, c,
           ds->h, ds->w, ds->c);
    return NULL;
  }
  if (qt_graph_check_memory(qt_device_graph(dev), lc->batch_size, err)) return NULL;
  qt_loader_config cfg = *lc;
  cfg.shuffle = 0;
  cfg.crop_pad = 0;
  cfg.flip = 0;
  return qt_loader_create(ds, &cfg, err);
}

int qt_device_compare(qt_device *dev, qt_graph *qdq, const qt_dataset *ds, const qt_loader_config *lc,
                      qt_device_agreement *a, char *err) {
  qt_device_agreement_init(a, qdq ? qt_output_lsb(qdq) : 0.0f);
  qt_loader *l = test_loader(dev, ds, lc, err);
  if (!l) return -1;
  const int64_t classes = qt_device_output_numel(dev);
  float *out = malloc((size_t)lc->batch_size * (size_t)classes * sizeof(float));
  QT_ASSERT(out, "out of memory for a batch of %d outputs", lc->batch_size);
  qt_exact *exact = NULL;
  float *ref = NULL;
  if (qdq) {
    if (!(exact = qt_exact_open(qdq, err))) {
      free(out);
      qt_loader_free(l);
      return -1;
    }
    ref = malloc((size_t)lc->batch_size * (size_t)classes * sizeof(float));
    QT_ASSERT(ref, "out of memory for a batch of %d outputs", lc->batch_size);
  }
  int rc = -1, n;
  const float *x;
  const int32_t *labels;
  /* Warm-up: primitives for the batch size are created on first use, not timed. */
  qt_loader_start_epoch(l, 0);
  if ((n = qt_loader_next(l, &x, &labels)) > 0 && qt_device_run(dev, out, x, n, err)) goto done;
  qt_loader_start_epoch(l, 0);
  while ((n = qt_loader_next(l, &x, &labels)) > 0) {
    const double t0 = qt_now_seconds();
    if (qt_device_run(dev, out, x, n, err)) goto done;
    a->device_seconds += qt_now_seconds() - t0;
    if (!qdq) {
      for (int i = 0; i < n; i++) a->device_correct += qt_argmax(out + (int64_t)i * classes, classes) == labels[i];
      a->images += n;
      a->outputs += (int64_t)n * classes;
      continue;
    }
    if (qt_exact_run(exact, ref, x, n, err)) goto done;
    qt_device_agreement_add(a, out, ref, labels, n, classes);
  }
  if (a->images == 0) {
    qt_err(err, "the test set is empty");
    goto done;
  }
  rc = 0;
done:
  qt_exact_free(exact);
  free(ref);
  free(out);
  qt_loader_free(l);
  return rc;
}

/* ---- writing what the device computes ----------------------------------------------------------- */

/* A dataset (N, shape) of type `type` in file f, written batch by batch. */
static hid_t create_dataset(hid_t f, const char *name, hid_t type, int64_t N, const qt_value *v) {
  hsize_t dims[1 + QT_MAX_DIMS];
  int nd = 1;
  dims[0] = (hsize_t)N;
  for (int d = 0; v && d < v->ndim; d++) dims[nd++] = (hsize_t)v->shape[d];
  hid_t space = H5Screate_simple(nd, dims, NULL);
  hid_t ds = space < 0 ? -1 : H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (space >= 0) H5Sclose(space);
  return ds;
}

/* Writes n rows at row `at` of dataset ds. */
static int write_rows(hid_t ds, hid_t type, int64_t at, int n, const void *data) {
  hid_t space = H5Dget_space(ds);
  if (space < 0) return -1;
  hsize_t dims[1 + QT_MAX_DIMS], start[1 + QT_MAX_DIMS] = {0}, count[1 + QT_MAX_DIMS];
  const int nd = H5Sget_simple_extent_dims(space, dims, NULL);
  for (int d = 0; d < nd; d++) count[d] = dims[d];
  start[0] = (hsize_t)at;
  count[0] = (hsize_t)n;
  hid_t mem = H5Screate_simple(nd, count, NULL);
  int rc = H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
                   H5Dwrite(ds, type, mem, space, H5P_DEFAULT, data) < 0
               ? -1
               : 0;
  H5Sclose(mem);
  H5Sclose(space);
  return rc;
}

/* The value of that name (a value, else a node's output); it exists (checked before). */
static const qt_value *named_value(const qt_graph *g, const char *name) {
  for (int v = 0; v < g->n_values; v++)
    if (strcmp(g->values[v].name, name) == 0) return &g->values[v];
  return &g->values[g->nodes[qt_graph_find_node(g, name)].output];
}

/* Writes the reference's logits and values, batch by batch: one run of the exact reference per
 * batch gives every value. */
static int write_reference_rows(const qt_graph *g, qt_loader *l, const qt_loader_config *lc, const char *const *values,
                                int n_values, hid_t lab, const hid_t *d, char *err) {
  qt_exact *x = qt_exact_open(g, err);
  if (!x) return -1;
  int *idx = malloc((size_t)(n_values + 1) * sizeof *idx);
  float **dst = calloc((size_t)n_values + 1, sizeof *dst);
  float *out = malloc((size_t)lc->batch_size * (size_t)qt_value_numel(&g->values[g->output]) * sizeof(float));
  QT_ASSERT(idx && dst && out, "out of memory");
  for (int k = 0; k < n_values; k++) {
    const qt_value *v = named_value(g, values[k]);
    idx[k] = (int)(v - g->values);
    dst[k] = malloc((size_t)lc->batch_size * (size_t)qt_value_numel(v) * sizeof(float));
    QT_ASSERT(dst[k], "out of memory for a batch of %s", values[k]);
  }
  int rc = 0, n;
  int64_t at = 0;
  const float *xb;
  const int32_t *labels;
  qt_loader_start_epoch(l, 0);
  while (!rc && (n = qt_loader_next(l, &xb, &labels)) > 0) {
    if (qt_exact_run_values(x, out, xb, n, idx, dst, n_values, err) ||
        write_rows(lab, H5T_NATIVE_INT32, at, n, labels) || write_rows(d[0], H5T_NATIVE_FLOAT, at, n, out))
      rc = -1;
    for (int k = 0; k < n_values && !rc; k++) rc = write_rows(d[k + 1], H5T_NATIVE_FLOAT, at, n, dst[k]);
    at += n;
  }
  for (int k = 0; k < n_values; k++) free(dst[k]);
  QT_FREE_ALL(dst, idx, out);
  qt_exact_free(x);
  return rc;
}

/* The device's logits and values: one value at a time over the whole set (the device deploys
 * each intermediate value once). */
static int write_device_rows(qt_device *dev, qt_loader *l, const qt_loader_config *lc, const char *const *values,
                             int n_values, hid_t lab, const hid_t *d, char *err) {
  const qt_graph *g = qt_device_graph(dev);
  int rc = 0, n;
  const float *x;
  const int32_t *labels;
  for (int k = -1; k < n_values && !rc; k++) {
    const char *name = k < 0 ? "logits" : values[k];
    const qt_value *v = k < 0 ? &g->values[g->output] : named_value(g, name);
    float *out = malloc((size_t)lc->batch_size * (size_t)qt_value_numel(v) * sizeof(float));
    QT_ASSERT(out, "out of memory for a batch of %s", name);
    int64_t at = 0;
    qt_loader_start_epoch(l, 0);
    while (!rc && (n = qt_loader_next(l, &x, &labels)) > 0) {
      if ((k < 0 ? qt_device_run(dev, out, x, n, err) : qt_device_read_value(dev, name, out, x, n, err)) ||
          (k < 0 && write_rows(lab, H5T_NATIVE_INT32, at, n, labels)) ||
          write_rows(d[k + 1], H5T_NATIVE_FLOAT, at, n, out))
        rc = -1;
      at += n;
    }
    free(out);
  }
  return rc;
}

int qt_device_write_outputs(qt_device *dev, int reference, const qt_dataset *ds, const qt_loader_config *lc,
                            const char *const *values, int n_values, const char *path, char *err) {
  const qt_graph *g = qt_device_graph(dev);
  for (int k = 0; k < n_values; k++) {
    if (qt_device_value_numel(dev, values[k]) < 0)
      return qt_err(err, "--values: graph %s has no value or node named '%s'", g->name, values[k]);
    if (strcmp(values[k], "logits") == 0 || strcmp(values[k], "labels") == 0 || strchr(values[k], '/'))
      return qt_err(err, "--values: '%s' cannot name a dataset (reserved, or holds '/')", values[k]);
  }
  qt_loader *l = test_loader(dev, ds, lc, err);
  if (!l) return -1;
  char tmp[4200];
  if (qt_mkdir_parent(path, err)) {
    qt_loader_free(l);
    return -1;
  }
  const int fd = qt_temp_create(path, tmp, sizeof tmp, err); /* a fresh file of ours, no planted link */
  if (fd < 0) {
    qt_loader_free(l);
    return -1;
  }
  close(fd);
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) {
    qt_loader_free(l);
    return qt_err(err, "cannot create '%s'", tmp);
  }
  err[0] = 0;
  int rc = -1, made = 0;
  hid_t *d = malloc((size_t)(n_values + 1) * sizeof *d);
  QT_ASSERT(d, "out of memory");
  hid_t lab = create_dataset(f, "labels", H5T_NATIVE_INT32, ds->n, NULL);
  for (; lab >= 0 && made <= n_values; made++) {
    const qt_value *v = made == 0 ? &g->values[g->output] : named_value(g, values[made - 1]);
    if ((d[made] = create_dataset(f, made == 0 ? "logits" : values[made - 1], H5T_NATIVE_FLOAT, ds->n, v)) < 0) break;
  }
  if (lab >= 0 && made == n_values + 1)
    rc = reference ? write_reference_rows(g, l, lc, values, n_values, lab, d, err)
                   : write_device_rows(dev, l, lc, values, n_values, lab, d, err);
  for (int k = 0; k < made; k++) H5Dclose(d[k]);
  free(d);
  if (lab >= 0) H5Dclose(lab);
  if (H5Fclose(f) < 0 && !rc) rc = -1;
  qt_loader_free(l);
  if (!rc) return qt_file_commit(tmp, path, err);
  if (!err[0]) qt_err(err, "cannot write '%s'", tmp);
  remove(tmp);
  return -1;
}

int qt_device_agreement_print(const qt_device_agreement *a, const char *prefix, FILE *f) {
  const double n = a->images > 0 ? (double)a->images : 1.0;
  fprintf(f, "%s: %lld test images: device top-1 %.2f%%, Q/DQ reference top-1 %.2f%%; outputs: ", prefix,
          (long long)a->images, 100.0 * (double)a->device_correct / n, 100.0 * (double)a->qdq_correct / n);
  if (a->output_scale > 0)
    fprintf(f, "max difference %.3g LSB, %lld of %lld logits differ, %lld logits over 1 LSB", a->max_lsb,
            (long long)a->differ, (long long)a->outputs, (long long)a->over_max_lsb);
  else
    fprintf(f, "max difference %.3g (absolute; fp32 output (no output LSB)), %lld of %lld logits differ",
            a->max_abs_diff, (long long)a->differ, (long long)a->outputs);
  fprintf(f, "; identical top-1 on %.3f%%\n", 100.0 * qt_device_agreement_top1(a));
  const int pass = qt_device_agreement_pass(a);
  if (!pass) fprintf(f, "%s: FAIL: the device must stay %s\n", prefix, qt_device_agreement_rule());
  return pass;
}
