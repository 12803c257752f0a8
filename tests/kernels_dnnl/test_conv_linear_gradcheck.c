/* Finite-difference gradient checks of the conv2d and linear reference kernels. The loss is
 * L = sum(out * g) (in double) for a fixed random g, so dL/dout = g. Both ops are linear in each
 * argument separately, so a central difference is exact up to rounding even with a large step:
 * eps = 0.1, divided by the step actually taken in float. Rounding of the fp32 outputs bounds
 * the error near 1e-5 for these sizes; tolerance atol 2e-4, rtol 1e-4. Every element of
 * dinp, dweight and dbias is checked. */
#include "autograd/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "tests/kernels_dnnl/conv_linear_util.h"

#define EPS 0.1f
#define ATOL 2e-4f
#define RTOL 1e-4f

/* The op's forward as a function of its three parameter buffers. */
typedef void (*forward_fn)(float *out, const float *inp, const float *weight, const float *bias, const void *shape);

typedef struct {
  forward_fn forward;
  const void *shape;
  float *inp, *weight, *bias, *out, *g;
  int64_t n_out;
} fd_problem;

static double loss(fd_problem *p) {
  p->forward(p->out, p->inp, p->weight, p->bias, p->shape);
  double l = 0.0;
  for (int64_t i = 0; i < p->n_out; i++) l += (double)p->out[i] * p->g[i];
  return l;
}

/* Numerical dL/dx for every element of x (one of p's buffers), compared with analytic. */
static void check_fd(const char *what, fd_problem *p, float *x, int64_t n, const float *analytic) {
  float *numeric = qt_test_zeros(n);
  for (int64_t i = 0; i < n; i++) {
    const float x0 = x[i], hi = x0 + EPS, lo = x0 - EPS;
    x[i] = hi;
    const double l_hi = loss(p);
    x[i] = lo;
    const double l_lo = loss(p);
    x[i] = x0;
    numeric[i] = (float)((l_hi - l_lo) / ((double)hi - (double)lo));
  }
  qt_test_close(what, analytic, numeric, n, ATOL, RTOL);
  free(numeric);
}

static void conv_forward_adapter(float *out, const float *inp, const float *weight, const float *bias,
                                 const void *shape) {
  qt_conv2d_forward_ref(out, inp, weight, bias, shape);
}

static void check_conv(qt_conv2d_shape s, const char *name, uint64_t seed) {
  if (qt_conv2d_shape_init(&s) != 0) {
    qt_test_fail("%s: shape rejected", name);
    return;
  }
  const int64_t ni = (int64_t)s.N * s.H * s.W * s.C, no = (int64_t)s.N * s.OH * s.OW * s.OC;
  const int64_t nw = (int64_t)s.OC * (s.C / s.groups) * s.KH * s.KW;
  fd_problem p = {.forward = conv_forward_adapter, .shape = &s, .n_out = no};
  p.inp = qt_test_uniform(ni, seed + 1);
  p.weight = qt_test_uniform(nw, seed + 2);
  p.bias = qt_test_uniform(s.OC, seed + 3);
  p.g = qt_test_uniform(no, seed + 4);
  p.out = qt_test_zeros(no);
  float *di = qt_test_zeros(ni), *dw = qt_test_zeros(nw), *db = qt_test_zeros(s.OC);
  qt_conv2d_backward_ref(di, dw, db, p.g, p.inp, p.weight, &s);
  char what[128];
  snprintf(what, sizeof what, "%s: dinp", name);
  check_fd(what, &p, p.inp, ni, di);
  snprintf(what, sizeof what, "%s: dweight", name);
  check_fd(what, &p, p.weight, nw, dw);
  snprintf(what, sizeof what, "%s: dbias", name);
  check_fd(what, &p, p.bias, s.OC, db);
  free(p.inp), free(p.weight), free(p.bias), free(p.g), free(p.out), free(di), free(dw), free(db);
}

typedef struct {
  int N, IN, OUT;
} linear_shape;

static void linear_forward_adapter(float *out, const float *inp, const float *weight, const float *bias,
                                   const void *shape) {
  const linear_shape *s = shape;
  qt_linear_forward_ref(out, inp, weight, bias, s->N, s->IN, s->OUT);
}

static void check_linear(int N, int IN, int OUT, uint64_t seed) {
  linear_shape s = {N, IN, OUT};
  const int64_t ni = (int64_t)N * IN, no = (int64_t)N * OUT, nw = (int64_t)OUT * IN;
  fd_problem p = {.forward = linear_forward_adapter, .shape = &s, .n_out = no};
  p.inp = qt_test_uniform(ni, seed + 1);
  p.weight = qt_test_uniform(nw, seed + 2);
  p.bias = qt_test_uniform(OUT, seed + 3);
  p.g = qt_test_uniform(no, seed + 4);
  p.out = qt_test_zeros(no);
  float *di = qt_test_zeros(ni), *dw = qt_test_zeros(nw), *db = qt_test_zeros(OUT);
  qt_linear_backward_ref(di, dw, db, p.g, p.inp, p.weight, N, IN, OUT);
  check_fd("linear: dinp", &p, p.inp, ni, di);
  check_fd("linear: dweight", &p, p.weight, nw, dw);
  check_fd("linear: dbias", &p, p.bias, OUT, db);
  free(p.inp), free(p.weight), free(p.bias), free(p.g), free(p.out), free(di), free(dw), free(db);
}

int main(void) {
  const struct {
    qt_conv2d_shape s;
    const char *name;
    uint64_t seed;
  } convs[] = {
      /*   N  H  W  C OC KH KW sh sw ph pw  g */
      {conv_shape(2, 5, 4, 4, 6, 3, 3, 2, 1, 1, 1, 2), "conv grouped, stride (2,1)", 10},
      {conv_shape(2, 5, 5, 1, 3, 3, 3, 1, 1, 1, 1, 1), "conv C=1", 20},
      {conv_shape(1, 4, 5, 3, 3, 2, 3, 1, 2, 1, 2, 3), "conv depthwise 2x3, pad (1,2)", 30},
      {conv_shape(2, 4, 3, 5, 2, 1, 1, 1, 1, 0, 0, 1), "conv 1x1", 40},
  };
  for (int k = 0; k < 4; k++) check_conv(convs[k].s, convs[k].name, convs[k].seed);
  check_linear(3, 6, 4, 50);
  return qt_test_finish();
}
