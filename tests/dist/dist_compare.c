/* dist_compare MODEL A.h5 B.h5 PARAM_TOL BUFFER_TOL: two checkpoints of the same model (e.g. one
 * trained by one process, one by two under mpirun) hold the same training state up to float
 * reordering: the same epoch and step, and every tensor within its tolerance relative to the
 * tensor's scale, max|a - b| <= tol * max|a| (parameters PARAM_TOL, BN running statistics
 * BUFFER_TOL). Prints every tensor's difference; exit status 0 when all are within, 1 when not,
 * 2 on a usage or load error. A helper of test_dist_train.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/train.h"

static qt_graph *load(const char *model, const char *path, qt_checkpoint_meta *meta) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  if (!g || qt_checkpoint_load(path, g, NULL, meta, err)) {
    fprintf(stderr, "dist_compare: %s\n", err);
    exit(2);
  }
  free(meta->config_ini);
  return g;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: dist_compare MODEL A.h5 B.h5 PARAM_TOL BUFFER_TOL\n");
    return 2;
  }
  const double tol[2] = {atof(argv[4]), atof(argv[5])};
  qt_checkpoint_meta ma, mb;
  qt_graph *a = load(argv[1], argv[2], &ma), *b = load(argv[1], argv[3], &mb);
  int bad = 0;
  if (ma.epoch != mb.epoch || ma.step != mb.step) {
    printf("epoch/step differ: %d/%lld vs %d/%lld\n", ma.epoch, (long long)ma.step, mb.epoch, (long long)mb.step);
    bad = 1;
  }
  double worst[2] = {0, 0};
  for (int i = 0; i < a->n_tensors; i++) {
    const qt_param *p = &a->tensors[i];
    const float *x = (p->is_buffer ? a->buffers : a->params) + p->offset;
    const float *y = (p->is_buffer ? b->buffers : b->params) + p->offset;
    double d = 0, m = 0;
    for (int64_t k = 0; k < p->numel; k++) {
      const double e = fabs((double)x[k] - (double)y[k]);
      d = e > d || isnan(e) ? e : d;
      m = fabs((double)x[k]) > m ? fabs((double)x[k]) : m;
    }
    const double rel = m > 0 ? d / m : d;
    const int over = !(rel <= tol[p->is_buffer]);
    if (!(rel <= worst[p->is_buffer])) worst[p->is_buffer] = rel;
    printf("%-28s %-9s max|a-b| %.3g  max|a| %.3g  relative %.3g%s\n", p->name, p->is_buffer ? "buffer" : "parameter",
           d, m, rel, over ? "  OVER TOLERANCE" : "");
    bad |= over;
  }
  printf("largest relative difference: parameters %.3g (tolerance %g), buffers %.3g (tolerance %g)\n", worst[0],
         tol[0], worst[1], tol[1]);
  qt_graph_free(a);
  qt_graph_free(b);
  return bad;
}
