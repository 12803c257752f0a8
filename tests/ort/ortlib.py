"""ONNX Runtime as a test client, from Python: runs models in the onnxruntime wheel of the test
environment (.venv, made by scripts/setup.sh from tests/requirements.txt) on numpy arrays.

    import sys; sys.path.insert(0, "tests/ort"); import ortlib
    y, info = ortlib.run("model.onnx", x_nhwc, layout="NHWC", opt="disabled")

Run it with the environment's interpreter (.venv/bin/python; CTest's ORT tests do). Errors raise
OrtError with the runner's message (tests/ort/ort_run.py, in process).
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ort_run  # noqa: E402


class OrtError(Exception):
    pass


def run(model, x, layout="NCHW", opt="all", x64quantprecision=False, threads=2, batch=256,
        spinning=False, warmup=False, optimized_model=None):
    """Runs `model` on x (N,C,H,W float32, or N,H,W,C with layout="NHWC": transposed to NCHW
    here) and returns (the first output as a float32 array of the dims the runner reports,
    the runner's info dict). Spinning is off by default (tests share cores). optimized_model:
    where ORT writes the graph it runs after its optimizations."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 4:
        raise OrtError("input must be 4-D (N,C,H,W or N,H,W,C), got shape %s" % (x.shape,))
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    elif layout != "NCHW":
        raise OrtError("layout must be NCHW or NHWC, not %r" % layout)
    try:
        return ort_run.run_arrays(str(model), np.ascontiguousarray(x), opt=opt, x64quantprecision=x64quantprecision,
                                  threads=threads, batch=batch, spinning=spinning, warmup=warmup,
                                  optimized_model=optimized_model)
    except ort_run.RunError as e:
        raise OrtError("ONNX Runtime on %s: %s" % (model, e))
    except ImportError as e:
        raise OrtError("%s: run with the test environment's python (.venv/bin/python, made by scripts/setup.sh)" % e)


def inference_copy(src, dst):
    """Writes to dst a copy of the ONNX model src whose BatchNormalization nodes run in
    inference mode (the running statistics of their initializers): training_mode removed and
    only the first output kept. torch.onnx.export in training mode writes BN with batch
    statistics (opset >= 14: training_mode=1; opset 9-13: the extra running-mean/var outputs),
    which ONNX Runtime computes over each run call's batch. Dropout nodes lose their
    training_mode input (torch 2.x writes True for a model exported in train mode, and ONNX
    Runtime then drops at random): identities, as the importer reads them. Returns the number of
    BN nodes changed."""
    import onnx
    m = onnx.load(src)
    changed = 0
    used = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
            n.input[2] = ""
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
