// Layout of SDFG pictures, scope by scope, and the history chart (node's test runner; `npm test`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';

import { countNodes, GraphData, layoutGraph, NodeData, scopeIds, StateData } from '../layout';
import { chart } from '../chart';
import { StepData } from '../format';

function node(id: string, kind: NodeData['kind'], scope: string | null, label = id): NodeData {
  return { id, kind, label, scope, info: kind.startsWith('map') ? { range: '0:4' } : {} };
}

// x -> [map m: x -> t -> y] -> y, with the map's body nested `depth` maps deep
function mapState(prefix: string, depth: number): StateData {
  const nodes: NodeData[] = [node(`${prefix}x`, 'access', null), node(`${prefix}y`, 'access', null)];
  const edges: StateData['edges'] = [];
  let outer: string | null = null;
  let last = `${prefix}x`;
  for (let d = 0; d < depth; d++) {
    const entry = `${prefix}m${d}`;
    nodes.push(node(entry, 'map_entry', outer), node(`${entry}x`, 'map_exit', entry));
    edges.push({ src: last, dst: entry, label: `x[0:4]` });
    last = entry;
    outer = entry;
  }
  nodes.push(node(`${prefix}t`, 'tasklet', outer));
  edges.push({ src: last, dst: `${prefix}t`, label: 'x[i]' });
  last = `${prefix}t`;
  for (let d = depth - 1; d >= 0; d--) {
    edges.push({ src: last, dst: `${prefix}m${d}x`, label: 'y[i]' });
    last = `${prefix}m${d}x`;
  }
  edges.push({ src: last, dst: `${prefix}y`, label: 'y[0:4]' });
  return { id: `${prefix}s`, label: 'state', nodes, edges };
}

function graph(states: StateData[]): GraphData {
  return { name: 'g', states, interstate: [] };
}

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

const timing = (median: number) => ({ min: median, mean: median, median, stdev: 0, max: median, runs: 5 });

function step(index: number, ok: boolean, dcnb = 2, torch = 4): StepData {
  return {
    index,
    name: 'map_fusion',
    title: 'map_fusion',
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
});
