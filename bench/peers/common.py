"""Shared by the peer benchmarks: the grid's recipes (experiments/grid.py reads them), our own
runs (build/bin/qat_train in the grid's run layout), versions, timing and result files.

Our runs live in WORK/ours/<model>/seed<S>/<fp32|ptq_wXaY|qat_wXaY>/ (experiments/grid.py's
layout, made with its `command`: the same qat_train argv as the grid's, then the budget
overrides of the peer script, e.g. data.train_limit). Every peer starts from the fp32
checkpoint of its (model, seed) there, loaded into the PyTorch twin (models.py).
"""
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import grid as gridlib  # noqa: E402  (experiments/grid.py: recipes, run layout, commands)

GRIDS = {"mobilenet_onnx": "experiments/grid/onnx.ini"}  # others: experiments/grid/grid.ini
DEFAULT_WORK = os.path.join(HERE, "work")


def qat_train(build):
    return os.path.join(build, "bin", "qat_train")


def load_grid(model):
    path = os.path.join(ROOT, GRIDS.get(model, "experiments/grid/grid.ini"))
    g = gridlib.load_grid(path, False)
    if model not in g["models"]:
        raise ValueError("%s is not a model of %s" % (model, path))
    return g


def parse_ini_train(path):
    import configparser
    cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    cp.read(path)
    return dict(cp["train"]) if cp.has_section("train") else {}


def zoo_model(model):
    """Whether `model` is one of experiments/zoo.py's (torchvision's, and the small ViT)."""
    import zoo
    return model in zoo.MODELS


def recipe(model, method, config=None):
    """The training recipe of `method` (fp32, ptq, qat, ...) for `model` as qat_train would
    resolve it: the model's fp32 config's [train], then the grid's overrides and the method's
    (train.* keys, and quant.freeze_bn_after / quant.calibration_batches). A zoo model: the
    [train] of `config` (the fp32 config experiments/zoo.py wrote), else of its zoo recipe's
    (experiments/zoo.py, RECIPES)."""
    if zoo_model(model):
        import zoo
        g, cfg = None, config or zoo.RECIPES[zoo.recipe_kind(model)][0]
    else:
        g = load_grid(model)
        cfg = os.path.join(ROOT, g["fp32_config"].replace("{model}", model))
    r = {"epochs": 4, "batch_size": 128, "optimizer": "sgd", "lr": 0.05, "schedule": "cosine", "min_lr": 0.0,
         "momentum": 0.9, "nesterov": False, "weight_decay": 5e-4, "warmup_epochs": 0, "beta1": 0.9,
         "beta2": 0.999, "adam_eps": 1e-8, "freeze_bn_after": 0.0, "calibration_batches": 32}
    for k, v in parse_ini_train(cfg).items():
        r[k] = v
    overrides = []
    if g:
        overrides = list(g["overrides"]) + list(g["method_defs"][method]["overrides"])
        overrides += g["model_overrides"].get("%s:%s" % (method, model), [])
    for ov in overrides:
        key, _, value = ov.partition("=")
        sec, _, name = key.partition(".")
        if sec == "train" or (sec == "quant" and name in ("freeze_bn_after", "calibration_batches")):
            r[name] = value
    out = {}
    for k, v in r.items():
        if isinstance(v, str):
            low = v.strip().lower()
            if low in ("true", "false"):
                v = low == "true"
            else:
                try:
                    v = int(v)
                except ValueError:
                    try:
                        v = float(v)
                    except ValueError:
                        v = v.strip()
        out[k] = v
    return out


def grid_env(model, threads):
    g = load_grid(model)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.update(g["env"])
    return env


def run_ours(model, seed, method, bits, work, build, threads, extra=(), reuse=True, log=print, tag=None):
    """Runs qat_train for one grid row (method 'fp32', 'ptq', 'qat', ...; bits 'fp32' or 'wXaY')
    into WORK/ours/..., with the grid's argv plus `extra` overrides (`tag`: into the row's
    directory name + '_' + tag instead). A finished run with the same argv is reused. Returns
    (run dir, summary dict)."""
    g = load_grid(model)
    g["threads"] = threads
    runs = os.path.join(work, "ours")
    argv = gridlib.command(g, qat_train(build), runs, model, seed, method, bits) + list(extra)
    argv = [a for a in argv if a != "output.progress=lines"] + ["output.progress=lines"]
    d = gridlib.run_dir(runs, model, seed, method, bits)
    if tag:  # a variant of the grid row (e.g. another backend) beside it
        d += "_" + tag
        argv = [a for a in argv if not a.startswith("output.dir=")] + ["output.dir=%s" % d]
    meta_path = os.path.join(d, "peers_run.json")
    summary_path = os.path.join(d, "summary.json")
    meta = gridlib.read_json(meta_path)
    if reuse and meta and meta.get("argv") == argv and meta.get("rc") == 0 and os.path.exists(summary_path):
        return d, gridlib.read_json(summary_path)
    os.makedirs(d, exist_ok=True)
    if os.path.exists(summary_path):
        os.remove(summary_path)
    log("  ours: %s" % " ".join(shlex.quote(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a) for a in argv))
    t = time.time()
    with open(os.path.join(d, "log.txt"), "w") as f:
        rc = subprocess.call(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=grid_env(model, threads))
    with open(meta_path, "w") as f:
        json.dump({"argv": argv, "rc": rc, "wall_s": round(time.time() - t, 2)}, f, indent=1)
    if rc != 0:
        with open(os.path.join(d, "log.txt")) as f:
            tail = f.read()[-1500:]
        raise RuntimeError("qat_train exited %d (%s):\n%s" % (rc, os.path.join(d, "log.txt"), tail))
    return d, gridlib.read_json(summary_path)


def fp32_checkpoint(model, seed, work, build, threads, extra=(), log=print):
    d, s = run_ours(model, seed, "fp32", "fp32", work, build, threads, extra, log=log)
    return os.path.join(d, "checkpoint.h5"), s


def budget_overrides(train_limit=0, test_limit=0):
    out = []
    if train_limit:
        out.append("data.train_limit=%d" % train_limit)
    if test_limit:
        out.append("data.test_limit=%d" % test_limit)
    return out


def stage(summary, name):
    try:
        v = float(summary["stages"][name]["test_accuracy"])
        return v if math.isfinite(v) else None
    except (KeyError, TypeError, ValueError):
        return None


def epoch_seconds(summary):
    try:
        return [float(e) for e in summary["train"]["epoch_seconds"]]
    except (KeyError, TypeError, ValueError):
        return []


def versions(names=("torch", "torchvision", "torchao", "executorch", "onnxruntime", "onnx", "numpy", "h5py",
                    "aimet-torch", "brevitas", "nncf")):
    from importlib import metadata
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def median(xs):
    return statistics.median(xs) if xs else None


def error_text(exc):
    """One line for the tables, the traceback's last frames for the JSON."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""), "".join(tb[-6:])


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def lr_at(rec, step, total_steps, steps_per_epoch):
    """qat_train's per-step schedule: linear warmup, then constant, step, cosine or linear decay
    from lr to min_lr over the remaining steps."""
    lr, min_lr = float(rec["lr"]), float(rec["min_lr"])
    warm = int(round(float(rec.get("warmup_epochs", 0)) * steps_per_epoch))
    if step < warm:
        return lr * (step + 1) / warm
    sched = rec.get("schedule", "cosine")
    t = (step - warm) / max(1, total_steps - warm)
    if sched == "constant":
        return lr
    if sched == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    if sched == "linear":
        return lr + (min_lr - lr) * t
    if sched == "step":
        return lr * float(rec.get("gamma", 0.1)) ** ((step // steps_per_epoch) // int(rec.get("step_epochs", 1)))
    raise ValueError("schedule %r" % sched)


def make_optimizer(params, rec):
    import torch
    if rec["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=float(rec["lr"]), betas=(float(rec["beta1"]), float(rec["beta2"])),
                                 eps=float(rec["adam_eps"]), weight_decay=float(rec["weight_decay"]))
    return torch.optim.SGD(params, lr=float(rec["lr"]), momentum=float(rec["momentum"]),
                           nesterov=bool(rec["nesterov"]), weight_decay=float(rec["weight_decay"]))
