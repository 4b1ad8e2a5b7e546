"""Calls and results as real models have them: positional and keyword inputs, results nested in tuples, lists,
dicts and dataclasses (transformers' ``ModelOutput``) or holding None. dcnb compiles for a flat list of tensors;
this module maps a call onto that list and the list back onto the module's own structure."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .errors import InputError


class _Slot:
    """Where a tensor of the result goes."""

    def __repr__(self) -> str:
        return "<tensor>"


SLOT = _Slot()


def leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a nested result, depth first: what the export's outputs and the checks compare, in order."""
    found: list[torch.Tensor] = []
    _visit(value, lambda t: found.append(t) or SLOT)
    return found


def skeleton(value: Any) -> Any:
    """The result's structure with every tensor replaced by SLOT (keeping no tensor alive); other values stay."""
    return _visit(value, lambda t: SLOT)


def fill(shape: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """The structure ``shape`` (a ``skeleton``) with its slots filled by ``tensors``, in order."""
    given = iter(tensors)
    return _visit(shape, lambda slot: next(given), is_leaf=lambda v: v is SLOT)


def _visit(value: Any, leaf: Callable[[Any], Any], is_leaf: Callable[[Any], bool] | None = None) -> Any:
    is_leaf = is_leaf or (lambda v: isinstance(v, torch.Tensor))
    if is_leaf(value):
        return leaf(value)
    if isinstance(value, Mapping):  # dicts, OrderedDicts, transformers' ModelOutput (set fields only)
        items = {k: _visit(v, leaf, is_leaf) for k, v in value.items()}
        return _rebuilt_mapping(value, items)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_visit(v, leaf, is_leaf) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_visit(v, leaf, is_leaf) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rebuilt = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(rebuilt, field.name, _visit(getattr(value, field.name), leaf, is_leaf))
        return rebuilt
    return value  # None, numbers, strings: constants of the result


def _rebuilt_mapping(original: Mapping, items: dict) -> Mapping:
    if dataclasses.is_dataclass(original):  # ModelOutput: its constructor takes the fields by name
        return type(original)(**items)
    try:
        return type(original)(items)
    except TypeError:  # a mapping type whose constructor takes something else
        return dict(items)


def positional_names(module: torch.nn.Module) -> list[str]:
    """The names of the parameters forward() takes positionally (``x``), so that graphs and messages use them."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # a forward without a readable signature (some C extensions)
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@dataclasses.dataclass(frozen=True)
class Call:
    """How the example call passes its arguments: tensors positionally, then tensors by keyword, then keyword
    arguments that are not tensors (flags, None), which the compiled code has baked in."""

    positional: int
    keywords: tuple[str, ...] = ()
    constants: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: of the constants, those a call must give again, as left out forward() would take another value: name ->
    #: what it would take ("its default False", "no value")
    required: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call:
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                raise InputError(
                    f"example input {i} is a {type(a).__name__}, not a torch.Tensor (pass values that are not "
                    "tensors by keyword: they are compiled in as constants)"
                )
        tensors = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        constants = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        return cls(len(args), tensors, constants)

    def tensors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensors of a call in the compiled order; an InputError says how the call differs from the example."""
        if not kwargs and not self.keywords and not self.required and len(args) == self.positional:
            return list(args)  # most modules, on every call: none of the checks below applies
        if len(args) != self.positional:
            raise InputError(f"compiled for {self.positional} positional inputs, got {len(args)}")
        names = set(self.keywords) | set(self.constants)
        if set(kwargs) - names or set(self.keywords) - set(kwargs):
            wanted = ", ".join(self.keywords) or "none"
            raise InputError(f"compiled for the keyword inputs {wanted}, got {', '.join(kwargs) or 'none'}")
        for k, v in kwargs.items():
            if k in self.constants and not _same(v, self.constants[k]):
                raise InputError(f"{k}={v!r} differs from the {self.constants[k]!r} the module was compiled with")
        for k, left_out in self.required.items():
            if k not in kwargs:
                raise InputError(
                    f"called without {k}, which would take {left_out}; it was compiled with {k}="
                    f"{self.constants[k]!r}: pass {k}={self.constants[k]!r}, or optimize again without it"
                )
        return [*args, *(kwargs[k] for k in self.keywords)]

    def invoke(self, fn: Callable[..., Any], tensors: Sequence[torch.Tensor]) -> Any:
        """``fn`` called as the example was, with ``tensors`` in the compiled order."""
        n = self.positional
        return fn(*tensors[:n], **dict(zip(self.keywords, tensors[n:])), **self.constants)


def left_out(module: torch.nn.Module, constants: Mapping[str, Any]) -> dict[str, str]:
    """Of the keyword constants of an example call, those a later call leaving them out would give forward() with
    another value (its default differs, or it has none): name -> what it would take then."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    found = {}
    for name, value in constants.items():
        p = parameters.get(name)
        if p is None or p.default is p.empty:
            found[name] = "no value"
        elif not _same(p.default, value):
            found[name] = f"its default {p.default!r}"
    return found


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # objects whose equality is not a bool
        return a is b
