/* dist_compare A.h5 B.h5 PARAM_TOL BUFFER_TOL CONFIG.ini [section.key=value ...]: two checkpoints
 * of the run CONFIG describes (e.g. one trained by one process, one by two under mpirun) hold the
 * same training state up to float reordering: the same epoch and step, every tensor within its
 * tolerance relative to the tensor's scale, max|a - b| <= tol * max|a| (parameters, LSQ scales
 * included, PARAM_TOL; BN running statistics BUFFER_TOL), and for a quantized run every
 * quantization point's scales within PARAM_TOL relative and zero points within 1. Prints every
 * difference; exit status 0 when all are within, 1 when not, 2 on a usage or load error. A helper
 * of test_dist_train.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/pipeline.h"

static qt_graph *load(const qt_options *o, const char *path, qt_checkpoint_meta *meta) {
  qt_status st = {0};
  qt_graph *g = qt_stage_build_model(o, NULL, &st), *p = g;
  if (g && o->quant.mode != QT_QUANT_NONE) {
    p = qt_stage_prepare(o, g, NULL, NULL, &st);
    qt_graph_free(g);
  }
  if (!p || qt_checkpoint_load(path, p, NULL, meta, st.msg)) {
    fprintf(stderr, "dist_compare: %s\n", st.msg);
    exit(2);
  }
  free(meta->config_ini);
  return p;
}

static double rel_diff(const float *x, const float *y, int64_t n, double *dmax, double *xmax) {
  double d = 0, m = 0;
  for (int64_t k = 0; k < n; k++) {
    const double e = fabs((double)x[k] - (double)y[k]);
    d = e > d || isnan(e) ? e : d;
    m = fabs((double)x[k]) > m ? fabs((double)x[k]) : m;
  }
  *dmax = d;
  *xmax = m;
  return m > 0 ? d / m : d;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: dist_compare A.h5 B.h5 PARAM_TOL BUFFER_TOL CONFIG.ini [section.key=value ...]\n");
    return 2;
  }
  static qt_options o;
  char err[QT_ERR_LEN];
  if (qt_options_load(argv[5], argv + 6, argc - 6, &o, err)) {
    fprintf(stderr, "dist_compare: %s\n", err);
    return 2;
  }
  const double tol[2] = {atof(argv[3]), atof(argv[4])};
  qt_checkpoint_meta ma, mb;
  qt_graph *a = load(&o, argv[1], &ma), *b = load(&o, argv[2], &mb);
  int bad = 0;
  if (ma.epoch != mb.epoch || ma.step != mb.step) {
    printf("epoch/step differ: %d/%lld vs %d/%lld\n", ma.epoch, (long long)ma.step, mb.epoch, (long long)mb.step);
    bad = 1;
  }
  double worst[3] = {0, 0, 0};
  for (int i = 0; i < a->n_tensors; i++) {
    const qt_param *p = &a->tensors[i];
    double d, m;
    const double rel = rel_diff((p->is_buffer ? a->buffers : a->params) + p->offset,
                                (p->is_buffer ? b->buffers : b->params) + p->offset, p->numel, &d, &m);
    const int over = !(rel <= tol[p->is_buffer]);
    if (!(rel <= worst[p->is_buffer])) worst[p->is_buffer] = rel;
    printf("%-28s %-9s max|a-b| %.3g  max|a| %.3g  relative %.3g%s\n", p->name, p->is_buffer ? "buffer" : "parameter",
           d, m, rel, over ? "  OVER TOLERANCE" : "");
    bad |= over;
  }
  for (int i = 0; i < a->n_nodes; i++)
    for (int w = 0; w < 2; w++) {
      const qt_qstate *qa = w ? a->nodes[i].wq : a->nodes[i].q, *qb = w ? b->nodes[i].wq : b->nodes[i].q;
      if (!qa || !qb || !qa->calibrated) continue;
      double d, m;
      const double rel = rel_diff(qa->scale, qb->scale, qa->channels, &d, &m);
      int zp = 0;
      for (int c = 0; c < qa->channels; c++) {
        const int dz = abs(qa->zero_point[c] - qb->zero_point[c]);
        zp = dz > zp ? dz : zp;
      }
      const int over = !(rel <= tol[0]) || zp > 1;
      if (!(rel <= worst[2])) worst[2] = rel;
      printf("%-28s %-9s scale relative %.3g, zero point max difference %d%s\n", a->nodes[i].name,
             w ? "weights" : "qparams", rel, zp, over ? "  OVER TOLERANCE" : "");
      bad |= over;
    }
  printf("largest relative difference: parameters %.3g, qparams %.3g (tolerance %g), buffers %.3g (tolerance %g)\n",
         worst[0], worst[2], tol[0], worst[1], tol[1]);
  qt_graph_free(a);
  qt_graph_free(b);
  return bad;
}
