"""Compiled SDFGs -> a differentiable nn.Module that shares the user module's parameters."""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable

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

    def __init__(
        self,
        imported: Imported,
        program: Program,
        forward: CompiledSDFG,
        backward: CompiledSDFG | None,
        device: str = "cpu",
    ):
        self.imported = imported
        self.device = torch.device(device)
        self.program = program
        self.forward_binary = forward
        self.backward_binary = backward
        self._forward_call = _Call(forward)
        self._backward_call = None if backward is None else _Call(backward)
        self.params = list(imported.param_paths)
        self.names = imported.inputs + self.params
        fwd = program.forward
        # (name, shape, dtype) worked out once: DaCe's descriptors are slow to read on every call
        self._outputs = [_spec(name, fwd.arrays[name]) for name in imported.outputs]
        self._updates = [_spec(name, fwd.arrays[name]) for name in imported.buffer_updates]
        self._constants = _constants(imported, fwd, self.device)
        # constants the backward reads are passed to it as constants, not stored by the forward
        given = set(self.names) | set(imported.outputs) | set(imported.constants)
        self._stored = [_spec(name, fwd.arrays[name]) for name in program.forwarded if name not in given]
        if backward is not None:
            bwd = program.backward
            grads = [program.input_grads.get(name) for name in self.names]
            self._grads = [None if g is None else _spec(g, bwd.arrays[g]) for g in grads]
            self._output_grads = [
                (program.output_grads.get(name), shape, dtype) for name, shape, dtype in self._outputs
            ]
            # gradients the backward accumulates into must start at zero; those it overwrites need not
            self._accumulated = {g for g in grads if g is not None and not overwritten(bwd, g)}
            self._bwd_constants = _constants(imported, bwd, self.device)

    def forward(
        self, tensors: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Outputs, what the backward needs, and new values of buffers by path (BatchNorm statistics)."""
        args = {name: _ready(t) for name, t in zip(self.names, tensors)}
        outputs = [self._empty(shape, dtype) for _, shape, dtype in self._outputs]
        saved = {**args, **{name: t for (name, _, _), t in zip(self._outputs, outputs)}}
        for name, shape, dtype in self._stored:
            saved[name] = self._empty(shape, dtype)
        updates = {name: self._empty(shape, dtype) for name, shape, dtype in self._updates}
        self._forward_call({**saved, **updates, **self._constants})
        buffers = {self.imported.buffer_updates[name]: t for name, t in updates.items()}
        return outputs, saved, buffers

    def backward(self, saved: dict[str, torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
        assert self._backward_call is not None
        args = {name: saved[name] for name in self.program.forwarded if name not in self._bwd_constants}
        for (grad_name, shape, dtype), grad in zip(self._output_grads, grad_outputs):
            if grad_name is not None:
                args[grad_name] = self._zeros(shape, dtype) if grad is None else _ready(grad, shape)
        results = []
        for spec in self._grads:
            if spec is None:
                results.append(None)
                continue
            name, shape, dtype = spec
            fresh = self._zeros if name in self._accumulated else self._empty
            args[name] = fresh(shape, dtype)
            results.append(args[name])
        self._backward_call({**args, **self._bwd_constants})
        return results

    def _empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return memory.empty(shape, dtype)
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return memory.zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)


class _Call:
    """Calls a binary with a dict of tensors and scalars through ``CompiledSDFG.fast_call``, passing raw pointers in
    the C signature's order: DaCe's ``__call__`` converts and checks every argument each time, which costs ~90 us
    per call, more than PyTorch's whole dispatch of a small op. The first call goes through ``__call__``, which
    loads and initializes the library (and checks the arguments once)."""

    def __init__(self, binary: CompiledSDFG):
        self.binary = binary
        arglist = binary.sdfg.arglist()
        self.order = binary.sdfg.signature_arglist(with_types=False, arglist=arglist)
        self.scalars = {n: d.dtype.as_ctypes() for n, d in arglist.items() if isinstance(d, dt.Scalar)}
        # symbolic sizes would need DaCe's own argument handling
        self.direct = not binary.sdfg.free_symbols
        self.ready = False

    def __call__(self, args: dict) -> None:
        if not (self.ready and self.direct):
            self.binary(**args)
            self.ready = True
            _release_arguments(self.binary)
            return
        scalars = self.scalars
        pointers = tuple(
            scalars[n](args[n]) if n in scalars else ctypes.c_void_p(args[n].data_ptr()) for n in self.order
        )
        self.binary.fast_call(pointers, (), do_gpu_check=True)


def _release_arguments(binary: CompiledSDFG) -> None:
    """Drop the references DaCe keeps to a ``__call__``'s arguments (for workspace queries and return values we do
    not use): they would hold those tensors, pooled output buffers among them, for as long as the binary lives, and
    the pool would hand out fresh (page-faulting) memory instead."""
    binary._lastargs = None
    binary._return_arrays = ()
    binary._argument_to_pyobject.clear()


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner: Runner, write_back: Callable[[dict[str, torch.Tensor]], None], *tensors: torch.Tensor):
        outputs, saved, buffers = runner.forward(list(tensors))
        write_back(buffers)
        ctx.runner = runner
        # saved through autograd: a second backward needs retain_graph, and an output changed in place since the
        # forward is caught, as for PyTorch's own functions
        ctx.names = list(saved)
        ctx.save_for_backward(*saved.values())
        ctx.shapes = [t.shape for t in tensors]
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        grads = ctx.runner.backward(dict(zip(ctx.names, ctx.saved_tensors)), list(grad_outputs))
        return (None, None, *(g if g is None or g.shape == s else g.reshape(s) for g, s in zip(grads, ctx.shapes)))


class DcnbModule(nn.Module):
    """The user's module, running forward and backward through dcnb's compiled SDFGs.

    It holds the user's module as ``module``, so that ``parameters()`` are the user's and ``.grad`` lands on them.
    The compiled code has the example inputs' shapes baked in, and the training/eval mode the session was built in.
    """

    def __init__(self, module: nn.Module, runner: Runner, example: list[torch.Tensor], output_shapes: list):
        super().__init__()
        self.module = module
        self._runner = runner
        self._example = [(t.shape, t.dtype) for t in example]
        self._output_shapes = output_shapes
        self._params = [_resolve(module, path) for path in runner.imported.param_paths.values()]
        imported = runner.imported
        self._used = [i for i, name in enumerate(imported.all_inputs) if name in set(imported.inputs)]

    def forward(self, *inputs: torch.Tensor):
        if len(inputs) != len(self._example):
            raise InputError(f"{type(self.module).__name__} was compiled for {len(self._example)} inputs, got {len(inputs)}")
        for i, (t, (shape, dtype)) in enumerate(zip(inputs, self._example)):
            if t.shape != shape or t.dtype != dtype:
                raise InputError(
                    f"input {i} of {type(self.module).__name__} was compiled as {_fmt(shape, dtype)}; "
                    f"got {_fmt(tuple(t.shape), t.dtype)} (dcnb builds for fixed shapes: optimize again for these)"
                )
        tensors = [inputs[i] for i in self._used] + [p() for p in self._params]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            outputs = _Apply.apply(self._runner, self._write_back, *tensors)
        else:  # nothing to differentiate: skip autograd's bookkeeping (a good part of a small call's cost)
            outputs, _, buffers = self._runner.forward(tensors)
            self._write_back(buffers)
        outputs = [o if o.shape == shape else o.reshape(shape) for o, shape in zip(outputs, self._output_shapes)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _write_back(self, buffers: dict[str, torch.Tensor]) -> None:
        """What PyTorch's training-mode forward does to the module's buffers: new running statistics, counters."""
        counters = self._runner.imported.counters
        if not buffers and not counters:
            return  # most modules: on every call, so no grad-mode switch for nothing (a few microseconds)
        with torch.no_grad():
            for path, value in buffers.items():
                self.module.get_buffer(path).copy_(value.reshape(self.module.get_buffer(path).shape))
            for path in counters:
                self.module.get_buffer(path).add_(1)


def _resolve(module: nn.Module, path: str):
    """A getter for a parameter or buffer by path, read at call time so that reassigned tensors are seen."""
    owner_path, _, attr = path.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return lambda: getattr(owner, attr)


def _constants(imported: Imported, sdfg, device: torch.device) -> dict:
    result = {}
    for name, value in imported.constants.items():
        if name in sdfg.arrays and not sdfg.arrays[name].transient:
            desc = sdfg.arrays[name]
            result[name] = value.cpu().numpy()[()] if isinstance(desc, dt.Scalar) else _ready(value.to(device))
    return result


def _ready(t: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A detached contiguous tensor (of ``shape``) whose data starts on a 64-byte boundary: vectorized code loads
    whole aligned vectors, and a view into a larger tensor (x[1:]) may start anywhere."""
    if t.requires_grad:
        t = t.detach()
    if shape is not None and t.shape != shape:
        t = t.reshape(shape)
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.data_ptr() % 64 == 0 else t.clone()


def _spec(name: str, desc: dt.Data) -> tuple[str, tuple[int, ...], torch.dtype]:
    return name, _shape(desc), _dtype(desc)


def _shape(desc: dt.Data) -> tuple[int, ...]:
    return (1,) if isinstance(desc, dt.Scalar) else tuple(int(s) for s in desc.shape)


def _dtype(desc: dt.Data) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=desc.dtype.as_numpy_dtype())).dtype


def _fmt(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"
