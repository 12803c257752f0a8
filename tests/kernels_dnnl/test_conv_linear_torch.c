/* conv2d and linear, optimized and reference, against PyTorch 1.13: forward outputs and the
 * gradients for input, weight and bias given a random upstream gradient, as written by
 * tests/ref/make_ref_conv_linear.py into tests/ref/conv_linear.h5. Gradient buffers start at
 * zero, as torch's did. Tolerance: atol 1e-5, rtol 1e-4 (fp32 on both sides). */
#include "autograd/kernels.h"

#include <stdio.h>
#include <stdlib.h>

#include "tests/common/testutil.h"
#include "tests/kernels_dnnl/conv_linear_util.h"

#define ATOL 1e-5f
#define RTOL 1e-4f

static const char *ref_file(void) { return qt_test_path("tests/ref/conv_linear.h5"); }

static float *load(const char *group, const char *name, int64_t expect_numel) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", group, name);
  int64_t shape[8];
  int ndim = 0;
  float *p = qt_test_load_f32(ref_file(), path, shape, &ndim);
  if (qt_test_numel(shape, ndim) != expect_numel)
    qt_test_fail("%s: expected %lld elements, file has %lld", path, (long long)expect_numel,
                 (long long)qt_test_numel(shape, ndim));
  return p;
}

/* The integer dataset <group>/config, which must hold n entries (else a failed check and NULL). */
static int32_t *load_config(const char *group, int64_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/config", group);
  int64_t cshape[8];
  int cndim = 0;
  int32_t *c = qt_test_load_i32(ref_file(), path, cshape, &cndim);
  if (qt_test_numel(cshape, cndim) != n) {
    qt_test_fail("%s: config has %lld entries, expected %lld", path, (long long)qt_test_numel(cshape, cndim),
                 (long long)n);
    free(c);
    return NULL;
  }
  return c;
}

typedef void (*conv_forward_fn)(float *, const float *, const float *, const float *, const qt_conv2d_shape *);
typedef void (*conv_backward_fn)(float *, float *, float *, const float *, const float *, const float *,
                                 const qt_conv2d_shape *);

static void check_conv(const char *group) {
  int32_t *c = load_config(group, 13);
  if (!c) return;
  qt_conv2d_shape s = conv_shape(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]);
  const int has_bias = c[12];
  free(c);
  if (qt_conv2d_shape_init(&s) != 0) {
    qt_test_fail("%s: shape rejected", group);
    return;
  }
  const int64_t ni = (int64_t)s.N * s.H * s.W * s.C, no = (int64_t)s.N * s.OH * s.OW * s.OC;
  const int64_t nw = (int64_t)s.OC * (s.C / s.groups) * s.KH * s.KW;
  float *inp = load(group, "inp", ni), *weight = load(group, "weight", nw);
  float *out_want = load(group, "out", no), *dout = load(group, "dout", no);
  float *dinp_want = load(group, "dinp", ni), *dweight_want = load(group, "dweight", nw);
  float *bias = has_bias ? load(group, "bias", s.OC) : NULL;
  float *dbias_want = has_bias ? load(group, "dbias", s.OC) : NULL;

  const conv_forward_fn fwd[2] = {qt_conv2d_forward, qt_conv2d_forward_ref};
  const conv_backward_fn bwd[2] = {qt_conv2d_backward, qt_conv2d_backward_ref};
  const char *impl[2] = {"optimized", "reference"};
  for (int k = 0; k < 2; k++) {
    float *out = qt_test_zeros(no), *di = qt_test_zeros(ni), *dw = qt_test_zeros(nw), *db = qt_test_zeros(s.OC);
    char what[128];
    fwd[k](out, inp, weight, bias, &s);
    snprintf(what, sizeof what, "%s %s: out", group, impl[k]);
    qt_test_close(what, out, out_want, no, ATOL, RTOL);
    bwd[k](di, dw, has_bias ? db : NULL, dout, inp, weight, &s);
    snprintf(what, sizeof what, "%s %s: dinp", group, impl[k]);
    qt_test_close(what, di, dinp_want, ni, ATOL, RTOL);
    snprintf(what, sizeof what, "%s %s: dweight", group, impl[k]);
    qt_test_close(what, dw, dweight_want, nw, ATOL, RTOL);
    if (has_bias) {
      snprintf(what, sizeof what, "%s %s: dbias", group, impl[k]);
      qt_test_close(what, db, dbias_want, s.OC, ATOL, RTOL);
    }
    free(out), free(di), free(dw), free(db);
  }
  free(inp), free(weight), free(out_want), free(dout), free(dinp_want), free(dweight_want), free(bias),
      free(dbias_want);
}

typedef void (*linear_forward_fn)(float *, const float *, const float *, const float *, int, int, int);
typedef void (*linear_backward_fn)(float *, float *, float *, const float *, const float *, const float *, int, int,
                                   int);

static void check_linear(const char *group) {
  int32_t *c = load_config(group, 3);
  if (!c) return;
  const int N = c[0], IN = c[1], OUT = c[2];
  free(c);
  const int64_t ni = (int64_t)N * IN, no = (int64_t)N * OUT, nw = (int64_t)OUT * IN;
  float *inp = load(group, "inp", ni), *weight = load(group, "weight", nw), *bias = load(group, "bias", OUT);
  float *out_want = load(group, "out", no), *dout = load(group, "dout", no);
  float *dinp_want = load(group, "dinp", ni), *dweight_want = load(group, "dweight", nw);
  float *dbias_want = load(group, "dbias", OUT);

  const linear_forward_fn fwd[2] = {qt_linear_forward, qt_linear_forward_ref};
  const linear_backward_fn bwd[2] = {qt_linear_backward, qt_linear_backward_ref};
  const char *impl[2] = {"optimized", "reference"};
  for (int k = 0; k < 2; k++) {
    float *out = qt_test_zeros(no), *di = qt_test_zeros(ni), *dw = qt_test_zeros(nw), *db = qt_test_zeros(OUT);
    char what[128];
    fwd[k](out, inp, weight, bias, N, IN, OUT);
    snprintf(what, sizeof what, "%s %s: out", group, impl[k]);
    qt_test_close(what, out, out_want, no, ATOL, RTOL);
    bwd[k](di, dw, db, dout, inp, weight, N, IN, OUT);
    snprintf(what, sizeof what, "%s %s: dinp", group, impl[k]);
    qt_test_close(what, di, dinp_want, ni, ATOL, RTOL);
    snprintf(what, sizeof what, "%s %s: dweight", group, impl[k]);
    qt_test_close(what, dw, dweight_want, nw, ATOL, RTOL);
    snprintf(what, sizeof what, "%s %s: dbias", group, impl[k]);
    qt_test_close(what, db, dbias_want, OUT, ATOL, RTOL);
    free(out), free(di), free(dw), free(db);
  }
  free(inp), free(weight), free(bias), free(out_want), free(dout), free(dinp_want), free(dweight_want),
      free(dbias_want);
}

int main(void) {
  check_conv("conv0"); /* 3x3 pad 1, bias */
  check_conv("conv1"); /* stride 2, groups 2, bias */
  check_conv("conv2"); /* C=1, no bias */
  check_linear("linear0");
  return qt_test_finish();
}
