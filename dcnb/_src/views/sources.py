"""A compiled SDFG -> its generated source, and the lines of it that each node's code is (the widget's code view).

Where the lines come from: DaCe's code generator writes a marker after every line it emits, ``////__DACE:c:s:n``
(the control-flow region, the state and the node or nodes, by id), and strips the markers when it writes the files.
In a build folder of the default ("development") mode it also leaves the map its VS Code extension reads,
``map/map_cpp.json``, made from those markers. That map is not good enough to show a node's code: it covers the
host file only (no CUDA kernels), keeps only the first run of lines of each node, and its parser reads one digit
after a comma (``(,[0-9])*``), so the line of a memlet copy between nodes 8 and 12 is given to node 1: 21 tasklets
in 300 cached builds (LayerNorm, Softmax, the MLP's backward) pointed at another tasklet's code.

So the markers are read here from the generator itself: a copy of the SDFG is generated again, in this process,
under the configuration the build saved (``dace.conf`` in its folder), and its code, without the markers, must equal
the build's files line for line (else that file's nodes are left out rather than shown at the wrong lines). The
copy keeps the nodes' guids (DaCe's ``deepcopy`` keeps them, access nodes excepted, which get no range here), so a
marker names the drawn node directly. Library nodes are expanded during code generation, into nodes that did not
exist before; each expansion is found where its library node was (``expansions``). (Tagging the library nodes
instead, say in their ``debuginfo``, which an expansion inherits, changes the code: DaCe gives identical nested
SDFGs one function, and tagged ones are no longer identical.)

A node's range is the brace block its code opens: a tasklet's ``{ ... }``, a map's loops from its entry to its
exit, a library node's or nested SDFG's function (DaCe generates each nested SDFG as an ``inline`` function before
the program, and a call where it runs; identical nested SDFGs share one function, which their calls point to), a
GPU map's kernel in the CUDA file.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import pathlib
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import dace
from dace.config import Config, temporary_config
from dace.sdfg import nodes

from .. import build, names
from ..analysis import Analysis
from ..errors import DcnbError

#: DaCe's marker after a generated line: region (cfg_id), state within it, node ids (two for a memlet)
_MARKER = re.compile(r"////__DACE:(\d+)(?::(\d+))?(?::(-?[\d,]+))?")
#: a nested SDFG's function as DaCe defines it: ``inline void name(...) {`` (``DACE_DFI void`` in device code)
_DEFINITION = r"^\s*(?:\w+\s+)*void\s+{}\s*\("
#: what a step's sources are kept as in its analysis (``Session.analysis``): generating the code again takes
#: seconds, and the views ask for a step's sources more than once
NAME = "sources"
#: a side's copy generated again (``_generate_again``), kept in the step's analysis under this name and the side
#: where ``expanded`` made it, until ``of`` reads the side's code from it
_COPY = "generated copy"
#: what ``_generate_again`` makes: the copy, the code with its markers by path, what each library node became
_Generated = tuple[dace.SDFG, dict[str, str], dict[str, tuple[nodes.Node, dace.SDFGState]]]


def of(session: Any, index: int | None = None) -> dict[str, dict[str, Any] | None]:
    """The generated sources of the forward and backward SDFGs as compiled at good step ``index`` (the current one
    by default): ``{"forward": source, "backward": source or None}``, each as ``generated`` returns it. Worked out
    once per step and kept in its analysis."""
    analysis = session.analysis(index)

    def worked_out() -> dict[str, dict[str, Any] | None]:
        found: dict[str, dict[str, Any] | None] = {}
        for side, sdfg in zip(("forward", "backward"), session.compiled_sdfgs(index)):
            found[side] = None if sdfg is None else _read(sdfg, pathlib.Path(sdfg.build_folder), analysis, side)
        return found

    return analysis.result(NAME, worked_out)


def generated(sdfg: dace.SDFG, folder: str | pathlib.Path | None = None) -> dict[str, Any]:
    """The code generated for ``sdfg`` (as compiled: after the build's passes) in its build ``folder``
    (``sdfg.build_folder`` unless given), as plain data::

        {"language": "cpp" | "cuda",
         "text": the whole source: each file under src/ after a header line "// ---- src/cpu/NAME.cpp ----",
         "nodes": {node guid: [first line, last line]}}   # 1-based, inclusive, into text

    ``nodes`` holds the tasklets, map entries and exits (both: the whole map), library nodes and nested SDFGs
    whose code was found; access nodes have no code of their own (their copies and declarations belong to the
    nodes around them). Worked out on every call (``of`` keeps a step's)."""
    return _read(sdfg, pathlib.Path(folder or sdfg.build_folder))


def _read(sdfg: dace.SDFG, folder: pathlib.Path, analysis: Analysis | None = None, side: str = "") -> dict[str, Any]:
    """``generated``: from the copy ``expanded`` kept in a step's ``analysis`` for ``side`` where there is one (it
    is not kept beside the result), else from a copy generated again here."""
    listed = folder / "dace_files.csv"
    if not listed.exists():
        raise DcnbError(
            f"no generated code for {names.readable_sdfg(sdfg.name)} in {folder}: the build folder is gone "
            "(cache cleared?)"
        )
    paths = _source_paths(listed)
    kept = None if analysis is None else analysis.take(f"{_COPY} {side}")
    generated_copy, annotated, expanded = kept or _generate_again(sdfg, folder)
    text = _Text()
    for path in paths:
        text.add(path, (folder / path).read_text(), annotated.get(path))
    index = _Index(generated_copy, text)
    ranges = {}
    for guid, found in _elements(sdfg, generated_copy, expanded).items():
        own, inner = index.lines(found)
        block = text.block(own, inner)
        if block is not None:
            ranges[guid] = list(block)
    language = "cuda" if any(path.startswith("src/cuda/") for path in paths) else "cpp"
    return {"language": language, "text": "\n".join(text.lines) + "\n", "nodes": ranges}


def _source_paths(listed: pathlib.Path) -> list[str]:
    """The files a build compiled, from its ``dace_files.csv`` (``target,target type,file name`` a line), as
    paths under the build folder, in DaCe's order (the host file first)."""
    paths = []
    with open(listed) as f:
        for row in csv.reader(f):
            if row:
                target, kind, name = (part.strip() for part in row)
                paths.append("/".join(p for p in ("src", target, kind, name) if p))
    return paths


def _lines(text: str) -> list[str]:
    return text.removesuffix("\n").split("\n")


def _strip(code: str) -> str:
    """Generated code as DaCe writes it to a file (``CodeObject.clean_code``: the markers removed)."""
    return re.sub(r"[ \t]*////__(DACE:|CODEGEN;)[^\n]*", "", code)


def expanded(
    sdfg: dace.SDFG, analysis: Analysis | None = None, side: str = ""
) -> dict[str, tuple[nodes.Node, dace.SDFGState]] | None:
    """What code generation expanded each library node of compiled ``sdfg`` into (by guid; recursively, as it
    generates code), from a copy generated again as ``generated`` reads its code: the overlays count a library
    node's work there. ``sdfg`` being the ``side`` of the step whose ``analysis`` is given, the copy is kept there
    until ``of`` reads the step's code from it, so that the expansion (seconds on a transformer layer) is done once
    for both views. None where the build folder is gone. Read it, do not change it."""
    folder = pathlib.Path(sdfg.build_folder)
    if not (folder / "dace.conf").exists():
        return None
    if analysis is None:
        return _generate_again(sdfg, folder)[2]
    return analysis.result(f"{_COPY} {side}", lambda: _generate_again(sdfg, folder))[2]


def _generate_again(sdfg: dace.SDFG, folder: pathlib.Path) -> _Generated:
    """Generate a copy of ``sdfg`` as its build did (the configuration the build saved in ``dace.conf``, the scope
    connectors filled by ``build.generate_code``): the copy as code generation left it, the code with its markers by
    path under the build folder, and what each library node (by guid) was expanded into."""
    generated_copy = copy.deepcopy(sdfg)
    with expansions(generated_copy) as expanded, temporary_config(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Config.load(str(folder / "dace.conf"))
        objects = build.generate_code(generated_copy, validate=False)
    annotated = {}
    for o in objects:
        parts = ("src", o.target.target_name, o.target_type, f"{o.name}.{o.language}")
        annotated["/".join(p for p in parts if p)] = o.code
    return generated_copy, annotated, expanded


@contextlib.contextmanager
def expansions(sdfg: dace.SDFG) -> Iterator[dict[str, tuple[nodes.Node, dace.SDFGState]]]:
    """For a block that expands library nodes of ``sdfg`` (code generation, ``LibraryNode.expand``): what each
    library node it expanded (by guid) became, filled in when the block ends.

    DaCe's expansion (ExpandTransformation) replaces a node in place: by a new node in the same state, named after
    it where it is a nested SDFG, on its edges (but for inputs the expansion folds in: Reduce's axes). A node
    expanded in turn (a library node into another, and that one into a nested SDFG) is found the same way."""
    existing = {id(node) for node, _ in sdfg.all_nodes_recursive()}
    libraries = [(n, s) for n, s in sdfg.all_nodes_recursive() if isinstance(n, nodes.LibraryNode)]
    places = [(n, n.label, s, _neighbours(n, s)) for n, s in libraries]
    found: dict[str, tuple[nodes.Node, dace.SDFGState]] = {}
    yield found
    for node, name, state, neighbours in places:
        remaining = set(state.nodes())
        if node in remaining:
            continue  # not expanded
        new = [n for n in remaining if id(n) not in existing]
        score = {id(n): (n.label == name, len(_neighbours(n, state) & neighbours)) for n in new}
        best = max(new, key=lambda n: score[id(n)], default=None)
        if best is not None and score[id(best)] > (False, 0):
            found[node.guid] = (best, state)
            existing.add(id(best))  # (not another library node's)


def _neighbours(node: nodes.Node, state: dace.SDFGState) -> frozenset[tuple[str, int, str | None]]:
    """What a node is connected to, and through which of its connectors."""
    ins = {("in", id(e.src), e.dst_conn) for e in state.in_edges(node)}
    return frozenset(ins | {("out", id(e.dst), e.src_conn) for e in state.out_edges(node)})


def _elements(
    drawn: dace.SDFG, generated_copy: dace.SDFG, expanded: dict[str, tuple[nodes.Node, dace.SDFGState]]
) -> dict[str, list[tuple[nodes.Node, dace.SDFGState]]]:
    """For each code node of the drawn SDFG (by guid): the nodes of the generated copy that hold its code, with
    their states. A node keeps its guid in the copy; a library node is what code generation expanded it into; a
    map, with the maps code generation put around it."""
    by_guid: dict[str, list] = defaultdict(list)
    for node, state in generated_copy.all_nodes_recursive():
        if not isinstance(node, nodes.AccessNode):
            by_guid[node.guid].append((node, state))
    drawn_nodes = [node for node, _ in drawn.all_nodes_recursive()]
    drawn_guids = {node.guid for node in drawn_nodes}
    result = {}
    for node in drawn_nodes:
        if isinstance(node, nodes.LibraryNode):
            found = [expanded[node.guid]] if node.guid in expanded else []
        elif isinstance(node, (nodes.Tasklet, nodes.MapEntry, nodes.MapExit, nodes.NestedSDFG)):
            found = [(n, s) for n, s in by_guid.get(node.guid, []) if type(n) is type(node)]
        else:
            continue
        if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
            found += [outer for n, s in found for outer in _added_scopes(n, s, drawn_guids)]
        if found:
            result[node.guid] = found
    return result


def _added_scopes(
    node: nodes.Node, state: dace.SDFGState, drawn: set[str]
) -> list[tuple[nodes.Node, dace.SDFGState]]:
    """The maps code generation put around a map, innermost first: a GPU map becomes a kernel (a new map over the
    blocks) around the original (now over the threads of a block), whose code is the kernel's."""
    added = []
    outer = state.entry_node(state.entry_node(node) if isinstance(node, nodes.MapExit) else node)
    while isinstance(outer, nodes.MapEntry) and outer.guid not in drawn:
        added.append((outer, state))
        outer = state.entry_node(outer)
    return added


class _Text:
    """The build's files one after the other, each after a header line, with the marker DaCe wrote on each line
    (1-based line numbers into the whole)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.file_of: dict[int, str] = {}
        #: line -> (region, state or None, node ids)
        self.marks: dict[int, tuple[int, int | None, list[int]]] = {}

    def add(self, path: str, code: str, annotated: str | None) -> None:
        """Append a file's ``code`` as the build wrote it; its markers from ``annotated``, the same code generated
        again, where that matches it line for line (dcnb's build appends an entry point at the end of the host
        file). Where it does not (a format step, another DaCe), the file gets no markers rather than wrong ones."""
        self.lines.append(f"// ---- {path} ----")
        start = len(self.lines)
        lines = _lines(code)
        self.lines.extend(lines)
        for line in range(start + 1, len(self.lines) + 1):
            self.file_of[line] = path
        regenerated = None if annotated is None else _lines(_strip(annotated))
        if regenerated is None or lines[: len(regenerated)] != regenerated:
            return
        for i, line in enumerate(annotated.split("\n"), start + 1):
            found = _MARKER.search(line)
            if found:
                cfg, state, ids = found.groups()
                nodes_marked = [int(n) for n in ids.split(",")] if ids else []
                self.marks[i] = (int(cfg), None if state is None else int(state), nodes_marked)

    def definition(self, call_line: int) -> int | None:
        """Where the function called on a line (``reduce_3_0_47(__state, ...);``) is defined, in the same file."""
        call = re.match(r"\s*(\w+)\s*\(", self.lines[call_line - 1])
        if call is None:
            return None
        pattern = re.compile(_DEFINITION.format(re.escape(call.group(1))))
        path = self.file_of[call_line]
        return next(
            (i for i, text in enumerate(self.lines, 1) if self.file_of.get(i) == path and pattern.match(text)), None
        )

    def block(self, own: list[int], inner: list[int]) -> tuple[int, int] | None:
        """The range of a node's code from the lines marked with it (``own``) and with what it holds (``inner``):
        in the file holding most of them (a GPU map: its kernel, not its launch), from the first, through the
        first run of its own lines and everything it holds, to where the braces opened there close. Own lines
        past that run are elsewhere: where its function is called, or its memory freed."""
        marked = own + inner
        if not marked:
            return None
        counts: dict[str, int] = defaultdict(int)
        for line in marked:
            counts[self.file_of[line]] += 1
        path = max(counts, key=lambda p: (counts[p], -min(line for line in marked if self.file_of[line] == p)))
        own = [line for line in own if self.file_of[line] == path]
        inner = [line for line in inner if self.file_of[line] == path]
        first = min(own + inner)
        last = max(inner, default=first)
        run = [line for line in own if line >= first]
        for previous, line in zip([first, *run], run):
            if line > previous + 1:
                break
            last = max(last, line)
        return first, self._closing(first, last)

    def _closing(self, first: int, last: int) -> int:
        """The line closing what lines ``first``..``last`` open: past ``last`` while a brace opened from ``first``
        on is still open (within the file; braces in literals and comments do not count)."""
        depth = 0
        for line in range(first, len(self.lines) + 1):
            if self.file_of.get(line) != self.file_of[first]:
                break
            depth += _braces(self.lines[line - 1])
            if line >= last and depth <= 0:
                return line
        return last


class _Index:
    """The generated lines by what they are marked with: a node (region, state, node id), or a region. A nested
    SDFG identical to one generated before has no lines of its own but a call of that one's function: it and
    what it holds stand for that one and what that one holds, node for node."""

    def __init__(self, generated_copy: dace.SDFG, text: _Text):
        self._copy = generated_copy
        self._by_node: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        self._by_region: dict[int, list[int]] = defaultdict(list)
        for line, (cfg, state, ids) in text.marks.items():
            self._by_region[cfg].append(line)
            for node_id in ids:
                self._by_node[(cfg, state, node_id)].append(line)
        self._alias: dict[int, tuple[nodes.Node, dace.SDFGState]] = {}
        for node, state in generated_copy.all_nodes_recursive():
            if isinstance(node, nodes.NestedSDFG) and id(node) not in self._alias:
                shared = self._shared(node, state, text)
                if shared is not None:
                    self._alias[id(node)] = shared
                    pairs = zip(node.sdfg.all_nodes_recursive(), shared[0].sdfg.all_nodes_recursive())
                    self._alias.update({id(mine): theirs for (mine, _), theirs in pairs})

    def _shared(
        self, node: nodes.NestedSDFG, state: dace.SDFGState, text: _Text
    ) -> tuple[nodes.NestedSDFG, dace.SDFGState] | None:
        """The nested SDFG whose function ``node`` calls, where it has none of its own."""
        own = self._of(node, state)
        if not own or self._within(node, state):
            return None
        defined = text.definition(own[0])
        if defined is None or defined not in text.marks:
            return None
        cfg, state_id, ids = text.marks[defined]
        if state_id is None or not ids:
            return None
        other_state = self._copy.cfg_list[cfg].node(state_id)
        other = other_state.node(ids[0])
        if other is node or not isinstance(other, nodes.NestedSDFG):
            return None
        return other, other_state

    def lines(self, found: Iterable[tuple[nodes.Node, dace.SDFGState]]) -> tuple[list[int], list[int]]:
        """The lines marked with the nodes themselves (a map: its entry) and those of what they hold (a map's
        exit and scope, a nested SDFG's regions)."""
        own, inner = [], []
        for node, state in found:
            while id(node) in self._alias:  # (a shared function's own calls of shared functions)
                node, state = self._alias[id(node)]
            if isinstance(node, nodes.MapExit):
                node = state.entry_node(node)
            own += self._of(node, state)
            inner += self._within(node, state)
        return sorted(set(own)), sorted(set(inner))

    def _of(self, node: nodes.Node, state: dace.SDFGState) -> list[int]:
        return self._by_node.get((state.parent_graph.cfg_id, state.block_id, state.node_id(node)), [])

    def _within(self, node: nodes.Node, state: dace.SDFGState) -> list[int]:
        if isinstance(node, nodes.NestedSDFG):
            regions = [node.sdfg, *node.sdfg.all_control_flow_regions(recursive=True)]
            return [line for region in regions for line in self._by_region.get(region.cfg_id, [])]
        if isinstance(node, nodes.MapEntry):
            lines = []
            for inside in state.scope_subgraph(node, include_entry=False, include_exit=True).nodes():
                lines += self._of(inside, state) + self._within(inside, state)
            return lines
        return []


def _braces(line: str) -> int:
    """Opening minus closing braces on a line of C++, outside literals and comments."""
    code = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', "", line).split("//")[0]
    return code.count("{") - code.count("}")
