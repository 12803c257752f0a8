/* Stages before training: the data splits, loader settings, the model, the fp32 starting point. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include "onnx/onnx_import.h"
#include "dist/dist.h"
#include "train/pipeline.h"

static int load_split(const qt_data_options *d, int test, qt_dataset *ds, char *err) {
  switch (d->format) {
    case QT_DATA_IDX:
      return test ? qt_dataset_load_idx(ds, d->test_images, d->test_labels, err)
                  : qt_dataset_load_idx(ds, d->train_images, d->train_labels, err);
    case QT_DATA_HDF5: return qt_dataset_load_hdf5(ds, test ? d->test_path : d->train_path, err);
    default: return qt_dataset_load_folder(ds, test ? d->test_path : d->train_path, d->channels, err);
  }
}

/* data.storage = file: the split's images into a scratch file (qt_dataset_to_file) in
 * data.scratch_dir, or $TMPDIR, or /var/tmp. */
static int store_split(const qt_data_options *d, qt_dataset *ds, char *err) {
  if (d->storage != QT_STORAGE_FILE || ds->n == 0) return 0;
  const char *dir = d->scratch_dir[0] ? d->scratch_dir : getenv("TMPDIR");
  if (!dir || !dir[0]) dir = "/var/tmp";
  struct statfs fs;
  static int warned;
  if (!warned && statfs(dir, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    warned = 1;
    fprintf(stderr,
            "warning: data.storage = file: scratch directory '%s' is a tmpfs, so the images stay in memory (shared "
            "memory, not counted as this process's); set data.scratch_dir to a directory on disk\n",
            dir);
  }
  if (qt_dataset_to_file(ds, dir, err) == 0) return 0;
  size_t n = strlen(err);
  snprintf(err + n, QT_ERR_LEN - n, " (data.storage = file; set data.scratch_dir, or data.storage = memory)");
  return -1;
}

static int load_one(const qt_data_options *d, int test, qt_dataset *ds, char *err) {
  if (load_split(d, test, ds, err)) return -1;
  qt_dataset_limit(ds, test ? d->test_limit : d->train_limit);
  if (store_split(d, ds, err) == 0) return 0;
  qt_dataset_free(ds);
  return -1;
}

int qt_stage_load_data(const qt_data_options *d, qt_split which, qt_dataset *train, qt_dataset *test, qt_status *st) {
  memset(train, 0, sizeof *train);
  memset(test, 0, sizeof *test);
  /* one split at a time, so that only one is ever decoded in memory */
  if (((which & QT_SPLIT_TRAIN) && load_one(d, 0, train, st->msg)) ||
      ((which & QT_SPLIT_TEST) && load_one(d, 1, test, st->msg))) {
    qt_dataset_free(train);
    qt_dataset_free(test);
    return qt_status_fail(st, QT_STATUS_INPUT); /* missing, unreadable or malformed data: bad input */
  }
  if ((which & QT_SPLIT_TEST) && d->format == QT_DATA_FOLDER && d->train_path[0] &&
      qt_dataset_folder_classes_match(d->train_path, test, d->test_path, st->msg)) {
    qt_dataset_free(train);
    qt_dataset_free(test);
    return qt_status_fail(st, QT_STATUS_INPUT);
  }
  if (which == QT_SPLIT_BOTH && (train->h != test->h || train->w != test->w || train->c != test->c)) {
    qt_status_set(st, QT_STATUS_INPUT, "data: training images are %dx%dx%d but test images are %dx%dx%d", train->h,
                  train->w, train->c, test->h, test->w, test->c);
    qt_dataset_free(train);
    qt_dataset_free(test);
    return -1;
  }
  return 0;
}

qt_loader_config qt_stage_loader_config(const qt_options *o, qt_loader_purpose purpose) {
  qt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  const int eval = purpose == QT_LOADER_EVAL;
  lc.batch_size = eval ? o->train.eval_batch_size : o->train.batch_size;
  lc.shuffle = !eval;
  lc.seed = (uint64_t)o->train.seed;
  lc.drop_last = 0;
  for (int c = 0; c < 4; c++) {
    lc.mean[c] = (float)o->data.mean;
    lc.std[c] = (float)o->data.std;
  }
  if (!eval) {
    lc.crop_pad = o->data.crop_pad;
    lc.flip = o->data.flip;
  }
  if (!eval && qt_dist_size() > 1) { /* data parallel: this process's rows of every batch */
    lc.shard_count = qt_dist_size();
    lc.shard_index = qt_dist_rank();
  }
  return lc;
}

int qt_stage_test_data(const char *config_path, int images, int batch, qt_options *o, qt_dataset *test,
                       qt_loader_config *lc, qt_status *st) {
  qt_dataset none;
  memset(test, 0, sizeof *test);
  if (qt_options_load(config_path, NULL, 0, o, st->msg)) return qt_status_fail(st, QT_STATUS_INPUT);
  if (qt_stage_load_data(&o->data, QT_SPLIT_TEST, &none, test, st)) return -1;
  if (images > 0) qt_dataset_limit(test, images);
  *lc = qt_stage_loader_config(o, QT_LOADER_EVAL);
  if (batch > 0) lc->batch_size = batch;
  return 0;
}

qt_loader *qt_stage_first_images(const qt_options *o, const qt_dataset *ds, int n, const float **images, int *got,
                                 qt_status *st) {
  qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_EVAL);
  lc.batch_size = n < ds->n ? n : (int)ds->n;
  qt_loader *l = qt_loader_create(ds, &lc, st->msg);
  if (!l) {
    qt_status_fail(st, QT_STATUS_INPUT);
    return NULL;
  }
  const int32_t *labels;
  qt_loader_start_epoch(l, 0);
  *got = qt_loader_next(l, images, &labels);
  return l;
}

int qt_stage_model_fits(const qt_options *o, const qt_graph *g, const qt_dataset *data, qt_status *st) {
  const qt_value *in = &g->values[g->input];
  const int C = (int)g->values[g->output].shape[0];
  if (in->shape[0] != data->h || in->shape[1] != data->w || in->shape[2] != data->c) {
    char decl[QT_ERR_LEN / 2] = "";
    if (o->model.onnx[0]) { /* name the ONNX declaration too (read again: only on this error path) */
      qt_onnx_info info;
      char ierr[QT_ERR_LEN];
      qt_graph *again = qt_onnx_import(o->model.onnx, NULL, &info, ierr);
      qt_graph_free(again);
      if (info.input_decl[0])
        snprintf(decl, sizeof decl, " (model.onnx %s: input '%s' %s)", o->model.onnx, info.input_name, info.input_decl);
    }
    return qt_status_set(st, QT_STATUS_INPUT, "model %s%s takes %lldx%lldx%lld images (HxWxC), data.%s gives %dx%dx%d",
                         g->name, decl, (long long)in->shape[0], (long long)in->shape[1], (long long)in->shape[2],
                         o->data.format == QT_DATA_IDX    ? "idx"
                         : o->data.format == QT_DATA_HDF5 ? "hdf5"
                                                          : "folder",
                         data->h, data->w, data->c);
  }
  const int64_t i = qt_dataset_label_at_least(data, C);
  if (i >= 0)
    return qt_status_set(st, QT_STATUS_INPUT, "model %s has %d outputs but image %lld of the data has label %d",
                         g->name, C, (long long)i, data->labels[i]);
  if (data->num_classes > C)
    return qt_status_set(st, QT_STATUS_INPUT, "model %s has %d outputs but the data has %d classes", g->name, C,
                         data->num_classes);
  return 0;
}

/* model.onnx: the import, with the data's image shape for dims the model leaves dynamic (from
 * data, or else read from the test split). */
static qt_graph *import_onnx(const qt_options *o, const qt_dataset *data, qt_status *st) {
  qt_onnx_info info;
  int hwc[3] = {0, 0, 0};
  if (data) hwc[0] = data->h, hwc[1] = data->w, hwc[2] = data->c;
  qt_graph *g = qt_onnx_import(o->model.onnx, data ? hwc : NULL, &info, st->msg);
  if (!g && info.needs_shape) {
    qt_dataset none, test;
    if (qt_stage_load_data(&o->data, QT_SPLIT_TEST, &none, &test, st)) return NULL;
    hwc[0] = test.h, hwc[1] = test.w, hwc[2] = test.c;
    qt_dataset_free(&test);
    g = qt_onnx_import(o->model.onnx, hwc, &info, st->msg);
  }
  if (!g) {
    qt_status_fail(st, QT_STATUS_INPUT);
    return NULL;
  }
  static int noted; /* once a process: a run imports its model more than once */
  if (info.convs > 0 && info.batch_norms == 0 && info.layer_norms == 0 && !noted) {
    noted = 1;
    fprintf(stderr,
            "note: %s has no BatchNormalization; if the PyTorch model has BN, its exporter folded it into the convs, "
            "and there is no BN for QAT to fold late; to keep BN, export with torch.onnx.export(..., optimize=False) "
            "(torch 2.x) or "
            "training=torch.onnx.TrainingMode.TRAINING (torch 1.13)\n",
            o->model.onnx);
  }
  return g;
}

qt_graph *qt_stage_build_model(const qt_options *o, const qt_dataset *data, qt_status *st) {
  const int onnx = o->model.onnx[0] != 0;
  qt_graph *g = onnx ? import_onnx(o, data, st) : qt_model_build(o->model.name, st->msg);
  if (!g) {
    if (!onnx) qt_status_fail(st, QT_STATUS_INPUT);
    return NULL;
  }
  if (data && qt_stage_model_fits(o, g, data, st)) {
    qt_graph_free(g);
    return NULL;
  }
  /* the loader's normalization (the one place it is set), recorded in the graph so that the
   * model files carry it */
  const qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_EVAL);
  const int C = (int)g->values[g->input].shape[2];
  int bad = 0;
  if (C > 4)
    bad = qt_status_set(st, QT_STATUS_INPUT, "model %s takes %d input channels (at most 4)", g->name, C);
  else if (qt_graph_set_input_preprocessing(g, lc.mean, lc.std, C, st->msg))
    bad = qt_status_fail(st, QT_STATUS_INPUT);
  if (bad) {
    qt_graph_free(g);
    return NULL;
  }
  if (!onnx) qt_graph_init_params(g, (uint64_t)o->train.seed); /* an imported model keeps its initializers */
  return g;
}
