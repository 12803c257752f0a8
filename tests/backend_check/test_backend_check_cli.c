/* qat_backend_check as a command: exit status 1 with the violations listed for FashionCNN with
 * full-range 8-bit weights on a forced non-VNNI ISA, 0 with --warn, with VNNI forced, or with
 * 7-bit weights; a model quantized for the accelerator passes its description and --partition
 * prints what runs where (fc1 on the CPU with its reason); a oneDNN model fails the accelerator
 * check; bad input (missing model, bad option, bad description, --isa for an accelerator, a
 * prepared graph) exits 2 with a message. With Fashion-MNIST installed, --run compares the
 * accelerator with the Q/DQ graph on the first test images: bit for bit with the int32 biases its
 * Quantizer chose (exit 0), over the rule with float biases instead (exit 1); and --quantize
 * PTQ-calibrates an fp32 checkpoint with the accelerator's Quantizer into a new directory. */
#include <sys/wait.h>
#include <unistd.h>

#include "tests/backend_check/bcheck_util.h"
#include "train/train.h"
#include "tests/common/quantizer_util.h"

#ifndef QT_BACKEND_CHECK
#error "QT_BACKEND_CHECK (the qat_backend_check binary) must be defined by the build"
#endif

static char out_text[1 << 16], err_text[1 << 14];

static void slurp(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  fclose(f);
}

/* Runs the command with args; returns its exit status, stdout and stderr in out_text / err_text. */
static int run(const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s %s > bcheck_stdout.txt 2> bcheck_stderr.txt", QT_BACKEND_CHECK, args);
  int st = system(cmd);
  slurp("bcheck_stdout.txt", out_text, sizeof out_text);
  slurp("bcheck_stderr.txt", err_text, sizeof err_text);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect(const char *args, int status, const char *in_stdout, const char *in_stderr) {
  int st = run(args);
  if (st != status || (in_stdout && !strstr(out_text, in_stdout)) || (in_stderr && !strstr(err_text, in_stderr)))
    qt_test_fail("qat_backend_check %s: exit %d (want %d), stdout %s '%s', stderr %s '%s'\n--- stdout:\n%s--- stderr:\n%s",
                 args, st, status, in_stdout && !strstr(out_text, in_stdout) ? "lacks" : "has",
                 in_stdout ? in_stdout : "", in_stderr && !strstr(err_text, in_stderr) ? "lacks" : "has",
                 in_stderr ? in_stderr : "", out_text, err_text);
}

int main(void) {
  char args[1024], err[QT_ERR_LEN];
  const char *desc = qt_test_path("experiments/accel_fictional.ini");
  char desc_path[512];
  snprintf(desc_path, sizeof desc_path, "%s", desc);
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph_free(ptq_model("fashion_cnn", NULL, 8, 8, 1, "cli_w8a8.h5"));
  qt_graph_free(ptq_model("fashion_cnn", NULL, 8, 8, 0, "cli_w7a8.h5"));
  qt_graph_free(ptq_model("fashion_cnn", &d, 8, 8, 1, "cli_accel.h5"));

  expect("cli_w8a8.h5 --isa no_vnni", 1, "conv1: [saturation] u8 x s8 pair sums reach", NULL);
  if (!strstr(out_text, "FAIL: 4 violations (saturation 4)")) qt_test_fail("no verdict line:\n%s", out_text);
  expect("cli_w8a8.h5 --isa no_vnni --warn", 0, "[saturation]", NULL);
  expect("cli_w8a8.h5 --isa vnni", 0, "PASS: no violations", NULL);
  /* --partition lowers on this CPU: full-range 8-bit weights run in int8 kernels only with VNNI
   * (without it their pair sums could saturate: fp32 fallbacks naming that); 7-bit ones everywhere */
  if (qt_cpu_has_vnni()) {
    expect("cli_w8a8.h5 --isa vnni --partition", 0, "partitions of fashion_cnn: 7 int8, 0 fallback", NULL);
  } else {
    expect("cli_w8a8.h5 --isa vnni --partition", 0, "partitions of fashion_cnn: 3 int8, 7 fallback", NULL);
    if (!strstr(out_text, "conv2d in fp32: u8 x s8 pair sums can pass 32767"))
      qt_test_fail("no VNNI: conv1's fallback does not say why:\n%s", out_text);
  }
  expect("cli_w7a8.h5 --isa no_vnni --partition", 0, "partitions of fashion_cnn: 7 int8, 0 fallback", NULL);
  expect("cli_w7a8.h5 --isa no_vnni", 0, "PASS: no violations", NULL);
  snprintf(args, sizeof args, "cli_accel.h5 --backend %s --partition", desc_path);
  expect(args, 0, "fc1: fp32 layer (weights not quantized): 128 output features > max_channels 64", NULL);
  if (!strstr(out_text, "PASS: no violations") || !strstr(out_text, "partitions of fashion_cnn on fict_npu: 2 accelerator"))
    qt_test_fail("accelerator model: no PASS or no partition header:\n%s", out_text);
  snprintf(args, sizeof args, "cli_w8a8.h5 --backend %s", desc_path);
  expect(args, 1, "[power-of-two]", NULL);

  /* bad input */
  expect("no_such_model.h5", 2, NULL, "no_such_model.h5");
  expect("cli_w8a8.h5 --isa sometimes", 2, NULL, "--isa expects auto, vnni or no_vnni");
  snprintf(args, sizeof args, "cli_w8a8.h5 --backend %s --isa no_vnni", desc_path);
  expect(args, 2, NULL, "--isa applies to the onednn_cpu backend");
  FILE *f = fopen("bad_accel.ini", "w");
  QT_ASSERT(f, "write bad_accel.ini");
  fprintf(f, "[accelerator]\nname = npu\nops = conv2d, softmax\nweight_bits = 8\nactivation_bits = 8\n"
             "per_tensor_only = true\nsymmetric = true\npower_of_two_scales = true\nmax_channels = 64\n");
  fclose(f);
  expect("cli_w8a8.h5 --backend bad_accel.ini", 2, NULL, "bad_accel.ini:3: [accelerator] ops: 'softmax'");
  expect("cli_w8a8.h5 --backend no_such_accel.ini", 2, NULL, "no_such_accel.ini");
  expect("", 2, NULL, "usage");
  {
    qt_graph *g = qt_model_build("fashion_cnn", err);
    qt_graph *p = qt_test_prepare_ptq_onednn(g);
    for (int i = 0; i < p->n_nodes; i++) {
      qt_qstate *qs[2] = {p->nodes[i].q, p->nodes[i].wq};
      for (int k = 0; k < 2; k++)
        if (qs[k]) qs[k]->calibrated = 1;
    }
    qt_graph_set_mode(p, QT_MODE_EVAL);
    QT_ASSERT(qt_qdq_save("cli_prepared.h5", p, err) == 0, "%s", err);
    qt_graph_free(p);
    qt_graph_free(g);
    expect("cli_prepared.h5", 2, NULL, "prepared");
  }

  if (access("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", R_OK) == 0) {
    /* The accelerator's Quantizer gives the model int32 biases (int32_bias = true), the integers
     * the simulator adds: bit for bit with the Q/DQ graph. (With float biases, which the device
     * rounded to accumulator units, this untrained model was 2 LSB away with 99.02% identical
     * top-1 and failed the agreement rule.) */
    snprintf(args, sizeof args, "cli_accel.h5 --backend %s --run --images 512", desc_path);
    expect(args, 0, "run: 512 test images: device top-1", NULL);
    if (!strstr(out_text, "max difference 0 LSB, 0 of 5120 logits differ"))
      qt_test_fail("accelerator --run: not bit for bit with the Q/DQ graph:\n%s", out_text);
    /* The same model with float biases (the audit copies kept, the integers dropped) fails the rule */
    {
      qt_graph *fb = qt_qdq_load("cli_accel.h5", err);
      QT_ASSERT(fb, "%s", err);
      for (int i = 0; i < fb->n_nodes; i++)
        if (fb->nodes[i].wq) {
          fb->nodes[i].wq->spec.bias_int32 = 0;
          free(fb->nodes[i].wq->qbias);
          fb->nodes[i].wq->qbias = NULL;
          fb->nodes[i].wq->n_qbias = 0;
        }
      QT_ASSERT(qt_qdq_save("cli_accel_float_bias.h5", fb, err) == 0, "%s", err);
      qt_graph_free(fb);
      snprintf(args, sizeof args, "cli_accel_float_bias.h5 --backend %s --run --images 512", desc_path);
      expect(args, 1, "run: 512 test images: device top-1", NULL);
      if (!strstr(out_text, "run: FAIL: the device must stay within 1 output LSB"))
        qt_test_fail("accelerator --run, float biases: no FAIL line:\n%s", out_text);
    }
    /* --quantize: PTQ of an fp32 checkpoint with the accelerator's Quantizer, into a new directory */
    qt_graph *g = qt_model_build("fashion_cnn", err);
    qt_graph_init_params(g, 3);
    qt_checkpoint_meta meta = {0, 0, 3, NULL};
    QT_ASSERT(qt_checkpoint_save("cli_fp32.h5", g, NULL, &meta, err) == 0, "%s", err);
    qt_graph_free(g);
    f = fopen("cli_ptq.ini", "w");
    QT_ASSERT(f, "write cli_ptq.ini");
    fprintf(f, "[model]\nname = fashion_cnn\n[data]\ntrain_limit = 512\ntest_limit = 256\n[quant]\nmode = ptq\n"
               "fp32_checkpoint = cli_fp32.h5\ncalibration_batches = 2\n");
    fclose(f);
    snprintf(args, sizeof args, "--quantize cli_ptq.ini cli_out/ptq/model_qdq.h5 --backend %s --run", desc_path);
    expect(args, 0, "calibrated on 2 batches; wrote cli_out/ptq/model_qdq.h5", NULL);
    if (!strstr(out_text, "PASS: no violations") || !strstr(out_text, "run: 256 test images"))
      qt_test_fail("--quantize: no PASS or no run line:\n%s", out_text);
    expect("--quantize cli_ptq.ini cli_out/x.h5 --backend onednn_cpu --config cli_ptq.ini", 2, NULL, "drop --config");
  }
  return qt_test_finish();
}
