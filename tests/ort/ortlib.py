"""ONNX Runtime as a test client, from Python (/usr/bin/python3 with numpy; onnx only for
inference_copy): runs tests/ort/ort_run.js on numpy arrays.

    import sys; sys.path.insert(0, "tests/ort"); import ortlib
    y, info = ortlib.run("model.onnx", x_nhwc, layout="NHWC", opt="disabled")

The node binary is $QT_NODE (set by the CTest helper qt_add_ort_test to what CMake found) or
the first `node` on PATH. Errors raise OrtError with the runner's message.
"""
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "ort_run.js")
PACKAGE = os.path.join(HERE, "node_modules", "onnxruntime-node", "package.json")


class OrtError(Exception):
    pass


def node_path():
    """The node binary: $QT_NODE when set (even to a path that no longer exists: the caller
    reports it), else `node` from PATH; None when there is none."""
    p = os.environ.get("QT_NODE")
    if p:
        return p
    return shutil.which("node")


def run(model, x, layout="NCHW", opt="all", x64quantprecision=False, threads=2, batch=256,
        spinning=False, timeout=600, warmup=False):
    """Runs `model` on x (N,C,H,W float32, or N,H,W,C with layout="NHWC": transposed to NCHW
    here) and returns (the first output as a float32 array of the dims the runner reports,
    the runner's JSON line as a dict). Spinning is off by default (tests share cores)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 4:
        raise OrtError("input must be 4-D (N,C,H,W or N,H,W,C), got shape %s" % (x.shape,))
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    elif layout != "NCHW":
        raise OrtError("layout must be NCHW or NHWC, not %r" % layout)
    node = node_path()
    if node is None:
        raise OrtError("node (Node.js) not found: set QT_NODE or install nodejs (scripts/setup.sh)")
    with tempfile.TemporaryDirectory(prefix="ortlib.") as tmp:
        fin, fout = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        np.ascontiguousarray(x, dtype="<f4").tofile(fin)
        cmd = [node, RUNNER, "--model", str(model), "--input", fin, "--output", fout,
               "--shape", ",".join(str(d) for d in x.shape), "--opt", opt,
               "--threads", str(threads), "--batch", str(batch)]
        if x64quantprecision:
            cmd.append("--x64quantprecision")
        if not spinning:
            cmd.append("--no-spinning")
        if warmup:
            cmd.append("--warmup")
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout)
        except OSError as e:
            raise OrtError("cannot start %s: %s" % (node, e))
        except subprocess.TimeoutExpired:
            raise OrtError("ort_run.js on %s took more than %d s" % (model, timeout))
        if r.returncode != 0:
            raise OrtError("ort_run.js on %s exited with %d: %s" % (model, r.returncode,
                                                                   r.stderr.strip()))
        lines = r.stdout.strip().splitlines()
        try:
            info = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise OrtError("ort_run.js on %s printed no JSON line: %r" % (model, r.stdout))
        y = np.fromfile(fout, dtype="<f4")
        dims = info.get("dims")
        if not dims or int(np.prod(dims)) != y.size:
            raise OrtError("ort_run.js on %s wrote %d floats, its dims say %s" % (model, y.size, dims))
        return y.reshape(dims), info


def inference_copy(src, dst):
    """Writes to dst a copy of the ONNX model src whose BatchNormalization nodes run in
    inference mode (the running statistics of their initializers): training_mode removed and
    only the first output kept. torch.onnx.export in training mode writes BN with batch
    statistics (opset >= 14: training_mode=1; opset 9-13: the extra running-mean/var outputs),
    which ONNX Runtime computes over each run call's batch. Returns the number of nodes changed."""
    import onnx
    m = onnx.load(src)
    changed = 0
    used = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type != "BatchNormalization":
            continue
        extra = [o for o in n.output[1:] if o]
        if any(o in used for o in extra):
            raise OrtError("%s: BN node %s's running statistics outputs are used" % (src, n.name))
        attrs = [a for a in n.attribute if a.name == "training_mode"]
        if extra or any(a.i for a in attrs):
            changed += 1
        for a in attrs:
            n.attribute.remove(a)
        del n.output[1:]
    onnx.save(m, dst)
    return changed
