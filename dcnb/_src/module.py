"""Compiled SDFGs -> a differentiable nn.Module that shares the user module's parameters."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from dace import data as dt
from dace.codegen.compiled_sdfg import CompiledSDFG
from torch import nn

from . import dace_internals, memory, native, structure
from .errors import DcnbError, InputError
from .frontend import Imported
from .passes.gradient_writes import Writes
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
        again: Again | None = None,
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
        #: (create_graph=True) gradients that are differentiable themselves, which the compiled backward's are not
        self.again: Callable[[list, list], list] = again or _no_second_derivative
        fwd = program.forward
        # (name, shape, dtype) worked out once: DaCe's descriptors are slow to read on every call
        self.outputs = [_spec(name, fwd.arrays[name]) for name in imported.outputs]
        every = range(len(self.outputs))
        #: per tensor of the call, the outputs computed from it: where none of them gets a gradient, it gets None
        self.reached_by = [
            [j for j in every if name in imported.reached.get(self.outputs[j][0], (name,))] for name in self.names
        ]
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
            writes = Writes(bwd)
            self._accumulated = {g for g in grads if g is not None and not writes.overwritten(g)}
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
            self.reached_by,
            self.again,
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
        arglist, self.order, symbolic = dace_internals.signature(binary)
        self.scalars = {n: d.dtype.as_ctypes() for n, d in arglist.items() if isinstance(d, dt.Scalar)}
        # symbolic sizes would need DaCe's own argument handling
        self.direct = not symbolic
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
        ctx.tensors = tensors  # (as called, with their history) for gradients through PyTorch: Again
        ctx.mark_non_differentiable(*updates)
        ctx.set_materialize_grads(False)  # an output without a gradient: its parameters' stay None
        return (*outputs, *updates)

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor | None):
        runner = ctx.runner
        grad_outputs = list(grad_outputs[: len(runner.outputs)])
        if torch.is_grad_enabled():  # create_graph=True
            return (None, *runner.again(list(ctx.tensors), grad_outputs))
        grads = runner.backward(dict(zip(ctx.names, ctx.saved_tensors)), grad_outputs)
        given = [g is not None for g in grad_outputs]
        return (
            None,
            *(
                None if g is None or not any(given[j] for j in reached) else g if g.shape == s else g.reshape(s)
                for g, s, reached in zip(grads, ctx.shapes, runner.reached_by)
            ),
        )


def _no_second_derivative(tensors: list[torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
    """A runner's ``again`` where it was given none (the profile's)."""
    raise DcnbError(
        "a gradient of a gradient (create_graph=True) through this compiled module was asked for, but it has "
        "no way to make one: use Session.module"
    )


class Again:
    """A call's gradients computed again through PyTorch eager, as differentiable functions of the call's tensors:
    what ``torch.autograd.grad(..., create_graph=True)`` asks of a compiled module (gradient penalties, MAML), since
    the compiled backward's gradients have no history. It reruns the user's module functionally on the call's
    inputs, parameters and buffers (copies of the buffers: running statistics move once, in the compiled forward)."""

    #: ONNX ops that draw random numbers: a run again would draw others
    RANDOM = frozenset(
        {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
    )

    def __init__(self, module: nn.Module, call: structure.Call, imported: Imported, signature: Signature):
        self._module = weakref.ref(module)  # the session holds the module; its runners must not hold the session
        self._call = call
        self._imported = imported
        self._signature = signature
        self._random = sorted(self.RANDOM & set(imported.ops)) + (
            ["Dropout"] if signature.training and "Dropout" in imported.ops else []
        )

    def __call__(self, tensors: list[torch.Tensor], grad_outputs: list[torch.Tensor | None]) -> list:
        imported, module = self._imported, self._module()
        name = type(module).__name__ if module is not None else imported.name
        if self._random:
            raise DcnbError(
                f"a gradient of a gradient (create_graph=True) through {name} is computed again by PyTorch, but "
                f"{name} draws random numbers ({', '.join(self._random)}) that a second run would draw differently: "
                "take it in eval mode, or through the original module"
            )
        if module is None:
            raise DcnbError(f"a gradient of a gradient through {name} needs its session's module, which is gone")
        given = dict(zip(imported.inputs, tensors))
        params = dict(zip(imported.param_paths.values(), tensors[len(imported.inputs) :]))
        buffers = {path: b.detach().clone() for path, b in module.named_buffers()}
        # the inputs the graph does not read are passed as zeros of their shape: no output depends on their values
        inputs = [
            given[n] if n in given else torch.zeros(shape, dtype=dtype, device=tensors[0].device)
            for n, (shape, dtype) in zip(imported.all_inputs, self._signature.inputs)
        ]
        flags = [(m, m.training) for m in module.modules()]
        module.train(self._signature.training)
        try:
            with torch.enable_grad():
                state = {**buffers, **{p: t.detach().clone() if p in buffers else t for p, t in params.items()}}
                run = lambda *xs: torch.func.functional_call(module, state, xs, strict=False)  # noqa: E731
                outputs = structure.leaves(self._call.invoke(run, inputs))
        finally:
            for m, mode in flags:
                m.training = mode
        pairs = [
            (o, g.reshape(o.shape)) for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad
        ]
        wanted = [i for i, t in enumerate(tensors) if t.requires_grad]
        grads: list = [None] * len(tensors)
        if pairs and wanted:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [tensors[i] for i in wanted],
                [g for _, g in pairs],
                create_graph=True,
                allow_unused=True,
            )
            for i, g in zip(wanted, found):
                grads[i] = g
        return grads


#: builds a compiled module keeps per step of its session, past which a call is refused (torch.compile's
#: recompile limit is the same 8)
MAX_BUILDS = 8


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a build of a module is for: its call's tensors' shapes and dtypes (in the compiled order), the dtype and
    device of its parameters, and the mode."""

    inputs: tuple[tuple[torch.Size, torch.dtype], ...]
    params: tuple[torch.dtype, torch.device] | None
    training: bool

    @classmethod
    def of(cls, inputs: list[torch.Tensor], first: torch.Tensor | None, training: bool) -> Signature:
        """The signature of a call of ``inputs``, ``first`` the module's first floating-point parameter."""
        params = None if first is None else (first.dtype, first.device)
        return cls(tuple((t.shape, t.dtype) for t in inputs), params, training)

    def __str__(self) -> str:
        shapes = ", ".join(_fmt(tuple(shape), dtype) for shape, dtype in self.inputs)
        return f"({shapes}) in {_mode(self.training)} mode"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One build of a module: its runner, and PyTorch's output shapes and result structure for that signature."""

    runner: Runner
    output_shapes: list[torch.Size]
    #: the structure of the module's result (structure.skeleton), filled with the compiled outputs
    result: Any

    @functools.cached_property
    def reshape(self) -> bool:
        """Whether the compiled outputs' shapes differ from PyTorch's (0-d in PyTorch, (1,) in the SDFG)."""
        return [tuple(s) for _, s, _ in self.runner.outputs] != [tuple(s) for s in self.output_shapes]


class Builds(Protocol):
    """Where a compiled module finds its build for a call: a session (its current step's, another shape's or
    mode's made on first use), or one build (a step's candidate)."""

    call: structure.Call

    def token(self) -> object:
        """An object that stays the same while the builds do (a session's: its current step's)."""
        ...

    def variant(self, module: nn.Module, signature: Signature, tensors: list[torch.Tensor]) -> Variant: ...

    def portable(self) -> Builds:
        """What a copy or a pickle of the compiled module carries in place of these builds."""
        ...


class OneBuild:
    """A single build, for its signature only: the module a step checks and times."""

    def __init__(self, call: structure.Call, signature: Signature, variant: Variant):
        self.call = call
        self._signature = signature
        self._variant = variant

    def token(self) -> object:
        return self

    def variant(self, module: nn.Module, signature: Signature, tensors: list[torch.Tensor]) -> Variant:
        if signature != self._signature:
            raise InputError(f"{type(module).__name__} was built for {self._signature}; got {signature}")
        return self._variant

    def portable(self) -> Builds:
        raise DcnbError("a step's candidate module cannot be copied: copy Session.module")


class DcnbModule(nn.Module):
    """The user's module, running forward and backward through dcnb's compiled SDFGs.

    It holds the user's module as ``module``, so that ``parameters()`` are the user's and ``.grad`` lands on them;
    its ``state_dict()`` has the user's module's keys. A call of a new signature (other shapes, ``train()`` or
    ``eval()``, ``.double()``) builds for it on first use (``Builds``); hooks on the user's submodules do not run.
    """

    def __init__(self, module: nn.Module, builds: Builds, training: bool):
        super().__init__()
        self.module = module
        self._builds = builds
        self.training = training
        self._prepare()
        self.register_state_dict_post_hook(_user_keys)
        self.register_load_state_dict_pre_hook(_keys_under_module)

    def _prepare(self) -> None:
        """What the calls read of the user's module, worked out once (again for a copy)."""
        #: the last call's (builds' token, key, (variant, parameter getters, which tensors of the call it takes))
        self._last: tuple | None = None
        self._submodules = list(self.module.modules())
        #: the submodules' training flags as last seen: changed together (``user.eval()``), the build follows
        self._flags = [m.training for m in self._submodules]
        self._hooks_told: tuple[str, ...] = ()
        self._attributes = _tensor_attributes(self.module)
        first = next((name for name, p in self.module.named_parameters() if p.is_floating_point()), None)
        #: the parameter a signature takes the parameters' dtype and device from (``first_floating``'s)
        self._first = None if first is None else _resolve(self.module, first)

    def train(self, mode: bool = True) -> DcnbModule:
        super().train(mode)
        self._flags = [m.training for m in self._submodules]
        return self

    def forward(self, *args: Any, **kwargs: Any):
        builds = self._builds
        try:
            inputs = builds.call.tensors(args, kwargs)
        except InputError as e:
            raise InputError(f"{type(self.module).__name__} was {e}") from None
        self._look_at_the_module()
        first = None if self._first is None else self._first()
        params = None if first is None else (first.dtype, first.device)
        try:
            key = (self.training, params, *[(t.shape, t.dtype) for t in inputs])
        except AttributeError:
            i, t = next((i, t) for i, t in enumerate(inputs) if not isinstance(t, torch.Tensor))
            raise InputError(
                f"{type(self.module).__name__} was called with a {type(t).__name__} as tensor input {i}, which was a "
                "tensor in the example call"
            ) from None
        token, last = builds.token(), self._last
        # (every call: a plain tuple compared with the last call's, a few hundred nanoseconds)
        if last is not None and last[0] is token and last[1] == key:
            variant, params, used = last[2]
        else:
            signature = Signature.of(inputs, first, self.training)
            variant = builds.variant(self.module, signature, inputs)
            params, used = self._bind(variant.runner)
            self._last = (token, key, (variant, params, used))
        tensors = [inputs[i] for i in used] + [p() for p in params]
        outputs, buffers = variant.runner.call(tensors)
        if buffers or variant.runner.imported.counters:
            self._write_back(variant.runner, buffers)
        if variant.reshape:
            outputs = [o.reshape(shape) for o, shape in zip(outputs, variant.output_shapes)]
        return structure.fill(variant.result, outputs)

    def _bind(self, runner: Runner) -> tuple[list, list[int]]:
        """The getters of the parameters and buffers a build reads (read at call time, so that reassigned tensors
        are seen), and which of the call's tensors it takes."""
        imported = runner.imported
        params = [_resolve(self.module, path) for path in imported.param_paths.values()]
        used = [i for i, name in enumerate(imported.all_inputs) if name in set(imported.inputs)]
        return params, used

    def _look_at_the_module(self) -> None:
        """Follow the mode the user's module was put in; refuse what the build cannot follow; warn of hooks."""
        submodules = self._submodules
        flags = [m.training for m in submodules]
        if flags != self._flags:
            if len(set(flags)) > 1:
                odd = [_path(self.module, m) for m in submodules if m.training != flags[0]]
                raise InputError(
                    f"{type(self.module).__name__} is in {_mode(flags[0])} mode but {', '.join(odd[:5])} in "
                    f"{_mode(not flags[0])} mode: dcnb builds a whole module in one mode; call train() or eval() on "
                    "the compiled module"
                )
            self._flags = flags
            self.training = flags[0]
        for owner, name, tensor, version, value in self._attributes:
            now = owner.__dict__.get(name)
            if now is not tensor or tensor._version != version:
                self._compiled_in_changed(owner, name, now, value)
        hooked = [
            m
            for m in submodules
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        ]
        if hooked or self._hooks_told:
            self._warn_of_hooks(tuple(_path(self.module, m) for m in hooked))

    def _warn_of_hooks(self, hooked: tuple[str, ...]) -> None:
        if hooked and hooked != self._hooks_told:
            warnings.warn(
                f"{type(self.module).__name__}'s compiled code does not call its submodules, so the hooks on "
                f"{', '.join(hooked[:5])}{' ...' if len(hooked) > 5 else ''} do not run (hooks on the compiled "
                "module itself do)",
                stacklevel=5,
            )
        self._hooks_told = hooked

    def _compiled_in_changed(self, owner: nn.Module, name: str, now: Any, value: torch.Tensor) -> None:
        """A tensor attribute (not a parameter or buffer) the export compiled in was changed or rebound: the same
        values pass (a cache computed again), other values are refused."""
        if isinstance(now, torch.Tensor) and now.shape == value.shape and torch.equal(now.detach().cpu(), value):
            self._attributes = [
                (o, n, now, now._version, v) if (o, n) == (owner, name) else (o, n, t, ver, v)
                for o, n, t, ver, v in self._attributes
            ]
            return
        raise InputError(
            f"{_path(self.module, owner) or type(self.module).__name__}.{name} changed since the build, and dcnb "
            "compiled its value in (it is a plain tensor attribute, not a parameter or buffer): register it as a "
            "buffer (register_buffer) to have it read at each call, or optimize again"
        )

    def _write_back(self, runner: Runner, buffers: dict[str, torch.Tensor]) -> None:
        """What PyTorch's training-mode forward does to the module's buffers: new running statistics, counters."""
        with torch.no_grad():
            for path, value in buffers.items():
                self.module.get_buffer(path).copy_(value.reshape(self.module.get_buffer(path).shape))
            for path in runner.imported.counters:
                self.module.get_buffer(path).add_(1)

    # --- copies ---------------------------------------------------------------------------------------------------

    #: what a DcnbModule works out of its user's module (``_prepare``): a copy works it out of its own
    _PREPARED = ("_last", "_submodules", "_flags", "_hooks_told", "_attributes", "_first")

    def __getstate__(self) -> dict[str, Any]:
        # the binaries stay behind: a pickle carries the example call and the recipe, and builds again on first use
        # (the build cache finds the binaries by their content)
        state = {k: v for k, v in self.__dict__.items() if k not in self._PREPARED}
        state["_builds"] = self._builds.portable()
        return state

    def __deepcopy__(self, memo: dict) -> DcnbModule:
        # a copy in the same process shares the builds (an EMA model, a copy to evaluate): their binaries take
        # each call's parameters, the copy's own, and build for new shapes from the same architecture
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        state = {k: v for k, v in self.__dict__.items() if k not in self._PREPARED and k != "_builds"}
        copied.__setstate__({**copy.deepcopy(state, memo), "_builds": self._builds})
        return copied

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._prepare()


def _user_keys(module: DcnbModule, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """``state_dict()`` with the user's module's own keys (``fc.weight``, not ``module.fc.weight``), so that a
    checkpoint loads into the plain module."""
    inner = prefix + "module."
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        state_dict[prefix + key.removeprefix(inner) if key.startswith(inner) else key] = value
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if k == inner[:-1] or k.startswith(inner)]:
            metadata[prefix + key.removeprefix(inner) if key != inner[:-1] else prefix[:-1]] = metadata.pop(key)


def _keys_under_module(
    module: DcnbModule, state_dict: dict, prefix: str, local_metadata, strict, missing, unexpected, errors
) -> None:
    """``load_state_dict()`` takes the user's module's keys (a checkpoint of the plain module), and those under
    ``module.`` too."""
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key.removeprefix(prefix)] = state_dict.pop(key)


def first_floating(module: nn.Module) -> torch.Tensor | None:
    """The first floating-point parameter of ``module``: a signature's parameters' dtype and device."""
    return next((p for p in module.parameters() if p.is_floating_point()), None)


def _mode(training: bool) -> str:
    return "training" if training else "eval"


def _path(root: nn.Module, module: nn.Module) -> str:
    """A submodule's path in ``root`` (``encoder.0.fc``); the root's is its class name."""
    if module is root:
        return type(root).__name__
    return next((name for name, m in root.named_modules() if m is module), type(module).__name__)


def _tensor_attributes(module: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, int, torch.Tensor]]:
    """Tensors held as plain attributes of the module's submodules (not parameters or buffers), which the export
    compiles in: (owner, name, tensor, its version, a copy of its values), to tell a change at call time."""
    found = []
    for owner in module.modules():
        for name, value in vars(owner).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                found.append((owner, name, value, value._version, value.detach().cpu().clone()))
    return found


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
