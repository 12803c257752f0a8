#!/usr/bin/env python3
"""Writes tests/onnx/models/mha_vit.onnx, mha_vit_cls.onnx, mha_timm.onnx, their *_d.onnx twins
and their PyTorch reference tests/onnx/ref/mha_ref.h5. Run with the peers environment's torch 2.x and torchvision
(bench/peers/.venv: nn.MultiheadAttention exports through scaled_dot_product_attention there,
not through torch 1.13's bmm; torchvision builds the blocks):

    bench/peers/.venv/bin/python tests/onnx/make_mha_models.py

Deterministic (seed 0); the CTest tests need no torch, only these committed files.

mha_vit: a small vision transformer built from torchvision's own encoder blocks
(torchvision.models.vision_transformer.EncoderBlock: pre-norm, nn.MultiheadAttention with
batch_first=True, its packed in_proj of q, k and v and its out_proj, an MLP with GELU): 4x4
patches of 1x28x28 (a stride-4 conv) as 49 tokens of 32 features, a learned position embedding,
two blocks of 4 heads, a final LayerNorm, the mean of the tokens, a linear head. Exported as
experiments/zoo.py exports: the TorchScript exporter (dynamo=False), training mode, opset 17,
dynamic batch, no constant folding: the attention's reshapes come from Shape / Gather / Concat
arithmetic on the batch, its scale from Sqrt of the head size, k^T by Transpose [0, 1, 3, 2].
mha_vit_d: the same model with the same weights, exported by the dynamo exporter (torch 2.x's
default) in eval mode with its default optimizations: the reshapes are constants with -1 for the
batch, k^T is a Reshape / Transpose [0, 2, 1] / Reshape of the heads, the scale a constant.
mha_vit_cls, mha_vit_cls_d: torchvision's VisionTransformer itself, exported the same two ways: a
class token (its Expand to the batch, from ConstantOfShape / Equal / Where arithmetic in the
TorchScript export, and its Concat before the tokens), x[:, 0] (Gather) to the head.
mha_timm, mha_timm_d: timm's VisionTransformer as timm writes it (TimmViT below, timm not being
installed): its Attention's packed q, k, v by Reshape [N, T, 3, heads, d], Transpose [2, 0, 3, 1,
4] and unbind (Split and Squeeze in the TorchScript export, Slice and Squeeze in the dynamo one),
a cls_token concatenated before the tokens, x[:, 0] to the head.

The LayerNorm parameters and the biases are randomized (a trained model's; the dynamo exporter
would otherwise share one initializer among parameters of equal values, and drop an out_proj
bias of zeros).

The reference groups hold what make_onnx_models.py's write_ref writes (x, labels, y_eval; for
the TorchScript exports also y_train, loss, grad/<name>), which tests/onnx/test_onnx_import.c
checks; the gradients are named as the imported graph names its parameters (in_proj after its
module, a parameter that is a module's attribute as <name>.weight).
"""
import copy
import os
import warnings

import h5py
import onnx
import torch
import torch.nn as nn
from torchvision.models import VisionTransformer
from torchvision.models.vision_transformer import EncoderBlock

import make_onnx_models as base


class MHAViT(nn.Module):
    def __init__(self, dim=32, heads=4, depth=2, hidden=64):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, 4)
        self.pos_embedding = nn.Parameter(torch.randn(1, 49, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(heads, dim, hidden, 0.0, 0.0) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos_embedding
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class TimmAttention(nn.Module):
    """timm.models.vision_transformer.Attention as timm writes it (fused_attn): one qkv linear map,
    reshape(B, N, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0), scaled_dot_product_attention,
    transpose(1, 2).reshape(B, N, C), proj."""
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class TimmBlock(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), TimmAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TimmViT(nn.Module):
    """timm's VisionTransformer as it is written (patch embedding, cls_token expanded and
    concatenated, pos_embed of 1 + T tokens, blocks, norm, x[:, 0], head), of the small ViT's size."""
    def __init__(self, dim=32, heads=4, depth=2, hidden=64):
        super().__init__()
        self.patch_embed = nn.Conv2d(1, dim, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 50, dim) * 0.02)
        self.blocks = nn.Sequential(*[TimmBlock(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def torchvision_vit():
    """torchvision's VisionTransformer itself (a class token, x[:, 0] to the head) for 1x28x28: 4x4
    patches, 2 layers of 4 heads, 32 features, MLP 64, 10 classes, its patch conv taking 1 channel."""
    m = VisionTransformer(image_size=28, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                          num_classes=10)
    m.conv_proj = nn.Conv2d(1, 32, 4, 4)
    with torch.no_grad():  # a trained model's: torchvision starts the class token and the head at zero
        m.class_token.normal_(0, 0.5)
        m.heads.head.weight.normal_(0, 0.2)
    return m


def randomize(model, gen):
    """A trained model's LayerNorm parameters and biases (nn.MultiheadAttention starts its biases at
    zero, LayerNorm at ones and zeros)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 0.5 + 0.75)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def fit_name(s):
    """The importer's name for a node named s (onnx/import_core.c, fit_name): a name of more than 49
    characters as an FNV-1a hash of it, '-' and its last 40 characters."""
    if len(s) <= 49:
        return s
    h = 2166136261
    for b in s.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return "%08x-%s" % (h, s[-40:])


def ir_names(model):
    """PyTorch's parameter names -> the imported graph's: <node>.weight / <node>.bias, the node named
    after the module (in_proj_weight / in_proj_bias: the module's in_proj; a parameter that is a
    module's attribute, class_token or pos_embedding: itself), fit as the importer fits names."""
    out = {}
    for name, _ in model.named_parameters():
        if name.endswith("_weight") or name.endswith("_bias"):
            node, suffix = name.rsplit("_", 1)
        elif name.endswith(".weight") or name.endswith(".bias"):
            node, suffix = name.rsplit(".", 1)
        else:
            node, suffix = name, "weight"
        out[name] = fit_name(node) + "." + suffix
    return out


def export_both(model, name, f):
    """name.onnx (the TorchScript exporter, training mode) and name_d.onnx (the dynamo exporter, eval
    mode), and their reference groups in the open file f."""
    x = torch.randn(2, 1, 28, 28)
    ts = os.path.join(base.MODELS, name + ".onnx")
    m = copy.deepcopy(model).train()
    torch.onnx.export(m, x, ts, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, dynamo=False, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(ts), full_check=True)
    d = os.path.join(base.MODELS, name + "_d.onnx")
    torch.onnx.export(copy.deepcopy(model).eval(), (x,), d, dynamo=True, input_names=["input"],
                      output_names=["logits"], dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    onnx.checker.check_model(onnx.load(d), full_check=True)
    base.write_ref(f, name, model, ir_names(model))
    base.write_ref(f, name + "_d", model, train=False)


def main():
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    tmp = os.path.join(base.REF, "mha_ref.h5.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs["generator"] = b"tests/onnx/make_mha_models.py"
        f.attrs["torch_version"] = str(torch.__version__).encode()
        for seed, (name, make) in enumerate((("mha_vit", MHAViT), ("mha_vit_cls", torchvision_vit),
                                             ("mha_timm", TimmViT))):
            torch.manual_seed(seed)
            model = make()
            randomize(model, gen)
            export_both(model, name, f)
    os.replace(tmp, os.path.join(base.REF, "mha_ref.h5"))


if __name__ == "__main__":
    main()
