"""Collects the peer benchmarks' result files into one JSON and a Markdown report.

    python3 bench/peers/report.py --work bench/peers/work --out experiments/results/peers

Reads every slice of WORK/results/ (one folder per run_all.sh run: pt2e.json, train_speed.json,
int8_infer.json, what pt2e.py, train_speed.py and int8_infer.py wrote, and steps.json, run_all.sh's
commands and exit statuses) and merges them: a row two slices measured (the same model, seed,
method, bits and peer) comes from the result file that finished last. Also reads
bench/peers/.venv/install_report.json and pip_freeze.txt (setup_peers.sh),
experiments/results/ort.json (bench/bench_ort.py --json: ONNX Runtime's speed rows), and
writes OUT.json (all of it, with the machine) and OUT.md: which models and seeds of the full set
(--full-models x --full-seeds) are still missing, one table per question, then every failure with
its error. Python standard library only.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.join(HERE, ".venv")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from grid import read_json  # noqa: E402  (experiments/grid.py: None for a missing or broken file)


def pct(x):
    return "%.2f" % (100 * x) if x is not None else "-"


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    if len(xs) == 1:
        return pct(xs[0])
    return "%.2f ± %.2f" % (100 * statistics.mean(xs), 100 * statistics.stdev(xs))


def per_seed(rows, key):
    """One value per seed (rows of one seed share their fp32 accuracy), in seed order."""
    seen = {}
    for r in rows:
        if r.get(key) is not None and r.get("seed") not in seen:
            seen[r.get("seed")] = r[key]
    return [seen[k] for k in sorted(seen, key=str)]


def num(x, fmt="%.0f"):
    return fmt % x if x is not None else "-"


def md_table(head, rows):
    out = ["", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |")
    return "\n".join(out)


def short(err, n=160):
    err = " ".join(str(err).split())
    return err if len(err) <= n else err[:n - 3] + "..."


class Failures:
    def __init__(self):
        self.items = []

    def add(self, where, err):
        key = (where, short(err, 2000))
        if key not in self.items:
            self.items.append(key)
        return "failed [%d]" % (self.items.index(key) + 1)


def machine():
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:10]
    except OSError:
        lscpu = []
    return {"lscpu_head": lscpu, "kernel": platform.release(), "cores": os.cpu_count()}


def cell(rows, fails, where):
    """mean ± std of the rows' accuracies; a failure mark when any failed."""
    errs = [r["error"] for r in rows if r.get("error")]
    if errs:
        return fails.add(where, errs[0])
    return mean_std([r.get("accuracy") for r in rows]) or "-"


def pt2e_tables(res, fails):
    if not res:
        return ["No result file (pt2e.py did not run or died before its first row; see the steps below)."]
    rows = [r for r in res["rows"] if r.get("framework") != "setup"]
    for r in res["rows"]:
        if r.get("framework") == "setup":
            fails.add("pt2e.py %s seed %s: fp32 checkpoint" % (r["model"], r["seed"]), r["error"])
    peers = []
    for r in rows:
        k = (r["framework"], r["quantizer"])
        if not r["framework"].startswith("this framework") and k not in peers:
            peers.append(k)
    out = ["Test accuracy in %%, mean ± std over seeds %s (the converted PT2E model: Q/DQ ops around fp32 "
           "kernels; ours: the Q/DQ graph, and the int8 device in brackets). All start from the same fp32 "
           "checkpoint per seed." % ", ".join(str(s) for s in sorted({r["seed"] for r in rows}))]
    head = ["model", "method", "bits", "fp32 (twin)", "ours Q/DQ (int8 device)"] + ["%s %s" % (f, q) for f, q in peers]
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for method in ("ptq", "qat"):
            for bits in dict.fromkeys(r["bits"] for r in rows if r["method"] == method and r["model"] == model):
                sel = [r for r in rows if r["model"] == model and r["method"] == method and r["bits"] == bits]
                ours = [r for r in sel if r["framework"].startswith("this framework")]
                fp32 = mean_std(per_seed([r for r in sel if not r["framework"].startswith("this")], "fp32_accuracy")) or "-"
                if ours:
                    o = cell(ours, fails, "ours %s %s %s" % (model, method, bits))
                    if not o.startswith("failed"):
                        o += " (%s)" % (mean_std([r.get("int8_accuracy") for r in ours]) or "-")
                else:
                    o = "-"
                line = [model, method.upper(), bits, fp32, o]
                for f, q in peers:
                    ps = [r for r in sel if r["framework"] == f and r["quantizer"] == q]
                    line.append(cell(ps, fails, "%s %s %s %s %s" % (f, q, model, method, bits)) if ps else "-")
                table.append(line)
    out.append(md_table(head, table))
    # QAT cost
    out.append("")
    out.append("### QAT cost: QAT epoch time ÷ fp32 epoch time")
    out.append("")
    out.append("Median over seeds. Ours: qat_train's QAT epochs over its fp32 run's epochs. PT2E: the "
               "prepared (fake-quantized) exported graph's epochs over one epoch of the eager fp32 twin, same "
               "recipe, data and threads.")
    head = ["model", "bits", "ours"] + ["%s %s" % (f, q) for f, q in peers]
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for bits in dict.fromkeys(r["bits"] for r in rows if r["method"] == "qat" and r["model"] == model):
            sel = [r for r in rows if r["model"] == model and r["method"] == "qat" and r["bits"] == bits]

            def ratio(rs):
                xs = [r.get("epoch_ratio") for r in rs if r.get("epoch_ratio")]
                return "%.2f" % statistics.median(xs) if xs else "-"
            line = [model, bits, ratio([r for r in sel if r["framework"].startswith("this framework")])]
            for f, q in peers:
                line.append(ratio([r for r in sel if r["framework"] == f and r["quantizer"] == q]))
            table.append(line)
    out.append(md_table(head, table))
    return out


def train_table(res, fails):
    if not res:
        return ["No result file (train_speed.py did not run; see the steps below)."]
    o = res["options"]
    out = ["fp32 training, batch 128, %s threads, one epoch of %s images per round, %s rounds; images/s best "
           "(median) of the rounds, peak RSS. Speedup: ours over the fastest PyTorch variant, best-of figures, "
           "then the median and range of the rounds' own ratios." % (o["threads"], o["images"], o["rounds"])]
    keys = ("threads", "images", "rounds")
    for model, m in res["models"].items():
        mo = m.get("options") or o
        if any(mo.get(k) != o.get(k) for k in keys):
            out[0] += " %s: %s threads, %s images, %s rounds." % (model, mo.get("threads"), mo.get("images"), mo.get("rounds"))
    table = []
    for model, m in res["models"].items():
        for name, r in m["rows"].items():
            if r.get("error"):
                val = fails.add("train_speed %s %s" % (model, name), r["error"])
                table.append([model, r["label"], val, "-", "-"])
                continue
            comp = ""
            if r.get("compile_s"):
                comp = " (compile %.0f s)" % max(c for c in r["compile_s"] if c is not None)
            table.append([model, r["label"] + comp, "%s (%s)" % (num(r["best_images_per_s"]), num(r["median_images_per_s"])),
                          num(r["peak_rss_mb"]), ""])
        s = m.get("speedup_over_best_pytorch")
        if s:
            table.append([model, "**speedup, ours / best PyTorch**", "", "",
                          "%.2fx (rounds: median %.2fx, %.2f-%.2f)" % (s["best_of"], s["rounds_median"], s["rounds_min"],
                                                                     s["rounds_max"])])
    out.append(md_table(["model", "contender", "images/s best (median)", "peak RSS MB", "speedup"], table))
    return out


def infer_tables(res, fails):
    if not res:
        return ["No result file (int8_infer.py did not run; see the steps below)."], [
            "No result file (int8_infer.py did not run; see the steps below)."]
    o = res["options"]
    speed = ["Batch 256: best of %s rounds of 8 batches (x %s repeats); batch 1: median latency of %s single-image runs "
             "per round (ExecuTorch; its best in brackets) or 1 / the best round's rate (ours, bench_int8). %s threads. "
             "Accuracy: the engine's own on the test images. OMP_WAIT_POLICY: %s."
             % (o["rounds"], o["repeat"], o["latency_runs"], o["threads"],
                (res.get("env") or {}).get("OMP_WAIT_POLICY") or "unset")]
    table = []
    for r in res["speed"]:
        if r.get("error"):
            table.append([r["model"], r["engine"], fails.add("int8_infer speed %s %s" % (r["model"], r["engine"]),
                                                             r["error"]), "-", "-", "-"])
            continue
        lat = num(r.get("latency_ms"), "%.3f")
        if r.get("latency_best_ms") and r.get("latency_ms") and r["latency_best_ms"] != r["latency_ms"]:
            lat += " (%.3f)" % r["latency_best_ms"]
        left = r.get("ops_outside_delegate")
        table.append([r["model"], r["engine"], num(r.get("images_per_s")), lat, pct(r.get("accuracy")),
                      ", ".join(left) if left else ("none" if left is not None else "")])
    speed.append(md_table(["model", "engine", "images/s, batch 256", "batch-1 latency ms", "accuracy %",
                           "ops outside the delegate"], table))
    acc = ["Test accuracy in %, mean ± std over seeds, from the same fp32 checkpoints (the twin's fp32 accuracy "
           "beside it). Ours: the grid's [ptq], and PTQ-MSE + AdaRound (experiments/grid/reconstruction.ini's [ptq_adaround]) "
           "(Q/DQ graph; int8 device in brackets)."]
    rows = res["ptq_accuracy"]
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        keys = list(dict.fromkeys((r.get("framework"), r.get("method"), r.get("bits")) for r in rows
                                  if r["model"] == model))
        for f, m, b in keys:
            sel = [r for r in rows if r["model"] == model and r.get("framework") == f and r.get("method") == m
                   and r.get("bits") == b]
            v = cell(sel, fails, "%s %s %s %s" % (f, m or "", model, b or ""))
            if not v.startswith("failed") and any(r.get("int8_accuracy") is not None for r in sel):
                v += " (%s)" % mean_std([r.get("int8_accuracy") for r in sel])
            table.append([model, f, m or "-", b or "-", mean_std(per_seed(sel, "fp32_accuracy")) or "-", v])
    acc.append(md_table(["model", "toolkit", "method", "bits", "fp32", "accuracy"], table))
    return speed, acc


def ort_table(res):
    """bench/bench_ort.py's JSON (ONNX Runtime against our devices), when it was written."""
    if not res:
        return ["No result file: run `.venv/bin/python bench/bench_ort.py --json experiments/results/ort.json` "
                "(the test environment of scripts/setup.sh)."]
    out = ["From `%s` (ONNX Runtime %s, %s threads, best of %s rounds; batch 256: images/s over 8 batches; "
           "batch 1: median ms of 512 single-image calls, best round; %s). FashionCNN; our QAT example models "
           "(`experiments/fashion_cnn_qat_w*.ini`), exported with qat_export and run in ONNX Runtime, beside our "
           "int8 devices; ONNX Runtime's own quantize_static of the fp32 model (after quant_pre_process) and the "
           "fp32 model in ONNX Runtime. Accuracy on the 10,000 test images."
           % (res.get("command"), res.get("onnxruntime"), res.get("threads"), res.get("rounds"),
              (res.get("cpu") or "").split(":")[-1].strip())]
    table = [[r["name"], num(r.get("best_ips")), num(r.get("best_ms1"), "%.3f"), pct(r.get("accuracy"))]
             for r in res["rows"]]
    out.append(md_table(["model and engine", "images/s, batch 256", "batch-1 ms", "accuracy %"], table))
    return out


RESULTS = ("pt2e", "train_speed", "int8_infer")


def read_slices(work):
    """The slices under WORK/results/, oldest first (by the last time any of their scripts finished:
    the order of the commands in the report)."""
    base = os.path.join(work, "results")
    out = []
    for tag in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        d = os.path.join(base, tag)
        if not os.path.isdir(d):
            continue
        sl = {"tag": tag, "steps": read_json(os.path.join(d, "steps.json")) or []}
        for name in RESULTS:
            sl[name] = read_json(os.path.join(d, name + ".json"))
        sl["finished"] = max([sl[n].get("finished") or "" for n in RESULTS if sl[n]] or [""])
        out.append(sl)
    return sorted(out, key=lambda x: x["finished"])


def base_slice(path):
    """A report this script wrote before (OUT.json) as one slice older than any under WORK: its
    merged rows, runs and steps, so that new slices add to it (a clone or a new machine keeps the
    published report, not the work folder it came from)."""
    b = read_json(path)
    if not b or not isinstance(b.get("steps"), list):
        sys.exit("report: --base %s: not a report JSON this script wrote" % path)
    sl = {"tag": "base", "steps": b["steps"], "report": b}
    for name in RESULTS:
        m = dict(b[name]) if b.get(name) else None
        if m:
            m["finished"] = max([r.get("finished") or "" for r in m.get("runs") or []] or [""])
        sl[name] = m
    sl["finished"] = max([sl[n]["finished"] for n in RESULTS if sl[n]] or [""])
    return sl


def model_name(mach):
    return next((l.split(":", 1)[1].strip() for l in (mach or {}).get("lscpu_head") or [] if l.startswith("Model name")),
                "?")


def merged_rows(results, field, key):
    """The rows of every result file's FIELD, one per KEY, the later file's winning."""
    rows = {}
    for res in results:
        for r in res.get(field) or []:
            rows[tuple(r.get(k) for k in key)] = r
    return list(rows.values())


def merge(slices):
    """One result per script, as if one run had measured every slice."""
    merged = {}
    for name in RESULTS:
        results = sorted((sl[name] for sl in slices if sl[name]), key=lambda r: r.get("finished") or "")
        if not results:
            merged[name] = None
            continue
        last = results[-1]
        m = {k: last.get(k) for k in ("script", "versions", "options", "env")}
        m["runs"] = []
        for r in results:  # a base report's result holds its runs already
            m["runs"] += r["runs"] if "runs" in r else [{k: r.get(k) for k in ("argv", "started", "finished", "versions")}]
        if name == "pt2e":
            m["rows"] = merged_rows(results, "rows", ("model", "seed", "framework", "quantizer", "method", "bits"))
        elif name == "train_speed":
            m["models"] = {}
            for r in results:
                for model, v in r["models"].items():
                    m["models"][model] = dict(v, options=r.get("options"))
        else:
            m["speed"] = merged_rows(results, "speed", ("model", "engine"))
            m["ptq_accuracy"] = merged_rows(results, "ptq_accuracy", ("model", "seed", "framework", "method", "bits"))
            m["parts"] = {}
            for r in results:
                m["parts"].update(r["parts"] if "runs" in r else {" ".join(r.get("argv") or []): r.get("parts")})
        merged[name] = m
    return merged


def coverage(merged, models, seeds):
    """What the full set (MODELS x SEEDS) still lacks, per script; [] when nothing."""
    missing = []
    per_seed = (("pt2e", "PT2E accuracy and QAT cost", "rows"), ("int8_infer", "other toolkits' PTQ accuracy", "ptq_accuracy"))
    for name, what, field in per_seed:
        have = {(r.get("model"), str(r.get("seed"))) for r in (merged[name] or {}).get(field) or []}
        lack = []
        for m in models:
            ss = [s for s in seeds if (m, s) not in have]
            if ss:
                lack.append("%s (seed%s %s)" % (m, "s" if len(ss) > 1 else "", ", ".join(ss)))
        if lack:
            missing.append("%s: %s" % (what, ", ".join(lack)))
    per_model = (("training speed", set(((merged["train_speed"] or {}).get("models") or {}).keys())),
                 ("int8 inference speed", {r.get("model") for r in (merged["int8_infer"] or {}).get("speed") or []}))
    for what, have in per_model:
        lack = [m for m in models if m not in have]
        if lack:
            missing.append("%s: %s" % (what, ", ".join(lack)))
    return missing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(HERE, "work"))
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "peers"))
    ap.add_argument("--title", default="Peers, side by side on our models")
    ap.add_argument("--note", default="", help="a line under the title (e.g. that this is a smoke run)")
    ap.add_argument("--ort", default=os.path.join(ROOT, "experiments", "results", "ort.json"),
                    help="bench/bench_ort.py's --json output")
    ap.add_argument("--full-models", default="", help="the full set's models (comma-separated): the report says "
                    "which of them, with --full-seeds, no slice has measured")
    ap.add_argument("--full-seeds", default="")
    ap.add_argument("--base", help="a report JSON written before (e.g. experiments/results/peers.json): its rows "
                    "count as measured before every slice under WORK")
    a = ap.parse_args()
    slices = read_slices(a.work)
    base = base_slice(a.base) if a.base else None
    if base:
        slices = [base] + slices
    merged = merge(slices)
    pt2e, train, infer = merged["pt2e"], merged["train_speed"], merged["int8_infer"]
    ort = read_json(a.ort)
    new_tags = [sl["tag"] for sl in slices if sl is not base]
    # a slice under WORK that the base report also holds lists its steps once: as WORK has them
    steps = [s if sl is base else dict(s, slice=sl["tag"]) for sl in slices for s in sl["steps"]
             if sl is not base or s.get("slice") not in new_tags]
    tags = list(dict.fromkeys((base["report"]["slices"] if base else []) + new_tags))
    missing = []
    if a.full_models:
        missing = coverage(merged, a.full_models.split(","), (a.full_seeds or "0").split(","))
    versions = {json.dumps(run["versions"], sort_keys=True) for m in (pt2e, train, infer) if m
                for run in m["runs"] if run.get("versions")}
    install = read_json(os.path.join(VENV, "install_report.json"))
    try:
        with open(os.path.join(VENV, "pip_freeze.txt")) as f:
            freeze = [l.strip() for l in f if l.strip()]
    except OSError:
        freeze = []
    mach = machine()
    fails = Failures()
    allres = {"title": a.title, "note": a.note, "written": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": mach,
              "install": install, "pip_freeze": freeze, "steps": steps, "pt2e": pt2e, "train_speed": train,
              "int8_infer": infer, "ort": ort, "slices": tags, "missing": missing}
    # the CPU each slice ran on (a base report's slices: as it recorded them)
    allres["slice_machines"] = {}
    if base:
        b = base["report"]
        allres["slice_machines"] = b.get("slice_machines") or {t: model_name(b.get("machine")) for t in b["slices"]}
        allres["base"] = {"file": a.base, "written": b.get("written")}
    allres["slice_machines"].update({t: model_name(mach) for t in new_tags})
    md = ["# %s" % a.title, ""]
    if a.note:
        md += ["**%s**" % a.note, ""]
    if missing:
        md += ["**Not the full set yet (%s models x seeds %s). Missing: %s.**" % (a.full_models, a.full_seeds,
                                                                               "; ".join(missing)), ""]
    md += ["Written by bench/peers/run_all.sh (bench/peers/README.md) on %s, from the slices %s (under "
           "bench/peers/work/results/%s; the commands below)." % (
               allres["written"], ", ".join(allres["slices"]) or "none", ", or in the base report" if base else ""),
           "",
           "## Machine", "", "```"] + mach["lscpu_head"] + ["```", ""]
    cpus = {}
    for t, cpu in allres["slice_machines"].items():
        cpus.setdefault(cpu, []).append(t)
    if len(cpus) > 1 or base:
        md += ["Slices by CPU%s: %s." % (" (the earlier ones as %s, written %s, records them)" % (
            a.base, allres["base"]["written"]) if base else "", "; ".join(
                "%s: %s" % (c, ", ".join(ts)) for c, ts in cpus.items())), ""]
    md += ["## Versions", ""]
    if install:
        t = []
        for name, e in install["packages"].items():
            st = e.get("status")
            if e.get("error"):
                st = fails.add("install %s" % name, e["error"])
            t.append([name, e.get("pinned") or "-", e.get("installed") or "-", st])
        md += ["Python %s (%s). Full `pip freeze` in the JSON." % (install.get("python"), install.get("python_executable")),
               "", md_table(["package", "pinned", "installed", "status"], t), ""]
        if len(versions) > 1:
            md += ["The slices ran with different package versions: each run's are in the JSON (`runs`).", ""]
    else:
        md += ["No install report (bench/peers/setup_peers.sh has not run).", ""]
    md += ["## PTQ and QAT accuracy: torchao PT2E against this framework", ""] + pt2e_tables(pt2e, fails) + [""]
    md += ["## fp32 training speed: PyTorch 2.x against this framework", ""] + train_table(train, fails) + [""]
    speed, acc = infer_tables(infer, fails)
    md += ["## int8 inference: ExecuTorch XNNPACK against this framework's devices", ""] + speed + [""]
    md += ["## int8 inference: ONNX Runtime against this framework's devices", ""] + ort_table(ort) + [""]
    md += ["## PTQ accuracy of other toolkits: ONNX Runtime quantize_static, AIMET AdaRound, NNCF, Brevitas", ""] + acc + [""]
    md += ["## Commands", ""]
    if steps:
        md += [md_table(["slice", "step", "command", "exit", "seconds"],
                        [[s["slice"], s["name"], "`%s`" % s["command"], s.get("rc"), s.get("seconds")] for s in steps]), ""]
        for s in steps:
            if s.get("rc") not in (0, None):
                fails.add("step %s of %s" % (s["name"], s["slice"]),
                          "exit %s; last lines of its log:\n%s" % (s.get("rc"), s.get("tail", "")))
    md += ["## Failures", ""]
    if fails.items:
        for i, (where, err) in enumerate(fails.items, 1):
            md.append("%d. **%s**: %s" % (i, where, short(err, 600)))
    else:
        md.append("None.")
    md.append("")
    allres["failures"] = [{"where": w, "error": e} for w, e in fails.items]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(allres, f, indent=1, default=str)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md))
    print("wrote %s.json and %s.md" % (a.out, a.out))


if __name__ == "__main__":
    main()
