/* HDF5 checkpoints: /params/<name>, /buffers/<name> (PyTorch's state_dict names and shapes,
 * weights OIHW), /optim/<state> (flat, over the parameter slab), root attributes epoch,
 * step, seed, model, config; for a prepared (quantized) graph also /quant, the quantization
 * training state (qat/qstate_file.h). Built in memory, then written to a temporary file,
 * fsync'd and renamed (qt_h5_commit): a crash or a full disk never leaves a half-written
 * checkpoint under the real name. Checksummed: every dataset
 * carries a Fletcher-32 checksum and the file is in HDF5 1.10's format, whose superblock and
 * object headers (with the attributes) carry checksums, so a flipped bit is refused on loading
 * instead of loaded as another number; saving the same state twice gives the same bytes. Every attribute is read
 * through base/h5.h, which checks its class, rank and size first: a crafted file with an array
 * `epoch` or a variable-length `model` gets a message, not a buffer overflow. */
#include "train/train.h"
#include "base/base.h"
#include "base/h5.h"
#include "dist/dist.h"
#include "qat/qstate_file.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest config text a checkpoint may carry (the INI of a run). */
#define CHECKPOINT_MAX_CONFIG ((size_t)1 << 20)

int qt_checkpoint_save(const char *path, const qt_graph *g, qt_optim *opt, const qt_checkpoint_meta *meta, char *err) {
  qt_h5_quiet();
  char cmsg[QT_ERR_LEN];
  qt_h5_image *img;
  hid_t f = qt_h5_create_checksummed(path, &img, cmsg);
  if (f < 0) return qt_err(err, "checkpoint: %s", cmsg);
  int bad = 0;
  hid_t gp = qt_h5_group_create(f, "params"), gb = qt_h5_group_create(f, "buffers");
  bad = gp < 0 || gb < 0;
  for (int i = 0; i < g->n_tensors && !bad; i++) {
    const qt_param *p = &g->tensors[i];
    const float *data = (p->is_buffer ? g->buffers : g->params) + p->offset;
    bad |= qt_h5_dataset_write_f32(p->is_buffer ? gb : gp, p->name, p->ndim, p->shape, data);
  }
  if (gp >= 0) H5Gclose(gp);
  if (gb >= 0) H5Gclose(gb);
  if (opt && !bad) {
    hid_t go = qt_h5_group_create(f, "optim");
    bad = go < 0;
    for (int i = 0; i < qt_optim_state_count(opt) && !bad; i++) {
      const char *name = NULL;
      float *st = qt_optim_state(opt, i, &name);
      bad |= qt_h5_dataset_write_f32(go, name, 1, &g->n_params, st);
    }
    if (go >= 0) {
      bad |= qt_h5_attr_write_i64(go, "steps", qt_optim_steps(opt));
      H5Gclose(go);
    }
  }
  if (!bad) {
    bad |= qt_h5_attr_write_i64(f, "epoch", meta->epoch);
    bad |= qt_h5_attr_write_i64(f, "step", meta->step);
    bad |= qt_h5_attr_write_i64(f, "seed", (int64_t)meta->seed);
    bad |= qt_h5_attr_write_str(f, "model", g->name);
    bad |= qt_h5_attr_write_str(f, "config", meta->config_ini ? meta->config_ini : "");
    bad |= qt_h5_attr_write_str(f, "format", "qat-checkpoint-1");
  }
  char qerr[QT_ERR_LEN] = "";
  if (!bad && qt_graph_has_quant_state(g)) bad |= qt_quant_state_write(f, g, qerr) != 0;
  if (bad) {
    qt_h5_discard(f, img);
    return qt_err(err, "checkpoint: writing '%s' failed (%s); the previous checkpoint is kept", path,
                  qerr[0] ? qerr : "HDF5 failed in memory");
  }
  char cerr[QT_ERR_LEN];
  if (qt_h5_commit(f, img, path, cerr)) return qt_err(err, "checkpoint: %s; the previous checkpoint is kept", cerr);
  return 0;
}

static int read_f32(hid_t f, const char *group, const char *name, int ndim, const int64_t *shape, float *out,
                    const char *path, char *err) {
  char full[256], obj[64];
  snprintf(full, sizeof full, "/%s/%s", group, name);
  snprintf(obj, sizeof obj, "/%s", group);
  if (H5Lexists(f, group, H5P_DEFAULT) <= 0 || H5Lexists(f, full, H5P_DEFAULT) <= 0)
    return qt_err(err, "checkpoint '%s': missing dataset %s (a different model?)", path, full);
  hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  if (g < 0) return qt_err(err, "checkpoint '%s': %s is not a readable group", path, obj);
  char msg[QT_ERR_LEN];
  int rc = qt_h5_dataset_read_f32(g, NULL, obj, name, ndim, shape, out, msg);
  H5Gclose(g);
  return rc ? qt_err(err, "checkpoint '%s': %s (a different model?)", path, msg) : 0;
}

/* Opens a checkpoint for reading; -1 (err set) when it is missing or not HDF5. */
static hid_t open_checkpoint(const char *path, char *err) {
  char msg[QT_ERR_LEN];
  hid_t f = qt_h5_open_read(path, "checkpoint", H5P_DEFAULT, msg);
  if (f < 0) qt_err(err, "%s", msg);
  return f;
}

/* The root attributes epoch, step, seed (required int64 scalars) and config (an optional
 * string; malloc'd). */
static int read_meta(hid_t f, const char *path, qt_checkpoint_meta *meta, char *err) {
  memset(meta, 0, sizeof *meta);
  int64_t epoch = 0, step = 0, seed = 0;
  char file[4200];
  snprintf(file, sizeof file, "checkpoint '%s'", path);
  if (qt_h5_attr_read_i64(f, file, "/", "epoch", &epoch, err) ||
      qt_h5_attr_read_i64(f, file, "/", "step", &step, err) || qt_h5_attr_read_i64(f, file, "/", "seed", &seed, err))
    return -1;
  if (epoch < 0 || epoch > INT32_MAX || step < 0)
    return qt_err(err, "checkpoint '%s': /: epoch %lld, step %lld, expected non-negative counts", path,
                  (long long)epoch, (long long)step);
  meta->epoch = (int)epoch;
  meta->step = step;
  meta->seed = (uint64_t)seed;
  const htri_t has = H5Aexists(f, "config");
  if (has < 0) return qt_err(err, "checkpoint '%s': /: cannot read the attributes (corrupt file?)", path);
  if (has && !(meta->config_ini = qt_h5_attr_read_str_alloc(f, file, "/", "config", CHECKPOINT_MAX_CONFIG, err)))
    return -1;
  return 0;
}

/* The checkpoint holds g's model, and quantization state exactly when g is a prepared graph:
 * an fp32 checkpoint cannot resume a quantized run, nor a quantized run's checkpoint be taken
 * for fp32 weights. */
static int check_model(hid_t f, const char *path, const qt_graph *g, char *err) {
  char model[QT_NAME_LEN] = "", file[4200];
  snprintf(file, sizeof file, "checkpoint '%s'", path);
  if (H5Aexists(f, "model") <= 0)
    return qt_err(err, "checkpoint '%s': no 'model' attribute (not a qat checkpoint?)", path);
  if (qt_h5_attr_read_str(f, file, "/", "model", model, sizeof model, err)) return -1;
  if (strcmp(model, g->name) != 0)
    return qt_err(err, "checkpoint '%s' holds model '%s', the config builds '%s'", path, model, g->name);
  const int file_quant = H5Lexists(f, "quant", H5P_DEFAULT) > 0, graph_quant = qt_graph_has_quant_state(g);
  if (graph_quant && !file_quant)
    return qt_err(err,
                  "checkpoint '%s' holds no quantization state (/quant): it was written by an fp32 run (or by a "
                  "quantized run before such runs could be resumed), but the graph to load is a prepared (quantized) "
                  "one",
                  path);
  if (!graph_quant && file_quant)
    return qt_err(err,
                  "checkpoint '%s' holds a quantized run's training graph (/quant: fake quant, conv_bn, qparams), not "
                  "the fp32 model '%s': resume it as the same quantized run, or load an fp32 run's checkpoint",
                  path, g->name);
  return 0;
}

/* The optimizer's state slabs (malloc'd, *states: qt_optim_state_count of them) and step count. */
static int read_optim(hid_t f, const char *path, const qt_graph *g, qt_optim *opt, float ***states, int64_t *steps,
                      char *err) {
  const int ns = qt_optim_state_count(opt);
  char file[4200];
  snprintf(file, sizeof file, "checkpoint '%s'", path);
  *states = calloc((size_t)ns + 1, sizeof **states);
  QT_ASSERT(*states, "out of memory");
  hid_t go = H5Lexists(f, "optim", H5P_DEFAULT) > 0 ? H5Gopen2(f, "optim", H5P_DEFAULT) : -1;
  if (go < 0) return qt_err(err, "checkpoint '%s': no optimizer state (/optim) to resume from", path);
  int bad = qt_h5_attr_read_i64(go, file, "/optim", "steps", steps, err) != 0;
  H5Gclose(go);
  for (int i = 0; i < ns && !bad; i++) {
    const char *name = NULL;
    qt_optim_state(opt, i, &name);
    (*states)[i] = malloc((size_t)(g->n_params + 1) * sizeof(float));
    QT_ASSERT((*states)[i], "out of memory");
    bad = read_f32(f, "optim", name, 1, &g->n_params, (*states)[i], path, err);
  }
  return bad ? -1 : 0;
}

/* Everything g (and opt) will hold, read into scratch copies first so that a failure leaves
 * the graph untouched. */
typedef struct {
  float *params, *buffers, **states;
  int64_t steps;
  qt_checkpoint_meta meta;
  qt_quant_state *qs;
} loaded;

static int read_all(hid_t f, const char *path, qt_graph *g, qt_optim *opt, loaded *L, char *err) {
  L->params = malloc((size_t)(g->n_params + 16) * sizeof(float));
  L->buffers = malloc((size_t)(g->n_buffers + 16) * sizeof(float));
  QT_ASSERT(L->params && L->buffers, "out of memory");
  memcpy(L->params, g->params, (size_t)g->n_params * sizeof(float));
  memcpy(L->buffers, g->buffers, (size_t)g->n_buffers * sizeof(float));
  for (int i = 0; i < g->n_tensors; i++) {
    const qt_param *p = &g->tensors[i];
    if (read_f32(f, p->is_buffer ? "buffers" : "params", p->name, p->ndim, p->shape,
                 (p->is_buffer ? L->buffers : L->params) + p->offset, path, err))
      return -1;
  }
  if (read_meta(f, path, &L->meta, err)) return -1;
  if (opt && read_optim(f, path, g, opt, &L->states, &L->steps, err)) return -1;
  if (qt_graph_has_quant_state(g)) {
    char qerr[QT_ERR_LEN];
    if (!(L->qs = qt_quant_state_read(f, g, qerr)))
      return qt_err(err, "checkpoint '%s' does not match this run's prepared graph: %s", path, qerr);
  }
  return 0;
}

/* Loads the open checkpoint f (path names it in messages) and closes it. */
/* What a run cannot go on from: a parameter, buffer or optimizer state that is not finite, or a
 * negative BN running variance (a resumed run would print NaN losses). 0, or -1 with err naming
 * the tensor, the element and its value. */
static int check_values(const qt_graph *g, const loaded *L, int ns, const char *path, char *err) {
  static const char var[] = "running_var";
  for (int s = -1; s < ns; s++) /* -1: the model; s: optimizer state s */
    for (int t = 0; t < g->n_tensors; t++) {
      const qt_param *p = &g->tensors[t];
      if (s >= 0 && p->is_buffer) continue;
      const float *v = (s >= 0 ? L->states[s] : p->is_buffer ? L->buffers : L->params) + p->offset;
      const size_t len = strlen(p->name);
      const int is_var = s < 0 && len >= sizeof var - 1 && strcmp(p->name + len - (sizeof var - 1), var) == 0;
      for (int64_t i = 0; i < p->numel; i++)
        if (!isfinite(v[i]) || (is_var && v[i] < 0))
          return qt_err(err, "checkpoint '%s': %s%s[%lld] is %g (%s): it cannot be trained or evaluated from", path,
                        s >= 0 ? "the optimizer state of " : "", p->name, (long long)i, (double)v[i],
                        isfinite(v[i]) ? "a negative variance" : "not finite");
    }
  return 0;
}

static int load_open(hid_t f, const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err) {
  loaded L = {0};
  const int ns = opt ? qt_optim_state_count(opt) : 0;
  const int rc =
      check_model(f, path, g, err) || read_all(f, path, g, opt, &L, err) || check_values(g, &L, ns, path, err) ? -1 : 0;
  if (!rc) {
    memcpy(g->params, L.params, (size_t)g->n_params * sizeof(float));
    memcpy(g->buffers, L.buffers, (size_t)g->n_buffers * sizeof(float));
    for (int i = 0; i < ns; i++) {
      const char *name;
      memcpy(qt_optim_state(opt, i, &name), L.states[i], (size_t)g->n_params * sizeof(float));
    }
    if (opt) qt_optim_set_steps(opt, L.steps);
    if (L.qs) qt_quant_state_apply(g, L.qs);
    L.qs = NULL;
    if (meta) {
      *meta = L.meta;
      L.meta.config_ini = NULL;
    }
  }
  free(L.meta.config_ini);
  qt_quant_state_free(L.qs);
  for (int i = 0; L.states && i < ns; i++) free(L.states[i]);
  QT_FREE_ALL(L.states, L.params, L.buffers);
  H5Fclose(f);
  return rc;
}

typedef struct {
  const char *path;
  qt_graph *g;
  qt_optim *opt;
  qt_checkpoint_meta *meta;
} load_job;

static int load_parse(void *ctx, char *err) {
  const load_job *j = ctx;
  hid_t f = open_checkpoint(j->path, err);
  if (f < 0) return -1;
  return load_open(f, j->path, j->g, j->opt, j->meta, err);
}

int qt_checkpoint_load(const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err) {
  load_job j = {path, g, opt, meta};
  return qt_h5_contained(path, "checkpoint", load_parse, &j, err); /* it may come from anywhere */
}

int qt_checkpoint_load_image(const void *bytes, size_t n, const char *name, qt_graph *g, qt_optim *opt,
                             qt_checkpoint_meta *meta, char *err) {
  qt_h5_quiet();
  /* read-only, from a copy HDF5 makes and releases */
  hid_t f = H5LTopen_file_image((void *)bytes, n, 0);
  if (f < 0) return qt_err(err, "checkpoint '%s': not a readable HDF5 file (corrupt or truncated?)", name);
  return load_open(f, name, g, opt, meta, err);
}

/* The whole file into a new buffer: 0, or -1 with err. */
static int read_whole(const char *path, char **bytes, int64_t *n, char *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return qt_err(err, "checkpoint '%s': cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return qt_err(err, "checkpoint '%s': not a regular file", path);
  }
  *n = (int64_t)sb.st_size;
  *bytes = malloc(*n > 0 ? (size_t)*n : 1);
  QT_ASSERT(*bytes, "out of memory for a checkpoint of %lld bytes", (long long)*n);
  const int ok = fread(*bytes, 1, (size_t)*n, f) == (size_t)*n;
  fclose(f);
  if (!ok) {
    free(*bytes);
    *bytes = NULL;
    return qt_err(err, "checkpoint '%s': cannot read its %lld bytes", path, (long long)*n);
  }
  return 0;
}

int qt_checkpoint_load_shared(const char *path, qt_graph *g, qt_optim *opt, qt_checkpoint_meta *meta, char *err) {
  if (qt_dist_size() == 1) return qt_checkpoint_load(path, g, opt, meta, err);
  /* process 0 reads the bytes (its message, if it cannot, is the one reported) and sends them */
  char *bytes = NULL;
  int64_t n = -1;
  if (qt_dist_rank() == 0 && read_whole(path, &bytes, &n, err)) n = -1;
  qt_dist_broadcast(&n, sizeof n, 0);
  if (n < 0) {
    if (qt_dist_rank() != 0) qt_err(err, "checkpoint '%s': process 0 could not read it", path);
    return -1;
  }
  if (qt_dist_rank() != 0) {
    bytes = malloc(n > 0 ? (size_t)n : 1);
    QT_ASSERT(bytes, "out of memory for a checkpoint of %lld bytes", (long long)n);
  }
  qt_dist_broadcast(bytes, (size_t)n, 0);
  const int rc = qt_checkpoint_load_image(bytes, (size_t)n, path, g, opt, meta, err);
  free(bytes);
  return rc;
}

typedef struct {
  const char *path;
  qt_checkpoint_meta *meta;
} meta_job;

static int meta_parse(void *ctx, char *err) {
  const meta_job *j = ctx;
  memset(j->meta, 0, sizeof *j->meta);
  hid_t f = open_checkpoint(j->path, err);
  if (f < 0) return -1;
  int rc = read_meta(f, j->path, j->meta, err);
  H5Fclose(f);
  return rc;
}

int qt_checkpoint_read_meta(const char *path, qt_checkpoint_meta *meta, char *err) {
  meta_job j = {path, meta};
  memset(meta, 0, sizeof *meta);
  return qt_h5_contained(path, "checkpoint", meta_parse, &j, err);
}
