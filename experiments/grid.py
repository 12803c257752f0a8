#!/usr/bin/python3
"""Runs the experiment grid and writes its results (tables and plots).

    /usr/bin/python3 experiments/grid.py                 # the full grid -> experiments/results/
    /usr/bin/python3 experiments/grid.py --quick --check # CI-sized grid -> runs/grid_quick/results/
    /usr/bin/python3 experiments/grid.py --report-only   # redraw tables and plots from the runs
    /usr/bin/python3 experiments/grid.py --models fashion_cnn --seeds 0 --resume  # a slice -> runs/grid_slice/

The grid is experiments/grid/grid.ini (experiments/grid/onnx.ini: the ONNX models, same
recipes, results in experiments/results/onnx/; --config). A method is a named recipe ([ptq], [ptq_mse], [qat],
...: mode ptq|qat, a label, qat_train overrides). The main table is models x methods x bit
widths ([grid]); a study ([study:NAME]) is a further table over its own models, bit widths and
methods (the QAT knobs); [ptq_debug] runs qat_train's PTQ debugging ([analysis] keys) per model.
For every model and seed, one fp32 checkpoint is trained with the model's fp32 recipe; every
quantized run of that (model, seed) starts from it, and a (model, method, bits, seed) shared by
several tables runs once. Runs are sequential (each qat_train uses all `threads`). Each run
lives in RUNS/<model>/seed<S>/<method>[_wXaY]/ (qat_train's output.dir, with grid_run.json:
the command, exit status and wall time, and log.txt: its output).

Writes into OUT: results.md (the main table: mean +- std over seeds of every stage; where each
method breaks; the studies), results.json, runs.csv (one line per run), accuracy_vs_bits.png,
ptq_vs_qat.png, qat_curves.png, study_<NAME>.png, ptq_debug.md with ptq_debug/ (each model's
analysis.md/json) and plotdata/ (the gnuplot script and its data files). --check validates OUT
(every configured row of every table present with all its seeds, accuracies in [0, 1], the
three stages fp32 / Q/DQ / int8 device in every quantized row, the consistency check passed,
the PTQ-debugging analyses present, the plots non-empty PNGs) and exits 1 otherwise.

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


METHOD_KEYS = {"mode", "label", "about", "overrides"}
STUDY_KEYS = {"title", "about", "models", "bits", "methods"}
DEBUG_KEYS = {"models", "bits", "seed", "overrides"}
GRID_KEYS = {"models", "methods", "bits", "seeds", "threads", "fp32_config", "overrides", "env",
             "base"}
DEBUG = "ptq_debug"  # the method name of PTQ-debugging runs


def load_grid(path, quick):
    cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
    cp.optionxform = str
    if not cp.read(path):
        sys.exit("grid: cannot read %s" % path)
    if not cp.has_section("grid"):
        sys.exit("grid: %s has no [grid] section" % path)

    def fail(msg):
        sys.exit("grid: %s: %s" % (path, msg))

    # [grid] base = OTHER.ini (relative to this file): a grid of other models with the same
    # recipes. The base's [grid] and [quick] keys and its method sections ([fp32], [<method>],
    # [<method>:<model>]) apply wherever this file does not set them; its studies and its
    # [ptq_debug] belong to its own models and are not taken.
    base = cp["grid"].get("base", "").strip()
    if base:
        bpath = os.path.join(os.path.dirname(path), base)
        bcp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
        bcp.optionxform = str
        if not bcp.read(bpath):
            fail("[grid] base: cannot read %s" % bpath)
        if bcp.has_section("grid") and bcp["grid"].get("base", "").strip():
            fail("[grid] base: %s has a base of its own (one level only)" % bpath)
        for sec in bcp.sections():
            if sec.startswith("study:") or sec == DEBUG:
                continue
            if not cp.has_section(sec):
                cp.add_section(sec)
            for k, v in bcp[sec].items():
                if not cp.has_option(sec, k):
                    cp[sec][k] = v

    def check_keys(sec, known):
        for k in cp[sec]:
            if k not in known:
                fail("unknown key %r in [%s] (known: %s)" % (k, sec, ", ".join(sorted(known))))

    def bits_list(text, where):
        out = split_list(text)
        for b in out:
            try:
                parse_bits(b)
            except ValueError as e:
                fail("%s: %s" % (where, e))
        return out

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
    for k in g:
        if k not in GRID_KEYS:
            fail("unknown key %r in [grid]/[quick] (known: %s)" % (k, ", ".join(sorted(GRID_KEYS))))
    grid = {
        "path": path,
        "quick": quick,
        "models": split_list(g.get("models", "")),
        "methods": split_list(g.get("methods", "")),
        "bits": bits_list(g.get("bits", ""), "[grid] bits"),
        "seeds": [int(s) for s in split_list(g.get("seeds", "0"))],
        "threads": int(g.get("threads", "2")),
        "fp32_config": g.get("fp32_config", "experiments/{model}_fp32.ini"),
        "overrides": shlex.split(g.get("overrides", "")),
        "env": dict(kv.split("=", 1) for kv in shlex.split(g.get("env", "")) if "=" in kv),
        "quick_overrides": quick_overrides,
        "method_defs": {"fp32": {"mode": "fp32", "label": "fp32", "about": "", "overrides": []}},
        "model_overrides": {},
        "studies": [],
        "debug": None,
    }
    if not grid["models"] or not grid["seeds"]:
        fail("models and seeds must not be empty")
    defs = grid["method_defs"]
    for sec in cp.sections():
        if sec in ("grid", "quick"):
            continue
        if sec.startswith("study:"):
            continue
        if sec == DEBUG:
            check_keys(sec, DEBUG_KEYS)
            d = cp[sec]
            grid["debug"] = {
                "models": split_list(d.get("models", "")) or grid["models"],
                "bits": bits_list(d.get("bits", "w4a4"), "[%s] bits" % sec),
                "seed": int(d.get("seed", str(grid["seeds"][0]))),
                "overrides": shlex.split(d.get("overrides", "")),
            }
            if grid["debug"]["seed"] not in grid["seeds"]:
                fail("[%s] seed %d is not one of the grid's seeds %s (it needs that fp32 checkpoint)"
                     % (sec, grid["debug"]["seed"], grid["seeds"]))
            defs[DEBUG] = {"mode": "ptq", "label": "PTQ debugging", "about": "",
                           "overrides": grid["debug"]["overrides"]}
            continue
        if ":" in sec:  # [method:model]: extra overrides of one method on one model
            check_keys(sec, {"overrides"})
            grid["model_overrides"][sec] = shlex.split(cp[sec].get("overrides", ""))
            continue
        check_keys(sec, METHOD_KEYS if sec != "fp32" else {"overrides", "about"})
        d = cp[sec]
        if sec == "fp32":
            defs["fp32"]["overrides"] = shlex.split(d.get("overrides", ""))
            continue
        mode = d.get("mode", sec if sec in ("ptq", "qat") else "")
        if mode not in ("ptq", "qat"):
            fail("[%s]: mode must be ptq or qat (got %r)" % (sec, mode))
        if sec == DEBUG or not sec.replace("_", "").isalnum():
            fail("[%s]: a method name is letters, digits and underscores (and not %s)" % (sec, DEBUG))
        defs[sec] = {"mode": mode, "label": d.get("label", sec.upper()).strip(),
                     "about": " ".join(d.get("about", "").split()),
                     "overrides": shlex.split(d.get("overrides", ""))}
    for m in grid["methods"]:
        if m not in defs or m in ("fp32", DEBUG):
            fail("[grid] method %r has no [%s] section with mode = ptq|qat" % (m, m))
    for sec in cp.sections():
        if not sec.startswith("study:"):
            continue
        check_keys(sec, STUDY_KEYS)
        d = cp[sec]
        st = {"name": sec.split(":", 1)[1], "title": d.get("title", sec).strip(),
              "about": " ".join(d.get("about", "").split()),
              "models": split_list(d.get("models", "")) or grid["models"],
              "bits": bits_list(d.get("bits", ""), "[%s] bits" % sec) or grid["bits"],
              "methods": split_list(d.get("methods", ""))}
        if not st["methods"]:
            fail("[%s] lists no methods" % sec)
        for m in st["methods"]:
            if m not in defs or m in ("fp32", DEBUG):
                fail("[%s] method %r has no section of its own with mode = ptq|qat" % (sec, m))
        grid["studies"].append(st)
    for key in grid["model_overrides"]:
        if key.split(":", 1)[0] not in defs:
            fail("[%s]: %r is not a method" % (key, key.split(":", 1)[0]))
    seen = {}
    for m in defs:
        if defs[m]["label"] in seen:
            fail("[%s] and [%s] share the label %r (tables and plots name methods by label)"
                 % (seen[defs[m]["label"]], m, defs[m]["label"]))
        seen[defs[m]["label"]] = m
    return grid


def restrict(grid, models, seeds):
    """--models / --seeds: keep only those, in the main table, the studies and PTQ debugging."""
    if models:
        keep = split_list(models)
        known = set(grid["models"]) | {m for st in grid["studies"] for m in st["models"]}
        for m in keep:
            if m not in known:
                sys.exit("grid: --models: %r is not a model of the grid (%s)" % (m, ", ".join(sorted(known))))
        grid["models"] = [m for m in grid["models"] if m in keep]
        for st in grid["studies"]:
            st["models"] = [m for m in st["models"] if m in keep]
        grid["studies"] = [st for st in grid["studies"] if st["models"]]
        if grid["debug"]:
            grid["debug"]["models"] = [m for m in grid["debug"]["models"] if m in keep]
            if not grid["debug"]["models"]:
                grid["debug"] = None
        if not grid["models"]:
            sys.exit("grid: --models leaves the main table empty")
    if seeds:
        try:
            keep = [int(x) for x in split_list(seeds)]
        except ValueError:
            sys.exit("grid: --seeds: %r is not a list of integers" % seeds)
        for x in keep:
            if x not in grid["seeds"]:
                sys.exit("grid: --seeds: %d is not a seed of the grid (%s)" % (x, grid["seeds"]))
        grid["seeds"] = [x for x in grid["seeds"] if x in keep]
        if grid["debug"] and grid["debug"]["seed"] not in grid["seeds"]:
            grid["debug"] = None


def mode(grid, method):
    return grid["method_defs"][method]["mode"]


def label(grid, method):
    return grid["method_defs"][method]["label"]


def configured_rows(grid):
    """(model, method, bits) of every row of the main table, in table order."""
    rows = []
    for model in grid["models"]:
        rows.append((model, "fp32", "fp32"))
        for method in grid["methods"]:
            for bits in grid["bits"]:
                rows.append((model, method, bits))
    return rows


def study_rows(study):
    return [(model, method, bits) for model in study["models"] for bits in study["bits"]
            for method in study["methods"]]


def all_rows(grid):
    """Every (model, method, bits) some table shows, without repeats, fp32 rows included."""
    rows = list(configured_rows(grid))
    for st in grid["studies"]:
        for model in st["models"]:
            if (model, "fp32", "fp32") not in rows:
                rows.append((model, "fp32", "fp32"))
        rows += [r for r in study_rows(st) if r not in rows]
    return rows


def debug_runs(grid):
    d = grid["debug"]
    return [] if not d else [(model, d["seed"], DEBUG, bits) for model in d["models"] for bits in d["bits"]]


def run_dir(runs, model, seed, method, bits):
    name = "fp32" if method == "fp32" else "%s_%s" % (method, bits)
    return os.path.join(runs, model, "seed%d" % seed, name)


def command(grid, qat_train, runs, model, seed, method, bits):
    cfg = os.path.join(REPO, grid["fp32_config"].replace("{model}", model))
    argv = [qat_train, cfg] + list(grid["overrides"])
    argv += grid["method_defs"][method]["overrides"]
    argv += grid["model_overrides"].get("%s:%s" % (method, model), [])
    argv += grid["quick_overrides"]
    if method != "fp32":
        w, a = parse_bits(bits)
        ckpt = os.path.join(run_dir(runs, model, seed, "fp32", "fp32"), "checkpoint.h5")
        argv += ["quant.mode=%s" % mode(grid, method), "quant.weight_bits=%d" % w,
                 "quant.activation_bits=%d" % a, "quant.fp32_checkpoint=%s" % ckpt]
    argv += ["train.seed=%d" % seed, "train.threads=%d" % grid["threads"],
             "output.dir=%s" % run_dir(runs, model, seed, method, bits), "output.progress=lines"]
    return argv


def plan(grid, qat_train, runs):
    """Every run in execution order: the fp32 run of a (model, seed) first, the PTQ-debugging
    runs last."""
    rows = all_rows(grid)
    models = []
    for model, _, _ in rows:
        if model not in models:
            models.append(model)
    out = []
    for model in models:
        for seed in grid["seeds"]:
            out += [(model, seed, method, bits) for m, method, bits in rows if m == model]
    out += debug_runs(grid)
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
    for model, method, bits in all_rows(grid):
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


def qat_methods(grid, methods):
    return [m for m in methods if mode(grid, m) == "qat"]


def ptq_methods(grid, methods):
    return [m for m in methods if mode(grid, m) == "ptq"]


def primary_qat(grid):
    """The QAT method the training curves follow: the first QAT method of [grid] methods."""
    q = qat_methods(grid, grid["methods"])
    return q[0] if q else None


def paired(records, model, bits, a, b, seeds):
    """Per-seed differences of the Q/DQ accuracy of method a and method b (b = "fp32": the
    fp32 checkpoint of that seed), as (mean, std, n)."""
    d = []
    for seed in seeds:
        ra = [r for r in records if (r["model"], r["method"], r["bits"], r["seed"]) == (model, a, bits, seed)
              and r["ok"] and r["qdq"] is not None]
        if not ra:
            continue
        if b == "fp32":
            if ra[0]["fp32"] is not None:
                d.append(ra[0]["qdq"] - ra[0]["fp32"])
            continue
        rb = [r for r in records if (r["model"], r["method"], r["bits"], r["seed"]) == (model, b, bits, seed)
              and r["ok"] and r["qdq"] is not None]
        if rb:
            d.append(ra[0]["qdq"] - rb[0]["qdq"])
    return mean_std(d)


def gain_pairs(grid):
    """(QAT method, PTQ method) pairs of the main table whose difference is reported."""
    return [(q, p) for q in qat_methods(grid, grid["methods"]) for p in ptq_methods(grid, grid["methods"])]


def drop_table(grid, table):
    """Q/DQ accuracy minus fp32 (points, mean over seeds) per model, bits and method, and the
    QAT - PTQ differences."""
    by = {(r["model"], r["method"], r["bits"]): r for r in table}
    pairs = gain_pairs(grid)
    lines = ["| model | bits | " + " | ".join("%s Q/DQ − fp32" % label(grid, m) for m in grid["methods"])
             + "".join(" | %s − %s" % (label(grid, q), label(grid, p)) for q, p in pairs) + " |",
             "|---|---|" + "---:|" * (len(grid["methods"]) + len(pairs))]
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
            for q, p in pairs:
                cells.append("%+.2f" % (100 * (vals[q] - vals[p])) if q in vals and p in vals else "—")
            lines.append("| %s | %s | %s |" % (model, bits_label(bits), " | ".join(cells)))
    return lines


def study_table(grid, st, records, table):
    by = {(r["model"], r["method"], r["bits"]): r for r in table}
    cols = [(model, bits) for model in st["models"] for bits in st["bits"]]
    head = ["| method | recipe (overrides of the grid's fp32 recipe) |"]
    for model, bits in cols:
        fp = by.get((model, "fp32", "fp32"))
        head.append(" %s %s (fp32 %s) |" % (model, bits_label(bits), pm(fp["fp32"]) if fp else "—"))
    L = ["".join(head), "|---|---|" + "---:|" * len(cols)]
    for m in st["methods"]:
        d = grid["method_defs"][m]
        recipe = d["about"] or "`%s`" % " ".join(d["overrides"])
        cells = []
        for model, bits in cols:
            r = by.get((model, m, bits))
            g = paired(records, model, bits, m, "fp32", grid["seeds"])
            if r is None or r["qdq"][0] is None:
                cells.append("—")
            else:
                cells.append("%s (%s)" % (pm(r["qdq"]), "—" if g[0] is None else "%+.2f" % (100 * g[0])))
        L.append("| %s | %s | %s |" % (d["label"], recipe, " | ".join(cells)))
    return L


def debug_outputs(grid, records, out):
    """Copies every PTQ-debugging run's analysis into OUT/ptq_debug/<model>_<bits>.{md,json} and
    writes OUT/ptq_debug.md (all of them); returns [(model, bits, ok)]."""
    dd = os.path.join(out, DEBUG)
    if os.path.isdir(dd):
        shutil.rmtree(dd)
    res = []
    md = ["# PTQ debugging", "",
          "Written by `experiments/grid.py` (section `[%s]` of `%s`): qat_train's `[analysis]` on the "
          "seed-%d fp32 checkpoint of each model, overrides `%s`. One section per model and bit width "
          "(the run's analysis.md); the JSON twins are in `%s/`." %
          (DEBUG, os.path.relpath(grid["path"], REPO), grid["debug"]["seed"],
           " ".join(grid["debug"]["overrides"] + grid["quick_overrides"]), DEBUG), ""]
    for model, seed, method, bits in debug_runs(grid):
        r = [x for x in records if (x["model"], x["seed"], x["method"], x["bits"]) == (model, seed, method, bits)]
        src = os.path.join(r[0]["dir"], "analysis.md") if r else ""
        ok = bool(r) and r[0]["ok"] and os.path.exists(src)
        res.append((model, bits, ok))
        md.append("")
        if not ok:
            md += ["## %s %s: no analysis (the run failed; see %s)" %
                   (model, bits_label(bits), shown_path(os.path.join(r[0]["dir"], "log.txt")) if r else "—"), ""]
            continue
        os.makedirs(dd, exist_ok=True)
        for ext in ("md", "json"):
            f = os.path.join(r[0]["dir"], "analysis." + ext)
            if os.path.exists(f):
                shutil.copyfile(f, os.path.join(dd, "%s_%s.%s" % (model, bits, ext)))
        with open(src) as f:
            for line in f.read().rstrip("\n").split("\n"):
                md.append("#" + line if line.startswith("#") else line)
    with open(os.path.join(out, "ptq_debug.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return res


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
    debug = debug_outputs(grid, records, out) if grid["debug"] else []
    # results.json: the aggregated table
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"quick": grid["quick"], "grid": os.path.relpath(grid["path"], REPO),
                   "seeds": grid["seeds"], "machine": machine(), "written": started,
                   "runs_wall_min": round(sum(r["wall_s"] or 0 for r in records) / 60.0, 2),
                   "methods": {m: d for m, d in grid["method_defs"].items() if m != DEBUG},
                   "main": {"models": grid["models"], "methods": grid["methods"], "bits": grid["bits"]},
                   "studies": grid["studies"],
                   "ptq_debug": [{"model": m, "bits": b, "ok": ok,
                                  "md": "%s/%s_%s.md" % (DEBUG, m, b) if ok else None}
                                 for m, b, ok in debug],
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
          "- fp32: `%s` (%s). Every PTQ and QAT run starts from the fp32 checkpoint of the same "
          "model and seed." %
          (grid["fp32_config"], " ".join(grid["method_defs"]["fp32"]["overrides"]) or "as is"),
          ]
    shown = list(grid["methods"]) + [m for st in grid["studies"] for m in st["methods"]]
    for m in [m for i, m in enumerate(shown) if m not in shown[:i]]:
        d = grid["method_defs"][m]
        L.append("- **%s** (%s run)%s overrides `%s`." % (d["label"], d["mode"].upper(),
                                                         (": " + d["about"] + ";") if d["about"] else ":",
                                                         " ".join(d["overrides"])))
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
    main = set(configured_rows(grid))
    for r in table:
        if (r["model"], r["method"], r["bits"]) not in main:
            continue
        quant = r["method"] != "fp32"
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d%s |" % (
            r["model"], label(grid, r["method"]), bits_label(r["bits"]),
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
    q = [r for r in records if r["method"] not in ("fp32", DEBUG) and r["ok"]
         and r["qdq"] is not None and r["int8"] is not None]
    if q:
        diff = [abs(r["qdq"] - r["int8"]) for r in q]
        lsb = [r["int8_max_lsb"] for r in q if r["int8_max_lsb"] is not None]
        agree = [r["int8_top1_agreement"] for r in q if r["int8_top1_agreement"] is not None]
        L += ["", "Lowering (Q/DQ graph → int8 device), per run (every table of this page): in %d of %d "
              "quantized runs the two had the same test accuracy; the largest difference was %.2f points, "
              "the lowest top-1 agreement %s%%, the largest logit difference %s output LSB." %
              (sum(1 for d in diff if d == 0.0), len(q), 100 * max(diff),
               "%.2f" % (100 * min(agree)) if agree else "—",
               "%.0f" % max(lsb) if lsb else "—")]
    for st in grid["studies"]:
        L += ["", "## %s" % st["title"], ""]
        if st["about"]:
            L += [st["about"], ""]
        L += ["Q/DQ-graph test accuracy, mean ± std over seeds, and in parentheses its difference to "
              "the fp32 checkpoint (points, mean of the per-seed differences). Every row starts from "
              "the same fp32 checkpoints; rows shared with the main table are the same runs.", ""]
        L += study_table(grid, st, records, table)
        L += ["", "![%s](study_%s.png)" % (st["title"], st["name"]), ""]
    if grid["debug"]:
        L += ["", "## PTQ debugging", "",
              "Calibration methods × number of calibration batches, per-node SQNR (fp32 vs fake "
              "quant), one-layer sensitivity and mixed precision, per model: [ptq_debug.md](ptq_debug.md)"
              " (%s)." % ", ".join("%s %s%s" % (m, bits_label(b), "" if ok else " FAILED")
                                   for m, b, ok in debug), ""]
    pq = primary_qat(grid)
    L += ["", "## Plots", "",
          "![accuracy vs bit width](accuracy_vs_bits.png)", "",
          "`accuracy_vs_bits.png`: Q/DQ-graph test accuracy of every method per bit width (mean ± std "
          "over seeds; open markers: the int8 device), the fp32 accuracy as a dashed line.", ""]
    if "ptq_vs_qat.png" in plot_files(grid):
        L += ["![QAT minus PTQ](ptq_vs_qat.png)", "",
              "`ptq_vs_qat.png`: %s minus each PTQ method (Q/DQ graph), points, mean ± std over seeds "
              "of the per-seed difference (all start from the same fp32 checkpoint)." % label(grid, pq), ""]
    if pq:
        L += ["![QAT training curves](qat_curves.png)", "",
              "`qat_curves.png`: test accuracy and training loss per epoch (mean ± std over seeds): the "
              "fp32 epochs, then the %s epochs of every bit width, which start from the last fp32 epoch."
              % label(grid, pq), ""]
    runs_of = lambda model, method, key: [r[key] for r in records if r["model"] == model and r["method"] == method
                                          and r["ok"] and r[key] is not None]
    L += ["## Timings", "",
          "Medians over the runs of a kind (seeds and bit widths; a median, because the machine "
          "may be shared and a few runs slowed down by others).", "",
          "| model | fp32 epoch s | %s epoch s | fp32 run s | %s |" %
          (label(grid, pq) if pq else "QAT", " | ".join("%s run s" % label(grid, m) for m in grid["methods"])),
          "|---|---:|---:|---:|" + "---:|" * len(grid["methods"])]
    for model in grid["models"]:
        def med(method, key):
            v = runs_of(model, method, key)
            return ("%.1f" if key == "wall_s" else "%.2f") % statistics.median(v) if v else "—"
        L.append("| %s | %s | %s | %s | %s |" % (model, med("fp32", "epoch_s"), med(pq, "epoch_s") if pq else "—",
                 med("fp32", "wall_s"), " | ".join(med(m, "wall_s") for m in grid["methods"])))
    L += ["", "A quantized run's wall time includes convert, the consistency check, lowering, the "
          "three-stage evaluation and the fp32/int8 inference timing. Per-run numbers: `runs.csv`; "
          "run directories: `%s` (not committed)." % shown_path(runs), ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L))


# ----------------------------------------------------------------------------- plots

def fmt(x, scale=100.0):
    return "?" if x is None else "%.4f" % (scale * x)


COLORS = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def write_plots(grid, records, table, out):
    pd = os.path.join(out, "plotdata")
    if os.path.isdir(pd):
        shutil.rmtree(pd)
    os.makedirs(pd)
    by = {(r["model"], r["method"], r["bits"]): r for r in table}
    order = plot_order(grid["bits"])
    models = grid["models"]
    methods = grid["methods"]
    pq = primary_qat(grid)
    pairs = [(q, p) for q, p in gain_pairs(grid) if q == pq]
    # accuracy vs bits, one file per model: x, bits, fp32, fp32_std, then per method qdq std int8
    for model in models:
        fp = by[(model, "fp32", "fp32")]["fp32"]
        with open(os.path.join(pd, "acc_%s.dat" % model), "w") as f:
            f.write("# x bits fp32 fp32_std " + " ".join("%s_qdq %s_std %s_int8" % (m, m, m) for m in methods) + "\n")
            for i, bits in enumerate(order):
                cells = []
                for m in methods:
                    r = by.get((model, m, bits))
                    cells += ([fmt(r["qdq"][0]), fmt(r["qdq"][1]), fmt(r["int8"][0])] if r
                              else ["?", "?", "?"])
                f.write("%d %s %s %s %s\n" % (i, bits_label(bits), fmt(fp[0]), fmt(fp[1]), " ".join(cells)))
    # primary QAT minus every PTQ method, paired per seed
    with open(os.path.join(pd, "gain.dat"), "w") as f:
        f.write("# bits " + " ".join("%s-%s %s-%s_std" % (model, p, model, p) for model in models
                                     for _, p in pairs) + "\n")
        for bits in order:
            cells = []
            for model in models:
                for q, p in pairs:
                    m, sd, _ = paired(records, model, bits, q, p, grid["seeds"])
                    cells += [fmt(m), fmt(sd)]
            f.write("%s %s\n" % (bits_label(bits), " ".join(cells)))
    # studies: Q/DQ minus fp32 per method (rows) and model x bits (columns), paired per seed
    for st in grid["studies"]:
        cols = [(model, bits) for model in st["models"] for bits in st["bits"]]
        # all methods, and the QAT methods alone (a zoomed panel: PTQ may lose ten times more)
        for suffix, meths in (("", st["methods"]), ("_qat", qat_methods(grid, st["methods"]))):
            with open(os.path.join(pd, "study_%s%s.dat" % (st["name"], suffix)), "w") as f:
                f.write("# method " + " ".join("%s_%s %s_%s_std" % (m, b, m, b) for m, b in cols) + "\n")
                for meth in meths:
                    cells = []
                    for model, bits in cols:
                        m, sd, _ = paired(records, model, bits, meth, "fp32", grid["seeds"])
                        cells += [fmt(m), fmt(sd)]
                    f.write('"%s" %s\n' % (label(grid, meth), " ".join(cells)))
    # training curves: fp32 epochs then the primary QAT's epochs, mean +- std over seeds
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
        if pq:
            for bits in order:
                recs = [r for r in records if (r["model"], r["method"], r["bits"]) == (model, pq, bits)
                        and r["ok"]]
                blocks.append(block(recs, n_fp32))
                titles.append("%s %s" % (label(grid, pq), bits_label(bits)))
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
         'set terminal pngcairo noenhanced size %d,540 font "sans,11"' % (460 * len(models) + 40),
         'set output "accuracy_vs_bits.png"',
         'set multiplot layout 1,%d title "Test accuracy vs bit width (Q/DQ graph, '
         'mean ± std over %d seed%s)%s"' % (len(models), nseeds, "s" if nseeds > 1 else "", tag),
         'set xrange [-0.5:%f]' % (len(order) - 0.5),
         'set ylabel "test accuracy (%)"',
         'set xlabel "bit width (W: weights, A: activations)"']
    step = 0.14 / max(1, len(methods) - 1)
    for model in models:
        f = "plotdata/acc_%s.dat" % model
        parts = ['"%s" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32"' % f]
        for i, m in enumerate(methods):
            c = 5 + 3 * i
            dx = -0.07 + i * step if len(methods) > 1 else 0.0
            col = COLORS[i % len(COLORS)]
            parts += ['"%s" u ($1%+.3f):%d:%d w yerrorlines pt %d lw 2 lc rgb "%s" t "%s"'
                      % (f, dx, c, c + 1, 7 if mode(grid, m) == "ptq" else 5, col, label(grid, m)),
                      '"%s" u ($1%+.3f):%d w points pt %d ps 1.6 lc rgb "%s" t "%s int8 device"'
                      % (f, dx, c + 2, 6 if mode(grid, m) == "ptq" else 4, col, label(grid, m))]
        G += ['set title "%s"' % model, 'plot ' + ", \\\n     ".join(parts)]
    G += ['unset multiplot', 'unset xrange', 'unset xlabel']
    model_colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    if "ptq_vs_qat.png" in plot_files(grid):
        G += ['set terminal pngcairo noenhanced size 1000,540 font "sans,11"',
              'set output "ptq_vs_qat.png"',
              'set title "%s minus PTQ, Q/DQ-graph test accuracy (points, mean ± std over seeds)%s"'
              % (label(grid, pq), tag),
              'set style data histograms',
              'set style histogram errorbars gap 2 lw 1',
              'set boxwidth 0.9',
              'set key inside top left',
              'set yrange [*:*]',
              'set xzeroaxis lt -1',
              'set ylabel "%s − PTQ (points)"' % label(grid, pq)]
        parts = []
        k = 0
        for i, model in enumerate(models):
            for j, (_, p) in enumerate(pairs):
                c = 2 + 2 * k
                k += 1
                fill = "fs solid 0.8 border -1" if j == 0 else "fs pattern %d border -1" % (j + 1)
                parts.append('"plotdata/gain.dat" u %d:%d%s t "%s vs %s" lc rgb "%s" %s'
                             % (c, c + 1, ":xtic(1)" if k == 1 else "", model, label(grid, p),
                                model_colors[i % len(model_colors)], fill))
        G += ['plot ' + ", \\\n     ".join(parts)]
        G += ['set style data lines', 'set style fill empty', 'unset xzeroaxis']
    for st in grid["studies"]:
        cols = [(model, bits) for model in st["models"] for bits in st["bits"]]
        panels = [("", st["methods"], "all methods")]
        if qat_methods(grid, st["methods"]) and ptq_methods(grid, st["methods"]):
            panels.append(("_qat", qat_methods(grid, st["methods"]), "QAT methods only (zoomed)"))
        G += ['# study %s' % st["name"],
              'set terminal pngcairo noenhanced size %d,%d font "sans,11"'
              % (max(900, 40 * len(st["methods"]) * (len(cols) + 1) + 120), 480 * len(panels) + 40),
              'set output "study_%s.png"' % st["name"],
              'set multiplot layout %d,1 title "%s: Q/DQ-graph accuracy minus fp32 (points, mean ± std over '
              'seeds)%s"' % (len(panels), st["title"], tag),
              'set style data histograms',
              'set style histogram errorbars gap 2 lw 1',
              'set style fill solid 0.8 border -1',
              'set boxwidth 0.9',
              'set key below horizontal',
              'set yrange [*:*]',
              'set xzeroaxis lt -1',
              'set xtics rotate by -20 left',
              'set ylabel "Q/DQ − fp32 (points)"']
        for suffix, _, title in panels:
            parts = []
            for k, (model, bits) in enumerate(cols):
                c = 2 + 2 * k
                parts.append('"plotdata/study_%s%s.dat" u %d:%d%s t "%s %s" lc rgb "%s"'
                             % (st["name"], suffix, c, c + 1, ":xtic(1)" if k == 0 else "", model,
                                bits_label(bits), model_colors[k % len(model_colors)]))
            G += ['set title "%s"' % title, 'plot ' + ", \\\n     ".join(parts)]
        G += ['unset multiplot', 'set style data lines', 'set style fill empty', 'unset xzeroaxis',
              'set xtics norotate']
    # training curves
    if pq:
        G += ['set terminal pngcairo noenhanced size %d,820 font "sans,11"' % (460 * len(models) + 40),
              'set output "qat_curves.png"',
              'set multiplot layout 2,%d title "Training curves: fp32 epochs, then %s (mean ± std over '
              'seeds)%s"' % (len(models), label(grid, pq), tag),
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
        G += ['unset multiplot', 'unset arrow 1']
    G += ['set output']
    gp = os.path.join(pd, "plots.gp")
    with open(gp, "w") as f:
        f.write("\n".join(G) + "\n")
    for png in os.listdir(out):
        if png.endswith(".png"):
            os.remove(os.path.join(out, png))
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
    gains = primary_qat(grid) and ptq_methods(grid, grid["methods"])
    return (["accuracy_vs_bits.png"] + (["ptq_vs_qat.png"] if gains else [])
            + (["qat_curves.png"] if primary_qat(grid) else [])
            + ["study_%s.png" % st["name"] for st in grid["studies"]])


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
    main = set(configured_rows(grid))
    for key in all_rows(grid):
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
        if md is not None and key in main and \
                ("| %s | %s | %s |" % (model, label(grid, method), bits_label(bits))) not in md:
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
    for st in grid["studies"]:
        if md is None:
            break
        sec = md.split("## %s\n" % st["title"], 1)
        if len(sec) < 2:
            problems.append("study %s: section missing from results.md" % st["name"])
            continue
        body = sec[1].split("\n## ", 1)[0]
        for m in st["methods"]:
            line = [ln for ln in body.split("\n") if ln.startswith("| %s |" % label(grid, m))]
            if not line or any(c.strip() == "—" for c in line[0].split("|")[3:-1]):
                problems.append("study %s: row %s missing or incomplete in results.md" % (st["name"], label(grid, m)))
    if grid["debug"]:
        try:
            with open(os.path.join(out, "ptq_debug.md")) as f:
                dbg = f.read()
        except OSError:
            dbg = ""
            problems.append("ptq_debug.md missing")
        for model, seed, method, bits in debug_runs(grid):
            w, a = parse_bits(bits)
            p = os.path.join(out, DEBUG, "%s_%s.md" % (model, bits))
            try:
                with open(p) as f:
                    text = f.read()
            except OSError:
                problems.append("PTQ debugging %s %s: %s missing (the run failed?)" % (model, bits, shown_path(p)))
                continue
            if not text.startswith("# PTQ debugging: %s, W%dA%d" % (model, w, a)) or "\n## " not in text:
                problems.append("PTQ debugging %s %s: %s has no analysis sections" % (model, bits, shown_path(p)))
            if "## PTQ debugging: %s, W%dA%d" % (model, w, a) not in dbg:
                problems.append("PTQ debugging %s %s: not in ptq_debug.md" % (model, bits))
            if not os.path.exists(p[:-3] + ".json"):
                problems.append("PTQ debugging %s %s: %s.json missing" % (model, bits, shown_path(p[:-3])))
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
                    "runs/grid_quick/results/; with --models/--seeds runs/grid_slice/results/; "
                    "for a config NAME.ini other than grid.ini: experiments/results/NAME/, "
                    "runs/grid_NAME_quick/results/, runs/grid_NAME_slice/results/)")
    ap.add_argument("--runs", help="run directories (default: runs/grid/, with --quick "
                    "runs/grid_quick/runs/, OUT/runs/ when --out is given; runs/grid_NAME/... "
                    "for NAME.ini)")
    ap.add_argument("--resume", action="store_true",
                    help="keep runs that finished before with the same command")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing; write tables and plots from the existing runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    ap.add_argument("--models", help="only these models (comma-separated), in every table")
    ap.add_argument("--seeds", help="only these seeds (comma-separated)")
    ap.add_argument("--check", action="store_true",
                    help="validate the outputs; exit 1 if anything is missing or wrong")
    a = ap.parse_args()

    grid = load_grid(os.path.abspath(a.config), a.quick)
    restrict(grid, a.models, a.seeds)
    # grid.ini writes experiments/results/ and runs/grid*/; another grid NAME.ini writes
    # experiments/results/NAME/ and runs/grid_NAME*/
    stem = os.path.splitext(os.path.basename(a.config))[0]
    tag = "" if stem == "grid" else "_" + stem
    if a.out:
        out = os.path.abspath(a.out)
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(out, "runs")
    elif a.quick:  # not committed: experiments/results/ holds the full grid's results
        out = os.path.join(REPO, "runs", "grid%s_quick" % tag, "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "grid%s_quick" % tag, "runs")
    elif a.models or a.seeds:  # a slice never overwrites the committed full results
        out = os.path.join(REPO, "runs", "grid%s_slice" % tag, "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "grid" + tag)
    else:
        out = os.path.join(REPO, "experiments", "results", *([stem] if tag else []))
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "grid" + tag)
    qat_train = os.path.join(os.path.abspath(a.build), "bin", "qat_train")
    p = plan(grid, qat_train, runs)
    if a.dry_run:
        for model, seed, method, bits, argv in p:
            print(" ".join(shlex.quote(x) for x in argv))
        print("# %d runs, %d table rows" % (len(p), len(all_rows(grid))))
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
        print("grid --check: ok (%d rows x %d seeds, 3 stages, %d studies, %d PTQ-debugging runs, %d plots)" %
              (len(all_rows(grid)), len(grid["seeds"]), len(grid["studies"]), len(debug_runs(grid)),
               len(plot_files(grid))))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. --dry-run | head
        sys.exit(0)
