#!/bin/bash
# bench_profile's output has the structure its readers rely on, for an fp32 and a QAT (LSQ) run
# of a few steps on a small batch: every op kind of FashionCNN (and of its QAT graph) has a row,
# with the calls the model makes per step (so a profiler that records nothing fails), the rows
# (ops forward and backward, data, zero_grad, optimizer, other) add up to the step total within
# the table's rounding, the measured parts never exceed the step (nothing counted twice),
# images/s > 0, and --json writes valid JSON with the same figures; the arithmetic per training
# image is FashionCNN's, counted by hand, and the FMA peak was measured. Timing values are not
# judged.
# Usage: test_bench_profile.sh path/to/bench_profile SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
STEPS=3
common=(data.train_limit=256 train.batch_size=32 train.threads=2 --steps $STEPS --warmup 1)
fail=0
run() { # name config overrides...
  local name="$1" cfg="$2"
  shift 2
  if ! "$BIN" "$cfg" "$@" "${common[@]}" --json "$T/$name.json" > "$T/$name.txt" 2> "$T/$name.err"; then
    echo "bench_profile $name failed:"; cat "$T/$name.txt" "$T/$name.err"; exit 1
  fi
}
run fp32 "$SRC/experiments/fashion_cnn_fp32.ini"
# QAT W4A4 LSQ from the initialization (no fp32 checkpoint needed)
run qat "$SRC/experiments/fashion_cnn_qat_w4a4.ini" quant.fp32_checkpoint=
for name in fp32 qat; do
  /usr/bin/python3 - "$T/$name.txt" "$T/$name.json" "$name" "$STEPS" <<'PY' || { fail=1; cat "$T/$name.txt"; }
import json, re, sys
txt, js, name, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
errors = []
def check(ok, msg):
    if not ok: errors.append(msg)
# FashionCNN per step, fp32: conv1 with its BN, ReLU and max pool as one op
# (qt_conv1_bn_relu_max_pool2d), conv2 and its BN, ReLU and max pool as another
# (qt_batch_norm_relu_max_pool2d), fc1's ReLU, flatten, 2 linear, the loss
calls = {"conv2d": 1, "conv1_bn_relu_max_pool2d": 1, "bn_relu_max_pool2d": 1, "relu": 1, "flatten": 1, "linear": 2,
         "cross_entropy": 1}
if name == "qat":  # conv_bn: the BN scale factor and W * sf; conv1 / sf with the image's LSQ,
    # BN, ReLU, the activations' LSQ and the max pool as one op; conv2 / sf inside its batch norm,
    # fused with its ReLU, the LSQ fake quant after it and the max pool; LSQ on 4 weights and
    # fc1's activations
    calls.update({"bn_scale_factor": 2, "channel_scale": 2})
phases = ["data", "zero_grad", "optimizer"]
try:
    j = json.load(open(js))
except Exception as e:
    print("%s: not valid JSON: %s" % (js, e)); sys.exit(1)
lines = open(txt).read().splitlines()
rows = {}
for l in lines:
    m = re.match(r"^(\w+(?: total)?)\s+(\S+)\s+(-?\d+\.\d+)\s+(\S+)\s+(-?\d+\.\d+)$", l)
    if m: rows[m.group(1)] = m.groups()[1:]
total = [l for l in lines if l.startswith("step total:")]
check(len(total) == 1, "no 'step total:' line")
step_ms, ips = (float(x) for x in re.match(r"step total: (\S+) ms/step, (\S+) images/s", total[0]).groups()) if total else (0, 0)
check(ips > 0, "images/s %g not > 0" % ips)
check(re.search(r", \d+ threads, oneDNN ISA \S+", lines[0]) is not None, "header lacks threads / ISA: %r" % lines[0])
kern = [l for l in lines if l.startswith("oneDNN kernels: ")]
check(len(kern) == 1 and "convolution forward_training: " in kern[0], "no 'oneDNN kernels:' line naming the conv: %r" % kern)
check("convolution forward_training: " in j.get("onednn_kernels", ""), "json: onednn_kernels %r" % j.get("onednn_kernels"))
expect = list(calls) + (["fake_quant_lsq"] if name == "qat" else []) + phases + ["other"]
for k in expect:
    check(k in rows, "no row for %s" % k)
for gone in ("batch_norm", "max_pool2d", "lsq_max_pool2d"):  # run inside the fused ops
    check(gone not in rows, "a row for %s (it runs inside a fused op)" % gone)
check("conv2d_lsq_input" not in rows, "a row for conv2d_lsq_input (the image's LSQ runs inside conv1's fused op)")
# the rows add up to the step total (each printed to 0.001 ms)
parts = 0.0
n_vals = 0
for k, (c, f, b, share) in rows.items():
    if k == "ops total": continue
    parts += float(f) + (float(b) if b != "-" else 0.0)
    n_vals += 1 if b == "-" else 2
check(abs(parts - step_ms) <= 0.0005 * (n_vals + 1) + 1e-9,
      "rows sum to %.4f ms, step total %.3f ms" % (parts, step_ms))
# the JSON: the same model, calls per step, and parts within the step
ops = {o["kind"]: o for o in j["ops"]}
ph = {p["name"]: p for p in j["phases"]}
check(j["steps"] == steps, "json steps %r" % j["steps"])
for k, n in calls.items():
    o = ops.get(k)
    if not o:
        check(False, "json: no op %s" % k); continue
    check(o["forward_calls"] == n * steps, "%s: %d forward calls, want %d" % (k, o["forward_calls"], n * steps))
    check(o["backward_calls"] == n * steps, "%s: %d backward calls, want %d" % (k, o["backward_calls"], n * steps))
if name == "qat":
    lsq = ops.get("fake_quant_lsq", {"forward_calls": 0})["forward_calls"]
    check(lsq >= 4 * steps and lsq % steps == 0, "fake_quant_lsq: %d calls over %d steps" % (lsq, steps))
    check("fake_quant_lsq" in rows, "no fake_quant_lsq row")
check(ops.get("conv2d", {}).get("forward_ms", 0) > 0 and ops.get("conv2d", {}).get("backward_ms", 0) > 0,
      "conv2d has no forward or backward time")
for p in phases:
    check(ph.get(p, {}).get("calls") == steps, "phase %s: %r calls, want %d" % (p, ph.get(p, {}).get("calls"), steps))
measured = sum(o["forward_ms"] + o["backward_ms"] for o in j["ops"]) + sum(p["ms"] for p in j["phases"] if p["name"] != "other")
check(measured <= j["step_ms"] * (1 + 1e-9) + 1e-9, "ops and phases (%.6f ms) exceed the step (%.6f ms)" % (measured, j["step_ms"]))
check(abs(measured + ph["other"]["ms"] - j["step_ms"]) <= 1e-5, "json parts + other != step_ms")
share = sum(o["share"] for o in j["ops"]) + sum(p["share"] for p in j["phases"])
check(abs(share - 1) < 1e-4, "shares sum to %g" % share)
check(j["images_per_s"] > 0 and j["images"] == steps * 32, "json images %r, images/s %r" % (j["images"], j["images_per_s"]))
check(abs(j["step_ms"] - step_ms) <= 0.0005 + 1e-9, "json step_ms %r vs table %r" % (j["step_ms"], step_ms))
# arithmetic per training image, counted by hand for FashionCNN (fp32 and QAT alike): multiply-adds
# conv1 28*28*32*1*9 (forward, weight gradient: the image needs no gradient), conv2 14*14*64*32*9,
# fc1 3136*128, fc2 128*10 (forward, weight and input gradients), times 2 FLOP
mflop = 2 * (2 * 28 * 28 * 32 * 9 + 3 * (14 * 14 * 64 * 32 * 9 + 3136 * 128 + 128 * 10)) / 1e6
check(abs(j.get("mflop_per_image", 0) - mflop) < 1e-6, "json mflop_per_image %r, want %r" % (j.get("mflop_per_image"), mflop))
check(abs(j.get("gflops", 0) - mflop * j["images_per_s"] / 1e3) <= 1e-3 + 1e-6 * j.get("gflops", 0),
      "json gflops %r is not mflop_per_image x images/s" % j.get("gflops"))
# the machine's peak, measured in the run (every x86-64 machine this runs on has FMA; 512-bit only
# with AVX-512) and the share of it the steps reached
check(j.get("fma_peak_gflops_256", 0) > 0 and j.get("fma_peak_gflops_512", -1) >= 0, "json FMA peaks %r / %r"
      % (j.get("fma_peak_gflops_256"), j.get("fma_peak_gflops_512")))
ref = j.get("fma_peak_gflops_512") if j["onednn_isa"].startswith("avx512") else j.get("fma_peak_gflops_256")
check(ref and abs(j.get("peak_share", 0) - j.get("gflops", 0) / ref) < 1e-3 * j.get("peak_share", 0) + 1e-6,
      "json peak_share %r" % j.get("peak_share"))
check(any(l.startswith("arithmetic: %.2f MFLOP per training image" % mflop) for l in lines), "no 'arithmetic:' line")
check(any(l.startswith("FMA peak measured after the steps") for l in lines), "no 'FMA peak' line")
if errors:
    print("%s: %s" % (name, "; ".join(errors))); sys.exit(1)
PY
done
# train.conv_algorithm: conv2 (3x3, stride 1) runs oneDNN's Winograd kernels by default where
# oneDNN has them (ISA avx512*), never with direct
run direct "$SRC/experiments/fashion_cnn_fp32.ini" train.conv_algorithm=direct
/usr/bin/python3 - "$T/fp32.json" "$T/qat.json" "$T/direct.json" <<'PY' || fail=1
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:]]
for name, j, want in zip(("fp32", "qat", "direct"), runs, (True, True, False)):
    if not j["onednn_isa"].startswith("avx512"): want = False
    got = "jit_wino" in j["onednn_kernels"]
    if got != want:
        print("%s (ISA %s): Winograd %s, want %s: %s" % (name, j["onednn_isa"], got, want, j["onednn_kernels"]))
        sys.exit(1)
PY
# bad arguments: exit 2 with a message
"$BIN" "$SRC/experiments/fashion_cnn_fp32.ini" --steps 0 > /dev/null 2> "$T/bad.err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q -- "--steps wants an integer" "$T/bad.err"; then
  echo "--steps 0: exit $rc, stderr:"; cat "$T/bad.err"; fail=1
fi
exit $fail
