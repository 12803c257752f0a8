#!/usr/bin/python3
"""Training speed of FashionCNN imported from ONNX against the built-in preset, side by side in
one run: the same qat_train recipe (experiments/fashion_cnn_fp32.ini: batch 128, 2 threads, the
same images), once with model.name = fashion_cnn and once with model.onnx =
tests/onnx/models/fashion_cnn.onnx (PyTorch's export of the same network; the import builds the
same graph, which tests/onnx/test_onnx_import checks). The runs alternate, each contender keeps
its best; the wall time of the whole run (import, data, training, evaluation) is shown beside it.
The target: the imported model trains at the preset's speed. Run with both cores idle.

Usage: /usr/bin/python3 bench/bench_import.py [--images 20000] [--build build] [--repeat 3]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONNX = os.path.join(ROOT, "tests", "onnx", "models", "fashion_cnn.onnx")


def run(build, images, config):
    out = tempfile.mkdtemp(prefix="bench_import_")
    cmd = [os.path.join(build, "bin", "qat_train"), config, "train.epochs=1", "data.train_limit=%d" % images, "data.test_limit=1000", "output.dir=" + out,
           "output.progress=none", "train.threads=2"]
    t = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - t
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["train"]["images_per_s"], s["train"]["peak_rss_mb"], wall, s["parameters"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    preset = os.path.join(ROOT, "experiments", "fashion_cnn_fp32.ini")
    with open(preset) as f:
        text = f.read()
    assert "\nname = fashion_cnn\n" in text, preset + " no longer names fashion_cnn in [model]"
    imported = os.path.join(tempfile.mkdtemp(prefix="bench_import_cfg_"), "fashion_cnn_onnx_fp32.ini")
    with open(imported, "w") as f:
        f.write(text.replace("\nname = fashion_cnn\n", "\nonnx = %s\n" % ONNX))
    contenders = {"preset (model.name = fashion_cnn)": preset,
                  "ONNX import (model.onnx = tests/onnx/models/fashion_cnn.onnx)": imported}
    best = {k: None for k in contenders}
    for _ in range(a.repeat):
        for name, config in contenders.items():
            r = run(a.build, a.images, config)
            if best[name] is None or r[0] > best[name][0]:
                best[name] = r
    print("FashionCNN fp32 training, one epoch of %d images, batch 128, 2 threads (best of %d, alternating)"
          % (a.images, a.repeat))
    print("%-62s %12s %10s %10s %12s" % ("", "images/s", "peak MB", "wall s", "parameters"))
    for name, (ips, rss, wall, params) in best.items():
        print("%-62s %12.0f %10.1f %10.1f %12d" % (name, ips, rss, wall, params))
    p, o = best["preset (model.name = fashion_cnn)"][0], best[list(contenders)[1]][0]
    print("import / preset training speed: %.3f (target: 1.0, the same graph)" % (o / p))


if __name__ == "__main__":
    main()
