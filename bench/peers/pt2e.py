"""PT2E quantization (torchao.quantization.pt2e) of our models against this framework's PTQ and
QAT, from the same fp32 checkpoints, with the grid's recipes.

    bench/peers/.venv/bin/python bench/peers/pt2e.py                      # the full set
    bench/peers/.venv/bin/python bench/peers/pt2e.py --models fashion_cnn --seeds 0 \
        --train-limit 2000 --test-limit 1000 --fp32-epochs 1 --qat-epochs 1   # a smoke run

For every model and seed, the fp32 checkpoint is trained by build/bin/qat_train with the grid's
fp32 recipe (experiments/grid.py's command, into WORK/ours/<model>/seed<S>/fp32/; reused when
its argv is unchanged) and loaded into the PyTorch twin (models.py). Then, per quantizer:
  XNNPACKQuantizer (executorch.backends.xnnpack.quantizer.xnnpack_quantizer; per-channel
      symmetric weights [-127, 127], int8 activations [-128, 127] with a zero point)
  X86InductorQuantizer (torchao.quantization.pt2e.quantizer.x86_inductor_quantizer; per-channel
      symmetric weights [-128, 127], uint8 activations [0, 255])
each with its own default observers (PTQ: HistogramObserver activations, min-max weights; QAT:
FusedMovingAvgObsFakeQuantize, moving-average min-max, straight-through estimator), and fewer
bits by narrowing the QuantizationSpec's quant_min/quant_max in the quantizer's own convention
(4-bit: XNNPACK weights [-7, 7], activations [-8, 7]; X86 weights [-8, 7], activations [0, 15]).
Note that HistogramObserver's range search assumes 256 levels whatever quant_min/quant_max say.
  PTQ (--ptq-bits, default w8a8,w4a8): torch.export.export (dynamic batch) of the eval model,
      prepare_pt2e, calibration on the grid's [ptq] number of training batches (32 of 128,
      seeded shuffle), convert_pt2e.
  QAT (--qat-bits, default w8a8,w4a8,w4a4): export of the train-mode model, prepare_qat_pt2e,
      then the grid's [qat] schedule: its epochs, optimizer, lr, per-step schedule, weight decay
      and batch size (every batch, the last partial one too), BN statistics frozen after the
      grid's quant.freeze_bn_after epochs (each aten.batch_norm node set to training=False: BN
      then normalizes with its running statistics and stops updating them), then
      move_exported_model_to_eval and convert_pt2e.
The accuracy is the converted model's (quantize/dequantize ops around fp32 kernels: the
reference of what an int8 backend computes) on the test images. The QAT cost is the mean QAT
epoch time divided by the time of one fp32 training epoch of the eager twin with the same
recipe, data and threads (timed in the same process just before).
Ours (--ours, default on): qat_train's grid rows [ptq] and [qat] for the same bits from the same
checkpoint: the Q/DQ graph and int8 device accuracies, and its QAT epoch time divided by its fp32
run's epoch time. Budget options (--train-limit, --test-limit, --fp32-epochs, --qat-epochs) go
to both sides alike.
"""
import argparse
import copy
import logging
import os
import sys
import time

logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import models  # noqa: E402

QUANTIZERS = {"xnnpack": "XNNPACKQuantizer", "x86": "X86InductorQuantizer"}


def split(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_bits(tag):
    return common.gridlib.parse_bits(tag)


def narrowed(spec, bits):
    """A QuantizationSpec with `bits` bits in the spec's own convention: signed specs keep their
    symmetric-narrow ([-127, 127]) or full ([-128, 127]) form, unsigned ones start at 0."""
    import dataclasses
    if spec is None or bits == 8:
        return spec
    if spec.quant_min < 0:
        hi = (1 << (bits - 1)) - 1
        lo = -hi if spec.quant_min == -spec.quant_max else -hi - 1
    else:
        lo, hi = 0, (1 << bits) - 1
    return dataclasses.replace(spec, quant_min=lo, quant_max=hi)


def make_quantizer(kind, bits, is_qat):
    """(quantizer, its QuantizationConfig) for 'xnnpack' or 'x86' at wXaY."""
    w, a = parse_bits(bits)
    if kind == "xnnpack":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer, get_symmetric_quantization_config)
        base, q = get_symmetric_quantization_config(is_per_channel=True, is_qat=is_qat), XNNPACKQuantizer()
    elif kind == "x86":
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        base, q = get_default_x86_inductor_quantization_config(is_qat=is_qat), X86InductorQuantizer()
    else:
        raise ValueError("quantizer %r (known: %s)" % (kind, ", ".join(QUANTIZERS)))
    cfg = type(base)(narrowed(base.input_activation, a), narrowed(base.output_activation, a),
                     narrowed(base.weight, w), base.bias, base.is_qat)
    q.set_global(cfg)
    return q, cfg


def export(model, example):
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    return torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}}).module()


def set_bn_training(gm, training):
    """Sets the `training` argument of every aten.batch_norm node of an exported graph."""
    n_bn = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (torch.ops.aten.batch_norm.default,
                                                    torch.ops.aten._native_batch_norm_legit.default):
            args = list(n.args)
            args[5] = training
            n.args = tuple(args)
            n_bn += 1
    gm.recompile()
    return n_bn


def calibration_batches(x, y, rec, seed, n_batches):
    gen = torch.Generator().manual_seed(seed)
    out = []
    # whole batches only (ONNX Runtime's histogram calibrators need one shape)
    for xb, _ in models.batches(x, y, int(rec["batch_size"]), shuffle=True, generator=gen, drop_last=True):
        if len(out) >= n_batches:
            break
        out.append(xb)
    return out


def train_epochs(model, x, y, rec, seed, epochs, exported=False, freeze_bn_after=0.0):
    """The recipe's loop over `epochs` epochs; returns the seconds of each epoch (the training
    steps only)."""
    opt = common.make_optimizer(model.parameters(), rec)
    bs = int(rec["batch_size"])
    spe = (x.shape[0] + bs - 1) // bs
    total = spe * int(rec["epochs"])
    gen = torch.Generator().manual_seed(seed)
    freeze_step = int(round(freeze_bn_after * spe)) if freeze_bn_after else None
    if not exported:
        model.train()
    step, times = 0, []
    for _ in range(epochs):
        t = time.perf_counter()
        for xb, yb in models.batches(x, y, bs, shuffle=True, generator=gen):
            if freeze_step is not None and step == freeze_step:
                set_bn_training(model, False)
            for pg in opt.param_groups:
                pg["lr"] = common.lr_at(rec, step, total, spe)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            step += 1
        times.append(time.perf_counter() - t)
    return times


def run_ptq(fp32_model, kind, bits, calib, x_test, y_test):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    q, _ = make_quantizer(kind, bits, is_qat=False)
    t = time.perf_counter()
    prepared = prepare_pt2e(export(copy.deepcopy(fp32_model).eval(), calib[0]), q)
    with torch.no_grad():
        for xb in calib:
            prepared(xb)
    converted = convert_pt2e(prepared)
    seconds = time.perf_counter() - t
    return models.accuracy(converted, x_test, y_test), seconds


def run_qat(fp32_model, kind, bits, rec, seed, x_train, y_train, x_test, y_test):
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    q, _ = make_quantizer(kind, bits, is_qat=True)
    torch.manual_seed(seed)
    m = copy.deepcopy(fp32_model).train()
    prepared = prepare_qat_pt2e(export(m, x_train[:int(rec["batch_size"])]), q)
    times = train_epochs(prepared, x_train, y_train, rec, seed, int(rec["epochs"]), exported=True,
                         freeze_bn_after=float(rec.get("freeze_bn_after") or 0))
    move_exported_model_to_eval(prepared)
    converted = convert_pt2e(prepared)
    return models.accuracy(converted, x_test, y_test), times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="fashion_cnn,res_cnn,mobilenet_onnx")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quantizers", default="xnnpack,x86")
    ap.add_argument("--ptq-bits", default="w8a8,w4a8")
    ap.add_argument("--qat-bits", default="w8a8,w4a8,w4a4")
    ap.add_argument("--fp32-epochs", type=int, default=0, help="epochs of the fp32 checkpoints (0 = the grid's)")
    ap.add_argument("--qat-epochs", type=int, default=0, help="QAT epochs, both sides (0 = the grid's)")
    ap.add_argument("--train-limit", type=int, default=0, help="first N training images (0 = all)")
    ap.add_argument("--test-limit", type=int, default=0, help="first N test images (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-ours", dest="ours", action="store_false", help="skip qat_train's PTQ/QAT rows")
    ap.add_argument("--work", default=common.DEFAULT_WORK)
    ap.add_argument("--build", default=os.path.join(common.ROOT, "build"))
    ap.add_argument("--out", default=None, help="result JSON (default WORK/pt2e.json)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out_path = a.out or os.path.join(a.work, "pt2e.json")
    budget = common.budget_overrides(a.train_limit, a.test_limit)
    fp32_extra = budget + (["train.epochs=%d" % a.fp32_epochs] if a.fp32_epochs else [])
    qat_extra = budget + (["train.epochs=%d" % a.qat_epochs] if a.qat_epochs else [])
    result = {"script": "pt2e.py", "argv": sys.argv, "versions": common.versions(), "rows": [], "recipes": {},
              "options": vars(a), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    rows = result["rows"]
    x_train, y_train = models.load_fashion("train", a.train_limit)
    x_test, y_test = models.load_fashion("t10k", a.test_limit)

    def save():
        common.write_json(out_path, result)

    for model_name in split(a.models):
        ptq_rec, qat_rec = common.recipe(model_name, "ptq"), common.recipe(model_name, "qat")
        fp32_rec = common.recipe(model_name, "fp32")
        if a.qat_epochs:
            qat_rec["epochs"] = a.qat_epochs
        result["recipes"][model_name] = {"fp32": fp32_rec, "ptq": ptq_rec, "qat": qat_rec}
        for seed in [int(s) for s in split(a.seeds)]:
            print("%s seed %d" % (model_name, seed), flush=True)
            base = {"model": model_name, "seed": seed}
            try:
                ckpt, fp32_summary = common.fp32_checkpoint(model_name, seed, a.work, a.build, a.threads,
                                                            fp32_extra)
                fp32_model = models.load_model(model_name, ckpt)
                fp32_acc = models.accuracy(fp32_model, x_test, y_test)
            except Exception as e:  # noqa: BLE001 (recorded; the next (model, seed) goes on)
                msg, tb = common.error_text(e)
                rows.append(dict(base, framework="setup", error=msg, traceback=tb))
                print("  fp32 checkpoint FAILED: %s" % msg, flush=True)
                save()
                continue
            ours_fp32_acc = common.stage(fp32_summary, "fp32")
            print("  fp32: ours %.4f, PyTorch twin %.4f" % (ours_fp32_acc or float("nan"), fp32_acc), flush=True)
            # one eager fp32 epoch with the QAT recipe, after a few warm-up steps on another copy:
            # the denominator of PT2E's QAT cost
            fp32_epoch_s = None
            if split(a.quantizers):  # (no PT2E row, no denominator needed)
                try:
                    warm = dict(qat_rec, epochs=1)
                    train_epochs(copy.deepcopy(fp32_model), x_train[:3 * int(warm["batch_size"])],
                                 y_train[:3 * int(warm["batch_size"])], warm, seed, 1)
                    fp32_epoch_s = train_epochs(copy.deepcopy(fp32_model), x_train, y_train, qat_rec, seed, 1)[0]
                except Exception as e:  # noqa: BLE001
                    print("  fp32 epoch timing FAILED: %s" % common.error_text(e)[0], flush=True)
            calib = calibration_batches(x_train, y_train, ptq_rec, seed, int(ptq_rec["calibration_batches"]))
            for kind in split(a.quantizers):
                fw = {"framework": "torchao %s PT2E" % common.versions(("torchao",))["torchao"],
                      "quantizer": QUANTIZERS.get(kind, kind)}
                for bits in split(a.ptq_bits):
                    row = dict(base, method="ptq", bits=bits, fp32_accuracy=fp32_acc, **fw)
                    try:
                        row["accuracy"], row["seconds"] = run_ptq(fp32_model, kind, bits, calib, x_test, y_test)
                    except Exception as e:  # noqa: BLE001
                        row["error"], row["traceback"] = common.error_text(e)
                    rows.append(row)
                    print("  %s PTQ %s: %s" % (kind, bits, row.get("error") or "%.4f" % row["accuracy"]), flush=True)
                    save()
                for bits in split(a.qat_bits):
                    row = dict(base, method="qat", bits=bits, fp32_accuracy=fp32_acc, fp32_epoch_s=fp32_epoch_s, **fw)
                    try:
                        row["accuracy"], row["epoch_s"] = run_qat(fp32_model, kind, bits, qat_rec, seed, x_train,
                                                                  y_train, x_test, y_test)
                        if fp32_epoch_s:
                            row["epoch_ratio"] = (sum(row["epoch_s"]) / len(row["epoch_s"])) / fp32_epoch_s
                    except Exception as e:  # noqa: BLE001
                        row["error"], row["traceback"] = common.error_text(e)
                    rows.append(row)
                    print("  %s QAT %s: %s" % (kind, bits, row.get("error") or "%.4f, epoch x%.2f of fp32" % (
                        row["accuracy"], row.get("epoch_ratio") or float("nan"))), flush=True)
                    save()
            if not a.ours:
                continue
            fw = {"framework": "this framework (qat_train)", "quantizer": "onednn"}
            fp32_eps = common.epoch_seconds(fp32_summary)
            for method, bit_list, extra in (("ptq", split(a.ptq_bits), budget), ("qat", split(a.qat_bits), qat_extra)):
                for bits in bit_list:
                    row = dict(base, method=method, bits=bits, fp32_accuracy=ours_fp32_acc, **fw)
                    try:
                        d, s = common.run_ours(model_name, seed, method, bits, a.work, a.build, a.threads,
                                               extra, log=lambda m: print(m, flush=True))
                        row["accuracy"], row["int8_accuracy"] = common.stage(s, "qdq"), common.stage(s, "int8")
                        row["run_dir"] = d
                        eps = common.epoch_seconds(s)
                        if method == "qat" and eps and fp32_eps:
                            row["epoch_s"], row["fp32_epoch_s"] = eps, sum(fp32_eps) / len(fp32_eps)
                            row["epoch_ratio"] = (sum(eps) / len(eps)) / row["fp32_epoch_s"]
                    except Exception as e:  # noqa: BLE001
                        row["error"], row["traceback"] = common.error_text(e)
                    rows.append(row)
                    print("  ours %s %s: %s" % (method, bits, row.get("error") or "Q/DQ %.4f int8 %.4f%s" % (
                        row["accuracy"] or float("nan"), row["int8_accuracy"] or float("nan"),
                        ", epoch x%.2f of fp32" % row["epoch_ratio"] if row.get("epoch_ratio") else "")), flush=True)
                    save()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    print("wrote %s" % out_path)


if __name__ == "__main__":
    main()
