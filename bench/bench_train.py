#!/usr/bin/python3
"""Training throughput and peak memory of FashionCNN: this framework against PyTorch 1.13,
side by side in one run (batch 128, 2 threads, the same images).

Usage: /usr/bin/python3 bench/bench_train.py [--images 30000] [--rounds 3] [--build build]
PyTorch (Debian python3-torch) gets its best case: OpenBLAS (libopenblas0-pthread) and the
faster of NCHW and channels_last. Each contender runs in its own process so peak RSS is its
own. The contenders take turns, one epoch each per round (ours, PyTorch NCHW, PyTorch
channels_last, then again), so a slow minute of the machine falls on all of them; the speedup is
the best-of-rounds figures' ratio, then the median and range of the rounds' own ratios (ours
against PyTorch's faster layout in the same round). Run with both cores idle.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_util import torch_version

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FASHION = "/usr/share/datasets/fashion-mnist/"

TORCH_CHILD = r'''
import gzip, sys, time, numpy as np, torch, torch.nn as nn
images, layout, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads); torch.manual_seed(0)
raw = gzip.open("%strain-images-idx3-ubyte.gz", "rb").read()
x = np.frombuffer(raw, np.uint8, offset=16)[: images * 784].reshape(images, 1, 28, 28)
y = np.frombuffer(gzip.open("%strain-labels-idx1-ubyte.gz", "rb").read(), np.uint8, offset=8)[:images]
x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
y = torch.from_numpy(y.astype(np.int64))
model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
model = model.to(memory_format=mf)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
perm = torch.randperm(images)
def epoch():
    for i in range(0, images, 128):
        idx = perm[i:i + 128]
        xb = x[idx].contiguous(memory_format=mf)
        opt.zero_grad(); loss = nn.functional.cross_entropy(model(xb), y[idx]); loss.backward(); opt.step()
t = time.time(); epoch(); dt = time.time() - t
import resource
print(images / dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
''' % (FASHION, FASHION)


def run_ours(build, images, threads):
    out = tempfile.mkdtemp(prefix="bench_qat_")
    cmd = [os.path.join(build, "bin", "qat_train"), os.path.join(ROOT, "experiments", "fashion_cnn_fp32.ini"),
           "train.epochs=1", "data.train_limit=%d" % images, "data.test_limit=1000", "output.dir=" + out,
           "output.progress=none", "train.threads=%d" % threads]
    subprocess.run(cmd, check=True)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["train"]["images_per_s"], s["train"]["peak_rss_mb"]


def run_torch(images, layout, threads):
    p = subprocess.run(["/usr/bin/python3", "-c", TORCH_CHILD, str(images), layout, str(threads)], check=True,
                       capture_output=True, text=True)
    ips, rss = p.stdout.strip().splitlines()[-1].split()
    return float(ips), float(rss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=30000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    version = torch_version()
    layouts = ("nchw", "channels_last") if version else ()
    names = ["qat (this framework)"] + ["pytorch %s %s" % (version, layout) for layout in layouts]
    runs = {name: [] for name in names}  # (images/s, peak RSS MB) per round
    ratios = []
    for _ in range(max(1, a.rounds)):
        runs[names[0]].append(run_ours(a.build, a.images, a.threads))
        for name, layout in zip(names[1:], layouts):
            runs[name].append(run_torch(a.images, layout, a.threads))
        if layouts:
            ratios.append(runs[names[0]][-1][0] / max(runs[n][-1][0] for n in names[1:]))
    print("FashionCNN training, batch 128, %d threads, %d images, one epoch per round, %d rounds (best; median "
          "and range)"
          % (a.threads, a.images, len(ratios) or max(1, a.rounds)))
    print("%-32s %12s %24s %16s" % ("", "images/s", "images/s of the rounds", "peak RSS MB"))
    best = {}
    for name in names:
        ips, rss = sorted(r[0] for r in runs[name]), sorted(r[1] for r in runs[name])
        best[name] = ips[-1]
        print("%-32s %12.0f %10.0f (%.0f-%.0f) %16s" % (name, ips[-1], ips[len(ips) // 2], ips[0], ips[-1],
                                                       "%.0f" % rss[0] if round(rss[0]) == round(rss[-1]) else "%.0f-%.0f" % (rss[0], rss[-1])))
    if ratios:
        ratios.sort()
        print("speedup over PyTorch's best: %.2fx (rounds: median %.2fx, %.2f-%.2f)"
              % (best[names[0]] / max(best[n] for n in names[1:]), ratios[len(ratios) // 2], ratios[0], ratios[-1]))


if __name__ == "__main__":
    main()
