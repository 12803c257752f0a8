/* Helpers shared by the conv2d / linear kernel tests (header only; each test is one program). */
#ifndef QT_TEST_CONV_LINEAR_UTIL_H
#define QT_TEST_CONV_LINEAR_UTIL_H

#include "autograd/kernels.h"

/* A conv2d shape from its twelve sizes, in the order of the tables that list them. */
static inline qt_conv2d_shape conv_shape(int N, int H, int W, int C, int OC, int KH, int KW, int sh, int sw, int ph,
                                         int pw, int groups) {
  qt_conv2d_shape s = {.N = N, .H = H, .W = W, .C = C, .OC = OC, .KH = KH, .KW = KW, .stride_h = sh,
                       .stride_w = sw, .pad_h = ph, .pad_w = pw, .groups = groups};
  return s;
}

#endif
