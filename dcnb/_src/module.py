"""Compiled SDFGs -> a differentiable nn.Module that shares the user module's parameters."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from dace import data as dt
from dace.codegen.compiled_sdfg import CompiledSDFG
from torch import nn

from . import memory
from .errors import InputError
from .frontend import Imported
from .program import Program, overwritten


# we pass output arrays ourselves, which DaCe notes on every first call of a binary
warnings.filterwarnings("ignore", message='Return value "__return', category=UserWarning)


class Runner:
    """Calls a Program's compiled forward and backward with torch tensors."""

    def __init__(self, imported: Imported, program: Program, forward: CompiledSDFG, backward: CompiledSDFG | None):
        self.imported = imported
        self.program = program
        self.forward_binary = forward
        self.backward_binary = backward
        self.params = list(imported.param_paths)
        self.names = imported.inputs + self.params
        fwd = program.forward
        self._outputs = [(name, fwd.arrays[name]) for name in imported.outputs]
        given = set(self.names) | set(imported.outputs)
        self._stored = [(name, fwd.arrays[name]) for name in program.forwarded if name not in given]
        self._constants = _constants(imported, fwd)
        if backward is not None:
            bwd = program.backward
            self._grads = [
                (name, program.input_grads.get(name), bwd.arrays.get(program.input_grads.get(name)))
                for name in self.names
            ]
            self._output_grads = [(program.output_grads.get(name), desc) for name, desc in self._outputs]
            # gradients the backward accumulates into must start at zero; those it overwrites need not
            self._accumulated = {g for _, g, _ in self._grads if g is not None and not overwritten(bwd, g)}
            self._bwd_constants = _constants(imported, bwd)

    def forward(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        args = {name: _ready(t) for name, t in zip(self.names, tensors)}
        outputs = {name: _empty(desc) for name, desc in self._outputs}
        stored = {name: _empty(desc) for name, desc in self._stored}
        self.forward_binary(**args, **outputs, **stored, **self._constants)
        saved = {**args, **outputs, **stored}
        return list(outputs.values()), saved

    def backward(self, saved: dict[str, torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
        assert self.backward_binary is not None
        args = {name: saved[name] for name in self.program.forwarded}
        for (grad_name, desc), grad in zip(self._output_grads, grad_outputs):
            if grad_name is not None:
                shape = _shape(desc)
                args[grad_name] = (
                    memory.zeros(shape, _dtype(desc)) if grad is None else _ready(grad.reshape(shape))
                )
        results = []
        for _, grad_name, desc in self._grads:
            if grad_name is not None:
                fresh = memory.zeros if grad_name in self._accumulated else memory.empty
                args[grad_name] = fresh(_shape(desc), _dtype(desc))
        self.backward_binary(**args, **self._bwd_constants)
        for name, grad_name, _ in self._grads:
            results.append(None if grad_name is None else args[grad_name])
        return results


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner: Runner, *tensors: torch.Tensor):
        outputs, saved = runner.forward(list(tensors))
        ctx.runner = runner
        ctx.saved = saved
        ctx.shapes = [t.shape for t in tensors]
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        grads = ctx.runner.backward(ctx.saved, list(grad_outputs))
        ctx.saved = None
        return (None, *(None if g is None else g.reshape(shape) for g, shape in zip(grads, ctx.shapes)))


class DcnbModule(nn.Module):
    """The user's module, running forward and backward through dcnb's compiled SDFGs.

    It holds the user's module as ``module``, so that ``parameters()`` are the user's and ``.grad`` lands on them.
    The compiled code has the example inputs' shapes baked in, and the training/eval mode the session was built in.
    """

    def __init__(self, module: nn.Module, runner: Runner, example: list[torch.Tensor], output_shapes: list):
        super().__init__()
        self.module = module
        self._runner = runner
        self._example = [(tuple(t.shape), t.dtype) for t in example]
        self._output_shapes = output_shapes
        self._params = [_resolve(module, path) for path in runner.imported.param_paths.values()]

    def forward(self, *inputs: torch.Tensor):
        if len(inputs) != len(self._example):
            raise InputError(f"{type(self.module).__name__} was compiled for {len(self._example)} inputs, got {len(inputs)}")
        for i, (t, (shape, dtype)) in enumerate(zip(inputs, self._example)):
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise InputError(
                    f"input {i} of {type(self.module).__name__} was compiled as {_fmt(shape, dtype)}; "
                    f"got {_fmt(tuple(t.shape), t.dtype)} (dcnb builds for fixed shapes: optimize again for these)"
                )
        used = [t for t, name in zip(inputs, self._runner.imported.all_inputs) if name in self._runner.imported.inputs]
        params = [p() for p in self._params]
        outputs = _Apply.apply(self._runner, *used, *params)
        outputs = [o.reshape(shape) for o, shape in zip(outputs, self._output_shapes)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _resolve(module: nn.Module, path: str):
    """A getter for a parameter or buffer by path, read at call time so that reassigned tensors are seen."""
    owner_path, _, attr = path.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return lambda: getattr(owner, attr)


def _constants(imported: Imported, sdfg) -> dict:
    result = {}
    for name, value in imported.constants.items():
        if name in sdfg.arrays and not sdfg.arrays[name].transient:
            desc = sdfg.arrays[name]
            result[name] = value.numpy()[()] if isinstance(desc, dt.Scalar) else _ready(value)
    return result


def _ready(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor whose data starts on a 64-byte boundary: vectorized code loads whole aligned vectors,
    and a view into a larger tensor (x[1:]) may start anywhere."""
    t = t.detach().contiguous()
    return t if t.data_ptr() % 64 == 0 else t.clone()


def _shape(desc: dt.Data) -> tuple[int, ...]:
    return (1,) if isinstance(desc, dt.Scalar) else tuple(int(s) for s in desc.shape)


def _dtype(desc: dt.Data) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=desc.dtype.as_numpy_dtype())).dtype


def _empty(desc: dt.Data) -> torch.Tensor:
    return memory.empty(_shape(desc), _dtype(desc))


def _fmt(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"
