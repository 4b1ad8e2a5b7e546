"""Expansions written as DaCe programs, parsed once per signature.

DaCe's ``program_for_node`` parses an expansion's Python program into an SDFG each time a node expands (~0.3 s on
these 2 cores): a ResNet-18's 20 BatchNormalizations took 6.5 s of its 104 s naive step, though they come in five
shapes. A node whose program, constants and connectors' descriptors equal an earlier one's gets a copy of that SDFG.
dcnb's expansions call ``parsed``; DaCe's own call it in place of ``program_for_node`` (``from_dace``, installed on
import).
"""

from __future__ import annotations

import collections
import copy
import inspect
import types
from collections.abc import Callable, Hashable
from typing import Any

import dace
import numpy as np
from dace.frontend.python.parser import DaceProgram
from dace.libraries.onnx.op_implementations.utils import program_for_node
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.onnx import constant_folding

from .. import dace_internals, events

#: parsed programs kept: a model's distinct normalizations and reductions, many times over
KEPT = 256

_parsed: collections.OrderedDict[Hashable, dace.SDFG] = collections.OrderedDict()


def parsed(program: Callable, sdfg: dace.SDFG, state: dace.SDFGState, node, **globals_: Any) -> dace.SDFG:
    """``program_for_node(program, sdfg, state, node, extra_vars=globals_)``, or a copy of the SDFG it gave for the
    same program, closure, globals and connector descriptors."""
    key = _key(program, sdfg, state, node, globals_)
    if key is not None and key in _parsed:
        _parsed.move_to_end(key)
        # what program_for_node does besides parsing: the inputs the program does not take (Reshape's shape) go,
        # with what computes them only for them
        for unused in set(node.schema.non_variadic_inputs()) - set(inspect.signature(program).parameters):
            constant_folding.remove_node_and_computation(sdfg, state, node, unused)
        result = copy.deepcopy(_parsed[key])
        result.name = _name(program, node)
        return result
    events.emit("parse")
    result = program_for_node(program, sdfg, state, node, extra_vars=globals_ or None)
    if key is not None:
        _parsed[key] = copy.deepcopy(result)
        while len(_parsed) > KEPT:
            _parsed.popitem(last=False)
    return result


def _name(program: Callable, node) -> str:
    """The name a parse of ``program`` for ``node`` gives its SDFG: a copy named otherwise made an SDFG's content
    depend on what the process had parsed before (an inlined expansion's arrays are renamed after it where they
    clash: ``..._Reshape_3_expansion_data_0``), and so its build key."""
    program.__name__ = f"{node.label}_expansion"  # as program_for_node names it before it parses
    return DaceProgram(program, (), {}, False, dace.DeviceType.CPU).name


def from_dace(program: Callable, sdfg: dace.SDFG, state: dace.SDFGState, node, extra_vars: dict | None = None):
    """``parsed`` as DaCe's expansions call ``program_for_node``."""
    extra_vars = extra_vars or {}
    if extra_vars.keys() & {"program", "sdfg", "state", "node"}:  # names ``parsed`` takes for itself
        return program_for_node(program, sdfg, state, node, extra_vars=extra_vars)
    return parsed(program, sdfg, state, node, **extra_vars)


def _key(program: Callable, sdfg: dace.SDFG, state: dace.SDFGState, node, globals_: dict) -> Hashable | None:
    """What the parse depends on; None where something in it cannot be compared (then it is parsed each time)."""
    params = list(inspect.signature(program).parameters)
    inputs = set(node.in_connectors)
    try:
        descriptors = tuple(
            (name, _descriptor(in_desc_with_name(node, state, sdfg, name) if name in inputs
                               else out_desc_with_name(node, state, sdfg, name)))
            for name in params
        )
        return (
            _frozen(program),
            tuple(sorted((k, _frozen(v)) for k, v in globals_.items())),
            descriptors,
            str(node.schedule),
        )
    except (TypeError, ValueError, KeyError):
        return None


def _descriptor(desc: dace.data.Data) -> Hashable:
    return (type(desc).__name__, str(desc.dtype), tuple(map(str, desc.shape)), tuple(map(str, desc.strides)),
            str(desc.storage))


def _frozen(value: Any) -> Hashable:
    """A comparable stand-in for a value a program closes over; TypeError for one that has none."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    if isinstance(value, np.generic):
        return (str(value.dtype), value.item())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, type):
        return ("type", value.__module__, value.__qualname__)
    if isinstance(value, types.FunctionType):
        cells = tuple(_frozen(c.cell_contents) for c in value.__closure__ or ())
        return ("function", value.__code__, cells)
    if isinstance(value, DaceProgram):
        return ("program", _frozen(value.f))
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, dace.data.Data):  # a descriptor the program reads its shape from (DaCe's Unsqueeze)
        return ("data", _descriptor(value))
    raise TypeError(f"cannot compare a {type(value).__name__}")


dace_internals.replace_program_parses(from_dace)
