"""nn.Module + example inputs -> the forward SDFG DaCe imports from its ONNX export.

This is the only module that talks to PyTorch's ONNX exporter and DaCe's importer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import linecache
import os
import re
import tempfile
import warnings

import dace
import onnx
import torch
from dace.frontend.ml.onnx import ONNXModel
from dace.libraries.onnx.converters import clean_onnx_name
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node, has_onnx_node
from torch import nn

from .errors import DcnbError, UnsupportedOpError

OPSET = 18


@dataclasses.dataclass
class Imported:
    """What the importer made of a module: its forward SDFG and how to call it."""

    name: str
    sdfg: dace.SDFG
    #: SDFG array names of all example inputs, in call order
    all_inputs: list[str]
    #: those of them the graph reads
    inputs: list[str]
    #: SDFG array name -> path of the parameter or buffer in the module (``lin.weight``)
    param_paths: dict[str, str]
    #: SDFG array names of the outputs, in order (``__return`` or ``__return_<i>``)
    outputs: list[str]
    #: constants the export produced, by SDFG array name
    constants: dict[str, torch.Tensor]
    #: ONNX op types in the graph, in order
    ops: list[str]


def import_module(module: nn.Module, inputs: tuple[torch.Tensor, ...], *, training: bool) -> Imported:
    """Export ``module`` to ONNX and import it into a single-state forward SDFG."""
    name = _sdfg_name(module)
    input_names = _input_names(module, len(inputs))
    named = dict(module.named_parameters())
    named.update(module.named_buffers())
    model_proto = _export(module, inputs, input_names, training)
    _check_supported(model_proto, module, inputs, input_names, training)
    # the graph keeps parameters as inputs; drop their initializers so onnxsim cannot fold them
    for i in reversed(range(len(model_proto.graph.initializer))):
        if model_proto.graph.initializer[i].name in named:
            model_proto.graph.initializer.pop(i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ONNXModel(name, model_proto, onnx_simplify=True)
    graph_inputs = set(model.inputs)
    return Imported(
        name=name,
        sdfg=model.sdfg,
        all_inputs=[clean_onnx_name(n) for n in input_names],
        inputs=[clean_onnx_name(n) for n in input_names if n in graph_inputs],
        param_paths={clean_onnx_name(n): n for n in named if n in graph_inputs},
        outputs=[clean_onnx_name(n) for n in model.outputs],
        constants=model.clean_weights,
        ops=[node.op_type for node in model_proto.graph.node],
    )


def _sdfg_name(module: nn.Module) -> str:
    name = re.sub(r"\W", "_", type(module).__name__)
    return name if name[:1].isalpha() else "m_" + name


def _input_names(module: nn.Module, count: int) -> list[str]:
    """Names of forward()'s parameters, so that the graphs show ``x`` rather than ``input_0``."""
    try:
        params = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    taken = {n.split(".")[0] for n, _ in module.named_parameters()} | {
        n.split(".")[0] for n, _ in module.named_buffers()
    }
    names = []
    for i in range(count):
        candidate = params[i] if i < len(params) else f"input_{i}"
        names.append(candidate if candidate not in taken else f"input_{i}")
    return names


def _export(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str], training: bool, verbose: bool = False
) -> onnx.ModelProto:
    buffer = io.BytesIO()
    # export() runs forward once; in training mode that would move BatchNorm's running statistics
    state = {k: v.clone() for k, v in module.state_dict().items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                tuple(inputs),
                buffer,
                input_names=input_names,
                opset_version=OPSET,
                training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
                export_params=False,
                keep_initializers_as_inputs=True,
                do_constant_folding=False,
                dynamo=False,
                verbose=verbose,
            )
    except torch.onnx.errors.UnsupportedOperatorError as e:
        op = re.search(r"operator '([^']+)'", str(e))
        raise UnsupportedOpError(
            f"PyTorch cannot export {op.group(1) if op else 'an operator'} of {type(module).__name__} to ONNX "
            f"(opset {OPSET}), so DaCe cannot import the module.",
            op=op.group(1) if op else None,
        ) from e
    except Exception as e:  # the exporter raises many types; all mean the same to the user
        raise DcnbError(f"Exporting {type(module).__name__} to ONNX failed: {_first_line(e)}") from e
    finally:
        module.load_state_dict(state)
    return onnx.load_from_string(buffer.getvalue())


def _check_supported(
    model: onnx.ModelProto,
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    input_names: list[str],
    training: bool,
) -> None:
    for node in model.graph.node:
        if node.op_type == "Constant" or node.domain not in ("", "ai.onnx"):
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOpError(f"ONNX op {node.domain}::{node.op_type} is not a standard op.", op=node.op_type)
            continue
        if has_onnx_node(node.op_type) and get_onnx_node(node.op_type).implementations:
            continue
        where = _torch_source(module, inputs, input_names, training, node.name)
        raise UnsupportedOpError(
            f"DaCe has no implementation of the ONNX op {node.op_type}"
            + (f", which comes from {where}" if where else "")
            + f"; {type(module).__name__} cannot be built.",
            op=node.op_type,
            source=where,
        )


def _torch_source(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str], training: bool, onnx_name: str
) -> str | None:
    """The Python line that produced ONNX node ``onnx_name``, read off the exporter's verbose graph."""
    log = _capture_fds(lambda: _export(module, inputs, input_names, training, verbose=True))
    for line in log.splitlines():
        if f'onnx_name="{onnx_name}"' not in line:
            continue
        found = re.search(r"# (.+?):(\d+):\d+\s*$", line)
        if not found:
            return None
        path, lineno = found.group(1), int(found.group(2))
        code = linecache.getline(path, lineno).strip()
        place = f"{os.path.basename(path)}:{lineno}"
        return f"`{code}` ({place})" if code else place
    return None


def _capture_fds(fn) -> str:
    """Run fn with fds 1 and 2 redirected: the exporter's verbose graph is printed by C++, not Python."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = [os.dup(1), os.dup(2)]
        with contextlib.suppress(Exception):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                fn()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        sink.seek(0)
        return sink.read()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
