/* qat_run on bad model files: a missing file, a truncated file, a corrupt file (bytes
 * flipped inside a checksummed dataset) and a file with an unknown op each give a clear
 * message naming the problem on stderr and exit status 2. A valid converted FashionCNN runs
 * (on the first test images, with --compare: within 1 LSB of the Q/DQ graph) and exits 0;
 * that part is skipped when Fashion-MNIST is not installed. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

#ifndef QT_QAT_RUN
#error "QT_QAT_RUN (the qat_run binary) must be defined by the build"
#endif

static unsigned char *read_all(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  QT_ASSERT(f, "open %s", path);
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)*len);
  QT_ASSERT(b && fread(b, 1, (size_t)*len, f) == (size_t)*len, "read %s", path);
  fclose(f);
  return b;
}

static void write_all(const char *path, const unsigned char *b, long len) {
  FILE *f = fopen(path, "wb");
  QT_ASSERT(f && fwrite(b, 1, (size_t)len, f) == (size_t)len && fclose(f) == 0, "write %s", path);
}

/* Runs qat_run with args; returns its exit status and leaves its stderr in msg. */
static int run(const char *args, char *msg, size_t msg_len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s > qat_run_stdout.txt 2> qat_run_stderr.txt", QT_QAT_RUN, args);
  int st = system(cmd);
  msg[0] = 0;
  FILE *f = fopen("qat_run_stderr.txt", "r");
  if (f) {
    size_t n = fread(msg, 1, msg_len - 1, f);
    msg[n] = 0;
    fclose(f);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_error(const char *what, const char *args, const char *want) {
  char msg[4096];
  int st = run(args, msg, sizeof msg);
  if (st != 2 || !strstr(msg, want))
    qt_test_fail("%s: qat_run %s exited %d, want 2 with a message holding '%s'; stderr: %s", what, args, st, want,
                 msg);
}

static qt_graph *converted_fashion_cnn(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_graph_init_params(g, 5);
  qt_graph *p = qt_test_prepare_ptq_onednn(g);
  qt_graph_free(g);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {32, 28, 28, 1};
  float *x = malloc(sizeof(float) * 32 * 784);
  qt_test_fill_uniform(x, 32 * 784, -0.8f, 2.5f, 41);
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  QT_ASSERT(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)), "%s", p->error);
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  free(x);
  qt_ctx_free(ctx);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "%s", err);
  qt_graph_free(p);
  return c;
}

int main(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = converted_fashion_cnn();
  QT_ASSERT(qt_qdq_save("backend_model.h5", g, err) == 0, "%s", err);
  qt_graph_free(g);
  long len;
  unsigned char *bytes = read_all("backend_model.h5", &len);

  expect_error("missing file", "no_such_model.h5", "no_such_model.h5");
  expect_error("no arguments", "", "usage");

  write_all("backend_truncated.h5", bytes, len / 2);
  expect_error("truncated file", "backend_truncated.h5", "backend_truncated.h5");

  /* Flip 256 bytes in the middle: inside the large weight datasets, caught by Fletcher-32. */
  unsigned char *bad = malloc((size_t)len);
  memcpy(bad, bytes, (size_t)len);
  for (long i = len / 2; i < len / 2 + 256; i++) bad[i] ^= 0x5a;
  write_all("backend_corrupt.h5", bad, len);
  expect_error("corrupt file", "backend_corrupt.h5", "backend_corrupt.h5");
  free(bad);

  write_all("backend_unknown_op.h5", bytes, len);
  hid_t f = H5Fopen("backend_unknown_op.h5", H5F_ACC_RDWR, H5P_DEFAULT);
  QT_ASSERT(f >= 0 && H5LTset_attribute_string(f, "/nodes/0003_conv1", "op", "sigmoid2") >= 0 && H5Fclose(f) >= 0,
            "rewriting the op of conv1");
  expect_error("unknown op", "backend_unknown_op.h5", "unknown op 'sigmoid2'");
  expect_error("bad --batch", "backend_model.h5 --batch 0", "--batch");
  free(bytes);

  /* The valid model runs, when the default data set is installed. */
  if (access("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", R_OK) == 0) {
    char msg[4096];
    int st = run("backend_model.h5 --images 300 --batch 128 --compare", msg, sizeof msg);
    if (st != 0) qt_test_fail("valid model: qat_run exited %d; stderr: %s", st, msg);
  }
  return qt_test_finish();
}
