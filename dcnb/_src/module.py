"""Compiled SDFGs -> a differentiable nn.Module that shares the user module's parameters."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from dace import data as dt
from dace.codegen.compiled_sdfg import CompiledSDFG
from torch import nn

from .errors import InputError
from .frontend import Imported
from .program import Program


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
        self._updates = [(name, fwd.arrays[name]) for name in imported.buffer_updates]
        self._constants = _constants(imported, fwd)
        # constants the backward reads are passed to it as constants, not stored by the forward
        given = set(self.names) | set(imported.outputs) | set(imported.constants)
        self._stored = [(name, fwd.arrays[name]) for name in program.forwarded if name not in given]
        if backward is not None:
            bwd = program.backward
            self._grads = [
                (name, program.input_grads.get(name), bwd.arrays.get(program.input_grads.get(name)))
                for name in self.names
            ]
            self._output_grads = [(program.output_grads.get(name), desc) for name, desc in self._outputs]
            self._bwd_constants = _constants(imported, bwd)

    def forward(
        self, tensors: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Outputs, what the backward needs, and new values of buffers by path (BatchNorm statistics)."""
        args = {name: t.detach().contiguous() for name, t in zip(self.names, tensors)}
        outputs = {name: _empty(desc) for name, desc in self._outputs}
        stored = {name: _empty(desc) for name, desc in self._stored}
        updates = {name: _empty(desc) for name, desc in self._updates}
        self.forward_binary(**args, **outputs, **stored, **updates, **self._constants)
        saved = {**args, **outputs, **stored}
        buffers = {self.imported.buffer_updates[name]: t for name, t in updates.items()}
        return list(outputs.values()), saved, buffers

    def backward(self, saved: dict[str, torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
        assert self.backward_binary is not None
        args = {name: saved[name] for name in self.program.forwarded if name not in self._bwd_constants}
        for (grad_name, desc), grad in zip(self._output_grads, grad_outputs):
            if grad_name is not None:
                shape = _shape(desc)
                args[grad_name] = (
                    torch.zeros(shape, dtype=_dtype(desc)) if grad is None else grad.detach().reshape(shape).contiguous()
                )
        results = []
        for _, grad_name, desc in self._grads:
            if grad_name is not None:
                args[grad_name] = torch.zeros(_shape(desc), dtype=_dtype(desc))
        self.backward_binary(**args, **self._bwd_constants)
        for name, grad_name, _ in self._grads:
            results.append(None if grad_name is None else args[grad_name])
        return results


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner: Runner, write_back: Callable[[dict[str, torch.Tensor]], None], *tensors: torch.Tensor):
        outputs, saved, buffers = runner.forward(list(tensors))
        write_back(buffers)
        ctx.runner = runner
        ctx.saved = saved
        ctx.shapes = [t.shape for t in tensors]
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        grads = ctx.runner.backward(ctx.saved, list(grad_outputs))
        ctx.saved = None
        return (None, None, *(None if g is None else g.reshape(shape) for g, shape in zip(grads, ctx.shapes)))


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
        outputs = _Apply.apply(self._runner, self._write_back, *used, *params)
        outputs = [o.reshape(shape) for o, shape in zip(outputs, self._output_shapes)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @torch.no_grad()
    def _write_back(self, buffers: dict[str, torch.Tensor]) -> None:
        """What PyTorch's training-mode forward does to the module's buffers: new running statistics, counters."""
        for path, value in buffers.items():
            self.module.get_buffer(path).copy_(value.reshape(self.module.get_buffer(path).shape))
        for path in self._runner.imported.counters:
            self.module.get_buffer(path).add_(1)


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
            result[name] = value.numpy()[()] if isinstance(desc, dt.Scalar) else value
    return result


def _shape(desc: dt.Data) -> tuple[int, ...]:
    return (1,) if isinstance(desc, dt.Scalar) else tuple(int(s) for s in desc.shape)


def _dtype(desc: dt.Data) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=desc.dtype.as_numpy_dtype())).dtype


def _empty(desc: dt.Data) -> torch.Tensor:
    return torch.empty(_shape(desc), dtype=_dtype(desc))


def _fmt(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"
