#!/usr/bin/env python3
"""Makes a runnable copy of a zoo graph (tests/onnx/zoo/NAME.onnx, tests/onnx/make_zoo_models.py):
copies the graph to OUT_DIR/NAME.onnx and writes OUT_DIR/NAME.onnx.data, each external
initializer drawn from the normal distribution its doc_string records ({"mean": m, "std": s,
"min": lo, "max": hi}) and clipped to [lo, hi], float32, at the offset and length the graph gives
it.

    zoo_weights.py NAME.onnx OUT_DIR [SEED] [--draw-zeros]

--draw-zeros: an all-zero tensor of two or more dimensions (torchvision zeroes VisionTransformer's
head and class token) is drawn from N(0, 1 / its last dimension) instead, so that a comparison of
logits sees the layers before it (with a zero head every logit is its bias).
Deterministic: numpy's PCG64 generator seeded with (SEED, the initializer's index), so a tensor's
values do not depend on the others. Errors (a missing or malformed record, an offset that is not
where the previous tensor ended) name the file and the initializer and exit 1.
"""
import json
import os
import shutil
import sys

import numpy as np
import onnx


class ZooError(Exception):
    pass


def materialize(src, out_dir, seed=0, draw_zeros=False):
    """Writes out_dir/basename(src) and its data file; returns the copy's path."""
    m = onnx.load(src, load_external_data=False)
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, os.path.basename(src))
    data, end = None, 0
    try:
        for i, t in enumerate(m.graph.initializer):
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            ext = {e.key: e.value for e in t.external_data}
            where = "%s: initializer %s" % (src, t.name)
            try:
                stats = json.loads(t.doc_string)
                mean, std, lo, hi = (float(stats[k]) for k in ("mean", "std", "min", "max"))
                loc, offset, length = ext["location"], int(ext["offset"]), int(ext["length"])
            except (ValueError, KeyError) as e:
                raise ZooError("%s: no draw record or external data entry (%s)" % (where, e))
            if t.data_type != onnx.TensorProto.FLOAT or os.path.basename(loc) != loc:
                raise ZooError("%s: not float32 data in a file beside the graph" % where)
            n = int(np.prod(t.dims, dtype=np.int64))
            if offset != end or length != 4 * n:
                raise ZooError("%s: offset %d, length %d; want %d, %d" % (where, offset, length, end, 4 * n))
            if data is None:
                data = open(os.path.join(out_dir, loc), "wb")
            rng = np.random.Generator(np.random.PCG64([seed, i]))
            if draw_zeros and std == 0 and mean == 0 and len(t.dims) >= 2:
                std = float(t.dims[-1]) ** -0.5
                lo, hi = -np.inf, np.inf
            v = np.full(n, mean) if std == 0 else np.clip(mean + std * rng.standard_normal(n), lo, hi)
            data.write(v.astype("<f4").tobytes())
            end += length
    finally:
        if data is not None:
            data.close()
    shutil.copyfile(src, dst)
    return dst


def main():
    args = [a for a in sys.argv[1:] if a != "--draw-zeros"]
    if len(args) not in (2, 3):
        sys.exit("usage: zoo_weights.py NAME.onnx OUT_DIR [SEED] [--draw-zeros]")
    try:
        print(materialize(args[0], args[1], int(args[2]) if len(args) > 2 else 0, "--draw-zeros" in sys.argv))
    except (ZooError, OSError) as e:
        print("zoo_weights: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
