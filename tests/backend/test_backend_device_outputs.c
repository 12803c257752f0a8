/* What the device computes, from the command line and through the library: qat_run
 * --write-outputs writes logits, labels and named intermediate values that equal, bit for bit,
 * qt_device_run and qt_device_read_value on the same test images (the device read through the
 * one interface, for the oneDNN device and the accelerator alike: reading the output value by
 * name equals running); qat_run --compare on a Q/DQ graph whose output is fp32 (the last layer
 * left in fp32: no final dequantize, so no output LSB) says what it compared and passes (exit
 * 0); where a node runs (qt_device_node_on_backend) is asked the same way of the oneDNN device;
 * qat_run --write-outputs --reference writes what the exact reference computes
 * (qt_exact_run_values, bit for bit): at a quantize point its integers dequantized, within 1 LSB
 * of the device's there.
 * The command-line parts are skipped when Fashion-MNIST is not installed. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eval/exact.h"
#include "eval/report.h"
#include "tests/common/ptq_util.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"
#include "train/pipeline.h"

#ifndef QT_QAT_RUN
#error "QT_QAT_RUN (the qat_run binary) must be defined by the build"
#endif

static char out_text[1 << 16];

/* Runs qat_run with args; returns its exit status, stdout (and stderr) in out_text. */
static int run(const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s %s > qat_run_outputs.txt 2>&1", QT_QAT_RUN, args);
  const int st = system(cmd);
  out_text[0] = 0;
  FILE *f = fopen("qat_run_outputs.txt", "r");
  if (f) {
    out_text[fread(out_text, 1, sizeof out_text - 1, f)] = 0;
    fclose(f);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* FashionCNN, PTQ-converted with the oneDNN Quantizer (overrides: e.g. "fc2=fp32") or with d's. */
static qt_graph *converted(const char *overrides, const qt_backend_desc *d) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 5);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  QT_ASSERT(qt_parse_overrides(&qc, overrides, err) == 0, "%s", err);
  qt_annotations a;
  if (d) QT_ASSERT(qt_quantizer(g, d, &qc, &a, err) == 0, "%s", err);
  else QT_ASSERT(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  return qt_test_ptq_convert(g, &a);
}

/* The whole dataset `name` of file f as floats (n values), or NULL. */
static float *read_floats(hid_t f, const char *name, int64_t n) {
  hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  if (ds < 0) return NULL;
  hid_t sp = H5Dget_space(ds);
  const int64_t have = H5Sget_simple_extent_npoints(sp);
  float *x = have == n ? malloc((size_t)n * sizeof(float)) : NULL;
  if (x && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) < 0) {
    free(x);
    x = NULL;
  }
  H5Sclose(sp);
  H5Dclose(ds);
  return x;
}

/* Counts elements of a and b (n) that differ; prints the first. */
static int64_t differ(const char *what, const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (a[i] != b[i] && bad++ < 3) fprintf(stderr, "%s: element %lld: %.9g written, %.9g computed\n", what,
                                           (long long)i, a[i], b[i]);
  return bad;
}

/* The device read through the interface: the output read by name equals a run, and an
 * intermediate value has the size the graph says. */
static void read_value_by_name(const char *what, const qt_graph *g, const qt_backend_desc *d) {
  char err[QT_ERR_LEN];
  qt_device *dev = qt_device_open(g, d, err);
  QT_ASSERT(dev, "%s: %s", what, err);
  enum { N = 8 };
  float *x = malloc(sizeof(float) * N * 784), *a = malloc(sizeof(float) * N * 10), *b = malloc(sizeof(float) * N * 10);
  qt_test_fill_uniform(x, N * 784, -0.8f, 2.0f, 77);
  QT_CHECK(qt_device_run(dev, a, x, N, err) == 0);
  QT_CHECK(qt_device_read_value(dev, g->values[g->output].name, b, x, N, err) == 0);
  if (differ(what, a, b, N * 10)) qt_test_fail("%s: reading the output by name differs from running", what);
  QT_CHECK(qt_device_value_numel(dev, "pool1") == 14 * 14 * 32);
  float *p = malloc(sizeof(float) * N * 14 * 14 * 32);
  if (qt_device_read_value(dev, "pool1", p, x, N, err)) qt_test_fail("%s: read pool1: %s", what, err);
  if (qt_device_read_value(dev, "no_such_value", p, x, N, err) == 0 || !strstr(err, "no_such_value"))
    qt_test_fail("%s: an unknown value is not refused by name: %s", what, err);
  free(p);
  free(x);
  free(a);
  free(b);
  qt_device_free(dev);
}

/* qat_run --write-outputs --reference on the first 300 images of l's set: logits, a quantize
 * point and a pooled value equal qt_exact_run_values bit for bit; the quantize point holds
 * integers (multiples of its scale) within 1 LSB of the device's; the logits equal
 * qt_exact_run's. */
static void check_reference(const qt_graph *g, qt_loader *l) {
  char err[QT_ERR_LEN];
  remove("reference.h5");
  const int st =
      run("outputs_model.h5 --images 300 --batch 128 --write-outputs reference.h5 --reference --values "
          "relu1.fq.quantize,pool2");
  if (st != 0 || access("reference.h5", R_OK) != 0 || !strstr(out_text, "exact reference"))
    qt_test_fail("--write-outputs --reference: exit %d:\n%s", st, out_text);
  const int node = qt_graph_find_node(g, "relu1.fq.quantize");
  QT_ASSERT(node >= 0, "FashionCNN's Q/DQ graph has no relu1.fq.quantize");
  const int vals[2] = {g->nodes[node].output, g->nodes[qt_graph_find_node(g, "pool2")].output};
  const float s = g->nodes[node].q->scale[0];
  const int64_t relu1 = 28 * 28 * 32, pool2 = 7 * 7 * 64;
  hid_t f = H5Fopen("reference.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
  float *logits = read_floats(f, "logits", 300 * 10), *v1 = read_floats(f, "relu1.fq.quantize", 300 * relu1),
        *v2 = read_floats(f, "pool2", 300 * pool2);
  QT_ASSERT(logits && v1 && v2, "reference.h5: a dataset is missing or has the wrong size");
  H5Fclose(f);
  qt_exact *x = qt_exact_open(g, err);
  qt_device *dev = qt_device_open(g, NULL, err);
  QT_ASSERT(x && dev, "%s", err);
  float *o = malloc(sizeof(float) * 128 * 10), *o2 = malloc(sizeof(float) * 128 * 10),
        *d1 = malloc(sizeof(float) * 128 * relu1), *d2 = malloc(sizeof(float) * 128 * pool2),
        *dv = malloc(sizeof(float) * 128 * relu1);
  float *const dst[2] = {d1, d2};
  const float *xb;
  const int32_t *lab;
  int n;
  int64_t at = 0, bad = 0, off_grid = 0, over = 0, ones = 0;
  qt_loader_start_epoch(l, 0);
  while ((n = qt_loader_next(l, &xb, &lab)) > 0) {
    QT_ASSERT(qt_exact_run_values(x, o, xb, n, vals, dst, 2, err) == 0, "%s", err);
    QT_ASSERT(qt_exact_run(x, o2, xb, n, err) == 0, "%s", err);
    QT_ASSERT(qt_device_read_value(dev, "relu1.fq.quantize", dv, xb, n, err) == 0, "%s", err);
    bad += differ("reference logits", logits + at * 10, o, (int64_t)n * 10) +
           differ("qt_exact_run_values against qt_exact_run", o, o2, (int64_t)n * 10) +
           differ("reference relu1.fq.quantize", v1 + at * relu1, d1, (int64_t)n * relu1) +
           differ("reference pool2", v2 + at * pool2, d2, (int64_t)n * pool2);
    for (int64_t k = 0; k < (int64_t)n * relu1; k++) {
      const double q = (double)d1[k] / s, lsb = fabs((double)d1[k] - (double)dv[k]) / s;
      off_grid += fabs(q - nearbyint(q)) > 1e-3;
      over += lsb > 1.0 + 1e-3;
      ones += lsb > 0.5;
    }
    at += n;
  }
  printf("--reference: relu1.fq.quantize, the device against the exact reference: %lld of %lld values 1 LSB apart\n",
         (long long)ones, (long long)(at * relu1));
  if (bad || at != 300) qt_test_fail("--reference: %lld written values differ from the reference's", (long long)bad);
  if (off_grid || over)
    qt_test_fail("--reference: relu1.fq.quantize: %lld values off its integer grid, %lld over 1 LSB from the device",
                 (long long)off_grid, (long long)over);
  if (run("outputs_model.h5 --images 10 --reference") != 2 || !strstr(out_text, "--write-outputs"))
    qt_test_fail("--reference without --write-outputs is not refused:\n%s", out_text);
  QT_FREE_ALL(o, o2, d1, d2, dv, logits, v1, v2);
  qt_device_free(dev);
  qt_exact_free(x);
}

int main(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = converted("", NULL);
  QT_ASSERT(qt_qdq_save("outputs_model.h5", g, err) == 0, "%s", err);
  read_value_by_name("onednn_cpu", g, NULL);
  qt_backend_desc accel;
  QT_ASSERT(qt_backend_desc_load(&accel, qt_test_path("experiments/accel_fictional.ini"), err) == 0, "%s", err);
  qt_graph *ga = converted("", &accel);
  read_value_by_name("accelerator", ga, &accel);
  qt_graph_free(ga);
  qt_graph *g32 = converted("fc2=fp32", NULL);
  QT_CHECK(qt_output_lsb(g32) == 0.0f && qt_output_lsb(g) > 0.0f);
  { /* where a node runs, asked the same way of every device: fc2 left in fp32 falls back */
    qt_device *dev = qt_device_open(g32, NULL, err);
    QT_ASSERT(dev, "%s", err);
    const char *reason = NULL;
    QT_CHECK(qt_device_node_on_backend(dev, "conv1", NULL) == 1);
    QT_CHECK(qt_device_node_on_backend(dev, "fc2", &reason) == 0 && reason && reason[0]);
    QT_CHECK(qt_device_node_on_backend(dev, "no_such_node", NULL) == -1);
    qt_device_free(dev);
  }
  QT_ASSERT(qt_qdq_save("outputs_fp32_output.h5", g32, err) == 0, "%s", err);
  qt_graph_free(g32);

  if (access("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", R_OK) == 0) {
    /* --write-outputs: logits, labels and two intermediate values of the first 300 images */
    remove("outputs.h5");
    int st = run("outputs_model.h5 --images 300 --batch 128 --write-outputs outputs.h5 --values relu1,pool2");
    if (st != 0 || access("outputs.h5", R_OK) != 0 || qt_test_temp_left("outputs.h5"))
      qt_test_fail("--write-outputs: exit %d, outputs.h5 %s:\n%s", st, access("outputs.h5", R_OK) ? "missing" : "there",
                   out_text);
    static qt_options opts;
    qt_status sst = {0};
    qt_dataset test = {0};
    qt_loader_config lc;
    QT_ASSERT(qt_stage_test_data(NULL, 300, 128, &opts, &test, &lc, &sst) == 0, "%s", sst.msg);
    qt_loader *l = qt_loader_create(&test, &lc, err);
    qt_device *dev = qt_device_open(g, NULL, err);
    QT_ASSERT(l && dev, "%s", err);
    hid_t f = H5Fopen("outputs.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
    const int64_t relu1 = 28 * 28 * 32, pool2 = 7 * 7 * 64;
    float *logits = read_floats(f, "logits", 300 * 10), *v1 = read_floats(f, "relu1", 300 * relu1),
          *v2 = read_floats(f, "pool2", 300 * pool2), *labels = read_floats(f, "labels", 300);
    QT_ASSERT(logits && v1 && v2 && labels, "outputs.h5: a dataset is missing or has the wrong size");
    float *o = malloc(sizeof(float) * 128 * relu1);
    const float *x;
    const int32_t *lab;
    int n;
    int64_t at = 0, bad = 0;
    qt_loader_start_epoch(l, 0);
    while ((n = qt_loader_next(l, &x, &lab)) > 0) {
      QT_ASSERT(qt_device_run(dev, o, x, n, err) == 0, "%s", err);
      bad += differ("logits", logits + at * 10, o, (int64_t)n * 10);
      for (int i = 0; i < n; i++) bad += labels[at + i] != (float)lab[i];
      QT_ASSERT(qt_device_read_value(dev, "relu1", o, x, n, err) == 0, "%s", err);
      bad += differ("relu1", v1 + at * relu1, o, (int64_t)n * relu1);
      QT_ASSERT(qt_device_read_value(dev, "pool2", o, x, n, err) == 0, "%s", err);
      bad += differ("pool2", v2 + at * pool2, o, (int64_t)n * pool2);
      at += n;
    }
    if (bad || at != 300) qt_test_fail("--write-outputs: %lld written values differ from the device's (%lld images)",
                                       (long long)bad, (long long)at);
    H5Fclose(f);
    check_reference(g, l);
    free(o);
    free(logits);
    free(v1);
    free(v2);
    free(labels);
    qt_device_free(dev);
    qt_loader_free(l);
    qt_dataset_free(&test);
    if (run("outputs_model.h5 --images 10 --values relu1") != 2 || !strstr(out_text, "--write-outputs"))
      qt_test_fail("--values without --write-outputs is not refused:\n%s", out_text);
    if (run("outputs_model.h5 --images 10 --write-outputs bad.h5 --values no_such") != 2 || !strstr(out_text, "no_such"))
      qt_test_fail("--values naming no value is not refused:\n%s", out_text);

    /* an fp32 output: no output LSB; the comparison says so and passes */
    st = run("outputs_fp32_output.h5 --images 300 --batch 128 --compare");
    if (st != 0 || !strstr(out_text, "fp32 output (no output LSB)") || strstr(out_text, "over 1 LSB"))
      qt_test_fail("--compare on an fp32 output: exit %d:\n%s", st, out_text);
    st = run("outputs_model.h5 --images 300 --batch 128 --compare");
    if (st != 0 || !strstr(out_text, "logits over 1 LSB")) qt_test_fail("--compare: exit %d:\n%s", st, out_text);
  }
  qt_graph_free(g);
  return qt_test_finish();
}
