#!/usr/bin/python3
"""Inference throughput of FashionCNN at batch 256: this framework's fp32 executor and int8
lowered model against PyTorch 1.13's fp32 (NCHW and channels_last, the faster kept) and int8
(FX post-training quantization with the onednn engine), side by side in one run, 2 threads.

Usage: /usr/bin/python3 bench/bench_infer.py [--rounds 5] [--repeat 2] [--build build]
                                             [--qdq runs/fashion_cnn_ptq_w8a8/model_qdq.h5]
                                             [--fp32 runs/fashion_cnn_fp32/checkpoint.h5]

Ours: `qat_report MODEL_QDQ --fp32 CHECKPOINT` times the fp32 graph (eval mode) and the lowered
int8 model on the same 256 test images (model time only, best of --rounds rounds of 8 batches
that alternate the two engines). When the default files do not exist they are made first
(`qat_train experiments/fashion_cnn_ptq_w8a8.ini`, which trains the fp32 model if needed).
PyTorch gets the same weights (the checkpoint holds PyTorch state_dict names; read with h5py,
random weights without it), the same images, its best fp32 case (OpenBLAS from
libopenblas0-pthread, the faster layout) and the documented int8 recipe:
torch.backends.quantized.engine = 'onednn', get_default_qconfig_mapping('onednn'), prepare_fx,
calibration on 8 training batches, convert_fx. Each contender runs in its own process; the
test accuracy of each engine on the 10,000 test images is printed alongside. The whole
sequence runs --repeat times and every row keeps its best: other processes only ever slow a
measurement down. Run with both cores idle all the same.
"""
import argparse
import os
import re
import subprocess
import sys

from bench_util import BestOf, torch_version

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FASHION = "/usr/share/datasets/fashion-mnist/"

TORCH_CHILD = r'''
import gzip, sys, time, numpy as np, torch, torch.nn as nn
mode, threads, rounds, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
FASHION, engine = sys.argv[5], sys.argv[6]
torch.set_num_threads(threads); torch.manual_seed(0)

def load(kind, n):
    raw = gzip.open(FASHION + "%s-images-idx3-ubyte.gz" % kind, "rb").read()
    x = np.frombuffer(raw, np.uint8, offset=16)[: n * 784].reshape(-1, 1, 28, 28)
    y = np.frombuffer(gzip.open(FASHION + "%s-labels-idx1-ubyte.gz" % kind, "rb").read(), np.uint8, offset=8)[:n]
    return (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))

class FashionCNN(nn.Module):
    """The framework's FashionCNN with its parameter names; it flattens NHWC (docs/training.md: presets)."""
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False); self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False); self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(3136, 128); self.fc2 = nn.Linear(128, 10)
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.pool1, self.pool2 = nn.MaxPool2d(2), nn.MaxPool2d(2)
    def forward(self, x):
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
        x = torch.flatten(x.permute(0, 2, 3, 1), 1)
        return self.fc2(self.relu3(self.fc1(x)))

model = FashionCNN()
weights = "random"
if ckpt:
    try:
        import h5py
        with h5py.File(ckpt, "r") as f:
            sd = {k: torch.from_numpy(f["params"][k][()]) for k in f["params"]}
            sd.update({k: torch.from_numpy(f["buffers"][k][()]) for k in f["buffers"]})
        model.load_state_dict(sd, strict=False)
        weights = "checkpoint"
    except ImportError:
        pass
model.eval()
x_test, y_test = load("t10k", 10000)
batch = x_test[:256].contiguous()

def best_rate(run, xb):
    with torch.no_grad():
        for _ in range(3):
            run(xb)
        best = 0.0
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(8):
                run(xb)
            best = max(best, 8 * xb.shape[0] / (time.perf_counter() - t))
    return best

def accuracy(run, mf):
    correct = 0
    with torch.no_grad():
        for i in range(0, x_test.shape[0], 256):
            correct += int((run(x_test[i:i + 256].contiguous(memory_format=mf)).argmax(1) == y_test[i:i + 256]).sum())
    return correct / x_test.shape[0]

layouts = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
if mode == "int8":
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_fx, convert_fx
    if engine not in torch.backends.quantized.supported_engines:
        sys.exit("quantized engine %s not in this build (%s)" % (engine, torch.backends.quantized.supported_engines))
    torch.backends.quantized.engine = engine  # before convert_fx, which packs the weights for it
    prepared = prepare_fx(model, get_default_qconfig_mapping(engine), (batch[:1],))
    x_train, _ = load("train", 2048)
    with torch.no_grad():
        for i in range(0, 2048, 256):
            prepared(x_train[i:i + 256])
    model = convert_fx(prepared)
for name, mf in layouts.items():
    m = model.to(memory_format=mf) if mode == "fp32" else model
    xb = batch.contiguous(memory_format=mf)
    print(name, best_rate(m, xb), accuracy(m, mf), weights)
'''


def run_ours(build, qdq, fp32, rounds, threads, backend="onednn", extra=()):
    """qat_report on MODEL_QDQ with the backend's device: (fp32 images/s or None, int8 images/s,
    {stage: test accuracy}, its output). Without an fp32 checkpoint (fp32 None) the device is
    timed alone, its rounds back to back; with one, its rounds alternate with the fp32 graph's.
    extra: more qat_report options (e.g. --timing-batch 1)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [os.path.join(build, "bin", "qat_report"), qdq, "--backend", backend, "--probe-images", "0",
           "--timing-rounds", str(rounds)] + (["--fp32", fp32] if fp32 else []) + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    m = re.search(r"^inference at batch .*?(?:fp32 ([0-9.]+) images/s, )?int8 ([0-9.]+) images/s", out, re.M)
    acc = {k: float(v) / 100 for k, v in re.findall(r"(fp32 model|Q/DQ graph|int8 device)\s+top-1\s+([0-9.]+)%", out)}
    if not m:
        sys.exit("bench_infer: no timing line in qat_report's output:\n" + out)
    return float(m.group(1)) if m.group(1) else None, float(m.group(2)), acc, out


def run_torch(mode, threads, rounds, ckpt, engine="onednn"):
    """PyTorch in its own process: {layout: (images/s, test accuracy, weights)}; int8 is FX PTQ
    with the quantized engine `engine` (its default qconfig mapping)."""
    p = subprocess.run(["/usr/bin/python3", "-c", TORCH_CHILD, mode, str(threads), str(rounds), ckpt, FASHION, engine],
                       check=True, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    rows = {}
    for line in p.stdout.strip().splitlines():
        name, ips, acc, weights = line.split()
        rows[name] = (float(ips), float(acc), weights)
    return rows


def ensure_models(build, qdq, fp32, overrides=()):
    """Makes qdq (and fp32 when missing) with qat_train experiments/fashion_cnn_ptq_w8a8.ini and
    its `overrides` (e.g. quant.backend=xnnpack output.dir=...) unless both exist."""
    if os.path.exists(qdq) and os.path.exists(fp32):
        return
    print("bench: %s or %s missing: making them with qat_train experiments/fashion_cnn_ptq_w8a8.ini %s"
          % (qdq, fp32, " ".join(overrides)))
    subprocess.run([os.path.join(build, "bin", "qat_train"), os.path.join(ROOT, "experiments", "fashion_cnn_ptq_w8a8.ini"),
                    "output.progress=lines"] + list(overrides), check=True, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--qdq", default=os.path.join(ROOT, "runs", "fashion_cnn_ptq_w8a8", "model_qdq.h5"))
    ap.add_argument("--fp32", default=os.path.join(ROOT, "runs", "fashion_cnn_fp32", "checkpoint.h5"))
    a = ap.parse_args()
    ensure_models(a.build, a.qdq, a.fp32)
    version = torch_version()
    bests = BestOf()
    best, order, keep = bests.best, bests.order, bests.keep

    for _ in range(a.repeat):
        ours_fp32, ours_int8, acc, _ = run_ours(a.build, a.qdq, a.fp32, a.rounds, a.threads)
        keep("qat fp32 (graph executor)", ours_fp32, acc.get("fp32 model"))
        keep("qat int8 (lowered, oneDNN)", ours_int8, acc.get("int8 device"))
        for mode in ("fp32", "int8") if version else ():
            for layout, (ips, accuracy, weights) in run_torch(mode, a.threads, a.rounds, a.fp32).items():
                label = "pytorch %s %s %s" % (version, mode, layout)
                keep(label + ("" if weights == "checkpoint" else " (random weights)"), ips, accuracy)
    rows = [(label,) + best[label] for label in order]
    ours_fp32, ours_int8 = best["qat fp32 (graph executor)"][0], best["qat int8 (lowered, oneDNN)"][0]
    torch_fp32 = max([v[0] for k, v in best.items() if k.startswith("pytorch") and " fp32 " in k], default=None)
    torch_int8 = max([v[0] for k, v in best.items() if k.startswith("pytorch") and " int8 " in k], default=None)
    print("FashionCNN inference, batch 256, %d threads, best of %d rounds of 8 batches, best of %d runs"
          % (a.threads, a.rounds, a.repeat))
    print("%-50s %12s %14s" % ("", "images/s", "test accuracy"))
    for name, ips, accuracy in rows:
        print("%-50s %12.0f %14s" % (name, ips, "%.2f%%" % (100 * accuracy) if accuracy is not None else "-"))
    print("ours int8 / ours fp32:           %.2fx (target >= 1.8x)" % (ours_int8 / ours_fp32))
    if torch_int8:
        print("ours int8 / PyTorch int8:        %.2fx (target >= 1.0x)" % (ours_int8 / torch_int8))
        print("ours fp32 / PyTorch best fp32:   %.2fx" % (ours_fp32 / torch_fp32))
        print("PyTorch int8 / PyTorch fp32:     %.2fx" % (torch_int8 / torch_fp32))


if __name__ == "__main__":
    main()
