#!/usr/bin/python3
"""Data-parallel training on one machine: N processes x 1 thread under mpirun against 1 process
x N threads on the same cores, in alternating rounds.

Usage: /usr/bin/python3 bench/bench_dist.py [--config fp32|w4a4|FILE.ini ...] [--images 20000]
           [--rounds 3] [--np 2] [--build build] [-- key=value ...]
Each round trains one epoch of each config both ways (one process first in odd rounds, the
processes first in even ones, so that a slow minute falls on both) and reads the epoch's
training images/s from metrics.csv (the evaluation after the epoch is not in it). Prints, per
config, each way's best round and the rounds' range, and the efficiency: the processes' images/s
over the one process's, best against best, then the median and range of the rounds' own ratios.
fp32 is experiments/fashion_cnn_fp32.ini; w4a4 the W4A4 example, experiments/fashion_cnn_qat_w4a4.ini
(which starts from runs/fashion_cnn_fp32/checkpoint.h5 and trains it first when missing: run it
once before timing). Overrides after -- go to every run. Run with the cores idle.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PRESETS = {"fp32": "experiments/fashion_cnn_fp32.ini", "w4a4": "experiments/fashion_cnn_qat_w4a4.ini"}


def run(cmd, out, env):
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("bench_dist: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return float(rows[0]["images_per_s"])


def one_epoch(a, config, processes, extra):
    out = tempfile.mkdtemp(prefix="bench_dist_")
    try:
        args = [os.path.join(a.build, "bin", "qat_train"), config, "train.epochs=1",
                "data.train_limit=%d" % a.images, "data.test_limit=500", "output.dir=" + out,
                "output.progress=none"] + extra
        env = dict(os.environ)
        if processes == 1:
            return run(args + ["train.threads=%d" % a.np], out, env)
        mpi = ["mpirun", "-np", str(processes), "--bind-to", "core", "-x", "OMP_NUM_THREADS=1"]
        if "OMP_WAIT_POLICY" in env:
            mpi += ["-x", "OMP_WAIT_POLICY"]
        if os.geteuid() == 0:
            mpi.append("--allow-run-as-root")
        return run(mpi + args + ["train.threads=1"], out, env)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", action="append")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args(argv)
    configs = [PRESETS.get(c, c) for c in (a.config or ["fp32", "w4a4"])]
    a.build = os.path.abspath(a.build)
    ways = {(c, n): [] for c in configs for n in (1, a.np)}
    for r in range(a.rounds):
        for c in configs:
            for n in ((1, a.np) if r % 2 == 0 else (a.np, 1)):
                ways[(c, n)].append(one_epoch(a, c, n, extra))
            print("round %d %s: 1 x %d threads %.0f, %d x 1 thread %.0f images/s" %
                  (r + 1, c, a.np, ways[(c, 1)][-1], a.np, ways[(c, a.np)][-1]), flush=True)
    print("\ntraining images/s, one epoch of %d images, batch of the config, %d rounds (best; median, range)"
          % (a.images, a.rounds))
    for c in configs:
        one, many = ways[(c, 1)], ways[(c, a.np)]
        ratios = sorted(m / o for m, o in zip(many, one))
        for label, v in (("1 process x %d threads" % a.np, one), ("%d processes x 1 thread" % a.np, many)):
            s = sorted(v)
            print("%-40s %-26s %8.0f  (%.0f; %.0f-%.0f)" % (c, label, s[-1], s[len(s) // 2], s[0], s[-1]))
        print("%-40s %-26s %8.2fx (rounds: median %.2fx, %.2f-%.2f)" %
              (c, "efficiency", max(many) / max(one), ratios[len(ratios) // 2], ratios[0], ratios[-1]))


if __name__ == "__main__":
    main()
