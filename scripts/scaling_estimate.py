#!/usr/bin/python3
"""Scaling on paper: the step time of data-parallel training on N ranks,
estimated from this machine's measured single-process figures and the communication the code
does per step (dist/dist.c, train/trainer.c, autograd/cpu_batch_norm.c, quant/quant_observer.c,
nn/exec.c). Nothing here is measured on more than one machine: it is arithmetic.

  step(N) = compute(per-rank batch) + gradient sum + SyncBN collectives + observer/loss collectives

(no overlap: one gradient sum after the backward, as with dist.bucket_mb = 0). The "overlapped"
column is the same step with the gradient sum hidden behind the backward as far as the
backward's length allows (the bound that dist.bucket_mb's gradient buckets work towards).

Prints the markdown that docs/scaling.md embeds between its "scaling_estimate.py" markers;
tests/dist/test_scaling_doc.sh checks that the two agree. Standard library only.

  /usr/bin/python3 scripts/scaling_estimate.py > /tmp/tables.md
"""
import argparse
import math
import sys

# ---- measured on this machine (2 cores) --------------------------------------------------------
# FashionCNN fp32 training, 1 process x 2 threads, batch 128, idle cores: 4,460-4,530 images/s
# (measured); the midpoint.
FASHION_IMAGES_PER_S = 4495.0
FASHION_MEASURED_BATCH = 128
# bench_profile (docs/performance.md, "Where a training step's time goes"), FashionCNN batch 128 on a busy
# machine: per-op forward and backward ms per step. Used for two ratios only: QAT / fp32 step
# time, and the backward's share of a step (how much a gradient sum could hide behind).
PROFILE_FP32_STEP_MS = 42.380
PROFILE_FP32_FWD_MS = [6.639, 2.451, 0.482, 1.516, 0.000, 1.072, 0.010]
PROFILE_FP32_BWD_MS = [20.811, 4.056, 1.001, 2.512, 0.000, 1.244, 0.004]
PROFILE_QAT_STEP_MS = 52.730  # QAT W4A4 LSQ
PROFILE_QAT_FWD_MS = [6.398, 2.427, 0.534, 2.118, 0.000, 0.879, 0.010, 1.144, 1.097, 0.002]
PROFILE_QAT_BWD_MS = [24.556, 4.079, 0.922, 2.602, 0.000, 1.261, 0.004, 2.898, 1.288, 0.001]
# FMA peak of the 2 cores (measured).
PEAK_GFLOPS = 555.0
FLOP_PER_MAC = 2          # the convention of the peak above
TRAIN_PER_FORWARD = 3.0   # training = forward + input gradients + weight gradients (assumed)

# ---- assumed network ---------------------------------------------------------------------------
# name: (bandwidth Gbit/s per rank, per-message latency us). Assumed, not measured.
NETWORKS = [("10G", 10.0, 30.0),    # TCP over 10 Gbit/s Ethernet (20-50 us typical; middle)
            ("100G", 100.0, 5.0)]   # RDMA-class 100 Gbit/s
RANKS = [1, 8, 64, 512]
# Latency steps of an MPI_Allgather of a small message: ceil(log2 N) (recursive doubling or
# Bruck, what MPI libraries use for small messages) by default; "ring" for N - 1. Assumed.
SMALL_ALLGATHER = "log2"

# ---- the code's collectives (read from the source) ---------------------------------------------
SUM_ROUND_ELEMS = 1 << 22      # dist/dist.c ROUND_ELEMS: one Alltoallv + one Allgatherv per round
# dist.h QT_DIST_SMALL_SUM_BYTES: a sum whose copies from all N ranks total at most this many
# bytes is one MPI_Allgather plus the same in-order sum on every rank (same bits, fewer latencies)
SMALL_SUM_BYTES = 64 << 10
OBSERVER_ALLGATHER_DOUBLES = 5  # quant/quant_observer.c minmax_sync: 3 + 2C doubles, C = 1 per tensor
LOSS_ALLGATHER_DOUBLES = 3      # train/trainer.c batch_totals: (loss, rows, correct)
HIST_BINS = 2048                # quant/quant.h: histogram observers also sum their bins (sum_f64)

# ---- batches -----------------------------------------------------------------------------------
WEAK_BATCH = {"fashion_cnn": 128, "resnet50": 32}      # per rank; train.batch_size = this x N
STRONG_BATCH = {"fashion_cnn": 1024, "resnet50": 2048}  # global train.batch_size, fixed


def fashion_cnn():
    """nn/models.c fashion_cnn: 28x28x1 input; conv 1->32 3x3 pad 1 (no bias) BN ReLU pool 2;
    conv 32->64 (no bias) BN ReLU pool 2; fc 3136->128 ReLU; fc 128->10."""
    convs = [(1, 32, 3, 28, 28), (32, 64, 3, 14, 14)]  # (in, out, k, out H, out W)
    fcs = [(3136, 128), (128, 10)]
    bn = [32, 64]
    return layout("FashionCNN", convs, fcs, bn, act_points=5)


def resnet50():
    """torchvision's resnet50 at 224x224: stem conv 7x7/2 64 BN ReLU, max-pool 3x3/2; stages of
    [3, 4, 6, 3] bottlenecks (1x1 w, 3x3 w (stride in the 3x3), 1x1 4w, each with BN; a 1x1
    downsample conv + BN on each stage's first block), widths 64, 128, 256, 512; global average
    pool; fc 2048->1000. Convs without bias."""
    convs, bn = [(3, 64, 7, 112, 112)], [64]
    cin, hw = 64, 56
    for i, (blocks, w) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
        for b in range(blocks):
            out_hw = hw // 2 if (b == 0 and i > 0) else hw
            convs += [(cin, w, 1, hw, hw), (w, w, 3, out_hw, out_hw), (w, 4 * w, 1, out_hw, out_hw)]
            bn += [w, w, 4 * w]
            if b == 0:
                convs.append((cin, 4 * w, 1, out_hw, out_hw))
                bn.append(4 * w)
            cin, hw = 4 * w, out_hw
    # Activation quantization points by qat/quantizer.c's rules (oneDNN description): the graph
    # input; each conv(+BN)(+ReLU) unit's output (stem 1, bottlenecks 3 x 16, downsamples 4); each
    # add+ReLU unit's output (16); the global average pool's (a quantized unit on oneDNN) and the
    # fc's: 1 + 1 + 48 + 4 + 16 + 1 + 1.
    return layout("ResNet-50-sized", convs, [(2048, 1000)], bn, act_points=72)


def layout(name, convs, fcs, bn, act_points):
    params = sum(i * o * k * k for i, o, k, _, _ in convs) + sum(i * o + o for i, o in fcs) + 2 * sum(bn)
    macs = sum(i * o * k * k * h * w for i, o, k, h, w in convs) + sum(i * o for i, o in fcs)
    # LSQ: one learned scale per activation point, per-channel weight scales (oneDNN: conv and
    # linear per channel), all in the gradient slab
    lsq = act_points + sum(o for _, o, _, _, _ in convs) + sum(o for _, o in fcs)
    return {"name": name, "params": params, "macs": macs, "bn": bn, "act_points": act_points, "lsq": lsq}


def percent(x):
    return "%.1f%%" % (100 * x) if x < 0.1 else "%.0f%%" % (100 * x)


def pos(x):
    v = float(x)
    if not v > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def options():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images-per-s", type=pos, default=FASHION_IMAGES_PER_S,
                   help="FashionCNN fp32 training images/s on one machine at batch 128 (default %(default)s)")
    p.add_argument("--peak-gflops", type=pos, default=PEAK_GFLOPS, help="machine FMA peak (default %(default)s)")
    p.add_argument("--speedup", type=pos, default=1.0,
                   help="each rank computes this many times faster than this machine (default 1)")
    p.add_argument("--lat-10g", type=pos, default=NETWORKS[0][2], help="10G per-message latency, us")
    p.add_argument("--lat-100g", type=pos, default=NETWORKS[1][2], help="100G per-message latency, us")
    p.add_argument("--small-allgather", choices=["log2", "ring"], default=SMALL_ALLGATHER,
                   help="latency steps of small all-gathers: ceil(log2 N) or N-1 (default %(default)s)")
    p.add_argument("--weak-fashion", type=int, default=WEAK_BATCH["fashion_cnn"], help="per-rank batch, FashionCNN")
    p.add_argument("--weak-resnet", type=int, default=WEAK_BATCH["resnet50"], help="per-rank batch, ResNet-50")
    p.add_argument("--strong-fashion", type=int, default=STRONG_BATCH["fashion_cnn"], help="global batch, FashionCNN")
    p.add_argument("--strong-resnet", type=int, default=STRONG_BATCH["resnet50"], help="global batch, ResNet-50")
    a = p.parse_args()
    if min(a.weak_fashion, a.weak_resnet) < 1 or min(a.strong_fashion, a.strong_resnet) < max(RANKS):
        p.error("per-rank batches must be >= 1 and global batches >= %d (every rank needs an image)" % max(RANKS))
    return a


# ---- the communication of one step -------------------------------------------------------------
class Net:
    def __init__(self, name, gbit, lat_us, small_allgather):
        self.name, self.bw, self.lat, self.small = name, gbit * 1e9 / 8, lat_us * 1e-6, small_allgather

    def fixed_sum(self, n, esize, N):
        """qt_dist_sum_f32/f64 of n elements: per round of <= 2^22, MPI_Alltoallv (reduce-scatter)
        then MPI_Allgatherv, each moving (N-1)/N of the round's bytes per rank and each charged N-1
        message latencies: Open MPI's coll/tuned fixed decision picks the pairwise alltoallv (N-1
        sequential exchanges) for 64..127 and 256..1023 processes and the linear one (N-1 messages
        posted at once: N-1 latencies is then an upper bound) for 4..63; the allgatherv is taken
        as a ring (N-1 steps). A sum whose N copies total at most SMALL_SUM_BYTES is one all-gather
        instead (dist.c sum_small)."""
        if N == 1 or n == 0:
            return 0.0, 0
        if n * esize * N <= SMALL_SUM_BYTES:
            return self.allgather(n * esize, N), 1
        t, calls = 0.0, 0
        for at in range(0, n, SUM_ROUND_ELEMS):
            b = min(SUM_ROUND_ELEMS, n - at) * esize
            t += 2 * ((N - 1) * self.lat + (N - 1) / N * b / self.bw)
            calls += 2
        return t, calls

    def allgather(self, nbytes, N):
        """MPI_Allgather of nbytes per rank: every rank receives (N-1) x nbytes."""
        if N == 1:
            return 0.0
        steps = math.ceil(math.log2(N)) if self.small == "log2" else N - 1
        return steps * self.lat + (N - 1) * nbytes / self.bw


MODES = [("fp32", "fp32"), ("qat_obs", "QAT, observers"), ("qat_lsq", "QAT, LSQ")]


def comm(m, mode, net, N):
    """(gradient sum s, SyncBN s, observers + loss s, MPI calls) of one step on N ranks."""
    grads = m["params"] + (m["lsq"] if mode == "qat_lsq" else 0)
    g, gc = net.fixed_sum(grads, 4, N)
    bn, bnc = 0.0, 0
    for C in m["bn"]:
        bn += net.allgather((1 + 2 * C) * 8, N)  # forward: count, means, centred sums of squares
        t, c = net.fixed_sum(2 * C, 8, N)        # backward: the two per-channel sums
        bn += t
        bnc += (1 if N > 1 else 0) + c
    other = net.allgather(LOSS_ALLGATHER_DOUBLES * 8, N)
    oc = 1 if N > 1 else 0
    if mode == "qat_obs":  # moving-average / min-max: every step; LSQ: the first step only
        other += m["act_points"] * net.allgather(OBSERVER_ALLGATHER_DOUBLES * 8, N)
        oc += m["act_points"] if N > 1 else 0
    return g, bn, other, gc + bnc + oc


def main():
    a = options()
    fc, rn = fashion_cnn(), resnet50()
    nets = [Net("10G", NETWORKS[0][1], a.lat_10g, a.small_allgather),
            Net("100G", NETWORKS[1][1], a.lat_100g, a.small_allgather)]
    # compute: FashionCNN from its measured rate; ResNet-50 from FLOPs at the same efficiency
    flop_img = {id(m): TRAIN_PER_FORWARD * FLOP_PER_MAC * m["macs"] for m in (fc, rn)}
    eff = a.images_per_s * flop_img[id(fc)] / (a.peak_gflops * 1e9)
    sec_img = {id(fc): 1.0 / a.images_per_s / a.speedup,
               id(rn): flop_img[id(rn)] / (eff * a.peak_gflops * 1e9) / a.speedup}
    qat = PROFILE_QAT_STEP_MS / PROFILE_FP32_STEP_MS
    bwd = {"fp32": sum(PROFILE_FP32_BWD_MS) / PROFILE_FP32_STEP_MS,
           "qat": sum(PROFILE_QAT_BWD_MS) / PROFILE_QAT_STEP_MS}

    def compute(m, mode, images):
        t = images * sec_img[id(m)] * (1.0 if mode == "fp32" else qat)
        return t, t * (bwd["fp32"] if mode == "fp32" else bwd["qat"])

    out = []
    w = out.append
    w("Generated by `/usr/bin/python3 scripts/scaling_estimate.py%s`; do not edit by hand "
      "(`tests/dist/test_scaling_doc.sh` compares)." % "".join(" " + x for x in sys.argv[1:]))
    w("")
    w("**Inputs.** FashionCNN fp32: %.0f images/s at batch %d on this machine (measured), %.1f MFLOP per "
      "training image (%s multiply-adds forward x %d x %g), so %.1f%% of the %.0f GFLOP/s peak. "
      "ResNet-50-sized: %.2f G multiply-adds forward at 224x224, %.1f GFLOP per training image, run at "
      "the same %.1f%% (extrapolated: %.0f ms per image). QAT / fp32 compute %.3f (bench_profile %.1f / %.1f "
      "ms); backward share of a step %.3f fp32, %.3f QAT (bench_profile, also used for ResNet-50). "
      "Networks (assumed): %s; small all-gathers take %s latency steps."
      % (a.images_per_s, FASHION_MEASURED_BATCH, flop_img[id(fc)] / 1e6, "{:,}".format(fc["macs"]), FLOP_PER_MAC,
         TRAIN_PER_FORWARD, 100 * eff, a.peak_gflops, rn["macs"] / 1e9, flop_img[id(rn)] / 1e9, 100 * eff,
         1e3 * sec_img[id(rn)] * a.speedup, qat, PROFILE_QAT_STEP_MS, PROFILE_FP32_STEP_MS, bwd["fp32"],
         bwd["qat"], ", ".join("%s = %g Gbit/s with %g us per message" % (n.name, n.bw * 8 / 1e9, n.lat * 1e6)
                                for n in nets),
         "ceil(log2 N)" if a.small_allgather == "log2" else "N - 1"))
    w("")

    # the inventory
    w("**Per-step communication (N > 1), from the code.** Calls are MPI collectives; bytes are the "
      "payload per rank per call. A fixed-order sum (`qt_dist_sum_*`) is 2 calls per round of 2^22 "
      "elements and moves 2(N-1)/N of its payload per rank; an all-gather delivers (N-1) x its payload "
      "to every rank.")
    w("")
    w("| model | what | when | calls per step | payload per rank |")
    w("|---|---|---|---:|---|")
    for m in (fc, rn):
        rounds = -(-m["params"] // SUM_ROUND_ELEMS)
        L, C = len(m["bn"]), sum(m["bn"])
        w("| %s | gradient sum (`qt_dist_sum_f32`, %s parameters) | after backward, every step | %d | %s B "
          "(QAT LSQ: + %s scales) |" % (m["name"], "{:,}".format(m["params"]), 2 * rounds,
                                         "{:,}".format(4 * m["params"]), "{:,}".format(m["lsq"])))
        w("| %s | SyncBN forward (`MPI_Allgather`, %d BN layers, %s channels) | forward, training-mode BN | %d | "
          "(1 + 2C) x 8 B per layer: %s B in all |" % (m["name"], L, "{:,}".format(C), L, "{:,}".format(8 * (L + 2 * C))))
        w("| %s | SyncBN backward (`qt_dist_sum_f64` of 2C) | backward, training-mode BN | %d | 16C B per layer: "
          "%s B in all |" % (m["name"], 2 * L, "{:,}".format(16 * C)))
        w("| %s | observers (`MPI_Allgather`, %d activation points) | forward, QAT with observers on | %d | "
          "%d B each (histogram: + 2 calls, %s B) |" % (m["name"], m["act_points"], m["act_points"],
                                                     8 * OBSERVER_ALLGATHER_DOUBLES, "{:,}".format(8 * HIST_BINS)))
        w("| %s | loss, rows, correct (`MPI_Allgather`) | after forward, every step | 1 | %d B |"
          % (m["name"], 8 * LOSS_ALLGATHER_DOUBLES))
    w("")

    def row(m, mode, label, net, N, images, base_step, strong):
        c, cb = compute(m, mode, images)
        g, bn, o, calls = comm(m, mode, net, N) if net else (0.0, 0.0, 0.0, 0)
        step = c + g + bn + o
        over = c + max(0.0, g - cb) + bn + o
        glob = images * N
        effc = base_step / step if not strong else base_step / (N * step)
        return ("| %d | %s | %s | %s | %.1f | %.1f (%.1f / %.1f / %.1f) | %d | %.1f | %s | %s |"
                % (N, net.name if net else "-", label, "{:,.0f}".format(glob), 1e3 * step, 1e3 * (g + bn + o),
                   1e3 * g, 1e3 * bn, 1e3 * o, calls, 1e3 * over, percent(effc), "{:,.0f}".format(glob / step)))

    head = ("| N | network | mode | global batch | step ms | comm ms (grad / SyncBN / obs+loss) | MPI calls | "
            "overlapped step ms | efficiency | images/s |")
    sep = "|---:|---|---|---:|---:|---|---:|---:|---:|---:|"
    for m, per in ((fc, a.weak_fashion), (rn, a.weak_resnet)):
        w("**%s, weak scaling**: %d images per rank, `train.batch_size` = %d x N; efficiency = step(1) / step(N)."
          % (m["name"], per, per))
        w("")
        w(head)
        w(sep)
        for mode, label in MODES:
            base = compute(m, mode, per)[0]
            w(row(m, mode, label, None, 1, per, base, False))
            for N in RANKS[1:]:
                for net in nets:
                    w(row(m, mode, label, net, N, per, base, False))
        w("")
    for m, glob in ((fc, a.strong_fashion), (rn, a.strong_resnet)):
        w("**%s, strong scaling**: `train.batch_size` = %d fixed, %d / N images per rank; "
          "efficiency = step(1) / (N x step(N))." % (m["name"], glob, glob))
        w("")
        w(head)
        w(sep)
        for mode, label in (MODES[0], MODES[2]):
            base = compute(m, mode, glob)[0]
            w(row(m, mode, label, None, 1, glob, base, True))
            for N in RANKS[1:]:
                for net in nets:
                    w(row(m, mode, label, net, N, glob / N, base, True))
        w("")

    # where communication equals compute: the per-rank speed-up at which comm = compute
    w("**Break-even**: how many times faster than this machine a rank must compute for the step's "
      "communication to equal its compute (weak scaling, no overlap; larger = communication matters less).")
    w("")
    w("| model | mode | network | N = 8 | N = 64 | N = 512 |")
    w("|---|---|---|---:|---:|---:|")
    for m, per in ((fc, a.weak_fashion), (rn, a.weak_resnet)):
        for mode, label in MODES:
            for net in nets:
                cells = []
                for N in RANKS[1:]:
                    c = compute(m, mode, per)[0]
                    t = sum(comm(m, mode, net, N)[:3])
                    cells.append("%.1f" % (c / t))
                w("| %s | %s | %s | %s |" % (m["name"], label, net.name, " | ".join(cells)))
    print("\n".join(out).rstrip("\n"))


if __name__ == "__main__":
    main()
