/* qat_backend_check MODEL_QDQ.h5 [--backend onednn_cpu|xnnpack|DESC.ini] [--isa auto|vnni|no_vnni] [--warn]
 *                   [--partition] [--run] [--config CFG.ini] [--images N] [--batch N]
 * qat_backend_check --quantize CFG.ini OUT_QDQ.h5 --backend DESC.ini [...the options above]
 *
 * The backend check pass (backend.h) as a command: every violation of the backend's constraints in
 * the Q/DQ graph file, with node and reason, for onednn_cpu (ISA from oneDNN, or --isa) or an
 * accelerator described by an INI file. --partition deploys it (qt_device) and prints the
 * partitions; --run compares the device with the Q/DQ reference on the config's test set (the one
 * agreement rule, eval/report.h). --quantize first makes OUT_QDQ.h5 with the pipeline's PTQ
 * stages (train/pipeline.h) and the backend's Quantizer, from CFG.ini's fp32 checkpoint.
 * Exit 0: no violations (or --warn) and, with --run, the device passes the rule; 1: violations,
 * or --run failing the rule; 2: bad input. */
#include <stdio.h>
#include <string.h>

#include "train/pipeline.h"

static int usage(void) {
  fprintf(stderr,
          "usage: qat_backend_check MODEL_QDQ.h5 [--backend onednn_cpu|xnnpack|DESC.ini] [--isa auto|vnni|no_vnni] "
          "[--warn]\n"
          "                         [--partition] [--run] [--config CFG.ini] [--images N] [--batch N]\n"
          "       qat_backend_check --quantize CFG.ini OUT_QDQ.h5 --backend DESC.ini [options above]\n");
  return 2;
}

/* --quantize: PTQ of CFG.ini's fp32 checkpoint with the backend's Quantizer (the pipeline's
 * stages), written to out_path. */
static int quantize(const char *cfg_path, const char *backend, const char *isa, const char *out_path, char *err) {
  char b[QT_OPT_STR + 32], i[64];
  const int onednn = strcmp(backend, "onednn_cpu") == 0 || strcmp(backend, "onednn") == 0;
  snprintf(b, sizeof b, onednn ? "quant.quantizer=onednn" : "quant.backend=%s", backend);
  snprintf(i, sizeof i, "quant.isa=%s", isa);
  char *overrides[] = {"quant.mode=ptq", onednn ? i : "quant.quantizer=backend", b};
  static qt_options o;
  qt_status st = {0};
  if (qt_options_load(cfg_path, overrides, 3, &o, err)) return -1;
  if (!qt_stage_ptq_to_file(&o, out_path, stdout, &st)) return 0;
  return qt_err(err, "%s", st.msg);
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  const char *model_path = NULL, *backend = "onednn_cpu", *quant_config = NULL, *isa_arg = "auto";
  qt_cli_data_options D = {.batch = 256};
  int warn = 0, partition = 0, run = 0, c;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
      backend = argv[++i];
    else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc)
      isa_arg = argv[++i];
    else if (strcmp(argv[i], "--warn") == 0)
      warn = 1;
    else if (strcmp(argv[i], "--partition") == 0)
      partition = 1;
    else if (strcmp(argv[i], "--run") == 0)
      run = partition = 1;
    else if ((c = qt_cli_data_option("qat_backend_check", "--config --images --batch", argc, argv, &i, &D)) != 0) {
      if (c < 0) return 2;
    } else if (strcmp(argv[i], "--quantize") == 0 && i + 2 < argc) {
      quant_config = argv[++i];
      model_path = argv[++i];
    } else if (argv[i][0] != '-' && !model_path)
      model_path = argv[i];
    else
      return usage();
  }
  if (!model_path) return usage();
  const qt_isa_choice isa = strcmp(isa_arg, "vnni") == 0      ? QT_ISA_VNNI
                            : strcmp(isa_arg, "no_vnni") == 0 ? QT_ISA_NO_VNNI
                                                              : QT_ISA_AUTO;
  char err[QT_ERR_LEN], why[QT_ERR_LEN];
  int status = 2;
  qt_backend_desc d;
  qt_graph *g = NULL;
  qt_device *dev = NULL;
  qt_backend_check_result r = {0};
  /* `cond && qt_err(...)`: qt_err sets the message and returns -1 (true) */
  if (isa == QT_ISA_AUTO && strcmp(isa_arg, "auto") != 0 &&
      qt_err(err, "--isa expects auto, vnni or no_vnni, found '%s'", isa_arg))
    goto fail;
  const int onednn = strcmp(backend, "onednn_cpu") == 0 || strcmp(backend, "onednn") == 0;
  if ((!onednn && strcmp(isa_arg, "auto") != 0 &&
       qt_err(err, "--isa applies to the onednn_cpu backend, not to %s", backend)) ||
      qt_backend_desc_named(&d, backend, isa, err)) /* onednn_cpu, xnnpack or a description file */
    goto fail;
  if (quant_config && D.config_path && qt_err(err, "--quantize takes its data from CFG.ini; drop --config")) goto fail;
  if (quant_config && quantize(quant_config, backend, isa_arg, model_path, why) &&
      qt_err(err, "--quantize %s: %s", quant_config, why))
    goto fail;
  if (!(g = qt_qdq_load(model_path, err)) || qt_backend_check(g, &d, &r, err)) goto fail;
  qt_backend_desc_print(&d, stdout);
  qt_backend_check_print(&r, stdout);
  status = r.n && !warn ? 1 : 0;
  if (r.n && warn) printf("(--warn: violations reported as warnings)\n");
  if (partition) {
    if (!(dev = qt_device_open(g, &d, err))) goto fail;
    qt_device_report(dev, stdout);
  }
  qt_status st = {0};
  const char *data_config = quant_config ? quant_config : D.config_path;
  const int rs = run ? qt_stage_compare_device(data_config, D.images, D.batch, dev, g, "run", &st) : 0;
  if (rs < 0 && qt_err(err, "%s", st.msg)) goto fail;
  status = rs ? 1 : status;
  goto done;
fail:
  fprintf(stderr, "qat_backend_check: %s\n", err);
  status = 2;
done:
  qt_backend_check_result_free(&r);
  qt_device_free(dev);
  qt_graph_free(g);
  return status;
}
