#!/usr/bin/python3
"""Reference for tests/train/test_fashion_cnn_steps.c: 20 SGD steps of FashionCNN in PyTorch.

Writes tests/ref/fashion_cnn_steps.h5 with the initial state_dict (PyTorch default init,
seed 0), the 640 first Fashion-MNIST training images (uint8) and labels, the loss of each of
20 steps (batch 32, SGD lr 0.05 momentum 0.9 weight decay 5e-4, train-mode BN), and the
state_dict after the last step. The PyTorch model flattens in NHWC order
(x.permute(0, 2, 3, 1).flatten(1)) so fc1's weight matches ours without a permutation.
Run with Debian's interpreter: /usr/bin/python3 tests/ref/make_ref_fashion_cnn.py
"""
import gzip
import os

import h5py
import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION = "/usr/share/datasets/fashion-mnist/"
STEPS, BATCH = 20, 32
MEAN, STD = 0.2860, 0.3530


class FashionCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)  # NHWC flatten order, as the C framework
        return self.fc2(torch.relu(self.fc1(x)))


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def train(model, x_all, y_all, dtype):
    model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    losses = []
    grad0 = {}
    model.train()
    for s in range(STEPS):
        x, y = x_all[s * BATCH:(s + 1) * BATCH].to(dtype), y_all[s * BATCH:(s + 1) * BATCH]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if s == 0:
            grad0 = {k: p.grad.detach().double().numpy().copy() for k, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    final = {k: v.detach().double().numpy() for k, v in model.state_dict().items() if "num_batches" not in k}
    return np.array(losses), final, grad0


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = STEPS * BATCH
    images = read_idx(FASHION + "train-images-idx3-ubyte.gz", 16)[: n * 784].reshape(n, 28, 28, 1)
    labels = read_idx(FASHION + "train-labels-idx1-ubyte.gz", 8)[:n].astype(np.int32)
    model = FashionCNN()
    init = {k: v.detach().clone() for k, v in model.state_dict().items() if "num_batches" not in k}
    x_all = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    x_all = x_all.permute(0, 3, 1, 2).contiguous()
    y_all = torch.from_numpy(labels).long()
    m32, m64 = FashionCNN(), FashionCNN()
    m32.load_state_dict(init, strict=False)
    m64.load_state_dict(init, strict=False)
    losses32, final32, _ = train(m32, x_all, y_all, torch.float32)
    losses64, final64, grad0 = train(m64, x_all, y_all, torch.float64)
    with h5py.File(os.path.join(HERE, "fashion_cnn_steps.h5"), "w") as f:
        f.create_dataset("images", data=images, compression="gzip")
        f.create_dataset("labels", data=labels)
        f.create_dataset("losses", data=losses64.astype(np.float32))
        f.create_dataset("losses_float32", data=losses32.astype(np.float32))
        for k, v in init.items():
            f.create_dataset("init/" + k, data=v.numpy().astype(np.float32))
        for k in final64:
            a, b = final64[k], final32[k]
            if k == "fc1.weight":  # keep the file small: the first 8 rows are checked
                k, a, b = "fc1.weight_rows0to7", a[:8], b[:8]
            f.create_dataset("final/" + k, data=a.astype(np.float32))
            f.create_dataset("final_float32_spread/" + k, data=np.array([np.abs(a - b).max()], dtype=np.float32))
        for k, v in grad0.items():  # gradients of the first step (float64)
            if k == "fc1.weight":
                k, v = "fc1.weight_rows0to7", v[:8]
            f.create_dataset("grad0/" + k, data=v.astype(np.float32))
    print("losses64", " ".join("%.5f" % l for l in losses64))
    print("losses32", " ".join("%.5f" % l for l in losses32))


if __name__ == "__main__":
    main()
