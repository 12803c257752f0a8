#!/usr/bin/env python3
"""Runs an ONNX model in ONNX Runtime (the `onnxruntime` wheel of the test environment, CPU
execution provider) on raw float32 NCHW input and writes the model's first output as raw float32
(both little-endian).

  .venv/bin/python tests/ort/ort_run.py --model M.onnx --input in.bin --shape N,C,H,W --output out.bin
      [--opt disabled|basic|extended|all] [--x64quantprecision] [--threads K] [--batch B]
      [--no-spinning] [--warmup] [--verbose] [--optimized-model OUT.onnx]

--opt sets the session's graph optimization level (default all, ORT's own default);
--x64quantprecision sets the session config entry session.x64quantprecision = "1" (ORT's slower
u8 x s8 kernels that do not saturate on x64 CPUs without VNNI); --threads the intra-op threads
(default 2; inter-op 1, sequential execution); --batch the images per run call (default 256; a
model whose batch dimension is fixed runs in batches of that size, and N must be a multiple of
it); --no-spinning stops ORT's worker threads from spin-waiting between tasks
(session.intra_op/inter_op.allow_spinning = "0"; for tests on shared cores); --warmup runs the
first batch once before the timed runs (benchmarks); --verbose turns on ORT's verbose log (on
stderr: the session options with their config entries, the kernels chosen);
--optimized-model writes the graph ORT runs after its optimizations (fused QDQ kernels and all).

Prints one JSON line on stdout: model, input and output names, output dims, ORT version, options,
session creation and run times (ms). Exit status 0 on success, 1 on any error (a message on
stderr starting "ort_run: ", no output file left behind).

tests/ort/ortlib.py calls run_arrays() in process; this file's command line serves the C tests
and the shell test of these messages (test_ort_run.sh).
"""
import json
import os
import sys
import time

USAGE = ("usage: ort_run.py --model M.onnx --input in.bin --shape N,C,H,W --output out.bin\n"
         "       [--opt disabled|basic|extended|all] [--x64quantprecision] [--threads K] [--batch B]\n"
         "       [--no-spinning] [--warmup] [--verbose] [--optimized-model OUT.onnx]")

OPT_LEVELS = ("disabled", "basic", "extended", "all")


class UsageError(Exception):
    pass


class RunError(Exception):
    pass


def positive_int(name, v):
    s = str(v)
    if not s.isdigit() or not s.isascii() or int(s) < 1 or int(s) > 2**53 - 1:
        raise UsageError("%s expects positive integers, not '%s'" % (name, s))
    return int(s)


def parse_args(argv):
    a = {"opt": "all", "threads": 2, "batch": 256, "x64quantprecision": False, "spinning": True,
         "verbose": False, "warmup": False, "optimized_model": None}
    valued = {"--model": "model", "--input": "input", "--shape": "shape", "--output": "output", "--opt": "opt",
              "--threads": "threads", "--batch": "batch", "--optimized-model": "optimized_model"}
    flags = {"--x64quantprecision": ("x64quantprecision", True), "--no-spinning": ("spinning", False),
             "--warmup": ("warmup", True), "--verbose": ("verbose", True)}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--help", "-h"):
            print(USAGE)
            sys.exit(0)
        elif arg in flags:
            a[flags[arg][0]] = flags[arg][1]
        elif arg in valued:
            if i + 1 >= len(argv):
                raise UsageError("%s needs a value" % arg)
            i += 1
            a[valued[arg]] = argv[i]
        else:
            raise UsageError("unknown argument '%s'" % arg)
        i += 1
    for k in ("model", "input", "shape", "output"):
        if k not in a:
            raise UsageError("--%s is required" % k)
    if a["opt"] not in OPT_LEVELS:
        raise UsageError("--opt must be one of %s, not '%s'" % (", ".join(OPT_LEVELS), a["opt"]))
    a["threads"] = positive_int("--threads", a["threads"])
    a["batch"] = positive_int("--batch", a["batch"])
    dims = str(a["shape"]).split(",")
    if len(dims) != 4:
        raise UsageError("--shape must be N,C,H,W (4 positive integers), not '%s'" % a["shape"])
    a["shape"] = [positive_int("--shape", d) for d in dims]
    return a


def dims_str(d):
    return "[" + ", ".join(str(x) for x in d) + "]"


def make_session(model, opt="all", threads=2, x64quantprecision=False, spinning=True, verbose=False,
                 optimized_model=None):
    """An InferenceSession on the CPU execution provider with the runner's options; returns
    (session, onnxruntime module, milliseconds taken)."""
    import onnxruntime as ort
    levels = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[opt]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 0 if verbose else 3
    if x64quantprecision:
        so.add_session_config_entry("session.x64quantprecision", "1")
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if optimized_model:
        so.optimized_model_filepath = optimized_model
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own Fail / InvalidGraph / ... classes
        raise RunError("ONNX Runtime cannot load %s: %s" % (model, e))
    return sess, ort, (time.perf_counter() - t0) * 1000.0


def check_input(sess, model, shape):
    """The batch size the model forces (its fixed batch dimension), or 0; raises on a mismatch."""
    ins = sess.get_inputs()
    if len(ins) != 1:
        raise RunError("model %s has %d inputs (%s); this runner feeds exactly one"
                       % (model, len(ins), ", ".join(i.name for i in ins)))
    meta = ins[0]
    if meta.type != "tensor(float)":
        raise RunError("model input '%s' is %s, not float32" % (meta.name, meta.type))
    ms = meta.shape
    if len(ms) != 4:
        raise RunError("model input '%s' has shape %s, not 4-D NCHW" % (meta.name, dims_str(ms)))
    for i in range(1, 4):
        if isinstance(ms[i], int) and ms[i] != shape[i]:
            raise RunError("model input '%s' is %s; --shape %s does not fit it"
                           % (meta.name, dims_str(ms), ",".join(map(str, shape))))
    if isinstance(ms[0], int) and ms[0] > 0:
        if shape[0] % ms[0]:
            raise RunError("model input '%s' has a fixed batch of %d; N = %d is not a multiple of it"
                           % (meta.name, ms[0], shape[0]))
        return ms[0]
    return 0


def run_batches(sess, x, batch, warmup, sink):
    """Runs x (N,C,H,W float32) through sess in calls of `batch` images; sink(y) receives each
    call's first output. Returns (the output dims after the batch, run milliseconds)."""
    import numpy as np
    inp, out = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    n = x.shape[0]
    if warmup:  # the first batch once, untimed and not kept (kernels are prepared on first use)
        sess.run([out], {inp: np.ascontiguousarray(x[:min(batch, n)])})
    out_dims, run_s = None, 0.0
    for n0 in range(0, n, batch):
        xb = np.ascontiguousarray(x[n0:n0 + batch])
        nb = xb.shape[0]
        t0 = time.perf_counter()
        try:
            y = sess.run([out], {inp: xb})[0]
        except Exception as e:
            raise RunError("ONNX Runtime failed on images %d..%d: %s" % (n0, n0 + nb - 1, e))
        run_s += time.perf_counter() - t0
        if y.dtype != np.float32:
            raise RunError("output '%s' is %s, not float32" % (out, y.dtype))
        if y.ndim == 0 or y.shape[0] != nb:
            raise RunError("output '%s' has dims %s; expected %d rows" % (out, dims_str(y.shape), nb))
        if out_dims is None:
            out_dims = list(y.shape[1:])
        elif list(y.shape[1:]) != out_dims:
            raise RunError("output '%s' changes shape between batches" % out)
        sink(y)
    return out_dims, run_s * 1000.0


def info_dict(sess, ort, model, n, out_dims, o, batch, session_ms, run_ms):
    return {"model": model, "input": sess.get_inputs()[0].name, "output": sess.get_outputs()[0].name,
            "dims": [n] + out_dims, "ort_version": ort.__version__, "opt": o["opt"],
            "x64quantprecision": o["x64quantprecision"], "threads": o["threads"], "spinning": o["spinning"],
            "batch": batch, "warmup": o["warmup"], "session_ms": session_ms, "run_ms": run_ms}


def run_arrays(model, x, opt="all", x64quantprecision=False, threads=2, batch=256, spinning=True, warmup=False,
               verbose=False, optimized_model=None):
    """x (N,C,H,W float32) through the model: returns (its first output stacked over the
    batches, the runner's info dict). Raises RunError."""
    import numpy as np
    o = {"opt": opt, "x64quantprecision": x64quantprecision, "threads": threads, "spinning": spinning,
         "warmup": warmup}
    sess, ort, session_ms = make_session(model, opt, threads, x64quantprecision, spinning, verbose, optimized_model)
    fixed = check_input(sess, model, list(x.shape))
    batch = fixed or min(batch, x.shape[0])
    parts = []
    out_dims, run_ms = run_batches(sess, x, batch, warmup, parts.append)
    y = np.concatenate(parts, axis=0)
    return y, info_dict(sess, ort, model, x.shape[0], out_dims, o, batch, session_ms, run_ms)


def main(argv):
    a = parse_args(argv)
    if sys.byteorder != "little":
        raise RunError("this runner reads and writes little-endian float32 on little-endian hosts only")
    N, C, H, W = a["shape"]
    for what in ("model", "input"):
        p = a[what]
        if not os.path.exists(p):
            raise RunError("cannot open %s %s: no such file" % (what, p))
        if what == "model" and not os.path.isfile(p):
            raise RunError("model %s is not a regular file" % p)
    want = N * C * H * W * 4
    size = os.path.getsize(a["input"])
    if size != want:
        raise RunError("input %s has %d bytes; --shape %s needs %d*%d*%d*%d*4 = %d (raw little-endian float32, NCHW)"
                       % (a["input"], size, ",".join(map(str, a["shape"])), N, C, H, W, want))
    import numpy as np
    sess, ort, session_ms = make_session(a["model"], a["opt"], a["threads"], a["x64quantprecision"], a["spinning"],
                                         a["verbose"], a["optimized_model"])
    fixed = check_input(sess, a["model"], a["shape"])
    batch = fixed or min(a["batch"], N)
    x = np.fromfile(a["input"], dtype="<f4").reshape(N, C, H, W)
    tmp = a["output"] + ".tmp"
    try:
        f = open(tmp, "wb")
    except OSError as e:
        raise RunError("cannot write %s: %s" % (tmp, e.strerror or e))
    try:
        with f:
            out_dims, run_ms = run_batches(sess, x, batch, a["warmup"], lambda y: f.write(y.astype("<f4").tobytes()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a["output"])
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    print(json.dumps(info_dict(sess, ort, a["model"], N, out_dims, a, batch, session_ms, run_ms),
                     separators=(",", ":")))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UsageError as e:
        sys.stderr.write("ort_run: %s\n%s\n" % (e, USAGE))
        sys.exit(1)
    except RunError as e:
        sys.stderr.write("ort_run: %s\n" % e)
        sys.exit(1)
    except ImportError as e:
        sys.stderr.write("ort_run: %s (run scripts/setup.sh: it installs onnxruntime into .venv)\n" % e)
        sys.exit(1)
