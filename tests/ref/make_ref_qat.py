#!/usr/bin/python3
"""Writes tests/ref/qat.h5: PyTorch 1.13 (Debian python3-torch) references for the QAT part of
the framework, checked by tests/qat/test_qat_torch.c. Conventions as make_ref_fashion_cnn.py:
activations NHWC, weights OIHW, the FashionCNN flattens in NHWC order.

unit/<case>/...   A conv -> BN -> ReLU unit (x (4, 6, 6, 3) NHWC, conv 3 -> 8, 3x3, pad 1)
    prepared by prepare_qat_fx (ConvBnReLU2d, weight FakeQuantize with
    MovingAveragePerChannelMinMaxObserver, qint8 per_channel_symmetric, [-8, 7] or [-128, 127]).
    The input and output activation FakeQuantize keep observing but have fake quant disabled
    (the C test does the same), so the unit's output is continuous in the conv result and the
    comparison can be tight. Loss: cross-entropy of the spatial mean of the unit output (8
    classes). One forward + backward, no optimizer step.
      init/{conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var}
      x, labels (int32), meta (int32 [bias, qmin, qmax, mode]) mode 0 train (batch stats),
      1 eval (running stats, observers disabled), 2 train with BN frozen (freeze_bn_stats)
      y (unit output, NHWC), loss (1), dx (NHWC), grad/{conv.weight, conv.bias, bn.weight,
      bn.bias}, after/{bn.running_mean, bn.running_var}, wscale (weight fake-quant scale)
    Cases: w4_train (no bias), w8b_train (bias, full 8-bit range: has_vnni), w8b_eval (the
    w8b module after its train step, second batch, model.eval() + disable_observer),
    w4b_frozen (bias, BN frozen while training). For w4_train and w8b_train also the convert,
    after disable_observer (see unit_convert: with observers on, PyTorch re-observes the folded
    weight and its scales move by ~1e-3 relative):
      convert/weight, convert/bias    convert_to_reference_fx's folded float weight and bias
                                      (fuse_conv_bn_weights on the post-step state)
      convert/qweight (int32)         convert_fx's (onednn engine) int_repr() of the weight
      convert/wscale                  its weight scales
    LSQ cases w4_lsq_train (no bias, [-8, 7]) and w8b_lsq_train (bias, [-128, 127]), mode 0,
    no convert: the weight fake quant is _LearnableFakeQuantize (same observer, per-channel
    symmetric, use_grad_scaling=True, qparam learning on). Its observer stays on for the one
    forward, which sets the learned scales from the observer before fake-quantizing (as the
    framework initializes LSQ), so wscale is both the observer's scales and the learned ones.
    Besides the datasets above:
      grad/weight_scale               gradient of the learned scales (per channel)
      grad/weight_scale_mag           per channel, sum of |per-element term| of that gradient
                                      (float64; the scale of the float32 summation error)
      lsq_grad_factor (1)             the grad_factor PyTorch used: 1 / sqrt(numel * quant_max),
                                      numel of the whole weight tensor (checked: the terms with
                                      it sum to PyTorch's gradient within 1e-5 of sum |term|)
    (Appended after the other cases with seeds of their own, so the earlier datasets keep their
    values.)
seq/...           The same unit (bias, 4-bit weights) with every fake quant on (input and
    output u8 [0, 255] affine, moving average), three training forwards without backward on
    batches x whose range grows (so the qparams move): after each, <step>/y (NHWC, output of
    the output FakeQuantize), <step>/{input,output}_qparams ([scale, zero point]),
    <step>/wscale, <step>/running_var; init/... as for the units.
fold/...          PTQ fold: a conv (bias or not) and a BN with random statistics, eval mode.
      init/... as above, fused/weight, fused/bias = torch.nn.utils.fusion.fuse_conv_bn_eval;
      train_formula/weight = W * (gamma / sqrt(running_var + eps)): the scaled weight
      ConvBn2d._forward_approximate fake-quantizes during QAT.
fx/...            FashionCNN QAT W4A8, 10 SGD steps (batch 32, lr 0.005, momentum 0.9, weight
    decay 5e-4) from fashion_cnn_steps.h5's init/* and its first 320 images, with
    prepare_qat_fx and a QConfigMapping: activations FakeQuantize(MovingAverageMinMaxObserver,
    quint8 [0, 255] per_tensor_affine), weights FakeQuantize(
    MovingAveragePerChannelMinMaxObserver, qint8 [-8, 7] per_channel_symmetric).
    FX 1.13 calls the shared FakeQuantize of a conv unit again after max_pool2d and permute
    (second and third moving-average updates per step, and re-quantization with the updated
    qparams) and gives flatten a fresh FakeQuantize of its own. The framework's onednn
    Quantizer observes each point once and lets pool/flatten share qparams, so those calls are
    removed from the FX graph (they are pass-through ops: fake quant commutes with them). What
    remains is one FakeQuantize per point: input, conv1 unit, conv2 unit, fc1 unit, fc2 -- the
    framework's input.fq, relu1.fq, relu2.fq, relu3.fq, fc2.fq. The unmodified FX graph's losses
    are stored too (losses_fx_unmodified, for the record; not compared).
      losses (float32 PyTorch, 1 thread), drift (per step: max |loss - loss'| over six float32
      reruns with 2-4 threads, with and without mkldnn: the chaos of float32 rounding through
      fake quant); act_drift/<point>_{min,max,scale}, wscale_drift/<layer>, grad0_drift/<tensor>
      (relative L2) likewise
      act/<point>_scale, _zp (int32), _min, _max: activation qparams and observer range after
      the last step
      wscale/<layer>: weight fake-quant scales after the last step, wscale_drift/<layer> (1)
      grad0/<tensor>: step-0 gradients (fc1.weight: rows 0..7)
      init_checksum (1): float64 sum of init/conv1.weight, to catch a stale fashion_cnn_steps.h5

Run: /usr/bin/python3 tests/ref/make_ref_qat.py   (deterministic: fixed seeds; identical bytes
on a rerun). It prints what the reference leaves out: convert_fx with observers on, its
integers outside a 4-bit range, and the unmodified FX graph's losses.
"""
import copy
import os

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.quantization import (FakeQuantize, MovingAverageMinMaxObserver,
                                   MovingAveragePerChannelMinMaxObserver, QConfig, QConfigMapping,
                                   disable_observer)
from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize
from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx, prepare_qat_fx
from torch.nn.intrinsic.qat import freeze_bn_stats

HERE = os.path.dirname(os.path.abspath(__file__))
MEAN, STD = 0.2860, 0.3530
FX_STEPS, FX_BATCH = 10, 32

torch.set_num_threads(1)
torch.backends.quantized.engine = "onednn"

out = {}  # name -> numpy array, written at the end


def put(name, arr, dtype=np.float32):
    if isinstance(arr, torch.Tensor):
        arr = arr.detach().numpy()
    out[name] = np.array(arr, dtype=dtype, copy=True, order="C")  # a copy: buffers change later


def nhwc(t):
    return t.detach().permute(0, 2, 3, 1).numpy()


def qconfig(wbits, abits, lsq_channels=0):
    """lsq_channels > 0: the weight fake quant learns its lsq_channels per-channel scales (LSQ,
    _LearnableFakeQuantize with use_grad_scaling) instead of following its observer."""
    act = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=2**abits - 1,
                                 dtype=torch.quint8, qscheme=torch.per_tensor_affine)
    wt_kind = FakeQuantize
    kw = {}
    if lsq_channels:
        wt_kind = _LearnableFakeQuantize
        kw = dict(channel_len=lsq_channels, use_grad_scaling=True)
    wt = wt_kind.with_args(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-2**(wbits - 1),
                           quant_max=2**(wbits - 1) - 1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                           **kw)
    return QConfig(activation=act, weight=wt)


def act_fqs(gm):
    return [m for n, m in gm.named_modules() if n.startswith("activation_post_process") and isinstance(m, FakeQuantize)]


# ---- unit: conv -> BN -> ReLU -------------------------------------------------------------
N, C, H, W, OC = 4, 3, 6, 6, 8


def unit_init(bias, seed):
    g = torch.Generator().manual_seed(seed)
    u = lambda *s, lo=-1.0, hi=1.0: lo + (hi - lo) * torch.rand(*s, generator=g)
    init = {"conv.weight": u(OC, C, 3, 3, lo=-0.4, hi=0.4), "bn.weight": u(OC, lo=0.5, hi=1.5),
            "bn.bias": u(OC, lo=-0.3, hi=0.3), "bn.running_mean": u(OC, lo=-0.5, hi=0.5),
            "bn.running_var": u(OC, lo=0.3, hi=2.0)}
    if bias:
        init["conv.bias"] = u(OC, lo=-0.2, hi=0.2)
    return init


def unit_model(init, wbits, lsq=False):
    bias = "conv.bias" in init
    m = nn.Sequential()
    m.add_module("conv", nn.Conv2d(C, OC, 3, padding=1, bias=bias))
    m.add_module("bn", nn.BatchNorm2d(OC))
    m.add_module("relu", nn.ReLU())
    with torch.no_grad():
        m.conv.weight.copy_(init["conv.weight"])
        if bias:
            m.conv.bias.copy_(init["conv.bias"])
        for k in ("weight", "bias", "running_mean", "running_var"):
            getattr(m.bn, k).copy_(init["bn." + k])
    m.train()
    qc = qconfig(wbits, 8, OC if lsq else 0)
    p = prepare_qat_fx(m, QConfigMapping().set_global(qc), example_inputs=(torch.randn(2, C, H, W),))
    for fq in act_fqs(p):
        fq.disable_fake_quant()  # observers stay on, as in the C test
    if lsq:
        wfq = p.conv.weight_fake_quant
        assert isinstance(wfq, _LearnableFakeQuantize) and wfq.use_grad_scaling
        # learning on; the observer (static_enabled) stays on for the first forward, which sets
        # the scales from it before fake-quantizing, as the C framework initializes LSQ
        wfq.toggle_qparam_learning(enabled=True)
        assert wfq.static_enabled[0] == 1 and wfq.fake_quant_enabled[0] == 1
    return p


def unit_batch(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, H, W, generator=g)
    labels = torch.randint(0, OC, (N,), generator=g)
    return x, labels


def unit_step(p, name, x, labels, mode, wbits):
    """One forward + backward of the prepared unit p (FX GraphModule), recorded under unit/name."""
    conv = getattr(p, "conv")  # ConvBnReLU2d
    if mode == 1:
        p.eval()
        p.apply(disable_observer)
    elif mode == 2:
        p.train()
        p.apply(freeze_bn_stats)
    pre = {k: v.detach().clone() for k, v in conv.state_dict().items()}
    wfq = conv.weight_fake_quant
    lsq = isinstance(wfq, _LearnableFakeQuantize)
    seen = {}
    if lsq:
        def capture(mod, inp, outp):
            seen["w"] = inp[0].detach().clone()  # W * sf
            outp.register_hook(lambda g: seen.__setitem__("dy", g.detach().clone()))
        hook = wfq.register_forward_hook(capture)
    x = x.clone().requires_grad_(True)
    y = p(x)
    if lsq:
        hook.remove()
    loss = F.cross_entropy(y.mean((2, 3)), labels)
    for prm in p.parameters():
        prm.grad = None
    loss.backward()
    r = "unit/%s/" % name
    for k in ("weight", "bias"):
        if getattr(conv, k) is not None:
            put(r + "init/conv." + k, pre[k])
    for k in ("weight", "bias", "running_mean", "running_var"):
        put(r + "init/bn." + k, pre["bn." + k])
    put(r + "x", nhwc(x))
    put(r + "labels", labels.numpy(), np.int32)
    qmin, qmax = -2**(wbits - 1), 2**(wbits - 1) - 1
    put(r + "meta", [int(conv.bias is not None), qmin, qmax, mode], np.int32)
    put(r + "y", nhwc(y))
    put(r + "loss", [loss.item()])
    put(r + "dx", nhwc(x.grad))
    put(r + "grad/conv.weight", conv.weight.grad)
    if conv.bias is not None:
        put(r + "grad/conv.bias", conv.bias.grad)
    put(r + "grad/bn.weight", conv.bn.weight.grad)
    put(r + "grad/bn.bias", conv.bn.bias.grad)
    put(r + "after/bn.running_mean", conv.bn.running_mean)
    put(r + "after/bn.running_var", conv.bn.running_var)
    put(r + "wscale", conv.weight_fake_quant.scale)
    if lsq:
        lsq_scale_grad(r, wfq, seen["w"], seen["dy"])


def lsq_scale_grad(r, wfq, w, dy):
    """The learned weight scales' gradient and, per channel, the sum of |per-element term|
    (float64, the scale of the float32 summation error; as make_ref_quant.py), and the
    grad_factor PyTorch used: 1 / sqrt(numel * quant_max), numel of the whole weight tensor."""
    qmin, qmax = wfq.quant_min, wfq.quant_max
    gf = 1.0 / (w.numel() * qmax) ** 0.5
    s32 = wfq.scale.detach().numpy()[:, None]
    x32 = w.numpy().reshape(w.shape[0], -1)
    s, xm = s32.astype(np.float64), x32.astype(np.float64)
    dym = dy.double().numpy().reshape(w.shape[0], -1)
    # rounded as PyTorch's kernel rounds: x * (1 / s) in float32 (the largest |x| of a channel
    # sits at the tie x / s = +-127.5 (+-7.5), where the float64 quotient can round the other way)
    xq = np.rint((x32 * (np.float32(1) / s32)).astype(np.float64))
    inr = (xq >= qmin) & (xq <= qmax)
    term = np.where(inr, dym * (xq - xm / s), dym * np.where(xq < qmin, qmin, qmax)) * gf
    assert wfq.scale.grad is not None and torch.all(wfq.zero_point.detach() == 0)
    put(r + "grad/weight_scale", wfq.scale.grad)
    put(r + "grad/weight_scale_mag", np.abs(term).sum(axis=1))
    put(r + "lsq_grad_factor", [gf])
    # a check of the reference itself: the float64 sum of the terms is PyTorch's gradient
    d = np.abs(term.sum(axis=1) - wfq.scale.grad.double().numpy())
    assert np.all(d <= 1e-5 * np.abs(term).sum(axis=1)), d


def frozen_copy(p):
    c = copy.deepcopy(p).eval()
    c.apply(disable_observer)
    return c


def unit_convert(p, name):
    """convert_fx with the observers disabled first. With an enabled observer, PyTorch 1.13's
    convert runs the weight FakeQuantize once more on the re-folded weight (convert.py: "a hack
    for QAT", pytorch issue 73941), moving its scales away from the ones training used; the
    framework's convert uses exactly the trained qparams (docs/design.md: modes)."""
    r = "unit/%s/convert/" % name
    ref = convert_to_reference_fx(frozen_copy(p))
    sd = ref.state_dict()
    put(r + "weight", sd["conv.0.weight"])
    put(r + "bias", sd["conv.0.bias"])
    q = convert_fx(frozen_copy(p))
    qw = q.conv.weight()
    assert torch.equal(qw.q_per_channel_scales().float(), p.conv.weight_fake_quant.scale)
    observing = convert_fx(copy.deepcopy(p).eval()).conv.weight()
    ds = (observing.q_per_channel_scales() - qw.q_per_channel_scales()).abs() / qw.q_per_channel_scales()
    print("unit %s: convert_fx with observers on: weight scales move by up to %.2g relative, %d of %d "
          "integer weights change" % (name, ds.max().item(), (observing.int_repr() != qw.int_repr()).sum().item(),
                                      qw.numel()))
    lo, hi = p.conv.weight_fake_quant.quant_min, p.conv.weight_fake_quant.quant_max
    iw = qw.int_repr()
    print("unit %s: convert_fx integer weights outside [%d, %d]: %d (range %d..%d)" %
          (name, lo, hi, ((iw < lo) | (iw > hi)).sum().item(), iw.min().item(), iw.max().item()))
    put(r + "qweight", qw.int_repr().numpy(), np.int32)
    put(r + "wscale", qw.q_per_channel_scales())
    # the folded weight convert_to_reference_fx keeps is what convert_fx quantized
    assert torch.equal(torch.quantize_per_channel(sd["conv.0.weight"], qw.q_per_channel_scales(),
                                                  qw.q_per_channel_zero_points(), 0, torch.qint8).int_repr(),
                       qw.int_repr())


def make_units():
    x1, l1 = unit_batch(10)
    x2, l2 = unit_batch(11)
    init = unit_init(False, 1)
    p = unit_model(init, 4)
    unit_step(p, "w4_train", x1, l1, 0, 4)
    unit_convert(p, "w4_train")
    init = unit_init(True, 2)
    p = unit_model(init, 8)
    unit_step(p, "w8b_train", x1, l1, 0, 8)
    unit_convert(p, "w8b_train")
    unit_step(p, "w8b_eval", x2, l2, 1, 8)
    init = unit_init(True, 3)
    p = unit_model(init, 4)
    unit_step(p, "w4b_frozen", x1, l1, 2, 4)
    # LSQ weight scales (appended: the cases above keep their datasets)
    init = unit_init(False, 5)
    p = unit_model(init, 4, lsq=True)
    unit_step(p, "w4_lsq_train", x1, l1, 0, 4)
    init = unit_init(True, 6)
    p = unit_model(init, 8, lsq=True)
    unit_step(p, "w8b_lsq_train", x1, l1, 0, 8)


def make_sequence():
    """Three training forwards of one unit with every fake quant on: FakeQuantize observes, then
    fake-quantizes with the qparams it just computed, in the same call."""
    init = unit_init(True, 4)
    p = unit_model(init, 4)
    for fq in act_fqs(p):
        fq.enable_fake_quant()
    r = "seq/"
    for k, v in init.items():
        put(r + "init/" + k, v)
    for step, seed in enumerate((12, 13, 14)):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(N, C, H, W, generator=g) * (1.0 + 0.5 * step)  # ranges that move
        with torch.no_grad():
            y = p(x)
        q = "%s%d/" % (r, step)
        put(q + "x", nhwc(x))
        put(q + "y", nhwc(y))
        for key, fq in (("input_qparams", p.activation_post_process_0),
                        ("output_qparams", p.activation_post_process_1)):
            put(q + key, [fq.scale.item(), fq.zero_point.item()])
        put(q + "wscale", p.conv.weight_fake_quant.scale)
        put(q + "running_var", p.conv.bn.running_var)


# ---- PTQ fold ----------------------------------------------------------------------------
def make_fold():
    for name, bias, seed in (("nobias", False, 20), ("bias", True, 21)):
        init = unit_init(bias, seed)
        g = torch.Generator().manual_seed(seed + 100)
        # a wide spread of statistics, tiny and large variances included
        init["bn.running_var"] = torch.exp(torch.empty(OC).uniform_(-6, 4, generator=g))
        init["bn.running_mean"] = torch.empty(OC).uniform_(-2, 2, generator=g)
        conv = nn.Conv2d(C, OC, 3, padding=1, bias=bias).eval()
        bn = nn.BatchNorm2d(OC).eval()
        with torch.no_grad():
            conv.weight.copy_(init["conv.weight"])
            if bias:
                conv.bias.copy_(init["conv.bias"])
            for k in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, k).copy_(init["bn." + k])
        fused = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
        r = "fold/%s/" % name
        for k, v in init.items():
            put(r + "init/" + k, v)
        put(r + "fused/weight", fused.weight.detach())
        put(r + "fused/bias", fused.bias.detach())
        sf = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        put(r + "train_formula/weight", (conv.weight * sf.reshape(-1, 1, 1, 1)).detach())


# ---- FashionCNN FX QAT ---------------------------------------------------------------------
class FashionCNN(nn.Module):
    """make_ref_fashion_cnn.py's model with ReLU modules, so FX fuses conv-bn-relu and
    linear-relu (it does not fuse torch.relu); the same function and state_dict."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.relu2 = nn.ReLU()
        self.fc1 = nn.Linear(3136, 128)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(self.relu1(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(self.relu2(self.bn2(self.conv2(x))), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC flatten order, as the C framework
        return self.fc2(self.relu3(self.fc1(x)))


FX_POINTS = ["input", "relu1", "relu2", "relu3", "fc2"]  # the framework's <value>.fq names


def dedup_fake_quants(gm):
    """Removes FakeQuantize calls after pass-through ops (max_pool2d, permute, flatten); returns
    the remaining activation FakeQuantize modules in graph order."""
    mods = dict(gm.named_modules(remove_duplicate=False))
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(mods[node.target], FakeQuantize):
            continue
        src = node.args[0]
        if (src.op == "call_function" and src.target is F.max_pool2d) or \
                (src.op == "call_method" and src.target in ("permute", "flatten")):
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(mods[n.target], FakeQuantize)]
    fqs = [mods[n.target] for n in calls]
    assert len(fqs) == len(set(map(id, fqs))) == len(FX_POINTS), gm.code
    return fqs


def fx_model(init, dedup):
    m = FashionCNN()
    missing, unexpected = m.load_state_dict(init, strict=False)
    assert not unexpected and all("num_batches" in k for k in missing)
    m.train()
    gm = prepare_qat_fx(m, QConfigMapping().set_global(qconfig(4, 8)), example_inputs=(torch.randn(2, 1, 28, 28),))
    fqs = dedup_fake_quants(gm) if dedup else None
    return gm, fqs


def fx_train(init, x_all, y_all, dedup=True):
    gm, fqs = fx_model(init, dedup)
    opt = torch.optim.SGD(gm.parameters(), lr=0.005, momentum=0.9, weight_decay=5e-4)
    losses, grad0 = [], {}
    for s in range(FX_STEPS):
        x = x_all[s * FX_BATCH:(s + 1) * FX_BATCH]
        y = y_all[s * FX_BATCH:(s + 1) * FX_BATCH]
        opt.zero_grad()
        loss = F.cross_entropy(gm(x), y)
        loss.backward()
        if s == 0:
            grad0 = {k: p.grad.detach().clone() for k, p in gm.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return np.array(losses), gm, fqs, grad0


def make_fx():
    src = os.path.join(HERE, "fashion_cnn_steps.h5")
    with h5py.File(src, "r") as f:
        init = {k: torch.from_numpy(f["init/" + k][()]) for k in f["init"]}
        n = FX_STEPS * FX_BATCH
        images = f["images"][:n]
        labels = f["labels"][:n]
    # normalize in float32 exactly as the C test does: (v / 255 - mean) / std
    x = (images.astype(np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)
    x_all = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    y_all = torch.from_numpy(labels.astype(np.int64))
    put("fx/init_checksum", [init["conv1.weight"].double().sum().item()])

    losses, gm, fqs, grad0 = fx_train(init, x_all, y_all)
    # float32 reruns with other summation orders (thread counts, conv without mkldnn): how far
    # rounding alone moves PyTorch's own trajectory through the fake quant roundings
    variants = []
    for threads in (2, 3, 4):
        torch.set_num_threads(threads)
        variants.append(fx_train(init, x_all, y_all))
    with torch.backends.mkldnn.flags(enabled=False):
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            variants.append(fx_train(init, x_all, y_all))
    torch.set_num_threads(1)
    drift = np.zeros(FX_STEPS)
    for v in variants:
        drift = np.maximum(drift, np.abs(v[0] - losses))
    unmod, _, _, _ = fx_train(init, x_all, y_all, dedup=False)

    put("fx/losses", losses)
    put("fx/drift", drift)
    put("fx/losses_fx_unmodified", unmod)
    for i, (name, fq) in enumerate(zip(FX_POINTS, fqs)):
        obs = fq.activation_post_process
        put("fx/act/%s_scale" % name, fq.scale)
        put("fx/act/%s_zp" % name, fq.zero_point, np.int32)
        put("fx/act/%s_min" % name, [obs.min_val.item()])
        put("fx/act/%s_max" % name, [obs.max_val.item()])
        for k in ("scale", "min", "max"):
            ref = {"scale": fq.scale.item(), "min": obs.min_val.item(), "max": obs.max_val.item()}[k]
            d = 0.0
            for v in variants:
                vf = v[2][i]
                got = {"scale": vf.scale.item(), "min": vf.activation_post_process.min_val.item(),
                       "max": vf.activation_post_process.max_val.item()}[k]
                d = max(d, abs(got - ref))
            put("fx/act_drift/%s_%s" % (name, k), [d])
    for layer in ("conv1", "conv2", "fc1", "fc2"):
        sc = getattr(gm, layer).weight_fake_quant.scale
        put("fx/wscale/" + layer, sc)
        d = max((getattr(v[1], layer).weight_fake_quant.scale - sc).abs().max().item() for v in variants)
        put("fx/wscale_drift/" + layer, [d])
    for k, g in grad0.items():
        d = max(((v[3][k] - g).norm() / g.norm()).item() for v in variants)
        if k == "fc1.weight":
            k, g = "fc1.weight_rows0to7", g[:8]
        put("fx/grad0/" + k, g)
        put("fx/grad0_drift/" + k, [d])  # relative L2 distance
    print("fx losses   ", " ".join("%.6f" % v for v in losses))
    print("fx drift    ", " ".join("%.1e" % v for v in drift))
    print("fx unmodified", " ".join("%.6f" % v for v in unmod), " max diff %.2e" % np.abs(unmod - losses).max())
    for name, fq in zip(FX_POINTS, fqs):
        print("  %-6s scale %.9g zp %d" % (name, fq.scale.item(), fq.zero_point.item()))


def main():
    make_units()
    make_sequence()
    make_fold()
    make_fx()
    path = os.path.join(HERE, "qat.h5")
    tmp = path + ".tmp"
    # no timestamps on the root group, groups and datasets: reruns give identical bytes
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    with h5py.File(h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)) as f:
        gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        gcpl.set_obj_track_times(False)
        for name in out:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                g = "/".join(parts[:i])
                if g not in f:
                    h5py.h5g.create(f.id, g.encode(), gcpl=gcpl)
        for name, arr in out.items():
            if arr.size > 256:
                f.create_dataset(name, data=arr, compression="gzip", compression_opts=9, shuffle=True,
                                 track_times=False)
            else:
                f.create_dataset(name, data=arr, track_times=False)
    os.replace(tmp, path)
    print("wrote %s (%d datasets, %d bytes)" % (path, len(out), os.path.getsize(path)))


if __name__ == "__main__":
    main()
