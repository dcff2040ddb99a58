#!/usr/bin/env python3
"""Exports the small models the cgt.torch model tests and examples/serve_model.cpp run, with
random weights (fixed seed; nothing is downloaded):

  mlp.pt     TorchScript (torch.jit.script): an MLP, [batch, 256] -> [batch, 64] (a tensor)
  block.pt   TorchScript (torch.jit.script): a small transformer block, [batch, 16, 64] ->
             (logits [batch, 10], {"hidden": [batch, 16, 64], "pooled": [batch, 64]})
  host_scalars.pt  TorchScript (torch.jit.trace): [batch, tokens <= 128, 64] -> the same shape,
             traced with two habits of Hugging Face's BERT that a capture without the executor's
             optimisations does not survive: a slice bound from the input's size plus a Python int
             (a 0-dim constant: on the device once loaded there, and int() of it synchronises), and
             torch.tensor(-1.0, device=x.device) (a host constant copied to the device per call)
  block.pt2  AOTInductor (torch._inductor.aoti_compile_and_package), the same block with a
             dynamic batch dimension (1..64); its C++ loader returns the outputs flat:
             [logits, hidden, pooled]. Compiling it takes about a minute (C++ and Triton).
  train_mlp.pt2  AOTInductor (scripts/aoti_training.py), the training step of TrainMlp
             (32 -> 64, GELU, 64 -> 16; MSE loss; batch 16): takes fc1.weight, fc1.bias,
             fc2.weight, fc2.bias, the batch and the target; returns the loss and 4 gradients.

  python3 scripts/export-test-models.py OUT_DIR [--no-aoti | --training-only]

Also prints which model libraries the Python has (transformers, torchvision): the tests need none.
"""
import importlib.util
import os
import shutil
import sys
import time
from typing import Dict, Tuple

import torch
import torch.nn.functional as F


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(256, 1024)
        self.fc2 = torch.nn.Linear(1024, 1024)
        self.fc3 = torch.nn.Linear(1024, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.gelu(self.fc1(x)))))


class TrainMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(torch.nn.Module):
    """Pre-norm self-attention and MLP over [batch, 16, 64], with a classifier head."""

    def __init__(self, dim: int = 64, heads: int = 4, classes: int = 10):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        attention = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        hidden = x + self.down(F.gelu(self.up(self.norm2(x))))
        pooled = hidden.mean(dim=1)
        return self.head(pooled), {"hidden": hidden, "pooled": pooled}


class HostScalars(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.register_buffer("positions", torch.arange(128.0).expand(1, -1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.size(1)
        offset = 0
        position = self.positions[:, offset : tokens + offset]
        y = self.fc(x) + position.unsqueeze(-1) / 128
        return torch.where(y > 0, y, torch.tensor(-1.0, device=x.device, dtype=y.dtype))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    aoti = "--no-aoti" not in sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {torch.cuda.is_available()}")
    for library in ("transformers", "torchvision"):
        print(f"{library}: {'installed' if importlib.util.find_spec(library) else 'not installed'}")
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    training_only = "--training-only" in sys.argv[2:]
    with torch.no_grad():
        for name, model in () if training_only else (("mlp", Mlp()), ("block", Block())):
            model = model.to(device).eval()
            start = time.time()
            torch.jit.script(model).save(os.path.join(out, f"{name}.pt"))
            print(f"{out}/{name}.pt: TorchScript, {time.time() - start:.1f} s")
            if name == "block" and aoti:
                export_aoti(model, os.path.join(out, f"{name}.pt2"))
        if not training_only:
            path = os.path.join(out, "host_scalars.pt")
            example = torch.randn(4, 16, 64, device=device)
            torch.jit.trace(HostScalars().to(device).eval(), (example,), check_trace=False).save(path)
            print(f"{path}: TorchScript (traced)")
    if aoti:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from aoti_training import export_training_step

        start = time.time()
        example = (torch.randn(16, 32, device=device), torch.randn(16, 16, device=device))
        path = os.path.join(out, "train_mlp.pt2")
        export_training_step(TrainMlp().to(device), F.mse_loss, example, path)
        print(f"{path}: AOTInductor training step, {time.time() - start:.1f} s")
    return 0


def export_aoti(model, path):
    # Inductor compiles the package's C++ with $CXX (g++ by default); prefer g++ where there is one.
    if shutil.which("g++"):
        os.environ["CXX"] = "g++"
    print(f"AOTInductor with CXX={os.environ.get('CXX', 'g++')}")
    start = time.time()
    example = torch.randn(4, 16, 64, device="cuda")
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
    torch._inductor.aoti_compile_and_package(program, package_path=path)
    print(f"{path}: AOTInductor, {time.time() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
