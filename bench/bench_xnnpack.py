#!/usr/bin/python3
"""int8 inference of FashionCNN on XNNPACK: this framework's XNNPACK device against its
oneDNN device and against PyTorch 1.13's quantized engines, `qnnpack` (XNNPACK's ancestor) and
`onednn`, side by side in one run: batch 256, 2 threads, the same fp32 weights, the same images.

Usage: /usr/bin/python3 bench/bench_xnnpack.py [--rounds 5] [--repeat 3] [--threads 2] [--build build]
           [--fp32 runs/fashion_cnn_fp32/checkpoint.h5]
           [--qdq-xnnpack runs/fashion_cnn_ptq_w8a8_xnnpack/model_qdq.h5]
           [--qdq-onednn runs/fashion_cnn_ptq_w8a8/model_qdq.h5]

Models: each backend gets the fp32 checkpoint quantized by its own Quantizer with the same PTQ
recipe (experiments/fashion_cnn_ptq_w8a8.ini: W8A8, calibration on 32 training batches), made
here when missing: `qat_train experiments/fashion_cnn_ptq_w8a8.ini` for oneDNN (u8 activations,
s8 per-channel weights) and the same with `quant.backend=xnnpack
output.dir=runs/fashion_cnn_ptq_w8a8_xnnpack` for XNNPACK (s8 activations with a zero point,
per-channel conv weights, per-tensor linear weights). Both run every layer as an int8 partition.

Ours: `qat_report MODEL_QDQ --backend B` without an fp32 model, so the device is timed alone:
two warm-up batches, then the best of --rounds rounds of 8 batches of the first 256 test images,
model time only. Its test accuracy is the device's on the 10,000 test images, from the same run.

PyTorch 1.13 (Debian's python3-torch; bench_infer.py's child process): the same FashionCNN
module reading the checkpoint by state_dict names, eval mode, quantized with the documented
default FX recipe of each engine: torch.backends.quantized.engine = E,
prepare_fx(model, get_default_qconfig_mapping(E)), calibration on 8 training batches of 256,
convert_fx. For `qnnpack` that mapping is HistogramObserver activations (quint8, reduce_range
False: the full [0, 255]) and per-tensor symmetric MinMaxObserver qint8 weights; for `onednn`,
the same activations and per-channel symmetric weights. Timing: 3 warm-up batches, the best of
--rounds rounds of 8 batches of the same 256 images, torch.set_num_threads(--threads), NCHW and
channels_last inputs (the faster row is the one compared). Accuracy on the 10,000 test images.

Every contender runs in its own process with OMP_NUM_THREADS = --threads (our XNNPACK device's
pthreadpool takes that many threads), and the environment is otherwise passed on as it is
(OMP_WAIT_POLICY included). The whole sequence runs --repeat times and every row keeps its best:
other processes only ever slow a measurement down. The goal: XNNPACK int8 >= 1.5x
PyTorch qnnpack. Run with both cores idle.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_infer import ensure_models, run_ours, run_torch  # noqa: E402
from bench_util import BestOf, torch_version  # noqa: E402

XNNPACK_DIR = os.path.join("runs", "fashion_cnn_ptq_w8a8_xnnpack")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--fp32", default=os.path.join(ROOT, "runs", "fashion_cnn_fp32", "checkpoint.h5"))
    ap.add_argument("--qdq-xnnpack", default=os.path.join(ROOT, XNNPACK_DIR, "model_qdq.h5"))
    ap.add_argument("--qdq-onednn", default=os.path.join(ROOT, "runs", "fashion_cnn_ptq_w8a8", "model_qdq.h5"))
    a = ap.parse_args()
    ensure_models(a.build, a.qdq_onednn, a.fp32)
    ensure_models(a.build, a.qdq_xnnpack, a.fp32, ["quant.backend=xnnpack", "output.dir=" + XNNPACK_DIR])
    version = torch_version()
    ours = [("xnnpack", "this framework, int8, XNNPACK device", a.qdq_xnnpack),
            ("onednn", "this framework, int8, oneDNN device", a.qdq_onednn)]
    engines = ("qnnpack", "onednn") if version else ()
    bests = BestOf()
    best, order, keep = bests.best, bests.order, bests.keep

    for _ in range(a.repeat):
        for backend, label, qdq in ours:
            _, ips, acc, _ = run_ours(a.build, qdq, None, a.rounds, a.threads, backend)
            keep(label, ips, acc.get("int8 device"))
        for engine in engines:
            for layout, (ips, accuracy, weights) in run_torch("int8", a.threads, a.rounds, a.fp32, engine).items():
                label = "PyTorch %s int8 FX PTQ, %s engine, %s" % (version, engine, layout)
                keep(label + ("" if weights == "checkpoint" else " (random weights)"), ips, accuracy)

    def fastest(engine):
        rows = [v[0] for k, v in best.items() if k.startswith("PyTorch") and (" %s engine" % engine) in k]
        return max(rows) if rows else None

    xnn, dnnl = best[ours[0][1]][0], best[ours[1][1]][0]
    print("FashionCNN int8 inference, PTQ W8A8, batch 256, %d threads, best of %d rounds of 8 batches, best of %d runs "
          "(OMP_WAIT_POLICY %s, load average %s)" % (a.threads, a.rounds, a.repeat, os.environ.get("OMP_WAIT_POLICY", "unset"),
                                                     " ".join(open("/proc/loadavg").read().split()[:3])))
    print("%-64s %12s %14s" % ("", "images/s", "test accuracy"))
    for label in order:
        ips, accuracy = best[label]
        print("%-64s %12.0f %14s" % (label, ips, "%.2f%%" % (100 * accuracy) if accuracy is not None else "-"))
    print("ours XNNPACK / ours oneDNN:             %.2fx" % (xnn / dnnl))
    if engines:
        print("ours XNNPACK / PyTorch qnnpack:         %.2fx (goal >= 1.5x)" % (xnn / fastest("qnnpack")))
        print("ours oneDNN / PyTorch onednn:           %.2fx" % (dnnl / fastest("onednn")))
        print("PyTorch qnnpack / PyTorch onednn:       %.2fx" % (fastest("qnnpack") / fastest("onednn")))


if __name__ == "__main__":
    main()
