#!/usr/bin/python3
"""Runs the experiment grid and writes its results (tables and plots).

    /usr/bin/python3 experiments/grid.py                 # the full grid -> experiments/results/
    /usr/bin/python3 experiments/grid.py --quick --check # CI-sized grid -> runs/grid_quick/results/
    /usr/bin/python3 experiments/grid.py --report-only   # redraw tables and plots from the runs

The grid (models, methods, bit widths, seeds, recipes) is experiments/grid/grid.ini. For every
model and seed, one fp32 checkpoint is trained with the model's fp32 recipe; every PTQ and QAT
row of that (model, seed) starts from it. Runs are sequential (each qat_train uses all
`threads`). Each run lives in RUNS/<model>/seed<S>/<method>[_wXaY]/ (qat_train's output.dir,
with grid_run.json: the command, exit status and wall time, and log.txt: its output).

Writes into OUT: results.md (the table: mean +- std over seeds of every stage), results.json,
runs.csv (one line per run), accuracy_vs_bits.png, ptq_vs_qat.png, qat_curves.png and
plotdata/ (the gnuplot script and its data files). --check validates OUT (every configured row
present with all its seeds, accuracies in [0, 1], the three stages fp32 / Q/DQ / int8 device
in every quantized row, the consistency check passed, the plots non-empty PNGs) and exits 1
otherwise.

Python standard library only; plots need gnuplot (Debian: gnuplot-nox).
"""

import argparse
import configparser
import csv
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("fp32", "fake_quant", "qdq", "int8")
STAGE_TITLES = {"fp32": "fp32", "fake_quant": "fake-quant", "qdq": "Q/DQ graph",
                "int8": "int8 device"}


# ----------------------------------------------------------------------------- grid description

def split_list(text):
    return [t.strip() for t in text.replace("\n", ",").split(",") if t.strip()]


def parse_bits(tag):
    t = tag.lower()
    if not (t.startswith("w") and "a" in t):
        raise ValueError("bit width %r is not of the form wXaY" % tag)
    w, a = t[1:].split("a", 1)
    w, a = int(w), int(a)
    if not (2 <= w <= 8 and 2 <= a <= 8):
        raise ValueError("bit width %r: weight and activation bits must be 2..8" % tag)
    return w, a


def load_grid(path, quick):
    cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
    cp.optionxform = str
    if not cp.read(path):
        sys.exit("grid: cannot read %s" % path)
    if not cp.has_section("grid"):
        sys.exit("grid: %s has no [grid] section" % path)
    g = dict(cp["grid"])
    quick_overrides = []
    if quick:
        if not cp.has_section("quick"):
            sys.exit("grid: --quick but %s has no [quick] section" % path)
        for k, v in cp["quick"].items():
            if k == "overrides":
                quick_overrides = shlex.split(v)
            else:
                g[k] = v
    known = {"models", "methods", "bits", "seeds", "threads", "fp32_config", "overrides", "env"}
    for k in g:
        if k not in known:
            sys.exit("grid: %s: unknown key %r in [grid]/[quick] (known: %s)"
                     % (path, k, ", ".join(sorted(known))))
    grid = {
        "path": path,
        "quick": quick,
        "models": split_list(g.get("models", "")),
        "methods": split_list(g.get("methods", "")),
        "bits": split_list(g.get("bits", "")),
        "seeds": [int(s) for s in split_list(g.get("seeds", "0"))],
        "threads": int(g.get("threads", "2")),
        "fp32_config": g.get("fp32_config", "experiments/{model}_fp32.ini"),
        "overrides": shlex.split(g.get("overrides", "")),
        "env": dict(kv.split("=", 1) for kv in shlex.split(g.get("env", "")) if "=" in kv),
        "quick_overrides": quick_overrides,
        "method_overrides": {},
    }
    for m in grid["methods"]:
        if m not in ("ptq", "qat"):
            sys.exit("grid: %s: method %r is not ptq or qat" % (path, m))
    for b in grid["bits"]:
        try:
            parse_bits(b)
        except ValueError as e:
            sys.exit("grid: %s: %s" % (path, e))
    if not grid["models"] or not grid["seeds"]:
        sys.exit("grid: %s: models and seeds must not be empty" % path)
    for sec in cp.sections():
        if sec in ("grid", "quick"):
            continue
        grid["method_overrides"][sec] = shlex.split(cp[sec].get("overrides", ""))
    return grid


def configured_rows(grid):
    """(model, method, bits) of every table row, in table order."""
    rows = []
    for model in grid["models"]:
        rows.append((model, "fp32", "fp32"))
        for method in grid["methods"]:
            for bits in grid["bits"]:
                rows.append((model, method, bits))
    return rows


def run_dir(runs, model, seed, method, bits):
    name = "fp32" if method == "fp32" else "%s_%s" % (method, bits)
    return os.path.join(runs, model, "seed%d" % seed, name)


def command(grid, qat_train, runs, model, seed, method, bits):
    cfg = os.path.join(REPO, grid["fp32_config"].replace("{model}", model))
    argv = [qat_train, cfg] + list(grid["overrides"])
    argv += grid["method_overrides"].get(method, [])
    argv += grid["method_overrides"].get("%s:%s" % (method, model), [])
    argv += grid["quick_overrides"]
    if method != "fp32":
        w, a = parse_bits(bits)
        ckpt = os.path.join(run_dir(runs, model, seed, "fp32", "fp32"), "checkpoint.h5")
        argv += ["quant.mode=%s" % method, "quant.weight_bits=%d" % w,
                 "quant.activation_bits=%d" % a, "quant.fp32_checkpoint=%s" % ckpt]
    argv += ["train.seed=%d" % seed, "train.threads=%d" % grid["threads"],
             "output.dir=%s" % run_dir(runs, model, seed, method, bits), "output.progress=lines"]
    return argv


def plan(grid, qat_train, runs):
    """Every run in execution order: the fp32 run of a (model, seed) first."""
    out = []
    for model in grid["models"]:
        for seed in grid["seeds"]:
            out.append((model, seed, "fp32", "fp32"))
            for method in grid["methods"]:
                for bits in grid["bits"]:
                    out.append((model, seed, method, bits))
    return [(m, s, me, b, command(grid, qat_train, runs, m, s, me, b)) for m, s, me, b in out]


# ----------------------------------------------------------------------------- running

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def execute(runs_plan, runs, resume, grid):
    n = len(runs_plan)
    t_grid = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=str(grid["threads"]))
    env.update(grid["env"])
    for i, (model, seed, method, bits, argv) in enumerate(runs_plan, 1):
        d = run_dir(runs, model, seed, method, bits)
        label = "%s seed %d %s%s" % (model, seed, method, "" if method == "fp32" else " " + bits)
        meta = read_json(os.path.join(d, "grid_run.json"))
        if (resume and meta and meta.get("argv") == argv and meta.get("env") == grid["env"]
                and meta.get("rc") == 0
                and os.path.exists(os.path.join(d, "summary.json"))):
            print("[%d/%d] %s: done before (--resume), %.1f s" % (i, n, label, meta.get("wall_s", 0)),
                  flush=True)
            continue
        if method != "fp32":
            ckpt = os.path.join(run_dir(runs, model, seed, "fp32", "fp32"), "checkpoint.h5")
            fp32_meta = read_json(os.path.join(os.path.dirname(ckpt), "grid_run.json"))
            if not os.path.exists(ckpt) or not fp32_meta or fp32_meta.get("rc") != 0:
                print("[%d/%d] %s: SKIPPED, its fp32 run failed" % (i, n, label), flush=True)
                if os.path.isdir(d):
                    shutil.rmtree(d)
                os.makedirs(d)
                with open(os.path.join(d, "grid_run.json"), "w") as f:
                    json.dump({"argv": argv, "rc": None, "wall_s": 0.0,
                               "error": "fp32 run failed"}, f, indent=1)
                continue
        if os.path.isdir(d):
            shutil.rmtree(d)  # no stale summary.json from an earlier run
        os.makedirs(d)
        print("[%d/%d] %s ..." % (i, n, label), end="", flush=True)
        t0 = time.time()
        with open(os.path.join(d, "log.txt"), "w") as log:
            log.write(" ".join(shlex.quote(a) for a in argv) + "\n\n")
            log.flush()
            rc = subprocess.call(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        wall = time.time() - t0
        with open(os.path.join(d, "grid_run.json"), "w") as f:
            json.dump({"argv": argv, "env": grid["env"], "rc": rc, "wall_s": round(wall, 2),
                       "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        rec = collect_run(runs, model, seed, method, bits)
        accs = " ".join("%s %s" % (STAGE_TITLES[s].split()[0], pct(rec[s]))
                        for s in ("fp32", "qdq", "int8") if rec[s] is not None)
        status = "ok" if rc == 0 else "FAILED (exit %d, see %s)" % (rc, os.path.join(d, "log.txt"))
        chk = "" if method == "fp32" else " check %s" % ("ok" if rec["check_ok"] else "NOT ok")
        print(" %.1f s  %s%s  %s  [grid %.0f s]" % (wall, accs, chk, status, time.time() - t_grid),
              flush=True)


# ----------------------------------------------------------------------------- collecting

def read_metrics(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def fnum(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def collect_run(runs, model, seed, method, bits):
    d = run_dir(runs, model, seed, method, bits)
    meta = read_json(os.path.join(d, "grid_run.json")) or {}
    s = read_json(os.path.join(d, "summary.json"))
    rec = {"model": model, "method": method, "bits": bits, "seed": seed, "dir": d,
           "rc": meta.get("rc"), "wall_s": meta.get("wall_s"), "finished": meta.get("finished"),
           "summary": s is not None}
    stages = (s or {}).get("stages") or {}
    for st in STAGES:
        rec[st] = fnum((stages.get(st) or {}).get("test_accuracy"))
    rec["test_images"] = (stages.get("fp32") or {}).get("test_images")
    check = (s or {}).get("check") or {}
    rec["check_ok"] = check.get("ok") if check else None
    rec["check_max_lsb"] = fnum(check.get("max_lsb"))
    iq = (s or {}).get("int8_vs_qdq") or {}
    rec["int8_max_lsb"] = fnum(iq.get("max_lsb"))
    rec["int8_top1_agreement"] = fnum(iq.get("top1_agreement"))
    tr = (s or {}).get("train") or {}
    eps = [fnum(e) for e in tr.get("epoch_seconds") or []]
    eps = [e for e in eps if e is not None]
    rec["epochs"] = len(eps)
    rec["epoch_s"] = statistics.mean(eps) if eps else None
    q = (s or {}).get("quant") or {}
    rec["weight_bits"] = q.get("weight_bits")
    rec["activation_bits"] = q.get("activation_bits")
    rec["quantizer"] = ""
    try:
        with open(os.path.join(d, "quantizer.txt")) as f:
            rec["quantizer"] = f.readline().strip().rstrip(":")
    except OSError:
        pass
    rec["metrics"] = read_metrics(os.path.join(d, "metrics.csv"))
    rec["ok"] = (rec["rc"] == 0 and rec["summary"])
    return rec


def mean_std(values):
    v = [x for x in values if x is not None]
    if not v:
        return None, None, 0
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0), len(v)


def aggregate(grid, records):
    table = []
    for model, method, bits in configured_rows(grid):
        recs = [r for r in records if (r["model"], r["method"], r["bits"]) == (model, method, bits)]
        ok = [r for r in recs if r["ok"]]
        row = {"model": model, "method": method, "bits": bits, "seeds_configured": len(grid["seeds"]),
               "n": len(ok), "failed": [r["seed"] for r in recs if not r["ok"]]}
        for st in STAGES:
            row[st] = mean_std(r[st] for r in ok)
        row["check_ok"] = sum(1 for r in ok if r["check_ok"] is True)
        lsb = [r["int8_max_lsb"] for r in ok if r["int8_max_lsb"] is not None]
        row["int8_max_lsb"] = max(lsb) if lsb else None
        agree = [r["int8_top1_agreement"] for r in ok if r["int8_top1_agreement"] is not None]
        row["int8_min_agreement"] = min(agree) if agree else None
        row["epoch_s"] = mean_std(r["epoch_s"] for r in ok)[0]
        row["wall_s"] = mean_std(r["wall_s"] for r in ok)[0]
        table.append(row)
    return table


# ----------------------------------------------------------------------------- writing

def pct(x, digits=2):
    return "—" if x is None else "%.*f" % (digits, 100.0 * x)


def pm(ms):
    m, s, n = ms
    if m is None:
        return "—"
    return "%.2f" % (100 * m) if n < 2 else "%.2f ± %.2f" % (100 * m, 100 * s)


def bits_label(bits):
    return "fp32" if bits == "fp32" else bits.upper()


def plot_order(bits_list):
    """Bit widths in the order the grid lists them (grid.ini: most bits first)."""
    return list(bits_list)


def shown_path(p):
    rel = os.path.relpath(p, REPO)
    return p if rel.startswith("..") else rel


def machine():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d cores" % (cpu or "unknown CPU", os.cpu_count() or 0)


def drop_table(grid, table):
    """Q/DQ accuracy minus fp32 (points, mean over seeds) per model, bits and method."""
    by = {(r["model"], r["method"], r["bits"]): r for r in table}
    lines = ["| model | bits | " + " | ".join("%s Q/DQ − fp32" % m.upper() for m in grid["methods"])
             + (" | QAT − PTQ |" if set(grid["methods"]) >= {"ptq", "qat"} else " |"),
             "|---|---|" + "---:|" * (len(grid["methods"]) + (1 if set(grid["methods"]) >= {"ptq", "qat"} else 0))]
    for model in grid["models"]:
        for bits in plot_order(grid["bits"]):
            cells = []
            vals = {}
            for m in grid["methods"]:
                r = by.get((model, m, bits))
                if r is None or r["qdq"][0] is None or r["fp32"][0] is None:
                    cells.append("—")
                    continue
                d = 100 * (r["qdq"][0] - r["fp32"][0])
                vals[m] = r["qdq"][0]
                cells.append(("**%+.2f**" if d < -2.0 else "%+.2f") % d)
            if set(grid["methods"]) >= {"ptq", "qat"}:
                cells.append("%+.2f" % (100 * (vals["qat"] - vals["ptq"]))
                             if "qat" in vals and "ptq" in vals else "—")
            lines.append("| %s | %s | %s |" % (model, bits_label(bits), " | ".join(cells)))
    return lines


def write_outputs(grid, records, table, out, runs, started, elapsed):
    os.makedirs(out, exist_ok=True)
    # runs.csv: one line per run
    cols = ["model", "method", "bits", "seed", "ok", "rc", "fp32", "fake_quant", "qdq", "int8", "check_ok",
            "check_max_lsb", "int8_max_lsb", "int8_top1_agreement", "epochs", "epoch_s", "wall_s",
            "test_images", "weight_bits", "activation_bits", "quantizer"]
    with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in records:
            w.writerow([("1" if r[c] else "0") if c == "ok" else "" if r[c] is None else
                        ("%.6f" % r[c] if isinstance(r[c], float) else r[c]) for c in cols])
    # results.json: the aggregated table
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"quick": grid["quick"], "grid": os.path.relpath(grid["path"], REPO),
                   "seeds": grid["seeds"], "machine": machine(), "written": started,
                   "runs_wall_min": round(sum(r["wall_s"] or 0 for r in records) / 60.0, 2),
                   "rows": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()}
                            for r in table]}, f, indent=1)

    quick = grid["quick"]
    images = sorted({r["test_images"] for r in records if r["test_images"]})
    extra = " ".join(grid["quick_overrides"])
    L = []
    if quick:
        L += ["# Experiment grid — QUICK variant (CI-sized, not the full grid)", "",
              "> **Quick results**: `grid.py --quick` — the same rows as the full grid but with `%s` "
              "and seeds %s. Accuracies here are far below the full-data numbers and say nothing "
              "about the methods; they only show that every row runs end to end." %
              (extra or "(no overrides)", ", ".join(map(str, grid["seeds"]))), ""]
    else:
        L += ["# Experiment grid: fp32, PTQ and QAT at several bit widths", ""]
    finished = [r["finished"] for r in records if r.get("finished")]
    L += ["Generated by `/usr/bin/python3 experiments/grid.py%s` from `%s` (%s); runs finished %s; "
          "the %d runs took %.1f min in total, one after the other." %
          (" --quick" if quick else "", os.path.relpath(grid["path"], REPO), machine(),
           ("%s to %s" % (min(finished), max(finished))) if finished else "—", len(records),
           sum(r["wall_s"] or 0 for r in records) / 60.0), ""]
    L += ["- Models: %s; seeds %s (mean ± sample std over seeds; n = seeds that ran)." %
          (", ".join(grid["models"]), ", ".join(map(str, grid["seeds"]))),
          "- fp32: `%s` (%s). PTQ and QAT start from the fp32 checkpoint of the same model and seed." %
          (grid["fp32_config"], " ".join(grid["method_overrides"].get("fp32", [])) or "as is"),
          ]
    for m in grid["methods"]:
        L.append("- %s: `%s`." % (m.upper(), " ".join(grid["method_overrides"].get(m, []))))
    L.append("- Every run: `%s`, one run at a time." % " ".join(
        ["train.threads=%d" % grid["threads"]] + grid["overrides"] + grid["quick_overrides"]
        + ["%s=%s" % kv for kv in sorted(grid["env"].items())]))
    L.append("- Test images per accuracy: %s. Stages: **fp32** (the fp32 checkpoint), **fake-quant** "
             "(the eval-mode training graph with fake quant), **Q/DQ** (the converted graph loaded back "
             "from model_qdq.h5), **int8 device** (the Q/DQ graph lowered to oneDNN int8 kernels). "
             "Accuracies in %%." % (", ".join(map(str, images)) or "—"))
    notes = sorted({r["quantizer"] for r in records if "restricted" in r["quantizer"]})
    for n in notes:
        L.append("- Note: `%s` (8-bit weights run as 7 bits on this CPU)." % n)
    L.append("")
    L += ["| model | method | bits | fp32 | fake-quant | Q/DQ | int8 device | int8 vs Q/DQ max LSB | "
          "check ok | n seeds |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        quant = r["method"] != "fp32"
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d%s |" % (
            r["model"], r["method"].upper() if quant else "fp32", bits_label(r["bits"]),
            pm(r["fp32"]), pm(r["fake_quant"]) if quant else "—", pm(r["qdq"]) if quant else "—",
            pm(r["int8"]) if quant else "—",
            ("—" if r["int8_max_lsb"] is None else "%.0f" % r["int8_max_lsb"]) if quant else "—",
            "%d/%d" % (r["check_ok"], r["seeds_configured"]) if quant else "—",
            r["n"], "" if not r["failed"] else " (failed: seeds %s)" % ", ".join(map(str, r["failed"]))))
    L += ["", "## Where each method breaks", "",
          "Q/DQ accuracy minus fp32 accuracy in points (mean over seeds; **bold**: more than 2 points "
          "lost), and what QAT gains over PTQ at the same bit widths:", ""]
    L += drop_table(grid, table)
    # stage 2, per run
    q = [r for r in records if r["method"] != "fp32" and r["ok"]
         and r["qdq"] is not None and r["int8"] is not None]
    if q:
        diff = [abs(r["qdq"] - r["int8"]) for r in q]
        lsb = [r["int8_max_lsb"] for r in q if r["int8_max_lsb"] is not None]
        agree = [r["int8_top1_agreement"] for r in q if r["int8_top1_agreement"] is not None]
        L += ["", "Lowering (Q/DQ graph → int8 device), per run: in %d of %d quantized runs the two "
              "had the same test accuracy; the largest difference was %.2f points, the lowest top-1 "
              "agreement %s%%, the largest logit difference %s output LSB." %
              (sum(1 for d in diff if d == 0.0), len(q), 100 * max(diff),
               "%.2f" % (100 * min(agree)) if agree else "—",
               "%.0f" % max(lsb) if lsb else "—")]
    L += ["", "## Plots", "",
          "![accuracy vs bit width](accuracy_vs_bits.png)", "",
          "`accuracy_vs_bits.png`: Q/DQ-graph test accuracy of PTQ and QAT per bit width (mean ± std "
          "over seeds; open markers: the int8 device), the fp32 accuracy as a dashed line.", "",
          "![QAT minus PTQ](ptq_vs_qat.png)", "",
          "`ptq_vs_qat.png`: QAT minus PTQ (Q/DQ graph), points, mean ± std over seeds of the "
          "per-seed difference (both start from the same fp32 checkpoint).", "",
          "![QAT training curves](qat_curves.png)", "",
          "`qat_curves.png`: test accuracy and training loss per epoch (mean ± std over seeds): the "
          "fp32 epochs, then the QAT epochs of every bit width, which start from the last fp32 epoch.",
          ""]
    L += ["## Timings", "",
          "Medians over the runs of a kind (seeds and bit widths; a median, because the machine "
          "may be shared and a few runs slowed down by others).", "",
          "| model | fp32 epoch s | QAT epoch s | fp32 run s | PTQ run s | QAT run s |",
          "|---|---:|---:|---:|---:|---:|"]
    for model in grid["models"]:
        def avg(method, key):
            v = [r[key] for r in records if r["model"] == model and r["method"] == method
                 and r["ok"] and r[key] is not None]
            return ("%.1f" if key == "wall_s" else "%.2f") % statistics.median(v) if v else "—"
        L.append("| %s | %s | %s | %s | %s | %s |" % (model, avg("fp32", "epoch_s"), avg("qat", "epoch_s"),
                 avg("fp32", "wall_s"), avg("ptq", "wall_s"), avg("qat", "wall_s")))
    L += ["", "A quantized run's wall time includes convert, the consistency check, lowering, the "
          "three-stage evaluation and the fp32/int8 inference timing. Per-run numbers: `runs.csv`; "
          "run directories: `%s` (not committed)." % shown_path(runs), ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L))


# ----------------------------------------------------------------------------- plots

def fmt(x, scale=100.0):
    return "?" if x is None else "%.4f" % (scale * x)


def write_plots(grid, records, table, out):
    pd = os.path.join(out, "plotdata")
    os.makedirs(pd, exist_ok=True)
    by = {(r["model"], r["method"], r["bits"]): r for r in table}
    order = plot_order(grid["bits"])
    models = grid["models"]
    # accuracy vs bits, one file per model
    for model in models:
        fp = by[(model, "fp32", "fp32")]["fp32"]
        with open(os.path.join(pd, "acc_%s.dat" % model), "w") as f:
            f.write("# x bits ptq_qdq ptq_std ptq_int8 qat_qdq qat_std qat_int8 fp32 fp32_std\n")
            for i, bits in enumerate(order):
                cells = []
                for m in ("ptq", "qat"):
                    r = by.get((model, m, bits))
                    cells += ([fmt(r["qdq"][0]), fmt(r["qdq"][1]), fmt(r["int8"][0])] if r
                              else ["?", "?", "?"])
                f.write("%d %s %s %s %s\n" % (i, bits_label(bits), " ".join(cells),
                                              fmt(fp[0]), fmt(fp[1])))
    # QAT - PTQ, paired per seed
    with open(os.path.join(pd, "gain.dat"), "w") as f:
        f.write("# bits " + " ".join("%s %s_std" % (m, m) for m in models) + "\n")
        for bits in order:
            cells = []
            for model in models:
                d = []
                for seed in grid["seeds"]:
                    p = [r for r in records if (r["model"], r["method"], r["bits"], r["seed"])
                         == (model, "ptq", bits, seed) and r["ok"] and r["qdq"] is not None]
                    q = [r for r in records if (r["model"], r["method"], r["bits"], r["seed"])
                         == (model, "qat", bits, seed) and r["ok"] and r["qdq"] is not None]
                    if p and q:
                        d.append(q[0]["qdq"] - p[0]["qdq"])
                m, s, _ = mean_std(d)
                cells += [fmt(m), fmt(s if s is not None else None)]
            f.write("%s %s\n" % (bits_label(bits), " ".join(cells)))
    # training curves: fp32 epochs then QAT epochs, mean +- std over seeds
    curve_titles = {}
    for model in models:
        blocks, titles = [], []
        fp32_recs = [r for r in records if r["model"] == model and r["method"] == "fp32" and r["ok"]]
        n_fp32 = max([len(r["metrics"]) for r in fp32_recs] or [0])

        def block(recs, offset):
            rows = []
            n = max([len(r["metrics"]) for r in recs] or [0])
            for e in range(n):
                acc = mean_std(fnum(r["metrics"][e].get("test_accuracy")) for r in recs
                               if len(r["metrics"]) > e)
                loss = mean_std(fnum(r["metrics"][e].get("train_loss")) for r in recs
                                if len(r["metrics"]) > e)
                rows.append("%d %s %s %s %s" % (offset + e + 1, fmt(acc[0]), fmt(acc[1]),
                                                fmt(loss[0], 1.0), fmt(loss[1], 1.0)))
            return rows

        blocks.append(block(fp32_recs, 0))
        titles.append("fp32")
        if "qat" in grid["methods"]:
            for bits in order:
                recs = [r for r in records if (r["model"], r["method"], r["bits"]) == (model, "qat", bits)
                        and r["ok"]]
                blocks.append(block(recs, n_fp32))
                titles.append("QAT " + bits_label(bits))
        with open(os.path.join(pd, "curves_%s.dat" % model), "w") as f:
            f.write("# epoch test_acc test_acc_std train_loss train_loss_std; blocks: %s\n"
                    % ", ".join(titles))
            for b in blocks:
                f.write("\n".join(b or ["? ? ? ? ?"]) + "\n\n\n")
        curve_titles[model] = (titles, n_fp32)

    tag = " (QUICK grid)" if grid["quick"] else ""
    nseeds = len(grid["seeds"])
    G = ['# Draws the grid plots; run from %s: gnuplot plotdata/plots.gp' % "the results folder",
         'set datafile missing "?"',
         'set encoding utf8',
         'set grid ytics lc rgb "#dddddd"',
         'set key below horizontal maxcols 3 font ",10"',
         'set bars small',
         '# accuracy vs bit width',
         'set terminal pngcairo noenhanced size %d,520 font "sans,11"' % (460 * len(models) + 40),
         'set output "accuracy_vs_bits.png"',
         'set multiplot layout 1,%d title "Test accuracy vs bit width: PTQ and QAT (Q/DQ graph, '
         'mean ± std over %d seed%s)%s"' % (len(models), nseeds, "s" if nseeds > 1 else "", tag),
         'set xrange [-0.5:%f]' % (len(order) - 0.5),
         'set ylabel "test accuracy (%)"',
         'set xlabel "bit width (W: weights, A: activations)"']
    for model in models:
        f = "plotdata/acc_%s.dat" % model
        parts = ['"%s" u 1:9:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32"' % f]
        if "ptq" in grid["methods"]:
            parts += ['"%s" u ($1-0.07):3:4 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ"' % f,
                      '"%s" u ($1-0.07):5 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ int8 device"' % f]
        if "qat" in grid["methods"]:
            parts += ['"%s" u ($1+0.07):6:7 w yerrorlines pt 5 lw 2 lc rgb "#1f77b4" t "QAT"' % f,
                      '"%s" u ($1+0.07):8 w points pt 4 ps 1.6 lc rgb "#1f77b4" t "QAT int8 device"' % f]
        G += ['set title "%s"' % model, 'plot ' + ", \\\n     ".join(parts)]
    G += ['unset multiplot', 'unset xrange', 'unset xlabel']
    # QAT - PTQ
    if "ptq_vs_qat.png" in plot_files(grid):
        G += ['set terminal pngcairo noenhanced size 900,520 font "sans,11"',
              'set output "ptq_vs_qat.png"',
              'set title "QAT minus PTQ, Q/DQ-graph test accuracy (points, mean ± std over seeds)%s"'
              % tag,
              'set style data histograms',
              'set style histogram errorbars gap 2 lw 1',
              'set style fill solid 0.8 border -1',
              'set boxwidth 0.9',
              'set key inside top left',
              'set yrange [*:*]',
              'set xzeroaxis lt -1',
              'set ylabel "QAT − PTQ (points)"']
        colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
        parts = []
        for i, model in enumerate(models):
            c = 2 + 2 * i
            parts.append('"plotdata/gain.dat" u %d:%d%s t "%s" lc rgb "%s"'
                         % (c, c + 1, ":xtic(1)" if i == 0 else "", model,
                            colors[i % len(colors)]))
        G += ['plot ' + ", \\\n     ".join(parts)]
        G += ['set style data lines', 'set style fill empty', 'unset xzeroaxis']
    # training curves
    G += ['set terminal pngcairo noenhanced size %d,820 font "sans,11"' % (460 * len(models) + 40),
          'set output "qat_curves.png"',
          'set multiplot layout 2,%d title "Training curves: fp32 epochs, then QAT (mean ± std over '
          'seeds)%s"' % (len(models), tag),
          'set key inside bottom right font ",9"',
          'set xlabel "epoch"', 'set xtics 1']
    palette = ["#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    for panel, (col, lab) in enumerate(((2, "test accuracy (%)"), (4, "training loss"))):
        for model in models:
            titles, n_fp32 = curve_titles[model]
            f = "plotdata/curves_%s.dat" % model
            G += ['set title "%s"' % model, 'set ylabel "%s"' % lab,
                  'set arrow 1 from %f, graph 0 to %f, graph 1 nohead dt 3 lc rgb "#888888"'
                  % (n_fp32 + 0.5, n_fp32 + 0.5)]
            if panel == 1:
                G.append('set logscale y')
            parts = []
            for i, t in enumerate(titles):
                parts.append('"%s" index %d u 1:%d:%d w yerrorlines pt 7 ps 0.8 lw %d lc rgb "%s" t "%s"'
                             % (f, i, col, col + 1, 2 if i == 0 else 1, palette[i % len(palette)], t))
            G += ['plot ' + ", \\\n     ".join(parts)]
            if panel == 1:
                G.append('unset logscale y')
    G += ['unset multiplot', 'unset arrow 1', 'set output']
    gp = os.path.join(pd, "plots.gp")
    with open(gp, "w") as f:
        f.write("\n".join(G) + "\n")
    for png in ("accuracy_vs_bits.png", "ptq_vs_qat.png", "qat_curves.png"):
        p = os.path.join(out, png)
        if os.path.exists(p):
            os.remove(p)
    if not shutil.which("gnuplot"):
        print("grid: gnuplot not found (Debian: apt-get install gnuplot-nox); plots not drawn",
              file=sys.stderr)
        return False
    r = subprocess.run(["gnuplot", os.path.join("plotdata", "plots.gp")], cwd=out,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0 or r.stdout.strip():
        print("grid: gnuplot (exit %d):\n%s" % (r.returncode, r.stdout), file=sys.stderr)
    return r.returncode == 0


# ----------------------------------------------------------------------------- checking

def plot_files(grid):
    both = set(grid["methods"]) >= {"ptq", "qat"}
    return ["accuracy_vs_bits.png"] + (["ptq_vs_qat.png"] if both else []) + ["qat_curves.png"]


def check_outputs(grid, out):
    problems = []
    res = read_json(os.path.join(out, "results.json"))
    if res is None:
        return ["%s missing or unreadable" % os.path.join(out, "results.json")]
    rows = {(r["model"], r["method"], r["bits"]): r for r in res.get("rows", [])}
    try:
        with open(os.path.join(out, "results.md")) as f:
            md = f.read()
    except OSError:
        md = None
        problems.append("results.md missing")
    try:
        with open(os.path.join(out, "runs.csv"), newline="") as f:
            runs = list(csv.DictReader(f))
    except OSError:
        runs = []
        problems.append("runs.csv missing")
    nseeds = len(grid["seeds"])
    for key in configured_rows(grid):
        model, method, bits = key
        name = "%s %s %s" % (model, method, bits)
        r = rows.get(key)
        if r is None:
            problems.append("%s: row missing from results.json" % name)
            continue
        if r["n"] != nseeds:
            problems.append("%s: %d of %d seeds ran (failed: %s)" % (name, r["n"], nseeds, r["failed"]))
        need = ("fp32",) if method == "fp32" else ("fp32", "fake_quant", "qdq", "int8")
        for st in need if r["n"] else ():
            m = r.get(st)
            if not m or m[0] is None or m[2] != r["n"]:
                problems.append("%s: stage %s (%s) not reported by every run"
                                % (name, st, STAGE_TITLES[st]))
        if method != "fp32" and r["n"] and r["check_ok"] != r["n"]:
            problems.append("%s: consistency check ok in %d of %d runs" % (name, r["check_ok"], r["n"]))
        if md is not None and ("| %s | %s | %s |" % (model, method.upper() if method != "fp32" else "fp32",
                                                     bits_label(bits))) not in md:
            problems.append("%s: row missing from results.md" % name)
        got = [x for x in runs if (x["model"], x["method"], x["bits"]) == key]
        if len(got) != nseeds:
            problems.append("%s: %d lines in runs.csv, expected %d" % (name, len(got), nseeds))
        for x in got:
            if x.get("ok") != "1":
                continue  # reported above as a seed that did not run
            for st in need:
                v = fnum(x.get(st))
                if v is None or not (0.0 <= v <= 1.0):
                    problems.append("%s seed %s: %s accuracy %r not in [0, 1]" % (name, x["seed"], st, x.get(st)))
    for png in plot_files(grid):
        p = os.path.join(out, png)
        try:
            with open(p, "rb") as f:
                head = f.read(8)
            size = os.path.getsize(p)
        except OSError:
            problems.append("%s missing" % png)
            continue
        if head != b"\x89PNG\r\n\x1a\n" or size < 2000:
            problems.append("%s is not a non-empty PNG (%d bytes)" % (png, size))
    return problems


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--config", default=os.path.join(REPO, "experiments", "grid", "grid.ini"),
                    help="grid description (default: experiments/grid/grid.ini)")
    ap.add_argument("--quick", action="store_true", help="the CI-sized variant ([quick] of the config)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory holding bin/qat_train (default: build/)")
    ap.add_argument("--out", help="results folder (default: experiments/results/; with --quick "
                    "runs/grid_quick/results/)")
    ap.add_argument("--runs", help="run directories (default: runs/grid/, with --quick "
                    "runs/grid_quick/runs/, OUT/runs/ when --out is given)")
    ap.add_argument("--resume", action="store_true",
                    help="keep runs that finished before with the same command")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing; write tables and plots from the existing runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    ap.add_argument("--check", action="store_true",
                    help="validate the outputs; exit 1 if anything is missing or wrong")
    a = ap.parse_args()

    grid = load_grid(os.path.abspath(a.config), a.quick)
    if a.out:
        out = os.path.abspath(a.out)
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(out, "runs")
    elif a.quick:  # not committed: experiments/results/ holds the full grid's results
        out = os.path.join(REPO, "runs", "grid_quick", "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "grid_quick", "runs")
    else:
        out = os.path.join(REPO, "experiments", "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "grid")
    qat_train = os.path.join(os.path.abspath(a.build), "bin", "qat_train")
    p = plan(grid, qat_train, runs)
    if a.dry_run:
        for model, seed, method, bits, argv in p:
            print(" ".join(shlex.quote(x) for x in argv))
        print("# %d runs, %d table rows" % (len(p), len(configured_rows(grid))))
        return 0
    started = time.strftime("%Y-%m-%d %H:%M")
    t0 = time.time()
    if not a.report_only:
        if not os.access(qat_train, os.X_OK):
            sys.exit("grid: %s not found; build first (cmake -S . -B build && cmake --build build)"
                     % qat_train)
        print("grid: %d runs (%s%d models x %d seeds), runs in %s, results in %s" %
              (len(p), "quick, " if a.quick else "", len(grid["models"]), len(grid["seeds"]), runs, out),
              flush=True)
        execute(p, runs, a.resume, grid)
    records = [collect_run(runs, m, s, me, b) for m, s, me, b, _ in p]
    if not any(r["summary"] for r in records):
        print("grid: no run results in %s" % runs, file=sys.stderr)
    table = aggregate(grid, records)
    elapsed = time.time() - t0
    write_outputs(grid, records, table, out, runs, started, elapsed)
    write_plots(grid, records, table, out)
    print("grid: wrote %s (%.1f min)" % (os.path.join(out, "results.md"), elapsed / 60), flush=True)
    if a.check:
        problems = check_outputs(grid, out)
        if problems:
            print("grid --check: %d problem%s:" % (len(problems), "s" if len(problems) > 1 else ""))
            for pr in problems:
                print("  " + pr)
            return 1
        print("grid --check: ok (%d rows x %d seeds, 3 stages, %d plots)" %
              (len(configured_rows(grid)), len(grid["seeds"]), 3))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. --dry-run | head
        sys.exit(0)
