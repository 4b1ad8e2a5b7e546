"""A session as static HTML: SVGs of the current graphs (Graphviz) and the tables of its steps.

This is what a saved notebook shows without a kernel (JupyterLab, nbconvert's HTML, GitHub). Every name,
label and piece of code is text here: it goes through ``html.escape`` or Graphviz's own escaping and the SVGs
are embedded as ``<img>`` data, which cannot run scripts.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import math
import re
import shutil
import subprocess
from typing import Any

from ..record import Row, Step, Table, tabulate_history, tabulate_timings
from ..session import Session
from . import graph as graphs
from . import overlays, profile

#: above this many nodes a picture is shown at its own size, in a box that scrolls
SCROLL_ABOVE = 60
# text columns read left-aligned (notebook styles right-align every cell)
_LEFT = " style='text-align: left'"
# tables start at the left edge, under their heading (JupyterLab centres tables in rendered HTML)
_TABLE = " style='margin-left: 0; margin-right: auto'"

# SDFV's shapes and colours: access nodes are ellipses, tasklets octagons, map entries and exits trapezoids,
# library nodes boxes, nested SDFGs double boxes
_SHAPES = {
    graphs.ACCESS: 'shape=ellipse style=filled fillcolor="#ffffff"',
    graphs.TASKLET: 'shape=octagon style=filled fillcolor="#ffffff"',
    graphs.MAP_ENTRY: 'shape=trapezium style=filled fillcolor="#d6e4ff"',
    graphs.MAP_EXIT: 'shape=invtrapezium style=filled fillcolor="#d6e4ff"',
    graphs.LIBRARY: 'shape=box style="filled,rounded" fillcolor="#ffe9c7"',
    graphs.NESTED: 'shape=box peripheries=2 style=filled fillcolor="#eeeeee"',
    graphs.OTHER: "shape=box",
}
# what the step did to a node, as its outline: the same colours as the widget's view
_CHANGES = {graphs.ADDED: ("#2b8a3e", "added"), graphs.CHANGED: ("#f59f00", "changed")}
#: the most removed nodes the line under a graph names (here and in the widget's view, which it is sent to)
REMOVED_SHOWN = 12


def to_html(session: Session) -> str:
    """The whole session: title, the current step, the history, and both graphs."""
    current = session.current
    parts = [
        '<div class="dcnb-static" style="font-family: sans-serif; font-size: 13px">',
        f"<h4 style='margin: 4px 0'>dcnb session: {_e(session.name)} on {_e(session.device)}</h4>",
        step_html(current),
        "<h5 style='margin: 8px 0 4px'>History</h5>",
        table_html(history(session)),
        chart_svg(session.history),
    ]
    # forward and backward side by side where the page is wide enough, as a reader compares them
    parts.append("<div style='display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start'>")
    shown = (("Forward SDFG", session.forward_sdfg), ("Backward SDFG", session.backward_sdfg))
    # each graph says what the step changed in the SDFG of the good step it was made from (the naive step: none)
    diffs = graphs.step_diffs(session) if any(sdfg is not None for _, sdfg in shown) else (None, None)
    # what the widget worked out or measured of the step (overlays.measured): the same heat and numbers
    metrics = overlays.measured(session) if session.forward_sdfg is not None else {}
    for (title, sdfg), diff, side in zip(shown, diffs, overlays.SIDES, strict=True):
        if sdfg is None:
            continue
        picture = graphs.describe(sdfg, before=diff, metrics=metrics.get(side))
        parts.append("<div class='dcnb-static-graph' style='flex: 1 1 0; min-width: 320px'>")
        parts.append(
            f"<h5 style='margin: 8px 0 4px'>{title}: {_e(picture['name'])} ({graphs.size(picture)} nodes)</h5>"
        )
        parts.append(graph_img(picture))
        parts.append("</div>")
    parts.append("</div>")
    found = profile.table(session) if session.forward_sdfg is not None else None
    if found is not None:
        parts.append(profile_html(found))
    parts.append("</div>")
    return "\n".join(parts)


def profile_html(found: dict[str, Any]) -> str:
    """The top ops of a profiled step (``profile.table``: its kernels summed per op) beside PyTorch eager's top ops,
    as tables."""
    kernels = Table(
        "kernels",
        ("op", "side", "ms", "share"),
        tuple(Row((k["name"], k["side"], f"{k['ms']:.3f}", f"{k['share']:.0%}")) for k in found["rows"][:TOP_SHOWN]),
        caption=f"step {found['step']}, instrumented: {found['step_ms']:.3f} ms per forward+backward",
        left=(0, 1),
    )
    eager = Table(
        "eager",
        ("op", "ms", "share"),
        tuple(Row((op["name"], f"{op['ms']:.3f}", f"{op['share']:.0%}")) for op in found["eager"][:TOP_SHOWN]),
        caption=f"PyTorch eager (torch.profiler): {found['torch_ms']:.3f} ms per forward+backward",
        left=(0,),
    )
    return (
        "<h5 style='margin: 8px 0 4px'>Profile: top ops, their kernels summed</h5>"
        "<div style='display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start'>"
        f"<div>{table_html(kernels)}</div><div>{table_html(eager)}</div></div>"
    )


def history(session: Session) -> Table:
    """The history table as the views show it."""
    return tabulate_history(session.history, session.current.index)


def step_html(step: Step) -> str:
    """One step: its summary (``Step.summary``'s headline and facts) and its timing table."""
    if not step.ok:
        return f"<p><b>{_e(step.headline)} failed</b>: {_e(step.error or '')}</p>"
    text = " &middot; ".join([f"<p><b>{_e(step.headline)}</b>", *map(_e, step.facts())]) + "</p>"
    if step.cuda is not None and step.cuda.log:
        text += f"<details><summary>CUDA build log</summary><pre>{_e(step.cuda.log)}</pre></details>"
    return text + table_html(tabulate_timings(step.timings))


def table_html(table: Table) -> str:
    """A record.Table as the widget draws it (its class names too), with inline styles for readers without
    dcnb's stylesheet (nbconvert, GitHub); empty where it has no rows."""
    if not table.rows:
        return ""

    def cell(tag: str, text: str, i: int, span: int = 1) -> str:
        attrs = f" colspan='{span}'" if span > 1 else ""
        if i in table.left or span > 1:
            attrs += f" class='dcnb-left'{_LEFT}"
        return f"<{tag}{attrs}>{_e(text)}</{tag}>"

    n = len(table.columns)
    rows = ["<tr>" + "".join(cell("th", c, i) for i, c in enumerate(table.columns)) + "</tr>"]
    for r in table.rows:
        classes = ("dcnb-ok" if r.ok else "dcnb-failed") + (" dcnb-current" if r.current else "")
        mark = " style='font-weight: bold'" if r.current else ""
        last = len(r.cells) - 1
        rows.append(
            f"<tr class='{classes}'{mark}>"
            + "".join(
                cell("th" if table.row_headers and i == 0 else "td", c, i, n - last if i == last else 1)
                for i, c in enumerate(r.cells)
            )
            + "</tr>"
        )
    caption = f"<caption>{_e(table.caption)}</caption>" if table.caption else ""
    return f"<table class='dcnb-table dcnb-{table.kind}'{_TABLE}>{caption}{''.join(rows)}</table>"


#: medians spread wider than this go on a log scale (labextension/src/chart.ts's LOG_SPREAD)
LOG_SPREAD = 20


def chart_svg(steps: list[Step], width: int = 360, height: int = 120) -> str:
    """Median ms per step as bars (dcnb), with torch eager and torch.compile as lines; empty without timings."""
    timed = [s for s in steps if s.ok and "dcnb" in s.timings]
    if not timed:
        return ""
    medians = [t.median for s in timed for t in s.timings.values() if t.median > 0]
    top = max(medians, default=1.0) * 1.1
    # as the live view's chart (labextension/src/chart.ts): medians spread wider than LOG_SPREAD on a log scale,
    # whose bottom is a third of the smallest, so that a slow naive step does not flatten the fast ones
    log = bool(medians) and top / min(medians) > LOG_SPREAD
    bottom = min(medians) / 3 if log else 0.0
    # a bar is never wider than 60px, so that one step does not fill the chart; the title and the legend take
    # two lines above the plot
    pad, bar = 40, min((width - 40) / len(timed), 60)

    def rise(value: float) -> float:
        if log:
            return (height - pad) * math.log(max(value, bottom) / bottom) / math.log(top / bottom)
        return (height - pad) * value / top

    title = f"median ms per step, log scale ({bottom:.2g} to {top:.3g})" if log else f"median ms per step (top {top:.3g})"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'font-family="sans-serif" font-size="10"><title>median ms per step</title>',
        f'<text x="2" y="10">{title}</text>',
    ]
    for i, s in enumerate(timed):
        h = rise(s.timings["dcnb"].median)
        x = 30 + i * bar
        out.append(f'<rect x="{x + 2:.1f}" y="{height - 14 - h:.1f}" width="{bar - 4:.1f}" height="{h:.1f}" fill="#4a7bd0"/>')
        out.append(f'<text x="{x + 2:.1f}" y="{height - 2}">{s.index}</text>')
    for name, colour in (("torch", "#d9534f"), ("torch_compile", "#5cb85c")):
        points = [
            (30 + (i + 0.5) * bar, height - 14 - rise(s.timings[name].median))
            for i, s in enumerate(timed)
            if name in s.timings
        ]
        if points:
            xy = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            out.append(f'<polyline points="{xy}" fill="none" stroke="{colour}" stroke-width="2"/>')
            # a dot at each step, so that a single step's baseline shows too
            out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points)
    out.append(
        '<text x="2" y="24" fill="#4a7bd0">■ dcnb</text><text x="52" y="24" fill="#d9534f">■ torch eager</text>'
        '<text x="132" y="24" fill="#5cb85c">■ torch.compile</text></svg>'
    )
    return "".join(out)


# --- graphs ---------------------------------------------------------------------------------------------------


def graph_img(picture: dict[str, Any]) -> str:
    """The picture as an SVG image (or a note where Graphviz is not installed), and under it what the step that
    made it changed and the legend of its heat colouring."""
    svg = to_svg(picture)
    if svg is None:
        return "<p><i>(install Graphviz to see the graph here)</i></p>" + changes_html(picture) + heat_html(picture)
    return _graph_box(picture, svg) + heat_html(picture)


def heat_html(picture: dict[str, Any]) -> str:
    """The legend of a picture's heat colouring and the numbers of its hottest nodes (an SVG drawn as an image
    shows no tooltips); empty where its nodes carry no metrics."""
    heat = _Heat.of(picture)
    if heat is None:
        return ""
    ramp = "".join(f"<span style='background: {c}'>&nbsp;&nbsp;&nbsp;</span>" for c in HEAT_COLOURS)
    # a map's entry and exit carry the same numbers: the entry stands for both
    measured = [n for n in graphs.all_nodes(picture) if n["kind"] != graphs.MAP_EXIT and n.get("metrics")]
    hottest = sorted(measured, key=lambda n: -n["metrics"].get(heat.metric, 0))[:HOTTEST_SHOWN]
    rows = [
        f"<li>{_e(n.get('name') or n['label'])}: {_e(_metrics_text(n['metrics']))}</li>"
        for n in hottest
        if n["metrics"].get(heat.metric)
    ]
    return (
        f"<p class='dcnb-heat' style='margin: 4px 0'>colour: {OVERLAYS[heat.metric]} from "
        f"{_e(metric_text(heat.metric, heat.low))} {ramp} to {_e(metric_text(heat.metric, heat.high))}</p>"
        f"<ul class='dcnb-hottest' style='margin: 2px 0'>{''.join(rows)}</ul>"
    )


def _metrics_text(measured: dict[str, float]) -> str:
    return " · ".join(f"{OVERLAYS[k]} {metric_text(k, measured[k])}" for k in OVERLAYS if k in measured)


def _graph_box(picture: dict[str, Any], svg: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    img = f'<img alt="{_e(picture["name"])}" style="max-width: 100%" src="data:image/svg+xml;base64,{data}"/>'
    if graphs.size(picture) <= SCROLL_ABOVE:
        return img + changes_html(picture)
    # a large graph at its own size opens on a corner of it (often empty), and shrunk to fit both ways a tall one
    # is a sliver: it fits the width in a box that scrolls down, and its full size is one click away
    box = "<div style='max-height: 720px; overflow: auto; border: 1px solid #c8d0e0'>{}</div>"
    full = img.replace("max-width: 100%", "max-width: none")
    return (
        box.format(img)
        + changes_html(picture)
        + "<details><summary style='cursor: pointer'>at full size</summary>"
        + box.format(full)
        + "</details>"
    )


def changes_html(picture: dict[str, Any]) -> str:
    """The line under a graph: how many nodes the step added and changed (their outlines' colours), and the
    nodes it removed; empty for a picture drawn without the step before it."""
    if "removed" not in picture:
        return ""
    counts = {change: 0 for change in _CHANGES}
    for node in graphs.all_nodes(picture):
        if node.get("change") in counts:
            counts[node["change"]] += 1
    parts = [
        f"<span style='color: {colour}'>&#9634; {counts[change]} {word}</span>"
        for change, (colour, word) in _CHANGES.items()
    ]
    removed = [f"{r['name']} ({r['kind'].replace('_', ' ')})" for r in picture["removed"]]
    if removed:
        more = f", and {len(removed) - REMOVED_SHOWN} more" if len(removed) > REMOVED_SHOWN else ""
        parts.append(f"{len(removed)} removed: " + _e(", ".join(removed[:REMOVED_SHOWN]) + more))
    else:
        parts.append("0 removed")
    return "<p class='dcnb-changes' style='margin: 4px 0'>this step: " + " &middot; ".join(parts) + "</p>"


def to_svg(picture: dict[str, Any]) -> str | None:
    """The SVG Graphviz draws of a picture, or None without Graphviz's ``dot``."""
    dot = _dot()
    if dot is None:
        return None
    done = subprocess.run([dot, "-Tsvg"], input=to_dot(picture), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return None
    return done.stdout


@functools.cache
def _dot() -> str | None:
    return shutil.which("dot")


def to_dot(picture: dict[str, Any]) -> str:
    """The picture in Graphviz's language: states, map scopes and nested SDFGs as clusters (map scopes and nested
    SDFGs collapsed if large); what the step added and changed outlined in colour; where its nodes carry metrics,
    a heat colouring (``_Heat``) and their numbers in each node's tooltip."""
    collapse = graphs.size(picture) > graphs.COLLAPSE_ABOVE
    lines = [
        "digraph sdfg {",
        '  graph [fontname="Helvetica" fontsize=10 rankdir=TB compound=true];',
        '  node [fontname="Helvetica" fontsize=10 height=0.3];',
        '  edge [fontname="Helvetica" fontsize=8 color="#555555"];',
    ]
    _dot_sdfg(picture, lines, collapse, _Heat.of(picture), "  ")
    lines.append("}")
    return "\n".join(lines)


def _dot_sdfg(picture: dict[str, Any], lines: list[str], collapse: bool, heat: _Heat | None, indent: str) -> None:
    for state in picture["states"]:
        lines.append(f'{indent}subgraph "cluster_{state["id"]}" {{')
        lines.append(f'{indent}  label={_q(state["label"])} style=filled fillcolor="#eef2f8" color="#8a99b8";')
        by_scope: dict[str | None, list[dict[str, Any]]] = {}
        for node in state["nodes"]:
            by_scope.setdefault(node["scope"], []).append(node)
        shown = _scope_nodes(state, by_scope, None, lines, collapse, heat, indent + "  ")
        for edge in state["edges"]:
            src, dst = shown.get(edge["src"]), shown.get(edge["dst"])
            if src is None or dst is None or src == dst:
                continue
            label = edge["label"] + (f"\nvolume {edge['volume']}" if edge.get("volume") else "")
            lines.append(f"{indent}  {_q(src)} -> {_q(dst)} [label={_q(label)}];")
        lines.append(f"{indent}}}")
    for e in picture["interstate"]:
        lines.append(f'{indent}{_q(e["src"] + ":anchor")} -> {_q(e["dst"] + ":anchor")} [label={_q(e["label"])}];')


def _scope_nodes(
    state: dict[str, Any],
    by_scope: dict[str | None, list[dict[str, Any]]],
    scope: str | None,
    lines: list[str],
    collapse: bool,
    heat: _Heat | None,
    indent: str,
) -> dict[str, str]:
    """Emit the nodes of one scope; returns node id -> the id drawn for it (a collapsed map stands for its body)."""
    shown: dict[str, str] = {}
    if scope is None and state["nodes"]:
        lines.append(f'{indent}{_q(state["id"] + ":anchor")} [shape=point style=invis];')
    for node in by_scope.get(scope, []):
        if node["kind"] == graphs.NESTED and "sdfg" in node:
            if collapse:
                lines.append(_dot_node(node, indent, heat, f"\n({graphs.size(node['sdfg'])} nodes inside)"))
            else:
                # drawn in place, as a map scope is: its node on top, its states in its box below it
                lines.append(f'{indent}subgraph "cluster_{node["id"]}" {{')
                lines.append(f'{indent}  label="" style=filled fillcolor="#ffffff" color="#888888" penwidth=2;')
                lines.append(_dot_node(node, indent + "  ", heat))
                _dot_sdfg(node["sdfg"], lines, collapse, heat, indent + "  ")
                lines.extend(
                    f"{indent}  {_q(node['id'])} -> {_q(state['id'] + ':anchor')} [style=invis];"
                    for state in node["sdfg"]["states"]
                    if state["nodes"]
                )
                lines.append(f"{indent}}}")
            shown[node["id"]] = node["id"]
            continue
        if node["kind"] == graphs.MAP_ENTRY:
            if collapse:
                body = _descendants(node["id"], by_scope)
                lines.append(_dot_node(node, indent, heat, f"\n({len(body)} nodes inside)"))
                shown[node["id"]] = node["id"]
                shown.update({n: node["id"] for n in body})
                continue
            lines.append(f'{indent}subgraph "cluster_{node["id"]}" {{')
            lines.append(f'{indent}  label="" style=dashed color="#4a7bd0";')
            lines.append(_dot_node(node, indent + "  ", heat))
            shown[node["id"]] = node["id"]
            shown.update(_scope_nodes(state, by_scope, node["id"], lines, collapse, heat, indent + "  "))
            lines.append(f"{indent}}}")
            continue
        lines.append(_dot_node(node, indent, heat))
        shown[node["id"]] = node["id"]
    return shown


def _descendants(scope: str, by_scope: dict[str | None, list[dict[str, Any]]]) -> list[str]:
    found = []
    for node in by_scope.get(scope, []):
        found.append(node["id"])
        found.extend(_descendants(node["id"], by_scope) if node["kind"] == graphs.MAP_ENTRY else [])
    return found


def _dot_node(node: dict[str, Any], indent: str, heat: _Heat | None, note: str = "") -> str:
    label = node.get("name") or node["label"]
    if node["kind"] in (graphs.MAP_ENTRY, graphs.MAP_EXIT):
        label += f" [{node['info'].get('range', '')}]"
    outline = ""
    if node.get("change") in _CHANGES:
        outline = f' color="{_CHANGES[node["change"]][0]}" penwidth=3'
    shape = _SHAPES.get(node["kind"], "shape=box")
    measured = node.get("metrics") or {}
    if heat is not None and (value := measured.get(heat.metric)):
        shape = re.sub(r'fillcolor="[^"]*"', "", shape).replace("style=filled", "").strip()
        styled = "rounded,filled" if node["kind"] == graphs.LIBRARY else "filled"
        shape = re.sub(r'style="[^"]*"', "", shape).strip() + f' style="{styled}" fillcolor="{heat.colour(value)}"'
    tip = f" tooltip={_q(_metrics_text(measured))}" if measured else ""
    return f"{indent}{_q(node['id'])} [label={_q(label + note)} {shape}{outline}{tip}];"


#: the overlays' metrics in the widget's order, as its selector names them
#: each metric a graph can be coloured by, in the order they are offered, and its name (the widget's view names them so
#: too: sent in its ``constants``)
OVERLAYS = {"bytes": "bytes", "flops": "FLOPs", "intensity": "intensity", "ms": "time"}
#: light yellow to dark red (ColorBrewer's YlOrRd), readable under black labels at its light end; the widget's view
#: colours by them too (sent in its ``constants``)
HEAT_COLOURS = ("#ffffb2", "#fecc5c", "#fd8d3c", "#f03b20", "#bd0026")
_UNITS = {"bytes": "B", "flops": "FLOP", "intensity": "FLOP/byte", "ms": "ms"}
#: rows of each profile table shown
TOP_SHOWN = 10
#: nodes whose numbers the legend under a coloured graph lists
HOTTEST_SHOWN = 5


def metric_text(metric: str, value: float) -> str:
    """A metric as the widget's tooltips write it: bytes and FLOPs with SI prefixes, 3 significant digits."""
    if metric in ("bytes", "flops"):
        prefix = ""
        for step in ("k", "M", "G", "T", "P"):
            if abs(value) < 1000:
                break
            value, prefix = value / 1000, step
        return f"{f'{value:.3g}' if prefix else f'{value:g}'} {prefix}{_UNITS[metric]}"
    return f"{value:.3g} {_UNITS[metric]}"


@dataclasses.dataclass(frozen=True)
class _Heat:
    """The heat colouring of one picture: a metric on a log scale between its smallest and largest value there."""

    metric: str
    low: float
    high: float

    @classmethod
    def of(cls, picture: dict[str, Any]) -> _Heat | None:
        """Time where the step was profiled, else bytes moved (what the static picture has room for: one); None
        where its nodes have neither."""
        for metric in ("ms", "bytes"):
            values = [v for n in graphs.all_nodes(picture) if (v := (n.get("metrics") or {}).get(metric)) and v > 0]
            if values:
                return cls(metric, min(values), max(values))
        return None

    def colour(self, value: float) -> str:
        t = 1.0 if self.high <= self.low else (math.log(value) - math.log(self.low)) / math.log(self.high / self.low)
        t = min(1.0, max(0.0, t)) * (len(HEAT_COLOURS) - 1)
        i = min(int(t), len(HEAT_COLOURS) - 2)
        a, b = (_rgb(HEAT_COLOURS[i]), _rgb(HEAT_COLOURS[i + 1]))
        return "#" + "".join(f"{round(x + (y - x) * (t - i)):02x}" for x, y in zip(a, b))


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(colour[k : k + 2], 16) for k in (1, 3, 5))


def _q(text: str) -> str:
    """A Graphviz quoted string holding ``text`` literally (Graphviz escapes it again when writing SVG)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
