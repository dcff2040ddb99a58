#!/usr/bin/env python3
"""Exports a training step's forward and backward as one AOTInductor package, for C++ training
through cgt.torch (`load_aoti_gradients` + `make_training_step_from_gradients`): Inductor's
generated, fused kernels for the whole forward and backward, where libtorch's autograd runs
eager kernels. AOTInductor compiles inference graphs only; the joint graph of the forward and
the backward (AOTAutograd's, with the parameters as inputs) is one, and so it compiles.

The package takes the parameters (in the order of `model.named_parameters()`), then the step's
inputs, and returns the loss, then one gradient per parameter (contiguous). Shapes are those of
the example inputs. Models with buffers (BatchNorm's running statistics) are refused: their
in-place updates would need to be outputs too.

  python3 scripts/aoti_training.py OUT.pt2     # the transformer of bench/training.py, MSE loss

From Python: export_training_step(model, loss_fn, example_inputs, path) with
loss_fn(model_output, *other_inputs) -> loss; the model's first input is example_inputs[0].
"""
import os
import shutil
import sys
import time

import torch
import torch._inductor.config


def export_training_step(model, loss_fn, example_inputs, path):
    """Writes the package to `path`; returns the parameter names in the order it takes them."""
    from torch._functorch.aot_autograd import aot_export_module

    if any(True for _ in model.buffers()):
        raise ValueError("the model has buffers: their updates are not outputs of the exported step")

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return (loss_fn(self.model(inputs[0]), *inputs[1:]),)

    joint, signature = aot_export_module(Loss(), list(example_inputs), trace_joint=True, output_loss_index=0)
    names = [name for name, _ in model.named_parameters()]
    graded = list(signature.backward_signature.gradients_to_parameters.values())
    if graded != ["model." + name for name in names]:
        raise ValueError(f"every parameter needs a gradient, in order: {graded}")

    class Step(torch.nn.Module):
        # Contiguous gradients: the optimizer's kernels read parameter and gradient in memory
        # order, and a joint graph returns some weight gradients transposed.
        def __init__(self):
            super().__init__()
            self.joint = joint

        def forward(self, *arguments):
            out = self.joint(*arguments)
            return (out[0], *(gradient.contiguous() for gradient in out[1:]))

    params = [p.detach() for p in model.parameters()]
    program = torch.export.export(Step(), (*params, *example_inputs))
    # Inductor compiles the package's C++ with $CXX as it was when Inductor was imported; prefer
    # g++ where there is one (a carried clang may lack the OpenMP library the package links).
    if shutil.which("g++"):
        torch._inductor.config.cpp.cxx = (None, "g++")
    torch._inductor.aoti_compile_and_package(program, package_path=path)
    return names


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import torch.nn.functional as F
    from training import BATCH, HIDDEN, SEQ, Transformer

    torch.manual_seed(0)
    model = Transformer().cuda()
    example = (torch.randn(BATCH, SEQ, HIDDEN, device="cuda"), torch.randn(BATCH, SEQ, HIDDEN, device="cuda"))
    start = time.time()
    names = export_training_step(model, F.mse_loss, example, sys.argv[1])
    print(f"{sys.argv[1]}: the training step of bench/training.py's transformer, {len(names)} parameters "
          f"({names[0]} ... {names[-1]}), {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
