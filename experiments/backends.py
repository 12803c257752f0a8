#!/usr/bin/python3
"""One model, three backends: the same fp32 checkpoint through oneDNN, XNNPACK and the
simulated accelerator, each with its own Quantizer.

    /usr/bin/python3 experiments/backends.py                  # -> experiments/results/backends.{md,json}
    /usr/bin/python3 experiments/backends.py --quick --check  # CI-sized -> runs/backends_quick/results/
    /usr/bin/python3 experiments/backends.py --fp32 fashion_cnn=runs/grid/fashion_cnn/seed0/fp32/checkpoint.h5
    /usr/bin/python3 experiments/backends.py --models res_cnn --backends xnnpack,accel --resume

For every model one fp32 checkpoint is trained with the model's fp32 recipe (the grid's:
experiments/<model>_fp32.ini with grid.ini's [fp32] overrides), or taken from --fp32
MODEL=CHECKPOINT. Every row then runs qat_train from that same checkpoint with
quant.backend = the backend, so the Quantizer, the deployment and the three-stage report are
the backend's own. A row is a method of experiments/grid/grid.ini ([ptq], [qat], [qat_ste_ptq],
...: the same recipes as the experiment grid, with their quant.quantizer replaced) at a bit
width. A combination the backend's Quantizer refuses (the accelerator: 8 bits only, and no LSQ:
learned scales cannot stay powers of two) is a table entry with qat_train's reason.

Writes OUT/backends.md and OUT/backends.json: per model x backend x row the accuracy at every
stage (fp32, fake quant, Q/DQ graph's exact reference, device), the device's logits against the
Q/DQ graph in output LSB (0 / 1 / >1 and the max; the agreement rule), int8 partitions against
fp32 fallback partitions (and which nodes fell back, why), fp32 and int8 images/s, and the
machine (CPU, ISA flags, the ISA oneDNN's kernels use). Each run lives in
RUNS/<model>/<backend>/<method>_<bits>/ (RUNS/<model>/fp32/ for the checkpoint) with
backends_run.json (command, exit status, wall time) and log.txt.

The full run (the default rows, three models, three backends: 39 runs) is estimated at 30-40
minutes on 2 idle cores: the accelerator's rows evaluate 10,000 test images, probe every
quantization point on 1024 and time 6,656 in a simulator that runs a few hundred images/s.

--quick: the same models and backends on 128 training / 16 test images and one fp32 epoch, rows
PTQ W8A8 and PTQ W4A8 (no QAT: a training run's first epoch alone costs seconds; the accelerator
refuses W4A8), inference timed only in the first model's first row on the built-in backends
(the accelerator's timing alone would take half a minute); about half a minute on 2 idle cores. --check validates OUT (every configured row present; ran
rows with all four stages in [0, 1], the check passed, the LSB histogram, partition counts
with their fallback list, images/s where timed, one fp32 accuracy per model; refused rows with
the Quantizer's reason, PTQ W8A8 never refused) and exits 1 otherwise.

Python standard library only; helpers from experiments/grid.py.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grid as G  # noqa: E402  (experiments/grid.py: the grid's recipes and helpers)

REPO = G.REPO
GRID_INI = os.path.join(REPO, "experiments", "grid", "grid.ini")
MODELS = ["fashion_cnn", "res_cnn", "mobilenet_onnx"]
# name -> quant.backend: a built-in backend's name, or an accelerator description file
BACKENDS = {"onednn": "onednn", "xnnpack": "xnnpack", "accel": "experiments/accel_fictional.ini"}
BUILTIN = ("onednn", "onednn_cpu", "xnnpack")
# PTQ at W8A8, W4A8 and W4A4 (the widths whose device-vs-exact agreement the table is for;
# training recipes are compared in the grid) and one QAT row the accelerator takes too (STE
# from PTQ, W8A8)
ROWS = [("ptq", "w8a8"), ("ptq", "w4a8"), ("ptq", "w4a4"), ("qat_ste_ptq", "w8a8")]
QUICK_ROWS = [("ptq", "w8a8"), ("ptq", "w4a8")]
QUICK_OVERRIDES = ["data.train_limit=128", "data.test_limit=16", "quant.check_batch=16", "train.epochs=1",
                   "output.dot=false"]
# the accuracy columns: summary.json stages
STAGES = [("fp32", "fp32"), ("fake_quant", "fake-quant"), ("qdq_exact", "Q/DQ exact"), ("int8", "device")]
BASELINE = ("ptq", "w8a8")  # every backend must run it: --check never accepts it refused
REFUSAL = re.compile(r"quantizer [^:\s]+: ")  # qat_train's message when a Quantizer refuses


# ----------------------------------------------------------------------------- plan

def parse_rows(text, grid):
    rows = []
    for item in G.split_list(text):
        method, _, bits = item.partition(":")
        if method not in grid["method_defs"] or method in ("fp32", G.DEBUG):
            sys.exit("backends: --rows: %r is not a method of %s (%s)" % (method, G.shown_path(GRID_INI), ", ".join(
                m for m in grid["method_defs"] if m not in ("fp32", G.DEBUG))))
        try:
            G.parse_bits(bits)
        except ValueError as e:
            sys.exit("backends: --rows %s: %s" % (item, e))
        rows.append((method, bits.lower()))
    if not rows:
        sys.exit("backends: --rows is empty")
    return rows


def parse_backends(text):
    out = {}
    for item in G.split_list(text):
        name, eq, spec = item.partition("=")
        if not eq:
            if name not in BACKENDS:
                sys.exit("backends: --backends: %r is not one of %s (or give NAME=DESCRIPTION.ini)"
                         % (name, ", ".join(BACKENDS)))
            spec = BACKENDS[name]
        elif spec not in BUILTIN and not os.path.exists(os.path.join(REPO, spec)):
            sys.exit("backends: --backends %s: %s not found" % (item, spec))
        out[name] = spec
    if not out:
        sys.exit("backends: --backends is empty")
    return out


def parse_fp32(items, models):
    out = {}
    for item in items or []:
        model, eq, path = item.partition("=")
        if not eq or model not in models:
            sys.exit("backends: --fp32 %s: expected MODEL=CHECKPOINT with MODEL one of %s" % (item, ", ".join(models)))
        if not os.path.exists(path):
            sys.exit("backends: --fp32 %s: %s not found" % (item, path))
        out[model] = os.path.abspath(path)
    return out


def strip_quantizer(overrides):
    """A grid method's overrides without its Quantizer choice (each row sets the backend's)."""
    return [o for o in overrides if not o.startswith(("quant.quantizer=", "quant.backend="))]


def backend_overrides(spec):
    if spec in BUILTIN:
        return ["quant.quantizer=onednn", "quant.backend=%s" % spec]
    return ["quant.quantizer=backend", "quant.backend=%s" % spec]


def run_dir(runs, model, backend=None, method=None, bits=None):
    if backend is None:
        return os.path.join(runs, model, "fp32")
    return os.path.join(runs, model, backend, "%s_%s" % (method, bits))


def timed(cfg, model, backend, row):
    if not cfg["quick"]:
        return True
    return model == cfg["models"][0] and row == cfg["rows"][0] and cfg["backends"][backend] in BUILTIN


def plan(cfg, grid, qat_train, runs):
    """[(model, backend, method, bits, argv)], the fp32 run of a model (backend None) first."""
    out = []
    # the order of grid.py: [grid] overrides, the method's, --quick's, then the row's own
    common = list(grid["overrides"])
    tail = (QUICK_OVERRIDES if cfg["quick"] else []) + ["train.seed=0", "train.threads=%d" % grid["threads"],
                                                        "output.progress=lines"]
    for model in cfg["models"]:
        fp32_cfg = os.path.join(REPO, grid["fp32_config"].replace("{model}", model))
        ckpt = cfg["fp32"].get(model)
        if ckpt is None:
            d = run_dir(runs, model)
            ckpt = os.path.join(d, "checkpoint.h5")
            out.append((model, None, "fp32", "fp32",
                        [qat_train, fp32_cfg] + common + grid["method_defs"]["fp32"]["overrides"] + tail
                        + ["output.dir=%s" % d]))
        for backend, spec in cfg["backends"].items():
            for row in cfg["rows"]:
                method, bits = row
                w, a = G.parse_bits(bits)
                out.append((model, backend, method, bits,
                            [qat_train, fp32_cfg] + common + strip_quantizer(grid["method_defs"][method]["overrides"])
                            + backend_overrides(spec) + tail
                            + ["quant.mode=%s" % G.mode(grid, method), "quant.weight_bits=%d" % w,
                               "quant.activation_bits=%d" % a, "quant.fp32_checkpoint=%s" % ckpt,
                               "output.timing=%s" % ("true" if timed(cfg, model, backend, row) else "false"),
                               "output.dir=%s" % run_dir(runs, model, backend, method, bits)]))
    return out


# ----------------------------------------------------------------------------- running

def execute(p, runs, resume, grid):
    env = dict(os.environ, OMP_NUM_THREADS=str(grid["threads"]))
    env.update(grid["env"])
    t_all = time.time()
    retrained = set()  # models whose fp32 run ran now: their rows cannot be kept by --resume
    for i, (model, backend, method, bits, argv) in enumerate(p, 1):
        d = run_dir(runs, model, backend, method, bits) if backend else run_dir(runs, model)
        name = "%s fp32" % model if backend is None else "%s %s %s %s" % (model, backend, method, bits)
        meta = G.read_json(os.path.join(d, "backends_run.json"))
        if resume and model not in retrained and meta and meta.get("argv") == argv and meta.get("env") == grid["env"] \
                and (meta.get("rc") == 0 and os.path.exists(os.path.join(d, "summary.json")) or meta.get("refused")):
            print("[%d/%d] %s: done before (--resume)" % (i, len(p), name), flush=True)
            continue
        if backend is None:
            retrained.add(model)
        else:
            ckpt = [a.split("=", 1)[1] for a in argv if a.startswith("quant.fp32_checkpoint=")][0]
            own = ckpt == os.path.join(run_dir(runs, model), "checkpoint.h5")
            fp32_meta = G.read_json(os.path.join(run_dir(runs, model), "backends_run.json")) if own else {}
            if not os.path.exists(ckpt) or (own and (fp32_meta or {}).get("rc") != 0):
                print("[%d/%d] %s: SKIPPED, no fp32 checkpoint %s" % (i, len(p), name, ckpt), flush=True)
                if os.path.isdir(d):
                    shutil.rmtree(d)
                os.makedirs(d)
                with open(os.path.join(d, "backends_run.json"), "w") as f:
                    json.dump({"argv": argv, "env": grid["env"], "rc": None, "wall_s": 0.0,
                               "error": "no fp32 checkpoint %s (its fp32 run failed?)" % ckpt}, f, indent=1)
                continue
        if os.path.isdir(d):
            shutil.rmtree(d)  # no stale summary.json from an earlier run
        os.makedirs(d)
        print("[%d/%d] %s ..." % (i, len(p), name), end="", flush=True)
        t0 = time.time()
        with open(os.path.join(d, "log.txt"), "w") as log:
            log.write(" ".join(shlex.quote(a) for a in argv) + "\n\n")
            log.flush()
            rc = subprocess.call(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        wall = time.time() - t0
        refused = refusal(d) if rc == 2 else None
        with open(os.path.join(d, "backends_run.json"), "w") as f:
            json.dump({"argv": argv, "env": grid["env"], "rc": rc, "wall_s": round(wall, 2), "refused": refused,
                       "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        if refused:
            status = "refused: %s" % refused
        elif rc == 0:
            s = G.read_json(os.path.join(d, "summary.json")) or {}
            st = s.get("stages") or {}
            status = "ok  " + " ".join("%s %s" % (t, G.pct(G.fnum((st.get(k) or {}).get("test_accuracy"))))
                                       for k, t in STAGES if k in st)
        else:
            status = "FAILED (exit %d, see %s)" % (rc, os.path.join(d, "log.txt"))
        print(" %.1f s  %s  [%.0f s]" % (wall, status, time.time() - t_all), flush=True)


def refusal(d):
    """The Quantizer's reason when qat_train refused the row (exit 2), else None."""
    try:
        with open(os.path.join(d, "log.txt")) as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("qat_train: ") and REFUSAL.search(line):
            return line[len("qat_train: "):].strip()
    return None


# ----------------------------------------------------------------------------- collecting

def first_line(path):
    try:
        with open(path) as f:
            return f.readline().strip().rstrip(":")
    except OSError:
        return ""


def kernel_isas(path):
    """oneDNN kernel ISAs named in a report's partition lines, e.g. "(brgconv:avx512_core_vnni)"."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    return sorted(set(re.findall(r"\((?:[a-z0-9_]+):([a-z0-9_]+)\)", text)))


def collect(cfg, grid, runs):
    rows = []
    for model in cfg["models"]:
        for backend, spec in cfg["backends"].items():
            for method, bits in cfg["rows"]:
                d = run_dir(runs, model, backend, method, bits)
                meta = G.read_json(os.path.join(d, "backends_run.json")) or {}
                s = G.read_json(os.path.join(d, "summary.json")) if meta.get("rc") == 0 else None
                r = {"model": model, "backend": backend, "backend_spec": spec, "method": method,
                     "label": G.label(grid, method), "mode": G.mode(grid, method), "bits": bits,
                     "dir": G.shown_path(d), "rc": meta.get("rc"), "wall_s": meta.get("wall_s"),
                     "timed": timed(cfg, model, backend, (method, bits))}
                if meta.get("refused"):
                    r.update(status="refused", reason=meta["refused"])
                elif s is None:
                    r.update(status="failed" if meta else "missing",
                             reason=meta.get("error") or ("exit %s, see %s" % (meta.get("rc"), G.shown_path(
                                 os.path.join(d, "log.txt"))) if meta else "not run"))
                else:
                    r["status"] = "ok"
                    fill(r, s, d)
                rows.append(r)
    return rows


def fill(r, s, d):
    st = s.get("stages") or {}
    r["stages"] = {k: G.fnum((st.get(k) or {}).get("test_accuracy")) for k, _ in STAGES}
    r["test_images"] = (st.get("int8") or {}).get("test_images")
    r["backend_name"] = s.get("backend")
    r["quantizer"] = first_line(os.path.join(d, "quantizer.txt"))
    chk = s.get("check") or {}
    r["check_ok"] = chk.get("ok")
    iq = s.get("int8_vs_qdq") or {}
    h = iq.get("lsb_histogram")
    r["lsb"] = None if not h else {"0": h.get("0"), "1": h.get("1"),
                                   "over_1": (h.get("2") or 0) + (h.get("over_2") or 0),
                                   "max": G.fnum(iq.get("max_lsb"))}
    r["top1_agreement"] = G.fnum(iq.get("top1_agreement"))
    r["agreement_rule"] = (r["top1_agreement"] is not None and r["top1_agreement"] >= 0.999
                           and (r["lsb"] is None or (r["lsb"]["max"] is not None and r["lsb"]["max"] <= 1.0 + 1e-4)))
    low = s.get("lowering") or {}
    r["partitions"] = {"int8": low.get("int8_partitions"), "fallback": low.get("fallback_partitions"),
                       "fallbacks": low.get("fallbacks")}
    inf = s.get("inference") or {}
    r["inference"] = None if not inf else {"batch": inf.get("batch_size"),
                                           "fp32_images_per_s": G.fnum(inf.get("fp32_images_per_s")),
                                           "int8_images_per_s": G.fnum(inf.get("int8_images_per_s"))}
    r["kernel_isas"] = kernel_isas(os.path.join(d, "report.txt"))


def fp32_info(cfg, runs, rows):
    """Per model: the checkpoint, where it came from and its fp32 test accuracy (the quantized
    runs evaluate it again; they must all agree)."""
    out = {}
    for model in cfg["models"]:
        given = model in cfg["fp32"]
        d = run_dir(runs, model)
        ckpt = cfg["fp32"][model] if given else os.path.join(d, "checkpoint.h5")
        meta = {} if given else (G.read_json(os.path.join(d, "backends_run.json")) or {})
        s = None if given else G.read_json(os.path.join(d, "summary.json"))
        accs = sorted({r["stages"]["fp32"] for r in rows if r["model"] == model and r["status"] == "ok"
                       and r["stages"]["fp32"] is not None})
        out[model] = {"checkpoint": G.shown_path(ckpt), "trained_here": not given,
                      "ok": os.path.exists(ckpt) and (given or meta.get("rc") == 0),
                      "wall_s": meta.get("wall_s"),
                      "epochs": len(((s or {}).get("train") or {}).get("epoch_seconds") or []) if s else None,
                      "test_accuracy": G.fnum((((s or {}).get("stages") or {}).get("fp32") or {}).get("test_accuracy"))
                      if s else (accs[0] if accs else None),
                      "accuracies_in_rows": accs}
    return out


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    keep = ["sse4_2", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
                            "avx512_bf16", "amx_int8"]
                    return [k for k in keep if k in have]
    except OSError:
        pass
    return []


# ----------------------------------------------------------------------------- writing

def short_nodes(nodes):
    """The ops of a fallback partition's "a -> b.fq.dequantize -> c" without Q/DQ nodes."""
    ops = [n for n in nodes.split(" -> ") if not re.search(r"\.fq\.(de)?quantize$", n)]
    return ", ".join(ops) or nodes


def short_reasons(reason):
    """One fallback's reasons, "node: why" lines merged into distinct whys."""
    whys = []
    for line in reason.split("\n"):
        why = line.split(": ", 1)[1] if ": " in line else line
        if why and why not in whys:
            whys.append(why)
    return "; ".join(whys)


def fallback_text(r):
    p = r["partitions"]
    fb = p.get("fallbacks")
    if fb is None:
        return "(not in summary.json)"
    if not fb:
        return "none"
    text = "; ".join("`%s` (%s)" % (short_nodes(f["nodes"]), short_reasons(f["reason"])) for f in fb)
    if p["fallback"] is not None and p["fallback"] > len(fb):
        text += "; … %d more" % (p["fallback"] - len(fb))
    return text


def rate(x):
    return "—" if x is None else "{:,.0f}".format(x)


def write_outputs(cfg, grid, rows, fp32, out, runs, started):
    os.makedirs(out, exist_ok=True)
    walls = [r["wall_s"] for r in rows] + [m["wall_s"] for m in fp32.values() if m["trained_here"]]
    runs_min = sum(w or 0 for w in walls) / 60.0
    onednn_isa = sorted({i for r in rows if r["status"] == "ok" and r["backend_spec"] in ("onednn", "onednn_cpu")
                         for i in r["kernel_isas"]})
    quantizers = {}
    for r in rows:
        if r["status"] == "ok" and r["backend"] not in quantizers and r["quantizer"]:
            quantizers[r["backend"]] = re.sub(r" \(W\d+ A\d+\)$", "", r["quantizer"])
    mach = {"cpu": G.machine(), "isa_flags": cpu_flags(), "onednn_kernel_isa": onednn_isa,
            "threads": grid["threads"], "env": grid["env"]}
    with open(os.path.join(out, "backends.json"), "w") as f:
        json.dump({"quick": cfg["quick"], "written": started, "runs_wall_min": round(runs_min, 2),
                   "command": cfg["command"], "machine": mach, "models": cfg["models"],
                   "backends": cfg["backends"], "quantizers": quantizers,
                   "rows_configured": [{"method": m, "label": G.label(grid, m), "bits": b} for m, b in cfg["rows"]],
                   "methods": {m: dict(grid["method_defs"][m], overrides=strip_quantizer(
                       grid["method_defs"][m]["overrides"])) for m in sorted({m for m, _ in cfg["rows"]})},
                   "overrides": list(grid["overrides"]) + (QUICK_OVERRIDES if cfg["quick"] else []),
                   "fp32": fp32, "rows": rows}, f, indent=1)

    L = []
    if cfg["quick"]:
        L += ["# One model, three backends — QUICK variant (CI-sized)", "",
              "> **Quick results**: `backends.py --quick`, with `%s`. Accuracies and speeds here say nothing "
              "about the backends; they only show that every row runs end to end." % " ".join(QUICK_OVERRIDES), ""]
    else:
        L += ["# One model, three backends", ""]
    L += ["Generated by `%s` on %s; %d runs, %.1f min in total, one after the other." %
          (cfg["command"], started, len(walls), runs_min),
          "",
          "- Machine: %s; ISA flags %s; oneDNN kernels: %s; `train.threads=%d`, %s." %
          (mach["cpu"], ", ".join(mach["isa_flags"]) or "—", ", ".join(onednn_isa) or "—", grid["threads"],
           " ".join("%s=%s" % kv for kv in sorted(grid["env"].items())) or "default environment"),
          "- One fp32 checkpoint per model; every row below starts from it, with `quant.backend` set to the "
          "backend, so the Quantizer, the deployment and the report are that backend's:"]
    fp32_overrides = grid["overrides"] + grid["method_defs"]["fp32"]["overrides"] + (
        QUICK_OVERRIDES if cfg["quick"] else [])
    for model in cfg["models"]:
        m = fp32[model]
        L.append("  - %s: `%s` (%s), fp32 test accuracy %s%%" % (
            model, m["checkpoint"],
            ("trained here: `%s` %s" % (grid["fp32_config"].replace("{model}", model), " ".join(fp32_overrides)))
            if m["trained_here"] else "given with --fp32", G.pct(m["test_accuracy"])))
    L.append("- Backends and their Quantizers (`quantizer.txt` of the runs):")
    for b, spec in cfg["backends"].items():
        L.append("  - **%s** (`quant.backend=%s`): %s" % (b, spec, quantizers.get(b, "— (no run finished)")))
    L.append("- Rows: recipes of `experiments/grid/grid.ini` (their `quant.quantizer` replaced by the backend's):")
    for m in sorted({m for m, _ in cfg["rows"]}, key=[x for x, _ in cfg["rows"]].index):
        d = grid["method_defs"][m]
        L.append("  - **%s** (`[%s]`, %s)%s `%s`" % (d["label"], m, d["mode"].upper(),
                                                    ": " + d["about"] + ";" if d["about"] else ":",
                                                    " ".join(strip_quantizer(d["overrides"]))))
    images = sorted({r["test_images"] for r in rows if r.get("test_images")})
    L += ["- Test images per accuracy: %s. Stages: **fp32** (the checkpoint), **fake-quant** (the eval-mode "
          "training graph), **Q/DQ exact** (the converted graph's exact integer reference, `stages.qdq_exact`, "
          "which the report judges the device by), **device** (the backend running the Q/DQ graph). Accuracies in %%."
          % (", ".join(map(str, images)) or "—"), ""]

    def head(r):
        return "| %s | %s | %s | %s |" % (r["model"], r["backend"], r["label"], G.bits_label(r["bits"]))

    def not_ran(r, ncols, first=False):
        """A row that did not run: the reason in the first table, a pointer to it in the others."""
        if r["status"] == "refused":
            why = "refused: %s" % r["reason"] if first else "refused (above)"
        else:
            why = "**%s**: %s" % (r["status"].upper(), r["reason"]) if first else "**%s**" % r["status"].upper()
        return head(r) + " %s |" % why + " |" * (ncols - 1)

    def points(a, b):
        return "—" if a is None or b is None else "%+.2f" % (100.0 * (b - a) + 0.0)  # + 0.0: no "-0.00"

    L += ["## Accuracy at each stage", "",
          "| model | backend | method | bits | " + " | ".join(t for _, t in STAGES)
          + " | stage 1 (quantization) | stage 2 (lowering) | check |",
          "|---|---|---|---|" + "---:|" * (len(STAGES) + 2) + "---|"]
    for r in rows:
        if r["status"] != "ok":
            L.append(not_ran(r, len(STAGES) + 3, first=True))
            continue
        s = r["stages"]
        L.append(head(r) + " %s | %s | %s |" % (" | ".join(G.pct(s[k]) for k, _ in STAGES),
                                                points(s["fp32"], s["qdq_exact"]), points(s["qdq_exact"], s["int8"]))
                 + " %s |" % ("ok" if r["check_ok"] else "**FAILED**"))
    L += ["", "Stage columns: accuracy change in points (fp32 → Q/DQ exact, Q/DQ exact → device).", ""]

    L += ["## Device against the Q/DQ graph", "",
          "The device's logits minus the Q/DQ graph's exact reference in output LSB (the final dequantize's "
          "scale), all test images: how many logits 0, 1 and more than 1 LSB apart, the largest difference, the "
          "share of images with the same top-1, and the agreement rule (within 1 LSB, identical top-1 on "
          ">= 99.9% of images).", "",
          "| model | backend | method | bits | 0 LSB | 1 LSB | >1 LSB | max LSB | same top-1 | rule |",
          "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            L.append(not_ran(r, 6))
            continue
        h = r["lsb"]
        cells = ["—"] * 4 if h is None else [str(h["0"]), str(h["1"]), str(h["over_1"]),
                                               "—" if h["max"] is None else "%.2f" % h["max"]]
        L.append(head(r) + " %s | %s | %s |" % (" | ".join(cells), G.pct(r["top1_agreement"]),
                                                "passes" if r["agreement_rule"] else "**fails**"))

    L += ["", "## Partitions: int8 against fp32 fallbacks", "",
          "Partitions of the lowered model (`lowering` in summary.json): on the backend's integer kernels, and "
          "on the CPU in fp32, with the nodes of each fallback (Q/DQ nodes left out) and the reason the backend "
          "gave. The accelerator counts the graph input (host memory) as a CPU partition; oneDNN and XNNPACK "
          "count its quantize as a boundary.", "",
          "| model | backend | method | bits | int8 | fp32 fallback | fell back (why) |",
          "|---|---|---|---|---:|---:|---|"]
    for r in rows:
        if r["status"] != "ok":
            L.append(not_ran(r, 3))
            continue
        p = r["partitions"]
        L.append(head(r) + " %s | %s | %s |" % (p["int8"], p["fallback"], fallback_text(r)))

    L += ["", "## Inference speed", "",
          "Batch 256, the same test images, model time only, best of 3 rounds (qat_train's `output.timing`). "
          "The accelerator is simulated on the CPU in its integer arithmetic: its images/s measure the simulator, "
          "not the device.%s" % (" In the quick variant only the first row of the first model on the built-in "
                                "backends is timed." if cfg["quick"] else ""), "",
          "| model | backend | method | bits | fp32 images/s | int8 images/s | int8 / fp32 |",
          "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        if r["status"] != "ok":
            L.append(not_ran(r, 3))
            continue
        i = r["inference"]
        if not i:
            L.append(head(r) + " %s | — | — |" % ("not timed" if not r["timed"] else "**missing**"))
            continue
        ratio = (i["int8_images_per_s"] / i["fp32_images_per_s"]) if i["fp32_images_per_s"] and \
            i["int8_images_per_s"] is not None else None
        L.append(head(r) + " %s | %s | %s |" % (rate(i["fp32_images_per_s"]), rate(i["int8_images_per_s"]),
                                                "—" if ratio is None else "%.2fx" % ratio))
    L += ["", "Run directories: `%s` (not committed): each row's `summary.json`, `report.txt` (the partitions "
          "and the three-stage report), `quantizer.txt` and `log.txt`." % G.shown_path(runs), ""]
    with open(os.path.join(out, "backends.md"), "w") as f:
        f.write("\n".join(L))


# ----------------------------------------------------------------------------- checking

def check_outputs(cfg, out):
    problems = []
    res = G.read_json(os.path.join(out, "backends.json"))
    if res is None:
        return ["%s missing or unreadable" % os.path.join(out, "backends.json")]
    try:
        with open(os.path.join(out, "backends.md")) as f:
            md = f.read()
    except OSError:
        md = ""
        problems.append("backends.md missing")
    if not (res.get("machine") or {}).get("cpu") or not (res.get("machine") or {}).get("isa_flags"):
        problems.append("machine / ISA flags missing")
    for model in cfg["models"]:
        m = (res.get("fp32") or {}).get(model)
        if not m or not m.get("ok"):
            problems.append("%s: no fp32 checkpoint" % model)
        elif len(m.get("accuracies_in_rows") or []) > 1:
            problems.append("%s: the rows evaluated different fp32 accuracies %s (not one checkpoint?)"
                            % (model, m["accuracies_in_rows"]))
    by = {(r["model"], r["backend"], r["method"], r["bits"]): r for r in res.get("rows", [])}
    for model in cfg["models"]:
        for backend in cfg["backends"]:
            for method, bits in cfg["rows"]:
                name = "%s %s %s %s" % (model, backend, method, bits)
                r = by.get((model, backend, method, bits))
                if r is None:
                    problems.append("%s: row missing from backends.json" % name)
                    continue
                if ("| %s | %s | %s | %s |" % (model, backend, r["label"], G.bits_label(bits))) not in md:
                    problems.append("%s: row missing from backends.md" % name)
                if r["status"] == "refused":
                    if (method, bits) == BASELINE:
                        problems.append("%s: refused (%s), but every backend must run the baseline"
                                        % (name, r["reason"]))
                    elif not r.get("reason"):
                        problems.append("%s: refused without a reason" % name)
                    continue
                if r["status"] != "ok":
                    problems.append("%s: %s (%s)" % (name, r["status"], r.get("reason")))
                    continue
                for k, t in STAGES:
                    v = r["stages"].get(k)
                    if v is None or not 0.0 <= v <= 1.0:
                        problems.append("%s: stage %s accuracy %r not in [0, 1]" % (name, t, v))
                if r.get("check_ok") is not True:
                    problems.append("%s: consistency check not passed" % name)
                h = r.get("lsb")
                if h is None or h.get("max") is None or any(h.get(k) is None for k in ("0", "1", "over_1")):
                    problems.append("%s: LSB histogram missing" % name)
                else:  # one count per logit: images x classes
                    n, images = h["0"] + h["1"] + h["over_1"], r.get("test_images") or 0
                    if n <= 0 or not images or n % images:
                        problems.append("%s: LSB histogram of %d logits for %d test images" % (name, n, images))
                if r.get("top1_agreement") is None:
                    problems.append("%s: top-1 agreement missing" % name)
                p = r.get("partitions") or {}
                if not isinstance(p.get("int8"), int) or not isinstance(p.get("fallback"), int):
                    problems.append("%s: partition counts missing" % name)
                elif p["int8"] + p["fallback"] == 0:
                    problems.append("%s: no partitions" % name)
                elif not isinstance(p.get("fallbacks"), list) or len(p["fallbacks"]) != min(p["fallback"], 16):
                    problems.append("%s: %s fallback partitions but %s listed" % (
                        name, p["fallback"], "none" if p.get("fallbacks") is None else len(p["fallbacks"])))
                if r.get("timed"):
                    i = r.get("inference") or {}
                    if not (G.fnum(i.get("fp32_images_per_s")) or 0) > 0 or \
                            not (G.fnum(i.get("int8_images_per_s")) or 0) > 0:
                        problems.append("%s: timed, but images/s missing" % name)
    return problems


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--quick", action="store_true", help="CI-sized: few images, rows %s" % ", ".join(
        "%s:%s" % r for r in QUICK_ROWS))
    ap.add_argument("--models", help="comma-separated (default: %s)" % ",".join(MODELS))
    ap.add_argument("--backends", help="comma-separated names (%s) or NAME=DESCRIPTION.ini (default: all three)"
                    % ", ".join("%s = %s" % kv for kv in BACKENDS.items()))
    ap.add_argument("--rows", help="comma-separated METHOD:BITS, METHOD a method section of grid.ini "
                    "(default: %s)" % ",".join("%s:%s" % r for r in ROWS))
    ap.add_argument("--fp32", action="append", metavar="MODEL=CHECKPOINT",
                    help="take this fp32 checkpoint for MODEL instead of training one (repeatable)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory holding bin/qat_train (default: build/)")
    ap.add_argument("--out", help="results folder (default: experiments/results/; with --quick "
                    "runs/backends_quick/results/; with --models/--backends/--rows runs/backends_slice/results/)")
    ap.add_argument("--runs", help="run directories (default: runs/backends/; with --quick "
                    "runs/backends_quick/runs/; OUT/runs/ when --out is given)")
    ap.add_argument("--resume", action="store_true", help="keep runs that finished before with the same command")
    ap.add_argument("--report-only", action="store_true", help="run nothing; write the tables from the runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    ap.add_argument("--check", action="store_true",
                    help="validate the outputs; exit 1 if anything is missing or wrong")
    a = ap.parse_args()

    grid = G.load_grid(GRID_INI, False)
    models = G.split_list(a.models) if a.models else list(MODELS)
    for m in models:
        if not os.path.exists(os.path.join(REPO, grid["fp32_config"].replace("{model}", m))):
            sys.exit("backends: --models: no fp32 recipe %s for %r" % (grid["fp32_config"].replace("{model}", m), m))
    cfg = {"quick": a.quick, "models": models,
           "backends": parse_backends(a.backends) if a.backends else dict(BACKENDS),
           "rows": parse_rows(a.rows, grid) if a.rows else list(QUICK_ROWS if a.quick else ROWS),
           "fp32": parse_fp32(a.fp32, models),
           "command": " ".join(["/usr/bin/python3 experiments/backends.py"] + [shlex.quote(x) for x in sys.argv[1:]])}
    sliced = a.models or a.backends or a.rows
    if a.out:
        out = os.path.abspath(a.out)
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(out, "runs")
    elif a.quick:  # not committed: experiments/results/ holds the full table
        out = os.path.join(REPO, "runs", "backends_quick", "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "backends_quick", "runs")
    elif sliced:  # a slice never overwrites the committed full table
        out = os.path.join(REPO, "runs", "backends_slice", "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "backends")
    else:
        out = os.path.join(REPO, "experiments", "results")
        runs = os.path.abspath(a.runs) if a.runs else os.path.join(REPO, "runs", "backends")
    qat_train = os.path.join(os.path.abspath(a.build), "bin", "qat_train")
    p = plan(cfg, grid, qat_train, runs)
    if a.dry_run:
        for *_, argv in p:
            print(" ".join(shlex.quote(x) for x in argv))
        print("# %d runs" % len(p))
        return 0
    started = time.strftime("%Y-%m-%d %H:%M")
    t0 = time.time()
    if not a.report_only:
        if not os.access(qat_train, os.X_OK):
            sys.exit("backends: %s not found; build first (cmake -S . -B build && cmake --build build)" % qat_train)
        print("backends: %d runs (%s%s x %s x %d rows), runs in %s, results in %s" %
              (len(p), "quick, " if a.quick else "", ",".join(models), ",".join(cfg["backends"]), len(cfg["rows"]),
               runs, out), flush=True)
        execute(p, runs, a.resume, grid)
    rows = collect(cfg, grid, runs)
    fp32 = fp32_info(cfg, runs, rows)
    elapsed = time.time() - t0
    write_outputs(cfg, grid, rows, fp32, out, runs, started)
    print("backends: wrote %s (%.1f min)" % (os.path.join(out, "backends.md"), elapsed / 60), flush=True)
    if a.check:
        problems = check_outputs(cfg, out)
        if problems:
            print("backends --check: %d problem%s:" % (len(problems), "s" if len(problems) > 1 else ""))
            for pr in problems:
                print("  " + pr)
            return 1
        res = G.read_json(os.path.join(out, "backends.json"))
        print("backends --check: ok (%d models x %d backends x %d rows: %d ran, %d refused by their Quantizer)" %
              (len(models), len(cfg["backends"]), len(cfg["rows"]),
               sum(1 for r in res["rows"] if r["status"] == "ok"),
               sum(1 for r in res["rows"] if r["status"] == "refused")))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. --dry-run | head
        sys.exit(0)
