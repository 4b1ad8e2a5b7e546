"""DaCe's generated names -> the module's own, for the views and for every message: ``ln1DOTweight`` reads
``ln1.weight``.

A name in an imported SDFG is built in layers, and each layer is read back here:

- DaCe's ONNX importer (``clean_onnx_name``) spells ``.``, ``/``, ``:``, ``-`` as ``DOT``, ``SLASH``, ``COLON``,
  ``DASH`` and puts ``ONNX_`` before a leading digit. PyTorch's exporter names a node by its module path and op
  (``/ln1/LayerNormalization``), its results ``<node>_output_<k>``, and parameters by their state-dict names.
- Expansions name the SDFG they return ``<node>_expansion`` (matrix products become an Einsum node
  ``<node>_einsum_expansion``); one written as a ``@dace.program`` gets its Python module in front
  (``dace_libraries_onnx_op_implementations_array_ops_...``); their maps and tasklets ``<node>_tasklet_map`` and
  the like. Inlining such an SDFG puts its name before the names of its arrays that clash.
- Autodiff names gradient arrays ``gradient_<array>`` (the backward SDFG's own) and ``<array>_grad`` (a backward
  rule's connectors), backward rules' nodes and SDFGs ``<node>_backward[_expansion]``, reversed tasklets
  ``_<tasklet>_reverse_``; dcnb's passes add ``_part`` (a nested SDFG's share of a gradient) and
  ``accumulate_<array>``, ``copy_<array>`` (before_autodiff.py), ``zero_<array>`` (lifetimes.py),
  ``<gradient>_terms``/``_sums`` with their ``sum_<gradient>`` and ``add_<gradient>_sums`` (broadcast_sums.py),
  ``<array>_rows``/``_partials`` (partial_sums.py); map fusion ``__map_fusion_<array>``; tasklet fusion
  ``<a>_fused_<b>``.

Read back: a node ``<path> · <op>`` (an op of the module itself, whose path is empty, after the module's class
where the caller knows it: ``root``), its output ``<path> · <op> output`` (``output k`` past the first), the
module's ``output`` (which stands for the op that made it: the importer renamed its result), a gradient
``∇<array>``, a name inside an expansion's SDFG ``<node> › <inner>``, and what a layer says about its node in
brackets (``(einsum, backward)``). A message reads the names it is about here, and those in DaCe's own errors it
quotes (``readable_text``). A node whose name says nothing of the module (an expansion's ``_Add_`` or
``einsum_gemmgemm``: ``generic``) the views name after the op of the arrays around it (``origin``; views/graph.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys

#: clean_onnx_name's spellings, read back
_UNESCAPED = {"DOT": ".", "COLON": ":", "SLASH": "/", "DASH": "-"}
_ESCAPE = re.compile("|".join(_UNESCAPED))
#: an ONNX node by its path, as PyTorch's exporter names it: the module path, then the op (with its number)
_NODE_PATH = re.compile(r"/((?:[^/]*/)*)([A-Za-z][A-Za-z0-9]*(?:_\d+)?)(.*)")
#: what an expansion or autodiff appends to a node's name -> how it reads, in brackets after the node
_NODE_SUFFIXES = {
    "einsum_expansion": "einsum",
    "backward_expansion": "backward",
    "backward": "backward",
    "expansion": "expansion",
}
#: what only follows an ONNX node's name: the tasklet and map its expansion makes (nothing to say), a scalar
#: result promoted to an array; its results (``_output_<k>``) read ``output`` (``output <k>`` past the first)
_ONNX_SUFFIXES = {"tasklet": None, "map": None, "array": "array"}
#: one suffix, whole (longer alternatives first)
_NODE_SUFFIX = re.compile(r"_(einsum_expansion|backward_expansion|backward|expansion)(?=_|$)")
_SUFFIX = re.compile(r"_(output_\d+|einsum_expansion|backward_expansion|backward|expansion|tasklet|map|array)(?=_|$)")
#: an ONNX node without a name (``<op>_<i>``), recognised only where an expansion's suffix follows
_UNNAMED_NODE = re.compile(
    r"([A-Z][A-Za-z0-9]*_\d+)(?=_(?:output_\d+|einsum_expansion|expansion|backward|tasklet|map)(?:_|$))(.*)"
)
#: a name in a text that only the importer or autodiff makes: an escaped ONNX name or a gradient
_MANGLED = re.compile(r"\b(?:\w+(?:SLASH|DOT|COLON|DASH)\w*|(?:SLASH|DOT|COLON|DASH)\w+|gradient_\w+)\b", re.ASCII)
#: a build key dcnb appends to the SDFGs it compiles (build.py)
_BUILD_KEY = re.compile(r"_[0-9a-f]{16}$")
#: the states DaCe splits off while inlining (``isolate_nested_sdfg``) are labelled ``<label>_pre_state``; state
#: fusion keeps the first label, so each nested SDFG inlined adds one more
_SPLIT_STATE = re.compile(r"(?:_(?:pre|post)_state)+")
#: what ends a reversed state's stem
REVERSED = "_reversed"
#: the labels DaCe gives states itself: an SDFG's first (``block``), and those its Python frontend names after the
#: line of DaCe's source that made them (``call_86_1``, ``BinOp_162_3``); state fusion keeps whichever came first
_GENERATED_STATE = re.compile(r"block(?:_\d+)?|init|[A-Za-z][A-Za-z_]*?_\d+(?:_\d+)*")
#: the states DaCe's autodiff and importer copy arrays in: state fusion may keep one's label on the state it merges
_COPY_STATE = re.compile(r"copy_(in|out)_(.+)")
#: what only a name of the module's has: an escaped ONNX name, a gradient, a value PyTorch numbered, an output
_OF_MODULE = re.compile(r"SLASH|DOT|COLON|DASH|gradient_|_grad(?!\w)|ONNX_\d|__return|__output_\d")


@dataclasses.dataclass
class _Part:
    """One layer of a name: the text, and what the layers around it say about it."""

    text: str
    tags: list[str] = dataclasses.field(default_factory=list)
    #: the ONNX node the part is, or is a result of or inside the expansion of (its readable name)
    op: str | None = None
    gradient: bool = False

    def __str__(self) -> str:
        return self.text + (f" ({', '.join(self.tags)})" if self.tags else "")


@functools.lru_cache(maxsize=65536)
def readable(raw: str, root: str = "") -> str:
    """The name of an array, a node or a nested SDFG as the module's author would write it; ``root``: the class of
    the module, which names its own ops (those of no submodule)."""
    return " › ".join(str(part) for part in _parts(_unescaped(raw), root))


@dataclasses.dataclass(frozen=True)
class Origin:
    """The ONNX node a name is of (``op``, readable), and whether it is of the op's backward: a gradient, or a name
    in its backward rule."""

    op: str
    backward: bool


@functools.lru_cache(maxsize=65536)
def origin(raw: str, root: str = "") -> Origin | None:
    """The ONNX node an array or node name is of: the node itself, one of its results, a name inside its expansion
    or its backward rule, or any of their gradients; None for anything else (a parameter, an input, an expansion's
    own ``mean``)."""
    parts = _parts(_unescaped(raw), root)
    op = next((part.op for part in parts if part.op), None)
    backward = any(part.gradient or "backward" in part.tags for part in parts)
    return None if op is None else Origin(op, backward)


def generic(raw: str) -> bool:
    """Whether a name says nothing of the module: no ONNX node, parameter, gradient or output in it (``_Add_``,
    ``einsum_gemmgemm``, ``reduce``: the names expansions and transformations give what they make)."""
    return not _OF_MODULE.search(raw) and origin(raw) is None


def readable_map(raw: str, root: str = "") -> str:
    """A map's label: its node's name (DaCe appends ``_map`` to the label of the tasklet it maps)."""
    return readable(raw.removesuffix("_map") or raw, root)


def readable_label(raw: str) -> str:
    """A label ``where`` names (an array, a map, a tasklet or a library node) by the name the graphs draw."""
    return readable_map(raw) if raw.endswith("_map") else readable(raw)


def readable_text(text: str) -> str:
    """``text`` (DaCe's error, a compiler's diagnostic) with each name the importer or autodiff made read back."""
    return _MANGLED.sub(lambda m: readable_label(m[0]), text)


def readable_sdfg(raw: str, root: str = "") -> str:
    """An SDFG's name, without the build key dcnb appends and the ``_sdfg`` some of DaCe's own end in."""
    return readable(_BUILD_KEY.sub("", raw).removesuffix("_sdfg") or raw, root)


def module_class(raw: str) -> str:
    """The class of the module an SDFG dcnb imported (or differentiated) is of, by the SDFG's name: what its ops of
    no submodule read after (``readable``'s ``root``)."""
    return (_BUILD_KEY.sub("", raw) or raw).removesuffix("_backward")


def readable_state(raw: str, root: str = "", backward: bool = False, computes: bool = False) -> str:
    """A state's label without the suffixes inlining piles up; a reversed state reads as its forward one, marked.

    A label DaCe made up reads ``block``, as an SDFG's first state does, marked ``(backward)`` in a ``backward``
    SDFG, so a state reads the same before and after a transformation that fuses it with one of another label; so
    does a copy's label on a state that ``computes`` more than copies (state fusion kept it from the copy)."""
    label = state_stem(raw)
    if label.endswith(REVERSED):
        return f"{readable_state(label.removesuffix(REVERSED), root)} (backward)"
    copy = _COPY_STATE.fullmatch(label)
    if (_GENERATED_STATE.fullmatch(label) and not _OF_MODULE.search(label)) or (copy and computes):
        return "block (backward)" if backward else "block"
    if copy:
        return f"copy {copy[1]} {readable(copy[2], root)}"
    return label


def state_stem(raw: str) -> str:
    """A state's label without the suffixes inlining piles up; a reversed state's as its forward one's plus a mark,
    whether DaCe reversed it as a loop or not."""
    stem = _SPLIT_STATE.sub("", raw)
    if match := re.fullmatch(r"(.+?)_(?:loop_)?reversed", stem):
        return state_stem(match[1]) + REVERSED
    return stem


def _unescaped(raw: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m[0]], raw)


def _of_module(name: str) -> bool:
    """Whether an unescaped name is of the module's: a path, a parameter, a gradient."""
    return name.startswith("gradient_") or any(c in name for c in "/.:-")


def _parts(name: str, root: str = "") -> list[_Part]:
    # what a layer wraps around a whole name: the marks go on the innermost part, the array it is about
    if (match := re.fullmatch(r"(.+)_(terms|sums|rows|partials)", name)) and _of_module(match[1]):
        return _mark(_parts(match[1], root), tag=match[2])
    if match := re.fullmatch(r"gradient_(.+)", name):
        return _mark(_parts(match[1], root), prefix="∇")
    if (match := re.fullmatch(r"(accumulate|zero|sum|add|copy)_(.+)", name)) and _of_module(match[2]):
        return _mark(_parts(match[2], root), prefix=f"{match[1]} ")
    if match := re.fullmatch(r"__map_fusion_(.+)", name):
        return _mark(_parts(match[1], root), tag="fused")
    if match := re.fullmatch(r"_(.+)_reverse_", name):
        return _mark(_parts(match[1], root), tag="backward")
    if match := re.fullmatch(r"(.+)_grad", name):
        return _mark(_parts(match[1], root), prefix="∇")
    if match := re.fullmatch(r"(.+)_part", name):
        return _mark(_parts(match[1], root), tag="part")
    if "_fused_" in name[1:-1]:
        return [_Part(" ∘ ".join(readable(piece, root) for piece in name.split("_fused_")))]
    if (rest := _without_module(name)) is not None:
        return _parts(rest, root)
    if match := _NODE_PATH.fullmatch(name):
        path = match[1].strip("/").replace("/", ".") or root
        return _suffixed(f"{path} · {match[2]}" if path else match[2], match[3], root, onnx=True)
    if match := _UNNAMED_NODE.fullmatch(name):
        return _suffixed(f"{root} · {match[1]}" if root else match[1], match[2], root, onnx=True)
    if match := re.fullmatch(r"ONNX_(\d+)(\..+)", name):  # a parameter of a submodule numbered (Sequential's 0.weight)
        return _parts(match[1] + match[2], root)
    if match := re.fullmatch(r"ONNX_(\d+)(.*)", name):  # a value PyTorch numbered (%19 in its graphs), of no node
        parts = _suffixed(f"%{match[1]}", match[2], root, onnx=True)
        parts[0].op = None
        return parts
    if match := re.fullmatch(r"__return|__output_(\d+)", name):  # the importer's outputs (frontend)
        # (the op that made one is named by it: the importer renamed its result)
        text = "output" + (f" {match[1]}" if match[1] else "")
        return [_Part(text, op=text)]
    if match := re.fullmatch(r"_([A-Za-z][A-Za-z0-9_]*?)_", name):  # the Python frontend's ops: _Add_, _Mult_
        return [_Part(match[1])]
    if match := re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)__(\d+)(.*)", name):  # an ONNX variadic input: Inputs__0
        return _suffixed(f"{match[1]}[{match[2]}]", match[3], root, onnx=False)
    if cut := _NODE_SUFFIX.search(name, 1):  # any other node's name ends where a suffix begins
        return _suffixed(name[: cut.start()], name[cut.start() :], root, onnx=False)
    return [_Part(name)]


def _suffixed(text: str, rest: str, root: str, onnx: bool) -> list[_Part]:
    """A node's name and what follows it: the suffixes layers appended, then maybe a name inside its SDFG."""
    part = _Part(text, op=text if onnx else None)
    while match := _SUFFIX.match(rest):
        suffix = match[1]
        if suffix in _NODE_SUFFIXES:
            reads = _NODE_SUFFIXES[suffix]
        elif onnx and suffix.startswith("output_"):
            k = int(suffix.removeprefix("output_"))
            part.text += " output" + (f" {k}" if k else "")
            reads = None
        elif onnx:
            reads = _ONNX_SUFFIXES[suffix]
        else:
            break
        if reads is not None and reads not in part.tags:
            part.tags.append(reads)
        rest = rest[match.end() :]
    if rest.startswith("_") and len(rest) > 1:
        # a name inside the node's SDFG, which inlining prefixed: that it is inside says "expansion" already
        part.tags = [t for t in part.tags if t != "expansion"]
        return [part, *_parts(rest[1:], root)]
    part.text += rest
    return [part]


def _mark(parts: list[_Part], prefix: str = "", tag: str = "") -> list[_Part]:
    parts[-1].text = prefix + parts[-1].text
    parts[-1].gradient |= prefix == "∇"
    if tag and tag not in parts[-1].tags:
        parts[-1].tags.append(tag)
    return parts


def _without_module(name: str) -> str | None:
    """``name`` without the Python module a ``@dace.program`` is named after (DaCe and dcnb's expansions)."""
    if not name.startswith(("dace_", "dcnb_")):
        return None
    modules = _program_modules(len(sys.modules))
    for i in range(len(name) - 1, 0, -1):
        if name[i] == "_" and name[:i] in modules:
            return name[i + 1 :] or None
    return None


@functools.lru_cache(maxsize=4)
def _program_modules(_loaded: int) -> frozenset[str]:
    """DaCe's and dcnb's modules as a ``@dace.program`` in them prefixes its name (loaded ones: a program's
    module ran before its SDFG existed); keyed by how many modules are loaded, so that new ones count."""
    return frozenset(
        m.replace(".", "_") for m in list(sys.modules) if m.startswith(("dace.", "dcnb.")) and "." in m
    )
