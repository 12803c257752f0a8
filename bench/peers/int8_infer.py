"""int8 inference of our models on ExecuTorch's XNNPACK delegate beside this framework's int8
devices (speed and accuracy), and the PTQ accuracy of ONNX Runtime's quantize_static and AIMET's
AdaRound on the same fp32 checkpoints.

    bench/peers/.venv/bin/python bench/peers/int8_infer.py                 # the full set
    bench/peers/.venv/bin/python bench/peers/int8_infer.py --models fashion_cnn --seeds 0 \
        --train-limit 2000 --test-limit 1000 --fp32-epochs 1 --rounds 1 --repeat 1 \
        --latency-runs 50 --adaround-iterations 50                         # a smoke run

Checkpoints: the fp32 checkpoint of each (model, seed), trained by qat_train with the grid's fp32
recipe into WORK/ours/ (common.py; reused when unchanged), loaded into the PyTorch twin.

Speed (the first seed only; --threads threads, default 2, every engine):
  ExecuTorch: the twin exported (torch.export.export), quantized with PT2E and XNNPACKQuantizer
      (per-channel symmetric weights, get_symmetric_quantization_config; HistogramObserver
      activations calibrated on the grid's [ptq] number of training batches), re-exported at a
      static batch (256, and 1), lowered with to_edge_transform_and_lower(partitioner=
      [XnnpackPartitioner()]) and to_executorch(), and run from the .pte buffer by
      executorch.runtime (threadpool set with portable_lib._unsafe_reset_threadpool). The fp32
      model lowered the same way without quantization is timed too. Ops left outside the
      delegate are listed.
  Ours: qat_train's grid [ptq] W8A8 row from the same checkpoint, for the oneDNN backend and
      (quant.backend=xnnpack, its own Quantizer) the XNNPACK backend; `qat_report MODEL_QDQ
      --backend B --fp32 CKPT` gives batch-256 images/s (model time, best of --rounds rounds of 8
      batches) and the int8 device's accuracy, `bench_int8 MODEL_QDQ --backend B --batch 1
      --int8-only` the batch-1 rate (latency = 1 / rate).
  Batch 256: warm-up, then the best of --rounds rounds of 8 batches of the first 256 test
  images; batch 1: the median and best of --latency-runs single-image runs per round. The whole
  sequence runs --repeat times and every figure keeps its best. ONNX Runtime's speed is left to
  bench/bench_ort.py.
PTQ accuracy (every seed):
  ONNX Runtime quantize_static: the twin exported to ONNX (torch.onnx.export, opset 17), then
      onnxruntime.quantization.shape_inference.quant_pre_process, then quantize_static with
      QuantFormat.QDQ, per_channel=True, QUInt8 activations and QInt8 weights (W8A8; W4A8: QInt4
      weights), calibrated with MinMax, Entropy and Percentile (CalibrationMethod) on the grid's
      calibration batches; accuracy from an InferenceSession (CPU) on the test images.
  AIMET (aimet-torch, if it installed): BN folded (fold_all_batch_norms), then AdaRound
      (Adaround.apply_adaround, --adaround-batches batches, --adaround-iterations iterations per
      layer; by default AIMET's own: 10,000 at 8-bit weights, 15,000 below), QuantizationSimModel with the per-channel config and the
      AdaRound weight encodings loaded and frozen, activation encodings computed on the
      calibration batches (tf_enhanced); the same without AdaRound (nearest rounding) beside it.
  NNCF (if it installed): nncf.quantize on the twin with the calibration batches (its default
      preset: symmetric, per-channel weights; fast bias correction), 4-bit weights through
      AdvancedQuantizationParameters; accuracy of the returned fake-quantized model.
  Brevitas (if it installed): its ImageNet example's PTQ flow (preprocess_for_quantize,
      quantize_model with the fx backend at the given bits, calibration_mode; then
      bias_correction_mode), the fake-quant model's accuracy.
  Ours: the grid's [ptq] rows, and the same with PTQ-MSE ranges and AdaRound
      (experiments/grid/reconstruction.ini's [ptq_adaround]: 2000 steps per layer unless
      --adaround-iterations; Q/DQ graph and int8 device accuracies).
Each part (ours, ort, aimet, nncf, brevitas, speed) runs in a process of its own.
"""
import argparse
import copy
import logging
import os
import re
import subprocess
import sys
import tempfile
import time

logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import models  # noqa: E402
import pt2e  # noqa: E402

BATCH, BATCHES = 256, 8


def split(text):
    return [t.strip() for t in text.split(",") if t.strip()]


# ---- ExecuTorch --------------------------------------------------------------------------------

def lower_pte(module, batch):
    """A .pte buffer of `module` (nn.Module or converted GraphModule) at a static batch, lowered
    to XNNPACK; with the ops left outside the delegate."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    ep = torch.export.export(module, (torch.zeros(batch, 1, 28, 28),))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    left = sorted({str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target)
                   for n in edge.exported_program().graph.nodes
                   if n.op == "call_function" and "executorch_call_delegate" not in str(n.target)
                   and "getitem" not in str(n.target)})
    return edge.to_executorch().buffer, left


_THREADPOOL = []


class PteRunner:
    """A loaded .pte program's forward method (the program object is kept alive with it)."""

    def __init__(self, buffer, threads):
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime
        if _THREADPOOL != [threads]:  # once per process, before any method runs
            portable_lib._unsafe_reset_threadpool(threads)
            _THREADPOOL[:] = [threads]
        self.buffer = buffer
        self.program = Runtime.get().load_program(buffer)
        self.method = self.program.load_method("forward")

    def __call__(self, x):
        return self.method.execute([x.contiguous()])[0]


def pte_accuracy(run, x, y, batch):
    correct = 0
    for i in range(0, x.shape[0], batch):
        xb = x[i:i + batch]
        n = xb.shape[0]
        if n < batch:  # a static batch: pad the last one
            xb = torch.cat([xb, torch.zeros(batch - n, *xb.shape[1:])])
        correct += int((run(xb)[:n].argmax(1) == y[i:i + n]).sum())
    return correct / x.shape[0]


def time_throughput(run, xb, rounds):
    for _ in range(3):
        run(xb)
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(BATCHES):
            run(xb)
        best = max(best, BATCHES * xb.shape[0] / (time.perf_counter() - t))
    return best


def time_latency(run, x1, rounds, runs):
    """(median, best) milliseconds of single-image runs over `rounds` rounds."""
    for _ in range(10):
        run(x1)
    samples = []
    for _ in range(rounds):
        for _ in range(runs):
            t = time.perf_counter()
            run(x1)
            samples.append((time.perf_counter() - t) * 1000.0)
    samples.sort()
    return samples[len(samples) // 2], samples[0]


def executorch_models(fp32_model, calib, threads):
    """{'fp32': {256: runner, 1: runner}, 'int8': ...} and the ops left outside the delegate."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    q, _ = pt2e.make_quantizer("xnnpack", "w8a8", is_qat=False)
    prepared = prepare_pt2e(pt2e.export(copy.deepcopy(fp32_model).eval(), calib[0]), q)
    with torch.no_grad():
        for xb in calib:
            prepared(xb)
    converted = convert_pt2e(prepared)
    out, left = {}, {}
    for kind, module in (("fp32", copy.deepcopy(fp32_model).eval()), ("int8", converted)):
        out[kind] = {}
        for b in (BATCH, 1):
            buf, ops = lower_pte(module, b)
            out[kind][b] = PteRunner(buf, threads)
            left[kind] = ops
    return out, left


# ---- ours --------------------------------------------------------------------------------------

def report_cmd(build, model, qdq, ckpt, backend, rounds):
    cmd = [os.path.join(build, "bin", "qat_report"), qdq, "--backend", backend, "--probe-images", "0",
           "--timing-rounds", str(rounds), "--fp32", ckpt]
    if model == "mobilenet_onnx":
        cmd += ["--model", os.path.join(common.ROOT, "tests", "onnx", "models", "mobilenet.onnx")]
    return cmd


def run_ours_speed(build, model, qdq, ckpt, backend, rounds, threads, test_limit):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = report_cmd(build, model, qdq, ckpt, backend, rounds)
    if test_limit:
        cmd += ["--images", str(test_limit)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=common.ROOT)
    if p.returncode != 0:
        raise RuntimeError("qat_report exit %d: %s" % (p.returncode, (p.stderr or p.stdout)[-1500:]))
    out = p.stdout
    m = re.search(r"^inference at batch .*?(?:fp32 ([0-9.]+) images/s, )?int8 ([0-9.]+) images/s", out, re.M)
    if not m:
        raise RuntimeError("no timing line in qat_report's output")
    acc = {k: float(v) / 100 for k, v in re.findall(r"(fp32 model|Q/DQ graph|int8 device)\s+top-1\s+([0-9.]+)%", out)}
    res = {"fp32_images_per_s": float(m.group(1)) if m.group(1) else None, "int8_images_per_s": float(m.group(2)),
           "accuracy": acc, "command": cmd}
    cmd1 = [os.path.join(build, "bin", "bench_int8"), qdq, "--backend", backend, "--batch", "1", "--seconds", "1",
            "--rounds", str(max(1, rounds)), "--int8-only"]
    p = subprocess.run(cmd1, capture_output=True, text=True, env=env, cwd=common.ROOT)
    m = re.search(r"int8 lowered\s+([0-9.]+) images/s", p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError("bench_int8 exit %d: %s" % (p.returncode, (p.stderr or p.stdout)[-1500:]))
    res["batch1_images_per_s"] = float(m.group(1))
    res["latency_ms"] = 1000.0 / float(m.group(1))
    res["command_batch1"] = cmd1
    return res


# ---- ONNX Runtime quantize_static --------------------------------------------------------------

def export_onnx(model, path):
    kw = dict(input_names=["input"], output_names=["logits"], opset_version=17,
              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    try:
        torch.onnx.export(model, (torch.zeros(2, 1, 28, 28),), path, dynamo=False, **kw)
    except Exception:  # noqa: BLE001 (the TorchScript exporter gone: the dynamo one)
        torch.onnx.export(model, (torch.zeros(2, 1, 28, 28),), path, dynamo=True, **kw)


def ort_accuracy(path, x, y, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    correct = 0
    for i in range(0, x.shape[0], BATCH):
        out = s.run(None, {"input": x[i:i + BATCH].numpy()})[0]
        correct += int((out.argmax(1) == y[i:i + BATCH].numpy()).sum())
    return correct / x.shape[0]


def ort_ptq(fp32_model, calib, x_test, y_test, bits_list, methods, threads, tmp):
    """[(bits, method, accuracy or None, error or None)]."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process
    fp32_path, pre_path = os.path.join(tmp, "fp32.onnx"), os.path.join(tmp, "fp32_pre.onnx")
    export_onnx(copy.deepcopy(fp32_model).eval(), fp32_path)
    quant_pre_process(fp32_path, pre_path)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            xb = next(self.it, None)
            return None if xb is None else {"input": xb.numpy()}

    out = []
    for bits in bits_list:
        w, a = pt2e.parse_bits(bits)
        for method in methods:
            qpath = os.path.join(tmp, "%s_%s.onnx" % (bits, method))
            try:
                if a != 8 or w not in (4, 8):
                    raise ValueError("quantize_static: %s not measured (QUInt8 activations; QInt8/QInt4 weights)" % bits)
                quantize_static(pre_path, qpath, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                                activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8 if w == 8 else QuantType.QInt4,
                                calibrate_method=getattr(CalibrationMethod, method))
                out.append((bits, method, ort_accuracy(qpath, x_test, y_test, threads), None))
            except Exception as e:  # noqa: BLE001
                out.append((bits, method, None, common.error_text(e)[0]))
    return out


# ---- AIMET AdaRound ----------------------------------------------------------------------------

def aimet_ptq(fp32_model, calib, x_test, y_test, bits_list, n_batches, iterations, tmp):
    """[(bits, 'adaround'|'nearest', accuracy or None, error or None)]."""
    from aimet_torch.adaround.adaround_weight import Adaround, AdaroundParameters
    from aimet_torch.batch_norm_fold import fold_all_batch_norms
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantsim import QuantizationSimModel
    import aimet_torch.common.quantsim_config as qc
    logging.disable(logging.INFO)  # AIMET logs every layer and step at INFO
    config = os.path.join(os.path.dirname(qc.__file__), "default_config_per_channel.json")
    from aimet_torch.nn.modules.custom import Add as AimetAdd
    dummy = torch.zeros(1, 1, 28, 28)
    folded = copy.deepcopy(fp32_model).eval()
    # the twins' residual `Add` modules (a + b) as AIMET's own, which its QuantSim knows how to quantize
    for parent in list(folded.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "Add" and not list(child.parameters()):
                setattr(parent, name, AimetAdd())
    fold_all_batch_norms(folded, input_shapes=(1, 1, 28, 28))
    loader = [(xb, torch.zeros(xb.shape[0], dtype=torch.int64)) for xb in calib]

    def calibrate(model, _):
        with torch.no_grad():
            for xb in calib:
                model(xb)

    out = []
    for bits in bits_list:
        w, a = pt2e.parse_bits(bits)
        for variant in ("adaround", "nearest"):
            try:
                model = copy.deepcopy(folded)
                enc = None
                if variant == "adaround":
                    params = AdaroundParameters(data_loader=loader, num_batches=min(n_batches, len(loader)),
                                                default_num_iterations=iterations or None)
                    model = Adaround.apply_adaround(model, dummy, params, path=tmp, filename_prefix="adaround_" + bits,
                                                    default_param_bw=w,
                                                    default_quant_scheme=QuantScheme.post_training_tf_enhanced,
                                                    default_config_file=config)
                    enc = os.path.join(tmp, "adaround_%s.encodings" % bits)
                sim = QuantizationSimModel(model, dummy, quant_scheme=QuantScheme.post_training_tf_enhanced,
                                           default_param_bw=w, default_output_bw=a, config_file=config)
                if enc:
                    sim.load_encodings(enc, strict=False, partial=True, requires_grad=False, allow_overwrite=False)
                sim.compute_encodings(calibrate, None)
                out.append((bits, variant, models.accuracy(sim.model, x_test, y_test), None))
            except Exception as e:  # noqa: BLE001
                out.append((bits, variant, None, common.error_text(e)[0]))
    return out


# ---- NNCF --------------------------------------------------------------------------------------

def nncf_ptq(fp32_model, calib, x_test, y_test, bits_list):
    """[(bits, accuracy or None, error or None)]: nncf.quantize with its default preset
    (symmetric, per-channel weights) and fast bias correction on the calibration batches; fewer
    weight bits through AdvancedQuantizationParameters."""
    os.environ.setdefault("NNCF_EXTENSION_LOAD_TIMEOUT", "0")  # its C++ extension builds on first use
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, QuantizationParameters
    out = []
    for bits in bits_list:
        w, a = pt2e.parse_bits(bits)
        try:
            adv = AdvancedQuantizationParameters(
                weights_quantization_params=QuantizationParameters(num_bits=w) if w != 8 else None,
                activations_quantization_params=QuantizationParameters(num_bits=a) if a != 8 else None)
            q = nncf.quantize(copy.deepcopy(fp32_model).eval(), nncf.Dataset(calib), subset_size=len(calib),
                              advanced_parameters=adv)
            out.append((bits, models.accuracy(q, x_test, y_test), None))
        except Exception as e:  # noqa: BLE001
            out.append((bits, None, common.error_text(e)[0]))
    return out


def brevitas_ptq(fp32_model, calib, x_test, y_test, bits_list):
    """[(bits, variant, accuracy or None, error or None)]: Brevitas's own PTQ flow as its ImageNet
    example runs it (brevitas_examples.imagenet_classification.ptq): preprocess_for_quantize (FX
    trace, BN folded), quantize_model with the fx backend (int8-style integer formats at the given
    bits: per-channel symmetric weights, per-tensor activations, 99.999th percentile statistics,
    float scales, 32-bit bias), calibration_mode over the calibration batches, then (variant
    "bias correction") bias_correction_mode over them too; the fake-quant model's accuracy."""
    import torch
    from brevitas.graph.calibrate import bias_correction_mode, calibration_mode
    from brevitas.graph.quantize import preprocess_for_quantize
    from brevitas_examples.imagenet_classification.ptq.ptq_common import quantize_model
    out = []
    for bits in bits_list:
        w, a = pt2e.parse_bits(bits)
        try:
            m = preprocess_for_quantize(copy.deepcopy(fp32_model).eval())
            q = quantize_model(m, backend="fx", weight_bit_width=w, act_bit_width=a, bias_bit_width=32,
                               weight_quant_granularity="per_channel", act_quant_percentile=99.999,
                               act_quant_type="sym", scale_factor_type="float_scale", quant_format="int")
            q.eval()
            with torch.no_grad():
                with calibration_mode(q):
                    for xb in calib:
                        q(xb)
                out.append((bits, "calibration", models.accuracy(q, x_test, y_test), None))
                with bias_correction_mode(q):
                    for xb in calib:
                        q(xb)
                out.append((bits, "bias correction", models.accuracy(q, x_test, y_test), None))
        except Exception as e:  # noqa: BLE001
            err = common.error_text(e)[0]
            out += [(bits, v, None, err) for v in ("calibration", "bias correction") if not any(
                r[0] == bits and r[1] == v for r in out)]
    return out


# ---- main --------------------------------------------------------------------------------------

PARTS = ("ours", "ort", "aimet", "nncf", "brevitas", "speed")
PART_LABELS = {"ours": "this framework (qat_train)", "ort": "ONNX Runtime quantize_static",
               "aimet": "AIMET AdaRound", "nncf": "NNCF quantize", "brevitas": "Brevitas PTQ",
               "speed": "ExecuTorch XNNPACK / this framework (speed)"}


def log(m):
    print(m, flush=True)


# Our PTQ rows: (method label, overrides on the grid's [ptq] row, run directory tag). The second is
# experiments/grid/reconstruction.ini's [ptq_adaround] (PTQ-MSE ranges, then AdaRound per layer):
# the row to read beside AIMET's AdaRound.
OURS_PTQ = (("PTQ (grid [ptq])", [], None),
            ("PTQ-MSE + AdaRound (quant.adaround)",
             ["quant.activation_observer=histogram", "quant.activation_range=mse", "quant.adaround=true"], "adaround"))


def part_ours(a, model_name, seed, base, ckpt, calib, x_test, y_test, result):
    budget = common.budget_overrides(a.train_limit, a.test_limit)
    for bits in split(a.ptq_bits):
        for method, over, tag in OURS_PTQ:
            row = dict(base, framework="this framework (qat_train)", method=method, bits=bits)
            if tag == "adaround" and a.adaround_iterations:
                over = over + ["quant.adaround_iterations=%d" % a.adaround_iterations]
            try:
                _, s = common.run_ours(model_name, seed, "ptq", bits, a.work, a.build, a.threads, budget + over,
                                       log=log, tag=tag)
                row["accuracy"], row["int8_accuracy"] = common.stage(s, "qdq"), common.stage(s, "int8")
            except Exception as e:  # noqa: BLE001
                row["error"] = common.error_text(e)[0]
            result["ptq_accuracy"].append(row)
            log("  ours %s %s: %s" % (method, bits, row.get("error") or "Q/DQ %.4f, int8 %.4f" % (
                row["accuracy"] or float("nan"), row["int8_accuracy"] or float("nan"))))


def part_ort(a, model_name, seed, base, ckpt, calib, x_test, y_test, result, fp32_model):
    import onnxruntime
    with tempfile.TemporaryDirectory(prefix="peers_ort_") as tmp:
        try:
            rows = ort_ptq(fp32_model, calib, x_test, y_test, split(a.ptq_bits), split(a.ort_methods), a.threads, tmp)
        except Exception as e:  # noqa: BLE001
            rows = [(b, m, None, common.error_text(e)[0]) for b in split(a.ptq_bits) for m in split(a.ort_methods)]
    for bits, method, acc, err in rows:
        result["ptq_accuracy"].append(dict(base, framework="ONNX Runtime %s quantize_static" % onnxruntime.__version__,
                                           method="QDQ per-channel, %s calibration" % method, bits=bits,
                                           accuracy=acc, error=err))
        log("  ORT %s %s: %s" % (bits, method, err or "%.4f" % acc))


def part_aimet(a, model_name, seed, base, ckpt, calib, x_test, y_test, result, fp32_model):
    ver = common.versions(("aimet-torch",))["aimet-torch"]
    with tempfile.TemporaryDirectory(prefix="peers_aimet_") as tmp:
        try:
            if not ver:
                raise RuntimeError("aimet-torch is not installed (see bench/peers/.venv/install_report.json)")
            rows = aimet_ptq(fp32_model, calib, x_test, y_test, split(a.ptq_bits), a.adaround_batches,
                             a.adaround_iterations, tmp)
        except Exception as e:  # noqa: BLE001
            rows = [(b, v, None, common.error_text(e)[0]) for b in split(a.ptq_bits) for v in ("adaround", "nearest")]
    for bits, variant, acc, err in rows:
        label = ("AdaRound + QuantSim (tf_enhanced, per-channel)" if variant == "adaround"
                 else "QuantSim, nearest rounding (tf_enhanced, per-channel)")
        result["ptq_accuracy"].append(dict(base, framework="AIMET %s" % ver, method=label, bits=bits,
                                           accuracy=acc, error=err))
        log("  AIMET %s %s: %s" % (bits, variant, err or "%.4f" % acc))


def part_nncf(a, model_name, seed, base, ckpt, calib, x_test, y_test, result, fp32_model):
    ver = common.versions(("nncf",))["nncf"]
    try:
        if not ver:
            raise RuntimeError("nncf is not installed (see bench/peers/.venv/install_report.json)")
        rows = nncf_ptq(fp32_model, calib, x_test, y_test, split(a.ptq_bits))
    except Exception as e:  # noqa: BLE001
        rows = [(b, None, common.error_text(e)[0]) for b in split(a.ptq_bits)]
    for bits, acc, err in rows:
        result["ptq_accuracy"].append(dict(base, framework="NNCF %s" % ver,
                                           method="quantize (default preset, fast bias correction)", bits=bits,
                                           accuracy=acc, error=err))
        log("  NNCF %s: %s" % (bits, err or "%.4f" % acc))


def part_brevitas(a, model_name, seed, base, ckpt, calib, x_test, y_test, result, fp32_model):
    ver = common.versions(("brevitas",))["brevitas"]
    try:
        if not ver:
            raise RuntimeError("brevitas is not installed (see bench/peers/.venv/install_report.json)")
        rows = brevitas_ptq(fp32_model, calib, x_test, y_test, split(a.ptq_bits))
    except Exception as e:  # noqa: BLE001
        rows = [(b, v, None, common.error_text(e)[0]) for b in split(a.ptq_bits)
                for v in ("calibration", "bias correction")]
    for bits, variant, acc, err in rows:
        result["ptq_accuracy"].append(dict(base, framework="Brevitas %s" % ver,
                                           method="fx quantize_model (per-channel weights, percentile "
                                                  "99.999 activations), %s" % variant, bits=bits,
                                           accuracy=acc, error=err))
        log("  Brevitas %s %s: %s" % (bits, variant, err or "%.4f" % acc))


def part_speed(a, model_name, seed, base, ckpt, calib, x_test, y_test, result, fp32_model):
    budget = common.budget_overrides(a.train_limit, a.test_limit)
    skip = set(split(a.skip))
    speed, et, et_err, et_left, ours_dirs, ours_err = {}, None, None, {}, {}, {}
    if "executorch" not in skip:
        try:
            et, et_left = executorch_models(fp32_model, calib, a.threads)
            for kind in ("fp32", "int8"):
                speed[("et", kind)] = {"accuracy": pte_accuracy(et[kind][BATCH], x_test, y_test, BATCH)}
        except Exception as e:  # noqa: BLE001
            et_err = common.error_text(e)[0]
            log("  ExecuTorch FAILED: %s" % et_err)
    if "ours" not in skip:
        for backend, extra, tag in (("onednn", [], None), ("xnnpack", ["quant.backend=xnnpack"], "xnnpack")):
            try:
                ours_dirs[backend], _ = common.run_ours(model_name, seed, "ptq", "w8a8", a.work, a.build, a.threads,
                                                        budget + extra, log=log, tag=tag)
            except Exception as e:  # noqa: BLE001
                ours_err[backend] = common.error_text(e)[0]
    for _ in range(max(1, a.repeat)):  # the engines take turns; every figure keeps its best
        for backend, d in ours_dirs.items():
            if backend in ours_err:
                continue
            try:
                r = run_ours_speed(a.build, model_name, os.path.join(d, "model_qdq.h5"), ckpt, backend, a.rounds,
                                   a.threads, a.test_limit)
            except Exception as e:  # noqa: BLE001
                ours_err[backend] = common.error_text(e)[0]
                continue
            s = speed.setdefault(("ours", backend), {"images_per_s": 0.0, "latency_ms": None})
            s["images_per_s"] = max(s["images_per_s"], r["int8_images_per_s"])
            s["latency_ms"] = r["latency_ms"] if s["latency_ms"] is None else min(s["latency_ms"], r["latency_ms"])
            s["accuracy"] = r["accuracy"].get("int8 device")
            s["commands"] = [r["command"], r["command_batch1"]]
            if backend == "onednn" and r["fp32_images_per_s"]:
                f = speed.setdefault(("ours", "fp32"), {"images_per_s": 0.0})
                f["images_per_s"] = max(f["images_per_s"], r["fp32_images_per_s"])
                f["accuracy"] = r["accuracy"].get("fp32 model")
        if et:
            for kind in ("fp32", "int8"):
                s = speed[("et", kind)]
                ips = time_throughput(et[kind][BATCH], x_test[:BATCH].contiguous(), a.rounds)
                med, best = time_latency(et[kind][1], x_test[:1].contiguous(), a.rounds, a.latency_runs)
                s["images_per_s"] = max(s.get("images_per_s", 0.0), ips)
                s["latency_ms"] = med if s.get("latency_ms") is None else min(s["latency_ms"], med)
                s["latency_best_ms"] = best if s.get("latency_best_ms") is None else min(s["latency_best_ms"], best)
    et_ver = common.versions(("executorch",))["executorch"]
    labels = {("et", "fp32"): "ExecuTorch %s XNNPACK delegate, fp32" % et_ver,
              ("et", "int8"): "ExecuTorch %s XNNPACK delegate, int8 (PT2E XNNPACKQuantizer PTQ W8A8)" % et_ver,
              ("ours", "fp32"): "this framework, fp32 graph executor",
              ("ours", "onednn"): "this framework, int8 device (oneDNN), PTQ W8A8",
              ("ours", "xnnpack"): "this framework, int8 device (XNNPACK), PTQ W8A8"}
    for key, label in labels.items():
        row = {"model": model_name, "seed": seed, "engine": label, "threads": a.threads}
        if key in speed:
            row.update(speed[key])
            if key[0] == "et":
                row["ops_outside_delegate"] = et_left.get(key[1], [])
        elif key[0] == "et":
            row["error"] = et_err or "skipped (--skip executorch)"
        else:
            row["error"] = ours_err.get(key[1]) or ours_err.get("onednn") or "skipped (--skip ours)"
        result["speed"].append(row)
        log("  %-72s %s" % (label, row.get("error") or "%8.0f images/s%s  accuracy %s" % (
            row["images_per_s"], "  batch-1 %.3f ms" % row["latency_ms"] if row.get("latency_ms") else "",
            "%.4f" % row["accuracy"] if row.get("accuracy") is not None else "-")))


def run_part(a, part, result):
    """One part over every model and seed (speed: the first seed only)."""
    fp32_extra = common.budget_overrides(a.train_limit, a.test_limit) + (
        ["train.epochs=%d" % a.fp32_epochs] if a.fp32_epochs else [])
    x_train, y_train = models.load_fashion("train", a.train_limit)
    x_test, y_test = models.load_fashion("t10k", a.test_limit)
    seeds = [int(s) for s in split(a.seeds)]
    for model_name in split(a.models):
        ptq_rec = common.recipe(model_name, "ptq")
        for seed in seeds[:1] if part == "speed" else seeds:
            log("%s: %s seed %d" % (part, model_name, seed))
            try:
                ckpt, _ = common.fp32_checkpoint(model_name, seed, a.work, a.build, a.threads, fp32_extra, log=log)
                fp32_model = models.load_model(model_name, ckpt)
                fp32_acc = models.accuracy(fp32_model, x_test, y_test)
            except Exception as e:  # noqa: BLE001
                msg, tb = common.error_text(e)
                result["ptq_accuracy" if part != "speed" else "speed"].append(
                    {"model": model_name, "seed": seed, "framework": PART_LABELS[part], "engine": PART_LABELS[part],
                     "error": "fp32 checkpoint: " + msg, "traceback": tb})
                log("  fp32 checkpoint FAILED: %s" % msg)
                continue
            calib = pt2e.calibration_batches(x_train, y_train, ptq_rec, seed, int(ptq_rec["calibration_batches"]))
            base = {"model": model_name, "seed": seed, "fp32_accuracy": fp32_acc}
            args = (a, model_name, seed, base, ckpt, calib, x_test, y_test, result)
            if part == "ours":
                part_ours(*args)
            else:
                {"ort": part_ort, "aimet": part_aimet, "nncf": part_nncf, "brevitas": part_brevitas,
                 "speed": part_speed}[part](*args, fp32_model)
            common.write_json(a.out, result)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="fashion_cnn,res_cnn,mobilenet_onnx")
    ap.add_argument("--seeds", default="0,1,2", help="PTQ accuracy over these; speed on the first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--latency-runs", type=int, default=200)
    ap.add_argument("--ptq-bits", default="w8a8,w4a8")
    ap.add_argument("--ort-methods", default="MinMax,Entropy,Percentile")
    ap.add_argument("--adaround-batches", type=int, default=16, help="AIMET's advice: ceil(2000 / batch size)")
    ap.add_argument("--adaround-iterations", type=int, default=0,
                    help="per layer (0 = AIMET's default: 10,000 at 8 bits, 15,000 below)")
    ap.add_argument("--skip", default="", help="any of: ours, ort, aimet, nncf, brevitas, speed (a part), executorch (in speed)")
    ap.add_argument("--fp32-epochs", type=int, default=0)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    ap.add_argument("--work", default=common.DEFAULT_WORK)
    ap.add_argument("--build", default=os.path.join(common.ROOT, "build"))
    ap.add_argument("--out", default=None, help="result JSON (default WORK/int8_infer.json)")
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: one part, in a child process
    a = ap.parse_args()
    a.out = a.out or os.path.join(a.work, "int8_infer.json")
    torch.set_num_threads(a.threads)
    if a.part:
        result = {"speed": [], "ptq_accuracy": []}
        run_part(a, a.part, result)
        common.write_json(a.out, result)
        return
    # Each part runs in a process of its own: one peer's crash (a segfault in a native library)
    # costs only its own rows, which then carry the error.
    result = {"script": "int8_infer.py", "argv": sys.argv, "versions": common.versions(), "options": vars(a),
              "speed": [], "ptq_accuracy": [], "parts": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}}
    skip = set(split(a.skip))
    argv = [x for x in sys.argv[1:]]
    for part in PARTS:
        if part in skip:
            continue
        part_out = a.out + ".%s.json" % part
        if os.path.exists(part_out):
            os.remove(part_out)
        log("== %s" % part)
        t = time.time()
        p = subprocess.run([sys.executable, os.path.abspath(__file__)] + argv + ["--part", part, "--out", part_out],
                           stderr=subprocess.PIPE, text=True)
        sys.stderr.write(p.stderr[-4000:] if p.returncode else "")
        got = common.gridlib.read_json(part_out) or {"speed": [], "ptq_accuracy": []}
        result["parts"][part] = {"rc": p.returncode, "seconds": round(time.time() - t, 1)}
        if p.returncode != 0:
            why = ("killed by signal %d" % -p.returncode if p.returncode < 0 else "exit %d" % p.returncode)
            tail = [l for l in p.stderr.strip().splitlines() if l.strip()][-1:] or [""]
            msg = "%s process %s: %s" % (part, why, tail[0][:300])
            result["parts"][part]["error"] = msg
            done = {(r.get("model"), r.get("seed")) for r in got["speed"] + got["ptq_accuracy"]}
            for model_name in split(a.models):
                key = "speed" if part == "speed" else "ptq_accuracy"
                got[key].append({"model": model_name, "framework": PART_LABELS[part], "engine": PART_LABELS[part],
                                 "error": msg + ("" if all(m != model_name for m, _ in done) else " (after the rows shown)")})
        result["speed"] += got["speed"]
        result["ptq_accuracy"] += got["ptq_accuracy"]
        if os.path.exists(part_out):
            os.remove(part_out)
        common.write_json(a.out, result)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    common.write_json(a.out, result)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
