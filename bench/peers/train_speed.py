"""fp32 training speed of our models: this framework's qat_train against PyTorch 2.x (eager NCHW,
eager channels_last, torch.compile), one epoch each per round, the contenders taking turns.

    bench/peers/.venv/bin/python bench/peers/train_speed.py                 # 30,000 images, 3 rounds
    bench/peers/.venv/bin/python bench/peers/train_speed.py --models fashion_cnn --images 2000 --rounds 1
    bench/peers/.venv/bin/python bench/peers/train_speed.py --models resnet18,mobilenet_v2 --images 4096

A model of experiments/zoo.py (torchvision's, with 10 classes and a 1-channel first convolution)
is exported as the zoo exports it and trained by qat_train with the zoo's fp32 recipe (that of
experiments/mobilenet_onnx_fp32.ini); PyTorch trains torchvision's module itself.

As bench/bench_train.py does it: every round runs ours (`qat_train experiments/<model>_fp32.ini
train.epochs=1 data.train_limit=N`, its images/s from summary.json: the epoch's training steps)
and then each PyTorch variant in a process of its own (peak RSS is each one's own), one epoch
of N images, batch 128, the fp32 recipe's optimizer (SGD momentum 0.9, weight decay 5e-4),
--threads threads (torch.set_num_threads, OMP_NUM_THREADS), the same preprocessed images. The
PyTorch variants first run --warmup training steps outside the timed epoch (torch.compile's
compilation happens there, with Inductor's caches off so that every round compiles afresh; it is
reported apart as compile_s). A slow minute of the machine so
falls on every contender of a round; the speedup is ours over the fastest PyTorch variant: the
ratio of the best-of-rounds figures, then the median and range of the rounds' own ratios. Run
with both cores idle.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

VARIANTS = ("eager_nchw", "eager_channels_last", "compile")


def child(model_name, images, variant, threads, warmup, seed):
    """One PyTorch epoch in this process; prints a JSON line."""
    import logging
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    import torch
    import models
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    x, y = models.load_fashion("train", images)
    model = models.build(model_name)
    mf = torch.channels_last if variant == "eager_channels_last" else torch.contiguous_format
    model = model.to(memory_format=mf).train()
    rec = common.recipe(model_name, "fp32")
    opt = common.make_optimizer(model.parameters(), rec)
    step_fn = model
    compile_s = None
    if variant == "compile":
        step_fn = torch.compile(model)
    bs = int(rec["batch_size"])

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(step_fn(xb.contiguous(memory_format=mf)), yb)
        loss.backward()
        opt.step()

    t = time.perf_counter()
    gen = torch.Generator().manual_seed(seed + 1)
    for i, (xb, yb) in enumerate(models.batches(x, y, bs, shuffle=True, generator=gen)):
        if i >= warmup:
            break
        step(xb, yb)
    if variant == "compile":
        compile_s = time.perf_counter() - t
    # the last partial batch has another shape: torch.compile would recompile for it inside the
    # timed epoch, so every variant runs whole batches only (the same images for all three)
    n = x.shape[0] - x.shape[0] % bs
    gen = torch.Generator().manual_seed(seed)
    t = time.perf_counter()
    for xb, yb in models.batches(x[:n], y[:n], bs, shuffle=True, generator=gen):
        step(xb, yb)
    dt = time.perf_counter() - t
    print(json.dumps({"images_per_s": n / dt, "seconds": dt, "images": n, "compile_s": compile_s,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


def run_torch(model, images, variant, threads, warmup, seed):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if variant == "compile":  # a cold compilation every round: compile_s is not a cache hit
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model, str(images), variant,
                        str(threads), str(warmup), str(seed)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError("exit %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-1500:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_ours(build, model, images, threads, seed):
    out = tempfile.mkdtemp(prefix="peers_train_")
    if common.zoo_model(model):  # exported as experiments/zoo.py does, with its fp32 recipe
        import zoo
        onnx_path, cfg = os.path.join(out, model + ".onnx"), os.path.join(out, "fp32.ini")
        zoo.export(model, onnx_path)
        zoo.write_fp32_config(model, onnx_path, out, cfg, 1, images, 1000)
    else:
        g = common.load_grid(model)
        cfg = os.path.join(common.ROOT, g["fp32_config"].replace("{model}", model))
    cmd = [common.qat_train(build), cfg, "train.epochs=1", "data.train_limit=%d" % images, "data.test_limit=1000",
           "output.dir=" + out, "output.progress=none", "train.threads=%d" % threads, "train.seed=%d" % seed]
    p = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if p.returncode != 0:
        raise RuntimeError("qat_train exit %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-1500:]))
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    subprocess.run(["rm", "-rf", out])
    return {"images_per_s": s["train"]["images_per_s"], "peak_rss_mb": s["train"]["peak_rss_mb"],
            "seconds": s["train"]["epoch_seconds"][0], "command": cmd}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        m, images, variant, threads, warmup, seed = sys.argv[2:8]
        child(m, int(images), variant, int(threads), int(warmup), int(seed))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="fashion_cnn,res_cnn,mobilenet_onnx")
    ap.add_argument("--images", type=int, default=30000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5, help="untimed PyTorch training steps before the epoch")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", default=os.path.join(common.ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(common.DEFAULT_WORK, "train_speed.json"))
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            sys.exit("train_speed: unknown variant %r (known: %s)" % (v, ", ".join(VARIANTS)))
    versions = common.versions(("torch",))
    result = {"script": "train_speed.py", "argv": sys.argv, "versions": common.versions(), "options": vars(a),
              "models": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for model in [m for m in a.models.split(",") if m]:
        names = ["ours"] + variants
        runs = {n: [] for n in names}
        errors = {}
        ratios = []
        for r in range(max(1, a.rounds)):
            for n in names:
                if n in errors:
                    continue
                try:
                    res = (run_ours(a.build, model, a.images, a.threads, a.seed) if n == "ours"
                           else run_torch(model, a.images, n, a.threads, a.warmup, a.seed))
                    runs[n].append(res)
                except Exception as e:  # noqa: BLE001 (recorded; the others go on)
                    errors[n] = common.error_text(e)[0]
                    print("  %s %s FAILED: %s" % (model, n, errors[n]), flush=True)
            got = [runs[n][-1]["images_per_s"] for n in variants if n not in errors and len(runs[n]) == r + 1]
            if got and "ours" not in errors and len(runs["ours"]) == r + 1:
                ratios.append(runs["ours"][-1]["images_per_s"] / max(got))
            print("%s round %d: %s" % (model, r + 1, ", ".join(
                "%s %.0f" % (n, runs[n][-1]["images_per_s"]) for n in names if len(runs[n]) == r + 1)), flush=True)
        rows = {}
        for n in names:
            ips = sorted(x["images_per_s"] for x in runs[n])
            rows[n] = {"label": "this framework (qat_train)" if n == "ours" else "PyTorch %s %s" % (versions["torch"], n),
                       "rounds_images_per_s": [x["images_per_s"] for x in runs[n]],
                       "best_images_per_s": ips[-1] if ips else None,
                       "median_images_per_s": common.median(ips),
                       "peak_rss_mb": max((x["peak_rss_mb"] for x in runs[n]), default=None),
                       "compile_s": [x.get("compile_s") for x in runs[n]] if n == "compile" else None,
                       "error": errors.get(n)}
        best_torch = max((rows[n]["best_images_per_s"] for n in variants if rows[n]["best_images_per_s"]), default=None)
        speedup = None
        if best_torch and rows["ours"]["best_images_per_s"]:
            speedup = {"best_of": rows["ours"]["best_images_per_s"] / best_torch,
                       "rounds_median": common.median(ratios), "rounds_min": min(ratios) if ratios else None,
                       "rounds_max": max(ratios) if ratios else None, "rounds": ratios}
        result["models"][model] = {"rows": rows, "speedup_over_best_pytorch": speedup}
        common.write_json(a.out, result)
        print("%s: %s" % (model, "ours / best PyTorch %.2fx best-of, median of rounds %.2fx" % (
            speedup["best_of"], speedup["rounds_median"]) if speedup else "no speedup (a contender failed)"),
            flush=True)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    common.write_json(a.out, result)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
