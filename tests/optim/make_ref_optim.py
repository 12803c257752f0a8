#!/usr/bin/python3
"""Writes tests/ref/optim.h5: PyTorch 1.13 reference trajectories for optim/ (SGD, AdamW) and
learning-rate schedules. Run with Debian's python3-torch: /usr/bin/python3 tests/optim/make_ref_optim.py
The output is small and committed, so CI needs no torch.

Layout (all float32):
  params0 (N), grads (STEPS, N)                shared by every optimizer case
  <case>/hparams  [sgd?1:0, momentum, dampening, nesterov, weight_decay, beta1, beta2, eps, masked]
  <case>/lr (STEPS)                            lr passed to step s (changes every step)
  <case>/mask (N)                              1 = weight decay applies (all ones unless masked)
  <case>/params (STEPS, N)                     params after step s
  <case>/<state name> (N)                      optimizer state after the last step
  lr/<name>/params [base_lr, min_lr, total_steps, warmup_steps, step_size, gamma]
  lr/<name>/values (total_steps + 1)           lr used by optimizer step s = 0..total_steps
Hyper-parameters are float32-representable so C (float) and Python (double) see the same numbers.
"""
import math
import os
import warnings

import h5py
import numpy as np
import torch

N = 257
STEPS = 5
f32 = lambda x: float(np.float32(x))

CASES = {
    "sgd_momentum": dict(kind="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd_nesterov": dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "sgd_plain": dict(kind="sgd", lr=0.05, weight_decay=5e-4),
    "sgd_dampening": dict(kind="sgd", lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-3),
    "sgd_momentum_masked": dict(kind="sgd", lr=0.05, momentum=0.9, weight_decay=5e-2, masked=True),
    "adamw": dict(kind="adamw", lr=1e-3, weight_decay=1e-2),
    "adamw_masked": dict(kind="adamw", lr=1e-3, weight_decay=1e-1, betas=(0.8, 0.99), eps=1e-6,
                         masked=True),
}

# name: (torch scheduler factory, base_lr, min_lr, total, warmup, step_size, gamma)
SCHEDULES = {
    "cosine": (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.0),
               0.05, 0.0, 20, 0, 1, 1.0),
    "cosine_min": (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=17, eta_min=1e-3),
                   0.05, 1e-3, 17, 0, 1, 1.0),
    "step": (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
             0.1, 0.0, 12, 0, 3, 0.5),
    "linear": (lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=f32(1e-3) / f32(0.05),
                                                           total_iters=15),
               0.05, 1e-3, 15, 0, 1, 1.0),
    # Linear warmup for 4 steps, then cosine over the remaining 16.
    "warmup_cosine": (lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LambdaLR(o, lambda s: (s + 1) / 4),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=16, eta_min=0.0)], milestones=[4]),
        0.05, 0.0, 20, 4, 1, 1.0),
}


def run_case(c, params0, grads, mask):
    lrs = [f32(c["lr"] * (1.0 - 0.1 * s)) for s in range(STEPS)]
    wd = f32(c.get("weight_decay", 0.0))
    decay = torch.tensor(params0[mask])
    nodecay = torch.tensor(params0[~mask])
    groups = [{"params": [decay], "weight_decay": wd}]
    if nodecay.numel():
        groups.append({"params": [nodecay], "weight_decay": 0.0})
    if c["kind"] == "sgd":
        opt = torch.optim.SGD(groups, lr=lrs[0], momentum=f32(c.get("momentum", 0.0)),
                              dampening=f32(c.get("dampening", 0.0)), nesterov=c.get("nesterov", False))
    else:
        b1, b2 = c.get("betas", (0.9, 0.999))
        opt = torch.optim.AdamW(groups, lr=lrs[0], betas=(f32(b1), f32(b2)), eps=f32(c.get("eps", 1e-8)))
    out = np.zeros((STEPS, N), np.float32)
    for s in range(STEPS):
        decay.grad = torch.tensor(grads[s][mask])
        nodecay.grad = torch.tensor(grads[s][~mask])
        for g in opt.param_groups:
            g["lr"] = lrs[s]
        opt.step()
        out[s][mask] = decay.detach().numpy()
        out[s][~mask] = nodecay.detach().numpy()
    state = {}
    names = {"sgd": ["momentum_buffer"], "adamw": ["exp_avg", "exp_avg_sq"]}[c["kind"]]
    for name in names:
        if opt.state[decay].get(name) is not None:
            full = np.zeros(N, np.float32)
            full[mask] = opt.state[decay][name].numpy()
            if nodecay.numel():
                full[~mask] = opt.state[nodecay][name].numpy()
            state[name] = full
    b1, b2 = c.get("betas", (0.9, 0.999))
    hp = [1.0 if c["kind"] == "sgd" else 0.0, f32(c.get("momentum", 0.0)), f32(c.get("dampening", 0.0)),
          1.0 if c.get("nesterov") else 0.0, wd, f32(b1), f32(b2), f32(c.get("eps", 1e-8)),
          1.0 if c.get("masked") else 0.0]
    return np.array(lrs, np.float32), out, state, np.array(hp, np.float32)


def run_schedule(factory, base, total):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=f32(base))
    sched = factory(opt)
    values = []
    for _ in range(total + 1):
        values.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(values, np.float32)


def main():
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # SequentialLR's deprecated step(epoch) call
    rng = np.random.default_rng(0)
    params0 = rng.uniform(-1, 1, N).astype(np.float32)
    grads = (0.5 * rng.standard_normal((STEPS, N))).astype(np.float32)
    grads[2, ::17] = 0.0  # exact zero gradients exercise AdamW's eps path
    out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref", "optim.h5")
    with h5py.File(out_path, "w") as f:
        f["params0"] = params0
        f["grads"] = grads
        for name, c in CASES.items():
            mask = np.ones(N, bool)
            if c.get("masked"):
                mask[1::3] = False  # every third element is a "bias/BN" parameter without decay
            lrs, out, state, hp = run_case(c, params0, grads, mask)
            g = f.create_group(name)
            g["hparams"] = hp
            g["lr"] = lrs
            g["mask"] = mask.astype(np.float32)
            g["params"] = out
            for k, v in state.items():
                g[k] = v
        for name, (factory, base, lo, total, warmup, step_size, gamma) in SCHEDULES.items():
            g = f.create_group("lr/" + name)
            g["params"] = np.array([base, lo, total, warmup, step_size, gamma], np.float32)
            g["values"] = run_schedule(factory, base, total)
    print("wrote", os.path.normpath(out_path))


if __name__ == "__main__":
    main()
