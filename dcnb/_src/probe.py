"""The user's forward run once under watch, before the export: what the export would silently get wrong.

PyTorch's ONNX export traces one call. A forward that writes into its inputs, or that turns a tensor computed
from its inputs or parameters into a Python value (``if x.sum() > 0:``, ``x.max().item()``), traces without an
error: the export keeps the branch the example inputs take, or the number they give, as a constant, and the
compiled module then differs from the user's for other inputs. ``check_forward`` raises InputError naming the
line of the user's code that does it. Installed libraries' code (PyTorch's, transformers') is not the user's: it
converts tensors in checks of its own, or where it is not traced (as the export traces it).
"""

from __future__ import annotations

import linecache
import os
import site
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from . import structure
from .errors import InputError
from .verify import preserved

#: tensor methods that hand a tensor's value to Python
_CONVERSIONS = {
    "__bool__": "a Python bool",
    "item": "a Python number",
    "__int__": "a Python int",
    "__float__": "a Python float",
    "__complex__": "a Python complex",
    "__index__": "a Python int",
    "tolist": "a Python list",
    "numpy": "a NumPy array",
}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_DCNB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: installed code (PyTorch, transformers, the standard library), whose conversions are its own business: transformers
#: skips an all-ones attention mask on a tensor's value unless it is traced, as the export does
_LIBRARIES = tuple(
    {
        os.path.join(form, "")
        for d in (
            site.getusersitepackages(),
            *site.getsitepackages(),
            *map(sysconfig.get_path, ("stdlib", "purelib", "platlib")),
        )
        if d
        for form in (d, os.path.realpath(d))
    }
    | {_TORCH_DIR}
)
#: PyTorch's Python wrappers between a call in the user's code and the function it dispatches to
_WRAPPERS = ("overrides.py", "_tensor.py")


def check_forward(
    module: nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    backward: bool,
    training: bool,
    invoke: Callable[[nn.Module, list[torch.Tensor]], Any] | None = None,
    keywords: Sequence[str] = (),
) -> None:
    """Raise InputError if ``module`` has nothing to differentiate (with ``backward``), writes into its inputs or
    branches on (or takes a number from) a tensor's values in the user's code.

    The module runs once, without gradients, on copies of ``inputs``, in ``training`` mode, called by ``invoke``
    (default: positionally), where the last inputs are those passed by the names ``keywords``; it is left as it was
    (parameters, buffers, modes). An exception in its forward is left for the session's eager run to report.
    """
    name = type(module).__name__
    trainable = any(p.requires_grad for p in module.parameters())
    if backward and not trainable and not any(t.is_floating_point() for t in inputs):
        raise InputError(
            f"{name} has nothing to differentiate: it has no parameter that requires a gradient and none of its "
            "inputs is a floating-point tensor; build the forward only (backward=False, or --no-backward in "
            "%%dcoptimize)"
        )
    device = next((t.device for t in (*module.parameters(), *module.buffers())), None)
    copies = [t.detach().clone() if device is None else t.detach().to(device, copy=True) for t in inputs]
    watch = _Watch(copies, list(module.parameters()))
    try:
        with preserved(module, training), torch.no_grad(), watch:
            (invoke or (lambda fn, tensors: fn(*tensors)))(module, copies)
    except Exception:  # noqa: BLE001, S110 -- the eager run reports it, without this watch in the way
        pass
    if watch.written is not None:
        index, func, place = watch.written
        where = func + (f", {_where(place)}" if place else "")
        raise InputError(
            f"{name} writes into its input `{_input_label(module, index, len(inputs), keywords)}` in place ({where}); "
            "dcnb's compiled module leaves its inputs as they are and cannot do the same: compute a new tensor "
            "instead (x = x * 2, not x.mul_(2) or x *= 2)"
        )
    if watch.converted is not None:
        what, place = watch.converted
        raise InputError(
            f"{name}'s forward depends on its data in Python"
            + (f" ({_where(place)})" if place else "")
            + f": it turns a tensor computed from its inputs or parameters into {what}, and PyTorch's ONNX export "
            "records one call, so the branch the example inputs take (or the value they give) would be compiled in "
            "for every input; write it with tensor operations (torch.where, masks, tensor arithmetic)"
        )


class _Watch(TorchFunctionMode):
    """Sees every torch call of one forward: where an input is written into, and where a value computed from the
    inputs or parameters becomes a Python value."""

    def __init__(self, inputs: list[torch.Tensor], params: list[torch.Tensor]):
        super().__init__()
        self.inputs = inputs
        #: id -> weak reference of each tensor computed from the inputs or parameters (ids are checked against
        #: the reference: a freed tensor's id may come back for an unrelated one)
        self._derived: dict[int, weakref.ref] = {}
        for t in (*inputs, *params):
            self._derive(t)
        #: (input index, function, place in the user's code) of the first write into an input
        self.written: tuple[int, str, tuple[str, int, str] | None] | None = None
        #: (what the value became, place in the user's code) of the first conversion
        self.converted: tuple[str, tuple[str, int, str] | None] | None = None

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if self.converted is None and name in _CONVERSIONS and any(self._is_derived(t) for t in tensors):
            caller = _caller(sys._getframe(1))
            if caller is not None:  # a conversion inside PyTorch's own code (shape checks) is PyTorch's business
                self.converted = (_CONVERSIONS[name], _place(caller))
        versions = [t._version for t in self.inputs]
        before = [(t, t._version) for t in tensors]
        result = func(*args, **kwargs)
        if self.written is None:
            changed = [i for i, (t, v) in enumerate(zip(self.inputs, versions)) if t._version != v]
            if changed:
                frame = _user_frame(sys._getframe(1))
                self.written = (changed[0], _qualified(func), None if frame is None else _place(frame))
        if any(self._is_derived(t) for t in tensors):
            outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for t in outputs + [t for t, v in before if t._version != v]:
                self._derive(t)
        return result

    def _derive(self, t: torch.Tensor) -> None:
        self._derived[id(t)] = weakref.ref(t)

    def _is_derived(self, t: torch.Tensor) -> bool:
        ref = self._derived.get(id(t))
        return ref is not None and ref() is t


def _caller(frame: types.FrameType | None) -> types.FrameType | None:
    """The frame that made a call, past PyTorch's Python wrappers; None where that is an installed library's (PyTorch,
    transformers) or dcnb's own."""
    while (
        frame is not None
        and frame.f_code.co_filename.startswith(_TORCH_DIR)
        and frame.f_code.co_filename.endswith(_WRAPPERS)
    ):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith((*_LIBRARIES, _DCNB_DIR)):
        return None
    return frame


def _user_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The innermost frame of the user's code (outside installed libraries) in a forward: None where a library's
    code was called from dcnb (a module of torch.nn itself)."""
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
    return None if frame is None or frame.f_code.co_filename.startswith(_DCNB_DIR) else frame


def user_line(tb: types.TracebackType | None) -> str:
    """Where an exception was raised in the user's code (its innermost frame outside installed libraries, inside what
    dcnb called), as `` (Cell In[3], line 4: `return x @ w`)``; empty where the traceback has no such frame."""
    found = None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if path.startswith(_DCNB_DIR):
            found = None  # what called dcnb is not the forward
        elif not path.startswith(_LIBRARIES):
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    return "" if found is None else f" ({_where(_source(*found))})"


def _place(frame: types.FrameType) -> tuple[str, int, str]:
    return _source(frame.f_code.co_filename, frame.f_lineno)


def _source(path: str, lineno: int) -> tuple[str, int, str]:
    return path, lineno, linecache.getline(path, lineno).strip()


def _where(place: tuple[str, int, str]) -> str:
    """``Cell In[3], line 4: `if x.sum() > 0:` `` (IPython's name for a cell), or ``models.py:12: `...` ``."""
    path, lineno, code = place
    where = f"{os.path.basename(path)}:{lineno}"
    try:
        from IPython import get_ipython

        shell = get_ipython()
        named = shell.compile.format_code_name(path) if shell is not None else None
        if named:
            where = f"{named[0]} {named[1]}, line {lineno}"
    except Exception:  # noqa: BLE001, S110 -- no IPython, or one without cell names: the file's name says enough
        pass
    return where + (f": `{code}`" if code else "")


def _qualified(func: Any) -> str:
    name = getattr(func, "__name__", repr(func))
    owner = getattr(func, "__qualname__", name).split(".")[0]
    if owner in ("Tensor", "TensorBase"):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{'torch' if module.startswith('torch._C') else module}.{name}"


def _input_label(module: nn.Module, index: int, count: int, keywords: Sequence[str]) -> str:
    """The name of input ``index`` of ``count`` (the last of which are passed by the names ``keywords``): forward()'s
    name for it where it has one (``x``), else its position."""
    positional = count - len(keywords)
    if index >= positional:
        return keywords[index - positional]
    params = structure.positional_names(module)
    return params[index] if index < len(params) else f"{index}"
