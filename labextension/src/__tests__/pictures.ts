// Pictures for the tests: made by hand, or dumped from a real session (fixtures/).
import * as fs from 'node:fs';
import * as path from 'node:path';

import { GraphData, NodeData, Picture, StateData } from '../layout';

export function node(id: string, kind: NodeData['kind'], scope: string | null, label = id): NodeData {
  return { id, kind, label, scope, info: kind.startsWith('map') ? { range: '0:4' } : {} };
}

// x -> [map m: x -> t -> y] -> y, with the map's body nested `depth` maps deep
export function mapState(prefix: string, depth: number): StateData {
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

export function graph(states: StateData[]): GraphData {
  return { name: 'g', states, interstate: [] };
}

// x -> [nested SDFG n: a state with `depth` maps] -> y, in a state of its own; the nested nodes' ids prefixed
export function nestedPicture(depth: number, collapseAbove = 250): Picture {
  const inner = graph([mapState('s0n1.', depth)]);
  const nested: NodeData = { ...node('s0n1', 'nested', null), name: 'layer norm', sdfg: inner };
  const outer: StateData = {
    id: 's0',
    label: 'outer',
    nodes: [node('s0n0', 'access', null), nested, node('s0n2', 'access', null)],
    edges: [
      { src: 's0n0', dst: 's0n1', label: 'x[0:4]' },
      { src: 's0n1', dst: 's0n2', label: 'y[0:4]' }
    ]
  };
  return { ...graph([outer]), collapse_above: collapseAbove };
}

// Pictures dumped from a real session. prenorm_auto_optimize.json: tests/zoo.py's prenorm_residual after
// auto_optimize, `graph.describe(sdfg, before=<the naive step's>)` of its forward and backward SDFGs.
export function fixture(name: string): Record<'forward' | 'backward', Picture> {
  return JSON.parse(fs.readFileSync(path.resolve(__dirname, '../../src/__tests__/fixtures', name), 'utf8'));
}

