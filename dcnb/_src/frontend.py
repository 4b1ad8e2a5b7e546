"""nn.Module + example inputs -> the forward SDFG DaCe imports from its ONNX export.

This is the only module that talks to PyTorch's ONNX exporter and DaCe's importer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import linecache
import os
import re
import tempfile
import warnings
from collections.abc import Callable

import dace
import onnx
import torch
from dace.frontend.ml.onnx import ONNXModel
from dace.frontend.ml.onnx.importer import infer_shapes_onnx_model, simplify_onnx_model
from dace.libraries.onnx.converters import clean_onnx_name
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node, has_onnx_node
from torch import nn
from torch.onnx._internal.torchscript_exporter import utils as torchscript_exporter

from . import export_rules, structure, workdir
from .errors import DcnbError, UnsupportedOpError, describe, first_line
from .structure import Call

OPSET = 18
# rules for aten ops the exporter cannot export (rms_norm, l1_loss, ...), as standard ONNX ops
export_rules.register(OPSET)


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
    #: SDFG array names of the outputs, in order (``__return``, or ``__output_<i>`` for several)
    outputs: list[str]
    #: constants the export produced, by SDFG array name
    constants: dict[str, torch.Tensor]
    #: ONNX op types in the graph, in order
    ops: list[str]
    #: SDFG array name of an output -> path of the buffer it updates (training-mode BatchNorm statistics)
    buffer_updates: dict[str, str] = dataclasses.field(default_factory=dict)
    #: paths of the counters a forward call increments (BatchNorm's ``num_batches_tracked``)
    counters: list[str] = dataclasses.field(default_factory=list)
    #: SDFG array name of an output -> the SDFG names of the inputs, parameters and buffers it is computed from
    reached: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)


def import_module(
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    *,
    training: bool,
    call: Call | None = None,
    progress: Callable[[str], None] = lambda message: None,
    uneven_pads: bool = True,
) -> Imported:
    """Export ``module`` to ONNX and import it into a single-state forward SDFG. ``call`` says which of ``inputs``
    go by keyword (default: all positional); ``progress`` hears when the import starts, after the export;
    ``uneven_pads``: whether the convolutions it is built for take more pads at one end than at the other (the
    CPU's do; cuDNN's do not, so for a GPU a zero Pad before a Conv exported ``padding="valid"`` stays a Pad)."""
    call = call or Call(len(inputs))
    name = _sdfg_name(module)
    input_names = _input_names(module, call)
    named = dict(module.named_parameters())
    named.update(module.named_buffers())
    model_proto = _export(module, inputs, call, input_names, training)
    # the graph keeps parameters as inputs; drop their initializers so onnxsim cannot fold them
    for i in reversed(range(len(model_proto.graph.initializer))):
        if model_proto.graph.initializer[i].name in named:
            model_proto.graph.initializer.pop(i)
    updates = _expose_running_statistics(model_proto, module) if training else {}
    progress("importing into DaCe")
    with warnings.catch_warnings(), workdir.untouched():
        warnings.simplefilter("ignore")
        # simplified first, so that shape arithmetic (Shape, Gather, Mod, ...) is folded before ops are checked
        model_proto = infer_shapes_onnx_model(model_proto)
        _indices_from_the_start(model_proto)
        if uneven_pads:
            _explicit_valid_pads(model_proto)
        model_proto = simplify_onnx_model(model_proto, auto_merge=False)
        own = _standard_for_own_ops(model_proto)
        _global_average_pools(model_proto)
        _each_output_once(model_proto)
        sources = _sources(model_proto)
        _check_supported(model_proto, module, inputs, call, input_names, training)
        try:
            model = ONNXModel(name, model_proto, onnx_simplify=False)
        except Exception as e:
            raise DcnbError(f"DaCe could not import the graph {type(module).__name__} exports: {describe(e)}") from e
        for node, _ in model.sdfg.all_nodes_recursive():
            if isinstance(node, ONNXOp) and node.label in own:
                node.backward_implementation = own[node.label]
        _check_covered(model.sdfg, model_proto, module, inputs, call, input_names, training)
    graph_inputs = set(model.inputs)
    # the importer renames the graph's outputs to __return or __return_<i>, in order; the latter become __output_<i>
    outputs = _outputs_apart_from_returns(model.sdfg, [clean_onnx_name(n) for n in model.outputs])
    renamed = dict(zip((o.name for o in model_proto.graph.output), outputs))
    return Imported(
        name=name,
        sdfg=model.sdfg,
        all_inputs=[clean_onnx_name(n) for n in input_names],
        inputs=[clean_onnx_name(n) for n in input_names if n in graph_inputs],
        param_paths={clean_onnx_name(n): n for n in named if n in graph_inputs},
        outputs=[renamed[n] for n in renamed if n not in updates],
        constants=model.clean_weights,
        ops=[node.op_type for node in model_proto.graph.node],
        buffer_updates={renamed[n]: path for n, path in updates.items()},
        counters=sorted(
            {_member(path.rpartition(".")[0], "num_batches_tracked") for path in updates.values()} & set(named)
        ),
        reached={
            renamed[n]: frozenset(clean_onnx_name(i) for i in sources[n])
            for n in renamed
            if n not in updates and n in sources
        },
    )


def _sources(model: onnx.ModelProto) -> dict[str, frozenset[str]]:
    """Each value of the graph -> the graph inputs it is computed from (a node with a subgraph, which may read any
    value around it: from every input). The nodes are in topological order, as ONNX requires."""
    found = {i.name: frozenset([i.name]) for i in model.graph.input}
    every = frozenset(found)
    subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for node in model.graph.node:
        if any(a.type in subgraphs for a in node.attribute):
            sources = every
        else:
            sources = frozenset().union(*(found.get(name, frozenset()) for name in node.input if name))
        found.update(dict.fromkeys(node.output, sources))
    return found


def _outputs_apart_from_returns(sdfg: dace.SDFG, outputs: list[str]) -> list[str]:
    """Rename the tuple outputs ``__return_<i>`` of ``sdfg`` to ``__output_<i>``; returns the outputs' names.

    gap: DaCe's validation takes arrays named ``__return_<i>`` for an SDFG's results and wants them numbered from 0
    without gaps; the backward holds the outputs its rules read, not the others (``x.argmax(-1), x.softmax(-1)``:
    softmax's alone), and autodiff refused it as invalid.
    """
    apart = {name: "__output_" + name.removeprefix("__return_") for name in outputs if name.startswith("__return_")}
    sdfg.replace_dict(apart)
    return [apart.get(name, name) for name in outputs]


def _member(path: str, name: str) -> str:
    """The path of ``name`` in the submodule at ``path`` ("" is the module itself: a BatchNorm the user passes)."""
    return f"{path}.{name}" if path else name


def _expose_running_statistics(model: onnx.ModelProto, module: nn.Module) -> dict[str, str]:
    """Make the running statistics of training-mode BatchNormalization nodes graph outputs; returns output name ->
    the buffer it updates.

    The exporter leaves these outputs unused (PyTorch updates the buffers in place), so without them the compiled
    module would train with frozen statistics.
    """
    for path, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.training and sub.track_running_stats:
            if sub.momentum is None:
                raise UnsupportedOpError(
                    f"{path or type(module).__name__} is a BatchNorm with momentum=None (a cumulative average of the "
                    "batch statistics), which ONNX's BatchNormalization cannot express; give it a momentum or "
                    "optimize it in eval mode",
                    op="BatchNormalization",
                )
    buffers = dict(module.named_buffers())
    updates = {}
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) < 3 or len(node.input) < 5:
            continue
        for output, buffer in zip(node.output[1:3], node.input[3:5]):
            if output and buffer in buffers:
                tensor = buffers[buffer]
                elem = onnx.helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=tensor.dtype).numpy().dtype)
                model.graph.output.append(onnx.helper.make_tensor_value_info(output, elem, list(tensor.shape)))
                updates[output] = buffer
    return updates


def _standard_for_own_ops(model: onnx.ModelProto) -> dict[str, str]:
    """Make each node of dcnb's own ops (``export_rules.OWN_OPS``: ``x.detach()``'s StopGradient) the standard op
    DaCe imports; returns their labels in the SDFG and the backward rule of each. (After simplification, which would
    remove an Identity and join the names before and after it.)"""
    labels = {}
    for node in model.graph.node:
        if node.domain == export_rules.DOMAIN:
            node.op_type, labels[clean_onnx_name(node.name)] = export_rules.OWN_OPS[node.op_type]
            node.domain = ""
    return labels


def _each_output_once(model: onnx.ModelProto) -> None:
    """Make a value the graph returns more than once (``return y, y``) a copy of it each time after the first.

    gap: DaCe's importer adds an array for each output and failed on the second ("Data descriptor already exists").
    """
    seen = set()
    for k, output in enumerate(model.graph.output):
        if output.name in seen:
            again = f"{output.name}/again_{k}"
            model.graph.node.append(onnx.helper.make_node("Identity", [output.name], [again], name=again))
            model.graph.value_info.append(onnx.helper.make_value_info(output.name, output.type))
            output.name = again
        seen.add(output.name)


def _indices_from_the_start(model: onnx.ModelProto) -> None:
    """Make each Gather read indices counted from the start of its axis: ``where(i < 0, i + size, i)`` before it,
    which simplification folds where the indices are constants (``x[:, -1]``). Needs the shapes inferred.

    gap: DaCe's Gather reads its indices as given, and ONNX's count from the end where negative: ``x[:, -1]`` read
    before the array (wrong values, a corrupted heap).
    """
    types = {v.name: v.type.tensor_type for v in (*model.graph.input, *model.graph.value_info)}
    for t in model.graph.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, t.dims).tensor_type
    rewritten = []
    for node in model.graph.node:
        size = _axis_size(types.get(node.input[0]), node) if node.op_type == "Gather" else None
        if size is not None and node.input[1] in types:
            name, dtype = f"{node.name or node.output[0]}/from_the_start", types[node.input[1]].elem_type
            at, zero, negative, moved, start = (f"{name}/{p}" for p in ("size", "zero", "negative", "moved", "start"))
            constants = ((at, size), (zero, 0))
            model.graph.initializer.extend(onnx.helper.make_tensor(n, dtype, [], [v]) for n, v in constants)
            rewritten += [
                onnx.helper.make_node("Less", [node.input[1], zero], [negative], name=negative),
                onnx.helper.make_node("Add", [node.input[1], at], [moved], name=moved),
                onnx.helper.make_node("Where", [negative, moved, node.input[1]], [start], name=start),
            ]
            node.input[1] = start
        rewritten.append(node)
    del model.graph.node[:]
    model.graph.node.extend(rewritten)


def _explicit_valid_pads(model: onnx.ModelProto) -> None:
    """Give each Conv exported with ``auto_pad="VALID"`` (``padding="valid"``) its zero pads explicitly, which means
    the same: the simplifier then folds a zero Pad in front of it into the convolution's pads, as it does where the
    pads are explicit (TensorFlow-style padding, Hugging Face's EfficientNet's before each stride-2 convolution),
    and no padded copy of the image is made and stored for the backward."""
    # gap: onnxsim leaves a zero Pad in front of a Conv exported with auto_pad VALID (padding="valid") unfused
    for node in (n for n in model.graph.node if n.op_type == "Conv"):
        valid = [a for a in node.attribute if a.name == "auto_pad" and a.s == b"VALID"]
        kernel = next((a.ints for a in node.attribute if a.name == "kernel_shape"), None)
        if not valid or kernel is None:
            continue
        node.attribute.remove(valid[0])
        node.attribute.append(onnx.helper.make_attribute("pads", [0] * (2 * len(kernel))))


def _global_average_pools(model: onnx.ModelProto) -> None:
    """Make each ReduceMean over an image's two spatial axes (``x.mean((2, 3))``, a squeeze-and-excitation's) the
    GlobalAveragePool it is, then a Flatten where the axes are not kept: the op ``channels_last`` lays out, summed a
    vector of channels at a time over a channels-last image (fixes/pooling.py), where the ReduceMean kept the image
    (N, C, H, W) and its neighbours read it across layouts. Needs the shapes inferred and the axes folded."""
    images = {
        v.name: v.type.tensor_type
        for v in (*model.graph.input, *model.graph.value_info)
        if len(v.type.tensor_type.shape.dim) == 4
    }
    constants = {t.name: t for t in model.graph.initializer}
    rewritten = []
    for node in model.graph.node:
        reduced = node.op_type == "ReduceMean" and len(node.input) == 2
        image, axes = (images.get(node.input[0]), constants.get(node.input[1])) if reduced else (None, None)
        if image is None or axes is None or sorted(a % 4 for a in onnx.numpy_helper.to_array(axes).ravel()) != [2, 3]:
            rewritten.append(node)
            continue
        kept = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        pooled = node.output[0] if kept else f"{node.output[0]}/pooled"
        rewritten.append(onnx.helper.make_node("GlobalAveragePool", [node.input[0]], [pooled], name=node.name))
        if not kept:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in image.shape.dim[:2]] + [1, 1]
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(pooled, image.elem_type, dims))
            flat = onnx.helper.make_node("Flatten", [pooled], [node.output[0]], name=f"{node.name}/flattened", axis=1)
            rewritten.append(flat)
    del model.graph.node[:]
    model.graph.node.extend(rewritten)


def _axis_size(data: onnx.TypeProto.Tensor | None, gather: onnx.NodeProto) -> int | None:
    """The length of the axis ``gather`` indexes in ``data``; None where no shape inferred says it."""
    if data is None or not data.HasField("shape"):
        return None
    axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
    dims = data.shape.dim
    return dims[axis].dim_value if -len(dims) <= axis < len(dims) and dims[axis].HasField("dim_value") else None


def _sdfg_name(module: nn.Module) -> str:
    name = re.sub(r"\W", "_", type(module).__name__)
    return name if name[:1].isalpha() else "m_" + name


def _input_names(module: nn.Module, call: Call) -> list[str]:
    """Names of forward()'s parameters and of the keyword inputs, so that the graphs show ``x`` and
    ``attention_mask`` rather than ``input_0``."""
    params = structure.positional_names(module)
    taken = {n.split(".")[0] for n, _ in module.named_parameters()} | {
        n.split(".")[0] for n, _ in module.named_buffers()
    }
    candidates = [params[i] if i < len(params) else f"input_{i}" for i in range(call.positional)]
    candidates += call.keywords
    return [c if c not in taken and c.isidentifier() else f"input_{i}" for i, c in enumerate(candidates)]


def _export(
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    call: Call,
    input_names: list[str],
    training: bool,
    verbose: bool = False,
) -> onnx.ModelProto:
    buffer = io.BytesIO()
    # export() runs forward once; in training mode that would move BatchNorm's running statistics
    state = {k: v.clone() for k, v in module.state_dict().items()}
    try:
        with (
            warnings.catch_warnings(),
            _onnx_log(verbose),
            export_rules.own_exports(OPSET),
            _persistent(module),
        ):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _flat(module, call),
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
        if verbose:
            raise
        op = re.search(r"operator '([^']+)'", str(e))
        where = _torch_source(module, inputs, call, input_names, training, f" = {op.group(1)}(") if op else None
        raise UnsupportedOpError(
            f"PyTorch cannot export {op.group(1) if op else 'an operator'} of {type(module).__name__} to ONNX "
            f"(opset {OPSET})" + (f", which comes from {where}" if where else "") + "; DaCe cannot import the module.",
            op=op.group(1) if op else None,
            source=where,
        ) from e
    except Exception as e:  # the exporter raises many types; all mean the same to the user
        # (a symbolic's refusal ends its line with the whole TorchScript graph around the value it names)
        reason = first_line(e).split("  [Caused by the value ")[0]
        raise DcnbError(f"Exporting {type(module).__name__} to ONNX failed: {reason}") from e
    finally:
        module.load_state_dict(state)
    return onnx.load_from_string(buffer.getvalue())


@contextlib.contextmanager
def _persistent(module: nn.Module):
    """Every buffer persistent while the module is exported: the exporter takes the state dict's tensors as the
    graph's inputs and bakes in the others, so that a non-persistent buffer changed after the build (a mask, a
    scale) was silently ignored; as an input, the compiled module reads it at each call, as eager does."""
    owners = [(m, set(m._non_persistent_buffers_set)) for m in module.modules() if m._non_persistent_buffers_set]
    for m, _ in owners:
        m._non_persistent_buffers_set.clear()
    try:
        yield
    finally:
        for m, names in owners:
            m._non_persistent_buffers_set.update(names)


@contextlib.contextmanager
def _onnx_log(enabled: bool):
    """The exporter's C++ log on only where ``enabled`` (a verbose export), as it was afterwards."""
    # gap: PyTorch's exporter tests the function _jit_is_onnx_log_enabled, not its result, so its log is on in every
    # export and stays on: an op it cannot export printed the whole TorchScript graph into the cell's output
    before, setup = torch._C._jit_is_onnx_log_enabled(), torchscript_exporter.setup_onnx_logging
    torchscript_exporter.setup_onnx_logging = lambda verbose: contextlib.nullcontext()
    torch._C._jit_set_onnx_log_enabled(enabled)
    try:
        yield
    finally:
        torchscript_exporter.setup_onnx_logging = setup
        torch._C._jit_set_onnx_log_enabled(before)


def _flat(module: nn.Module, call: Call) -> nn.Module:
    """The module with a forward that takes exactly the example's tensors, in the compiled order, and returns the
    tensors of its result (nested in dicts, dataclasses, ...) as a flat tuple, in ``structure.leaves``' order.

    The exporter appends forward()'s keyword defaults to the traced inputs and the tracer turns them into
    tensors, so a flag such as TransformerEncoderLayer's ``is_causal=False`` reached its function as a Tensor.
    The shallow copy shares the parameters, buffers and submodules, so their names stay those of the module.
    """
    # (a copy of the attributes, not copy.copy: a parametrized module, weight norm's, refuses to be copied)
    exported = object.__new__(type(module))
    exported.__dict__.update(module.__dict__)
    forward = lambda *args, **kwargs: type(module).forward(exported, *args, **kwargs)  # noqa: E731
    exported.forward = lambda *tensors: tuple(structure.leaves(call.invoke(forward, tensors)))
    return exported


def _check_supported(
    model: onnx.ModelProto,
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    call: Call,
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
        where = _torch_source(module, inputs, call, input_names, training, f'onnx_name="{node.name}"')
        raise UnsupportedOpError(
            f"DaCe has no implementation of the ONNX op {node.op_type}"
            + (f", which comes from {where}" if where else "")
            + f"; {type(module).__name__} cannot be built.",
            op=node.op_type,
            source=where,
        )


def _check_covered(
    sdfg: dace.SDFG,
    model: onnx.ModelProto,
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    call: Call,
    input_names: list[str],
    training: bool,
) -> None:
    """Raise if the implementation DaCe will expand an op to does not cover the op's attributes (a dilated
    convolution, a pooling with ceil_mode): otherwise code generation fails later with no word of the op."""
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, ONNXOp):
            continue
        chosen = node.implementation or type(node).default_implementation or "pure"
        impl = getattr(type(node).implementations.get(chosen), "forward_impl", None)
        if impl is None or impl.forward_can_be_applied(node, state, state.sdfg):
            continue
        proto = next((n for n in model.graph.node if clean_onnx_name(n.name) == node.label), None)
        attributes = ", ".join(f"{a.name}={_attribute(a)}" for a in proto.attribute) if proto else ""
        where = (
            _torch_source(module, inputs, call, input_names, training, f'onnx_name="{proto.name}"') if proto else None
        )
        raise UnsupportedOpError(
            f"DaCe's implementation of the ONNX op {node.schema.name} does not cover it as used here"
            + (f" ({attributes})" if attributes else "")
            + (f", which comes from {where}" if where else "")
            + f"; {type(module).__name__} cannot be built.",
            op=node.schema.name,
            source=where,
        )


def _attribute(attribute: onnx.AttributeProto) -> str:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    return str(value if isinstance(value, (int, float)) else list(value))


def _torch_source(
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    call: Call,
    input_names: list[str],
    training: bool,
    marker: str,
) -> str | None:
    """The Python line of the first line of the exporter's verbose graph that holds ``marker``: an ONNX node's
    ``onnx_name="..."``, or `` = aten::op(`` in the graph it logs where it cannot export that op."""
    log = _capture_fds(lambda: _export(module, inputs, call, input_names, training, verbose=True))
    line = next((line for line in log.splitlines() if marker in line), None)
    return _line_source(line) if line else None


def _line_source(line: str) -> str | None:
    """Where a line of the exporter's graph comes from: `the code` (file:line), and the module calling PyTorch."""
    found = re.search(r"# (.+?):(\d+):\d+\s*$", line)
    if not found:
        return None
    path, lineno = found.group(1), int(found.group(2))
    code = linecache.getline(path, lineno).strip()
    place = f"{os.path.basename(path)}:{lineno}"
    source = f"`{code}` ({place})" if code else place
    if os.path.abspath(path).startswith(os.path.dirname(torch.__file__)):
        # a line of PyTorch's own: the module that called it says more
        scope = re.search(r"scope: (\S+)", line)
        if scope:  # e.g. zoo.ConvNet::/torch.nn.modules.conv.Conv2d::conv1
            levels = [level.split("::", 1) for level in scope.group(1).split("/") if "::" in level]
            path = ".".join(attr for _, attr in levels[1:] if attr)
            cls = levels[-1][0].rpartition(".")[2]
            source += f" in {path} ({cls})" if path else f" in {cls}"
    return source


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
