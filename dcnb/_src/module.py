"""Compiled SDFGs -> a differentiable nn.Module that shares the user module's parameters."""

from __future__ import annotations

import ctypes
import threading
import warnings
import weakref
from typing import Any

import numpy as np
import torch
from dace import data as dt
from dace.codegen.compiled_sdfg import CompiledSDFG
from torch import nn

from . import dace_internals, memory, native, structure
from .errors import InputError
from .frontend import Imported
from .passes.gradient_writes import overwritten
from .program import Program


# we pass output arrays ourselves, which DaCe notes on every first call of a binary
warnings.filterwarnings("ignore", message='Return value "__return', category=UserWarning)


class Runner:
    """Calls a Program's compiled forward and backward with torch tensors: from C++ (native.cpp) where the binaries
    take pointers only, else from Python (``forward``, ``backward``, ``_Apply``)."""

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
        self.outputs = [_spec(name, fwd.arrays[name]) for name in imported.outputs]
        self._updates = [_spec(name, fwd.arrays[name]) for name in imported.buffer_updates]
        self._constants = _constants(imported, fwd, self.device)
        # constants the backward reads are passed to it as constants, not stored by the forward
        given = set(self.names) | set(imported.outputs) | set(imported.constants)
        self._stored = [_spec(name, fwd.arrays[name]) for name in program.forwarded if name not in given]
        self._bwd_constants: dict = {}
        if backward is not None:
            bwd = program.backward
            grads = [program.input_grads.get(name) for name in self.names]
            self._grads = [None if g is None else _spec(g, bwd.arrays[g]) for g in grads]
            self._output_grads = [
                (program.output_grads.get(name), shape, dtype) for name, shape, dtype in self.outputs
            ]
            # gradients the backward accumulates into must start at zero; those it overwrites need not
            self._accumulated = {g for g in grads if g is not None and not overwritten(bwd, g)}
            self._bwd_constants = _constants(imported, bwd, self.device)
            # what the forward keeps for the backward (not the running statistics it updates, say)
            self.saved_names = [n for n in program.forwarded if n not in self._bwd_constants]
        # DaCe's CUDA binaries select device 0 (the process's first visible GPU): tensors elsewhere go through Python
        on_gpu = self.device.type == "cuda" and self.device.index in (None, 0) and native.calls_cuda()
        self._native = native.extension() if (self.device.type == "cpu" and native.calls()) or on_gpu else None
        self._plan = None if self._native is None else self._make_plan()

    def call(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Outputs, and new values of buffers by path (BatchNorm statistics); through autograd where there is
        something to differentiate, else without its bookkeeping (a good part of a small call's cost)."""
        if self._plan is not None:
            results = self._native.call(self._plan, tensors)
        elif self.backward_binary is not None and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            results = _Apply.apply(self, *tensors)
        else:
            outputs, _, updates = self.forward(tensors)
            results = outputs + updates
        n = len(self.outputs)
        if len(results) == n:  # most modules: no buffers to update
            return list(results), {}
        return list(results[:n]), dict(zip(self.imported.buffer_updates.values(), results[n:]))

    def forward(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], list[torch.Tensor]]:
        """Outputs, what the backward needs, and new values of buffers (in ``imported.buffer_updates``' order)."""
        args = {name: _ready(t) for name, t in zip(self.names, tensors)}
        outputs = [self._empty(shape, dtype) for _, shape, dtype in self.outputs]
        saved = {**args, **{name: t for (name, _, _), t in zip(self.outputs, outputs)}}
        for name, shape, dtype in self._stored:
            saved[name] = self._empty(shape, dtype)
        updates = {name: self._empty(shape, dtype) for name, shape, dtype in self._updates}
        self._forward_call({**saved, **updates, **self._constants})
        return outputs, saved, list(updates.values())

    def backward(self, saved: dict[str, torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
        """Gradients of the call's tensors (None where there is none), from what ``forward`` saved (by name, those in
        ``saved_names``) and the outputs' gradients."""
        assert self._backward_call is not None
        args = dict(saved)
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

    def _make_plan(self):
        """Where each argument of each binary comes from, for native.cpp; None where a binary has no entry for it
        or takes what it cannot give (symbolic sizes, scalars that are not constants)."""
        calls = [c for c in (self._forward_call, self._backward_call) if c is not None]
        if not all(c.direct for c in calls):  # (and their initialization would take the symbols' values)
            return None
        entries = [native.entry(c.binary) for c in calls]
        if None in entries:
            return None
        n, n_out = len(self.names), len(self.outputs)
        # later sources win, as in ``forward``'s and ``backward``'s argument dicts
        sources: dict[str, tuple[int, int]] = {}
        saved_index: dict[str, int] = {}
        for kind, names, offset in (
            (_INPUT, self.names, 0),
            (_OUTPUT, [o[0] for o in self.outputs], n),
            (_STORED, [s[0] for s in self._stored], n + n_out),
        ):
            for i, name in enumerate(names):
                sources[name] = (kind, i)
                saved_index[name] = offset + i
        sources |= {name: (_UPDATE, i) for i, (name, _, _) in enumerate(self._updates)}
        sources |= {name: (_CONSTANT, i) for i, name in enumerate(self._constants)}
        backward_slots, save = [], []
        if self._backward_call is not None:
            bwd_sources: dict[str, tuple[int, int]] = {}
            for name in self.saved_names:
                if name in saved_index:
                    save.append(saved_index[name])
                    bwd_sources[name] = (_SAVED, len(save) - 1)
            for i, (grad_name, _, _) in enumerate(self._output_grads):
                if grad_name is not None:
                    bwd_sources[grad_name] = (_OUTPUT_GRAD, i)
            for i, spec in enumerate(self._grads):
                if spec is not None:
                    bwd_sources[spec[0]] = (_GRAD, i)
            bwd_sources |= {name: (_CONSTANT, i) for i, name in enumerate(self._bwd_constants)}
            if any(name not in bwd_sources for name in self._backward_call.order):
                return None
            backward_slots = [bwd_sources[name] for name in self._backward_call.order]
        if any(name not in sources for name in self._forward_call.order):
            return None
        forward_slots = [sources[name] for name in self._forward_call.order]
        fwd, bwd = self.forward_binary, self.backward_binary
        grads = self._grads if bwd is not None else []
        return self._native.plan(
            *entries[0],
            *(entries[1] if bwd is not None else (0, 0)),
            forward_slots,
            backward_slots,
            [(list(shape), dtype) for _, shape, dtype in self.outputs],
            [(list(shape), dtype) for _, shape, dtype in self._stored],
            [(list(shape), dtype) for _, shape, dtype in self._updates],
            [None if g is None else (list(g[1]), g[2]) for g in grads],
            [g is not None and g[0] in self._accumulated for g in grads],
            save,
            [_one_element(v) for v in self._constants.values()],
            [_one_element(v) for v in self._bwd_constants.values()],
            (fwd, bwd),
            str(self.device),
            *(self._cuda_launch(b) for b in (fwd, bwd)),
        )

    def _cuda_launch(self, binary: CompiledSDFG | None) -> tuple[int, bool]:
        """How native.cpp calls a binary on the GPU (native.cuda_launch); nothing to say for the CPU's."""
        return native.cuda_launch(binary) if binary is not None and self.device.type == "cuda" else (0, False)

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
        # (CUDA) the binary's one stream, set to PyTorch's current one before each call (build.py)
        self.set_streams = binary.get_exported_function("__dace_gpu_set_all_streams")

    def __call__(self, args: dict) -> None:
        # a CPU binary keeps its scratch arrays in its state (passes/lifetimes.py): one call at a time
        with _serial(self.binary):
            self._call(args)

    def _call(self, args: dict) -> None:
        if self.set_streams is not None:
            if not self.direct:  # its initialization takes the symbols
                self.binary.initialize(**args)
            state = dace_internals.initialized_state(self.binary)
            self.set_streams(ctypes.c_void_p(state), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if not (self.ready and self.direct):
            self.binary(**args)
            self.ready = True
            dace_internals.release_arguments(self.binary)
            return
        scalars = self.scalars
        pointers = tuple(
            scalars[n](args[n]) if n in scalars else ctypes.c_void_p(args[n].data_ptr()) for n in self.order
        )
        self.binary.fast_call(pointers, (), do_gpu_check=True)


_LOCKS: weakref.WeakKeyDictionary[CompiledSDFG, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _serial(binary: CompiledSDFG) -> threading.Lock:
    """The lock a binary's calls hold (native.cpp has its own for the C++ path)."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(binary, threading.Lock())


# where native.cpp finds an argument (its enum Kind)
_INPUT, _OUTPUT, _STORED, _UPDATE, _CONSTANT, _SAVED, _OUTPUT_GRAD, _GRAD = range(8)


def _one_element(value) -> torch.Tensor:
    """A constant as native.cpp passes it: a tensor, a scalar's as one element (its entry reads it by pointer)."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value).reshape(1))


class _Apply(torch.autograd.Function):
    """The Python path's autograd function: outputs, then new buffer values (not differentiable)."""

    @staticmethod
    def forward(ctx, runner: Runner, *tensors: torch.Tensor):
        outputs, saved, updates = runner.forward(list(tensors))
        ctx.runner = runner
        # saved through autograd: a second backward needs retain_graph, and an output changed in place since the
        # forward is caught, as for PyTorch's own functions
        ctx.names = runner.saved_names
        ctx.save_for_backward(*(saved[name] for name in ctx.names))
        ctx.shapes = [t.shape for t in tensors]
        ctx.mark_non_differentiable(*updates)
        return (*outputs, *updates)

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        runner = ctx.runner
        grads = runner.backward(dict(zip(ctx.names, ctx.saved_tensors)), list(grad_outputs[: len(runner.outputs)]))
        return (None, *(g if g is None or g.shape == s else g.reshape(s) for g, s in zip(grads, ctx.shapes)))


class DcnbModule(nn.Module):
    """The user's module, running forward and backward through dcnb's compiled SDFGs.

    It holds the user's module as ``module``, so that ``parameters()`` are the user's and ``.grad`` lands on them.
    The compiled code has the example inputs' shapes baked in, and the training/eval mode the session was built in.
    """

    def __init__(
        self,
        module: nn.Module,
        runner: Runner,
        example: list[torch.Tensor],
        output_shapes: list,
        call: structure.Call,
        result: Any,
    ):
        super().__init__()
        self.module = module
        self._runner = runner
        self._example = [(t.shape, t.dtype) for t in example]
        self._call = call
        #: the structure of the module's result (structure.skeleton), filled with the compiled outputs
        self._result = result
        self._output_shapes = output_shapes
        # the compiled code's output shapes differ where PyTorch's are 0-d (the SDFG's are (1,))
        self._reshape = [tuple(s) for _, s, _ in runner.outputs] != [tuple(s) for s in output_shapes]
        self._params = [_resolve(module, path) for path in runner.imported.param_paths.values()]
        imported = runner.imported
        self._used = [i for i, name in enumerate(imported.all_inputs) if name in set(imported.inputs)]

    def forward(self, *args: torch.Tensor, **kwargs: Any):
        try:
            inputs = self._call.tensors(args, kwargs)
        except InputError as e:
            raise InputError(f"{type(self.module).__name__} was {e}") from None
        for i, (t, (shape, dtype)) in enumerate(zip(inputs, self._example)):
            if t.shape != shape or t.dtype != dtype:
                raise InputError(
                    f"input {i} of {type(self.module).__name__} was compiled as {_fmt(shape, dtype)}; "
                    f"got {_fmt(tuple(t.shape), t.dtype)} (dcnb builds for fixed shapes: optimize again for these)"
                )
        tensors = [inputs[i] for i in self._used] + [p() for p in self._params]
        outputs, buffers = self._runner.call(tensors)
        self._write_back(buffers)
        if self._reshape:
            outputs = [o.reshape(shape) for o, shape in zip(outputs, self._output_shapes)]
        return structure.fill(self._result, outputs)

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
