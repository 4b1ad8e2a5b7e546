// Layout of SDFG pictures, scope by scope, and the history chart (node's test runner; `npm test`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';

import {
  ancestors,
  countNodes,
  defaultCollapsed,
  GraphData,
  Layout,
  layoutGraph,
  nodeText,
  nodeTree,
  scopeIds,
  seedOf,
  shownAs
} from '../layout';
import { chart, searchPlot } from '../chart';
import { elapsed, percent, StepData } from '../format';
import { heatColour, heatPosition, heatScale, metricText } from '../overlay';
import { DEFAULTS } from '../protocol';
import { fixture, graph, mapState, nestedPicture, node } from './pictures';

const inside = (inner: { x: number; y: number; width: number; height: number }, outer: typeof inner) =>
  inner.x >= outer.x - 0.5 &&
  inner.y >= outer.y - 0.5 &&
  inner.x + inner.width <= outer.x + outer.width + 0.5 &&
  inner.y + inner.height <= outer.y + outer.height + 0.5;

test('each map scope is laid out inside its box, entry above its body, exit below', () => {
  const layout = layoutGraph(graph([mapState('', 2)]), new Set());
  const byId = new Map(layout.nodes.map(n => [n.id, n]));
  assert.equal(layout.nodes.length, 7);
  const outer = layout.scopes.find(s => s.id === 'm0')!;
  const inner = layout.scopes.find(s => s.id === 'm1')!;
  assert.ok(inside(inner, outer));
  for (const id of ['m1', 'm1x', 't']) {
    assert.ok(inside(byId.get(id)!, inner), id);
  }
  assert.ok(!inside(byId.get('x')!, outer));
  assert.ok(byId.get('m0')!.y < byId.get('t')!.y && byId.get('t')!.y < byId.get('m0x')!.y);
  assert.ok(byId.get('x')!.y < byId.get('m0')!.y && byId.get('m0x')!.y < byId.get('y')!.y);
  // the memlets inside the inner scope are drawn, with their labels
  assert.ok(layout.edges.some(e => e.edge.src === 'm1' && e.edge.dst === 't' && e.labelAt));
});

test('a collapsed scope is one node that counts what it hides, and its body is not laid out', () => {
  const layout = layoutGraph(graph([mapState('', 2)]), new Set(['m0']));
  assert.deepEqual(layout.nodes.map(n => n.id).sort(), ['m0', 'x', 'y']);
  assert.equal(layout.nodes.find(n => n.id === 'm0')!.hidden, 4);
  assert.equal(layout.scopes.length, 0);
  // the memlets into and out of the scope are drawn to and from the collapsed entry
  assert.deepEqual(layout.edges.map(e => [e.edge.src, e.edge.dst]).sort(), [['m0x', 'y'], ['x', 'm0']]);
});

test('states are stacked without overlapping', () => {
  const g = graph([mapState('a', 1), mapState('b', 1)]);
  g.interstate.push({ src: 'as', dst: 'bs', label: '' });
  const layout = layoutGraph(g, new Set());
  const [a, b] = layout.states;
  assert.ok(a.y + a.height <= b.y);
  assert.equal(layout.interstate.length, 1);
  for (const n of layout.nodes) {
    assert.ok(inside(n, n.id.startsWith('a') ? a : b), n.id);
  }
});

test('a picture with thousands of nodes lays out, collapsed or not', () => {
  const states = Array.from({ length: 150 }, (_, i) => mapState(`s${i}_`, 3));
  const big = graph(states);
  assert.equal(countNodes(big), 150 * 9);
  const open = layoutGraph(big, new Set());
  assert.equal(open.nodes.length, 1350);
  const shut = layoutGraph(big, new Set(scopeIds(big)));
  assert.equal(shut.nodes.length, 150 * 3);
});

test('a nested SDFG is laid out inside its box, its states below its header, between its neighbours', () => {
  const layout = layoutGraph(nestedPicture(2), new Set());
  const box = layout.scopes.find(s => s.id === 's0n1')!;
  assert.equal(box.entry.kind, 'nested');
  assert.equal(box.depth, 0);
  const inner = layout.states.find(s => s.id === 's0n1.s')!;
  assert.equal(inner.depth, 1);
  assert.ok(inside(inner, box) && inner.y >= box.y + 20);
  for (const n of layout.nodes.filter(n => n.id.startsWith('s0n1.'))) {
    assert.ok(inside(n, inner), n.id);
  }
  // its map scopes are laid out as at the top level
  assert.ok(inside(layout.scopes.find(s => s.id === 's0n1.m1')!, layout.scopes.find(s => s.id === 's0n1.m0')!));
  const byId = new Map(layout.nodes.map(n => [n.id, n]));
  assert.ok(byId.get('s0n0')!.y + 30 <= box.y && box.y + box.height <= byId.get('s0n2')!.y);
  assert.ok(!layout.nodes.some(n => n.id === 's0n1'));
  assert.ok(inside(box, layout.states.find(s => s.id === 's0')!));
});

test('a collapsed nested SDFG is one node that counts what it hides', () => {
  const layout = layoutGraph(nestedPicture(2), new Set(['s0n1']));
  assert.deepEqual(layout.nodes.map(n => n.id).sort(), ['s0n0', 's0n1', 's0n2']);
  assert.equal(layout.nodes.find(n => n.id === 's0n1')!.hidden, 7);
  assert.equal(layout.states.length, 1);
  assert.equal(layout.scopes.length, 0);
});

test('the view draws readable names, falling back to the label', () => {
  const map = { ...node('m', 'map_entry', null, 'outer_fused_map_3'), name: 'LayerNorm: mean' };
  assert.equal(nodeText(map), 'LayerNorm: mean [0:4]');
  assert.equal(nodeText(node('t', 'tasklet', null, '_Mult_')), '_Mult_');
});

test('the node tree knows what holds each node, through nested SDFGs', () => {
  const picture = nestedPicture(2);
  const tree = nodeTree(picture);
  assert.deepEqual(ancestors(tree, 's0n1.t'), ['s0n1.m1', 's0n1.m0', 's0n1']);
  assert.deepEqual(scopeIds(picture).sort(), ['s0n1', 's0n1.m0', 's0n1.m1']);
  assert.equal(shownAs(tree, 's0n1.t', new Set(['s0n1.m1'])), 's0n1.m1');
  assert.equal(shownAs(tree, 's0n1.t', new Set(['s0n1.m1', 's0n1'])), 's0n1');
  assert.equal(shownAs(tree, 's0n1.t', new Set()), 's0n1.t');
  assert.equal(tree.stateOf.get('s0n1.t')!.id, 's0n1.s');
});

test('a small picture opens expanded; a large one opens from the outside in, within its budget', () => {
  assert.equal(defaultCollapsed(nestedPicture(2)).size, 0);
  // the nested SDFG holds 9 nodes, its outer map 7: with room for 3 + 4 nodes only the nested SDFG opens
  assert.deepEqual([...defaultCollapsed(nestedPicture(3, 7))].sort(), ['s0n1.m0', 's0n1.m1', 's0n1.m2']);
  assert.deepEqual([...defaultCollapsed(nestedPicture(3, 9))].sort(), ['s0n1.m1', 's0n1.m2']);
  // with no room for the nested SDFG's own nodes everything stays closed
  assert.equal(defaultCollapsed(nestedPicture(3, 4)).size, 4);
});

test("after auto_optimize the prenorm block's work sits in nested SDFGs: they are drawn, inside their boxes", () => {
  const { forward, backward } = fixture('prenorm_auto_optimize.json');
  for (const picture of [forward, backward]) {
    const layout = layoutGraph(picture, defaultCollapsed(picture));
    const nested = layout.scopes.filter(s => s.entry.kind === 'nested');
    assert.ok(nested.length >= 2);
    // every node of the picture is drawn, inside the box of each nested SDFG around it
    assert.equal(layout.nodes.length + nested.length, countNodes(picture));
    const boxes = new Map(nested.map(s => [s.id, s]));
    const tree = nodeTree(picture);
    for (const n of layout.nodes) {
      assert.ok(Number.isFinite(n.x) && Number.isFinite(n.y), n.id);
      for (const a of ancestors(tree, n.id).filter(a => boxes.has(a))) {
        assert.ok(inside(n, boxes.get(a)!), `${n.id} in ${a}`);
      }
    }
    assert.ok(layout.width > 0 && layout.height > 0);
  }
});

test('the overlay scale is logarithmic over the positive values', () => {
  const heat = heatScale([10, undefined, 0, 1000, 100])!;
  assert.deepEqual(heat, { min: 10, max: 1000 });
  assert.ok(Math.abs(heatPosition(heat, 100) - 0.5) < 1e-12);
  // between the colours the kernel sends (its defaults: the static rendering's)
  const colours = DEFAULTS.constants.heat_colours;
  assert.equal(colours.length, 5);
  assert.equal(heatColour(heat, 10, colours), 'rgb(255, 255, 178)');
  assert.equal(heatColour(heat, 1000, colours), 'rgb(189, 0, 38)');
  assert.equal(heatColour(heat, 100, ['#000000', '#ffffff']), 'rgb(128, 128, 128)');
  assert.equal(heatScale([0, undefined]), null);
  assert.equal(heatPosition({ min: 5, max: 5 }, 5), 1);
  assert.equal(metricText('bytes', 512), '512 B');
  assert.equal(metricText('bytes', 3_145_728), '3.15 MB');
  assert.equal(metricText('flops', 2.5e9), '2.50 GFLOP');
  assert.equal(metricText('intensity', 0.25), '0.250 FLOP/byte');
  assert.equal(metricText('ms', 1.5), '1.50 ms');
  assert.equal(percent(0.125), '12.5%');
  assert.equal(elapsed(0, 59_900), '59 s');
  assert.equal(elapsed(1000, 125_000), '2 min 4 s');
});

const timing = (median: number) => ({ min: median, mean: median, median, stdev: 0, max: median, runs: 5 });

function step(index: number, ok: boolean, dcnb = 2, torch = 4): StepData {
  return {
    index,
    name: 'map_fusion',
    title: 'map_fusion',
    summary: `step ${index}: map_fusion`,
    ok,
    error: ok ? null : 'map_fusion breaks correctness',
    applied: 1,
    max_abs_error: 1e-7,
    intermediate_bytes: 3 << 20,
    compile_seconds: 1.25,
    timings: ok ? { dcnb: timing(dcnb), torch: timing(torch) } : {},
    notes: [],
    timing: { kind: 'timing', columns: [], rows: [], caption: '', left: [], row_headers: true }
  };
}

test('the chart has a bar per timed step and a line per baseline', () => {
  const c = chart([step(0, true, 8, 4), step(1, false), step(2, true, 2, 4)], 100, 50)!;
  assert.deepEqual(c.bars.map(b => b.index), [0, 2]);
  assert.ok(Math.abs(c.bars[0].height - 50 / 1.1) < 1e-9);
  assert.deepEqual(Object.keys(c.lines), ['torch']);
  assert.equal(chart([step(0, false)], 100, 50), null);
  assert.ok(!c.log && c.bottom === 0);
});

test('medians spread wider than 20x go on a log scale, where a fast step keeps a bar to see', () => {
  // the widget's transformer block: a 153 ms naive step, then 0.5 ms ones, eager at 0.9 ms
  const c = chart([step(0, true, 153, 0.9), step(1, true, 0.5, 0.9), step(2, true, 0.45, 0.9)], 100, 50)!;
  assert.ok(c.log && c.bottom > 0 && c.bottom < 0.45);
  assert.ok(c.bars[1].height > 5, `a 0.5 ms bar ${c.bars[1].height}px high`);
  assert.ok(c.bars[0].height > c.bars[1].height && c.bars[1].height > c.bars[2].height);
  // eager's line sits between the fast steps' bars and the slow one's top
  const eager = 50 - c.lines.torch[1].y;
  assert.ok(eager > c.bars[1].height && eager < c.bars[0].height);
});

// x feeds four tasklets a..d (one rank), which all write y
function fan(order: string[], extra: string[] = []): GraphData {
  const ids = [...order, ...extra];
  const nodes = [node('x', 'access', null), ...ids.map(id => node(id, 'tasklet', null)), node('y', 'access', null)];
  const edges = ids.flatMap(id => [
    { src: 'x', dst: id, label: '' },
    { src: id, dst: 'y', label: '' }
  ]);
  return graph([{ id: 's', label: 'state', nodes, edges }]);
}

test("a layout seeded with the picture before keeps that picture's nodes in their order, a new one among them", () => {
  const leftToRight = (layout: Layout, ids: string[]) =>
    ids.map(id => layout.nodes.find(n => n.node.label === id)!).sort((a, b) => a.x - b.x).map(n => n.node.label);
  for (const order of [['a', 'b', 'c', 'd'], ['d', 'b', 'a', 'c'], ['c', 'd', 'b', 'a']]) {
    // the picture before, laid out as dagre likes it; then re-ordered by hand, as another layout might have drawn it
    const before = fan(['a', 'b', 'c', 'd']);
    const drawn = layoutGraph(before, new Set());
    const xs = drawn.nodes.filter(n => n.node.kind === 'tasklet').map(n => n.x).sort((p, q) => p - q);
    order.forEach((id, i) => (drawn.nodes.find(n => n.id === id)!.x = xs[i]));
    // the next step's picture: new ids (its nodes in another order), one node more
    const after = fan(['d', 'c', 'b', 'a'], ['e']);
    after.states[0].nodes.forEach(n => (n.id = `n_${n.id}`));
    after.states[0].edges.forEach(e => ((e.src = `n_${e.src}`), (e.dst = `n_${e.dst}`)));
    const seeded = layoutGraph(after, new Set(), seedOf(before, drawn));
    assert.deepEqual(leftToRight(seeded, order), order);
  }
});

test("a search's plot: memory across from 0, time up from 0, the front joined left to right", () => {
  const point = (index: number, time: number, bytes: number, front: boolean) =>
    ({ index, title: `#${index}`, time, unit: 'x eager', bytes, front, best: index === 2 });
  const { most, placed, front } = searchPlot(
    [point(0, 1.0, 2048, false), point(1, 0.8, 4096, true), point(2, 0.5, 8192, true), point(3, 0.9, 1024, true)],
    100,
    50
  );
  assert.ok(Math.abs(most.time - 1.1) < 1e-9 && Math.abs(most.bytes - 8192 * 1.1) < 1e-6);
  const at = new Map(placed.map(p => [p.index, p]));
  assert.ok(at.get(0)!.y < at.get(2)!.y, 'slower is higher: the best sit low and left');
  assert.ok(at.get(3)!.x < at.get(1)!.x && at.get(1)!.x < at.get(2)!.x, 'more memory is further right');
  assert.deepEqual(front.map(p => p.index), [3, 1, 2]);
});
