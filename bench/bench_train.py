#!/usr/bin/python3
"""Training throughput and peak memory of FashionCNN: this framework against PyTorch 1.13,
side by side in one run (batch 128, 2 threads, the same images).

Usage: /usr/bin/python3 bench/bench_train.py [--images 30000] [--build build]
PyTorch (Debian python3-torch) gets its best case: OpenBLAS (libopenblas0-pthread) and the
faster of NCHW and channels_last. Each contender runs in its own process so peak RSS is its
own. Run with both cores idle.
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    ours_ips, ours_rss = run_ours(a.build, a.images, a.threads)
    rows = [("qat (this framework)", ours_ips, ours_rss)]
    best = None
    version = torch_version()
    if version:
        for layout in ("nchw", "channels_last"):
            ips, rss = run_torch(a.images, layout, a.threads)
            rows.append(("pytorch %s %s" % (version, layout), ips, rss))
            if best is None or ips > best:
                best = ips
    print("FashionCNN training, batch 128, %d threads, %d images, one epoch" % (a.threads, a.images))
    print("%-32s %12s %14s" % ("", "images/s", "peak RSS MB"))
    for name, ips, rss in rows:
        print("%-32s %12.0f %14.0f" % (name, ips, rss))
    if best:
        print("speedup over PyTorch's best: %.2fx" % (ours_ips / best))


if __name__ == "__main__":
    main()
