// The SDFG pictures the kernel sends (dcnb/_src/graph.py) and their layout, scope by scope, with dagre.
//
// Like DaCe's SDFV, each map scope is laid out on its own and then placed as one box in its parent, so a
// collapsed scope costs one node and its body is never laid out. Pure code: no DOM, tested under node.
import * as dagre from '@dagrejs/dagre';

export type Kind = 'access' | 'map_entry' | 'map_exit' | 'tasklet' | 'library' | 'nested' | 'other';

export interface NodeData {
  id: string;
  kind: Kind;
  label: string;
  scope: string | null;
  info: Record<string, string>;
  exit?: string;
  sdfg?: GraphData;
}

export interface EdgeData {
  src: string;
  dst: string;
  label: string;
  data?: string;
  subset?: string;
  volume?: string;
  wcr?: string;
  connectors?: string;
}

export interface StateData {
  id: string;
  label: string;
  nodes: NodeData[];
  edges: EdgeData[];
}

export interface GraphData {
  name: string;
  states: StateData[];
  interstate: { src: string; dst: string; label: string }[];
}

// A whole SDFG's picture (graph.describe): a picture of more nodes than `collapse_above` opens with its map
// scopes collapsed, as the static SVG draws it.
export interface Picture extends GraphData {
  collapse_above: number;
}

export interface Box {
  id: string;
  x: number; // top-left corner
  y: number;
  width: number;
  height: number;
}

export interface PlacedNode extends Box {
  node: NodeData;
  // the nodes hidden inside a collapsed map scope
  hidden?: number;
}

export interface PlacedEdge {
  edge: EdgeData;
  points: { x: number; y: number }[];
  // where dagre left room for the memlet's label, if it is drawn at this level
  labelAt?: { x: number; y: number };
}

export interface PlacedScope extends Box {
  entry: NodeData;
}

export interface PlacedState extends Box {
  state: StateData;
}

export interface Layout {
  width: number;
  height: number;
  states: PlacedState[];
  scopes: PlacedScope[];
  nodes: PlacedNode[];
  edges: PlacedEdge[];
  interstate: PlacedEdge[];
}

const CHAR_WIDTH = 7; // at the 12px font the view draws labels with
const NODE_HEIGHT = 30;
const STATE_PADDING = 24;

// The size a node's label needs (map entries and exits also show their range).
export function nodeSize(node: NodeData): { width: number; height: number } {
  const text = nodeText(node);
  const extra = node.kind === 'map_entry' || node.kind === 'map_exit' ? 50 : node.kind === 'tasklet' ? 30 : 24;
  return { width: Math.max(60, Math.min(420, text.length * CHAR_WIDTH + extra)), height: NODE_HEIGHT };
}

export function nodeText(node: NodeData): string {
  if (node.kind === 'map_entry' || node.kind === 'map_exit') {
    return `${node.label} [${node.info.range ?? ''}]`;
  }
  return node.label;
}

// Total nodes in a picture, nested SDFGs included.
export function countNodes(graph: GraphData | null | undefined): number {
  if (!graph) {
    return 0;
  }
  let total = 0;
  for (const state of graph.states) {
    for (const node of state.nodes) {
      total += 1 + countNodes(node.sdfg);
    }
  }
  return total;
}

// The map entries of a picture (what can be collapsed).
export function scopeIds(graph: GraphData): string[] {
  const ids: string[] = [];
  for (const state of graph.states) {
    for (const node of state.nodes) {
      if (node.kind === 'map_entry') {
        ids.push(node.id);
      }
    }
  }
  return ids;
}

interface Block {
  width: number;
  height: number;
  nodes: PlacedNode[];
  scopes: PlacedScope[];
  edges: PlacedEdge[];
}

// Lay out a whole picture; map entries in `collapsed` stand for their scope as one node.
export function layoutGraph(graph: GraphData, collapsed: Set<string>): Layout {
  const blocks = new Map<string, Block>();
  for (const state of graph.states) {
    blocks.set(state.id, layoutState(state, collapsed));
  }
  // the states themselves, as boxes joined by interstate edges
  const g = newGraph(40);
  for (const state of graph.states) {
    const b = blocks.get(state.id)!;
    g.setNode(state.id, { width: b.width + 2 * STATE_PADDING, height: b.height + 2 * STATE_PADDING });
  }
  graph.interstate.forEach((e, i) => g.setEdge(e.src, e.dst, { width: e.label.length * 6, height: 14 }, `i${i}`));
  dagre.layout(g);
  const result: Layout = { width: 0, height: 0, states: [], scopes: [], nodes: [], edges: [], interstate: [] };
  for (const state of graph.states) {
    const n = g.node(state.id);
    const box = { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height };
    result.states.push({ id: state.id, ...box, state });
    const b = blocks.get(state.id)!;
    const dx = box.x + STATE_PADDING;
    const dy = box.y + STATE_PADDING;
    for (const p of b.nodes) {
      result.nodes.push({ ...p, x: p.x + dx, y: p.y + dy });
    }
    for (const s of b.scopes) {
      result.scopes.push({ ...s, x: s.x + dx, y: s.y + dy });
    }
    for (const e of b.edges) {
      result.edges.push(shift(e, dx, dy));
    }
  }
  graph.interstate.forEach((e, i) => {
    const edge = g.edge(e.src, e.dst, `i${i}`);
    if (edge?.points) {
      result.interstate.push({ edge: { src: e.src, dst: e.dst, label: e.label }, points: edge.points });
    }
  });
  const info = g.graph();
  result.width = info.width ?? 0;
  result.height = info.height ?? 0;
  return result;
}

function shift(e: PlacedEdge, dx: number, dy: number): PlacedEdge {
  const moved: PlacedEdge = { edge: e.edge, points: e.points.map(q => ({ x: q.x + dx, y: q.y + dy })) };
  if (e.labelAt) {
    moved.labelAt = { x: e.labelAt.x + dx, y: e.labelAt.y + dy };
  }
  return moved;
}

function newGraph(ranksep = 30): dagre.graphlib.Graph {
  const g = new dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: 'TB', nodesep: 20, ranksep, edgesep: 10, marginx: 0, marginy: 0 });
  g.setDefaultEdgeLabel(() => ({}));
  return g;
}

// Lay out one state: its outermost scope, whose map scopes are laid out first, each on its own.
export function layoutState(state: StateData, collapsed: Set<string>): Block {
  const byId = new Map(state.nodes.map(n => [n.id, n]));
  const children = new Map<string | null, NodeData[]>();
  for (const node of state.nodes) {
    const list = children.get(node.scope) ?? [];
    list.push(node);
    children.set(node.scope, list);
  }
  // the member of `scope` that stands for `id` (itself, or the outermost map inside `scope` that holds it)
  const representative = (id: string, scope: string | null): string | null => {
    let current: string | null = id;
    while (current !== null) {
      const node = byId.get(current);
      if (!node) {
        return null;
      }
      if (current === scope || node.scope === scope) {
        return current;
      }
      current = node.scope;
    }
    return null;
  };
  const hiddenCount = (entry: string): number => {
    let total = 0;
    for (const child of children.get(entry) ?? []) {
      total += 1 + (child.kind === 'map_entry' ? hiddenCount(child.id) : 0);
    }
    return total;
  };

  const layoutScope = (scope: string | null): Block => {
    const members = [...(scope !== null ? [byId.get(scope)!] : []), ...(children.get(scope) ?? [])];
    const inner = new Map<string, Block>();
    const g = newGraph();
    for (const node of members) {
      if (node.kind === 'map_entry' && node.id !== scope && !collapsed.has(node.id)) {
        const block = layoutScope(node.id);
        inner.set(node.id, block);
        g.setNode(node.id, { width: block.width, height: block.height });
      } else if (node.kind === 'map_entry' && node.id !== scope) {
        // a collapsed scope also says how many nodes it hides
        const size = nodeSize(node);
        g.setNode(node.id, { width: Math.min(size.width + 90, 500), height: size.height });
      } else {
        g.setNode(node.id, nodeSize(node));
      }
    }
    const memberIds = new Set(members.map(m => m.id));
    state.edges.forEach((e, i) => {
      const src = representative(e.src, scope);
      const dst = representative(e.dst, scope);
      if (src === null || dst === null || src === dst || !memberIds.has(src) || !memberIds.has(dst)) {
        return;
      }
      // labels take no room in the layout (dagre would give each one a node of its own): they are drawn
      // beside the edge's middle, and only for memlets whose both ends are drawn at this level
      g.setEdge(src, dst, { labelled: src === e.src && dst === e.dst }, `e${i}`);
    });
    dagre.layout(g);
    const block: Block = { width: 0, height: 0, nodes: [], scopes: [], edges: [] };
    for (const node of members) {
      const n = g.node(node.id);
      const x = n.x - n.width / 2;
      const y = n.y - n.height / 2;
      const sub = inner.get(node.id);
      if (sub) {
        block.scopes.push({ id: node.id, x, y, width: n.width, height: n.height, entry: node });
        block.nodes.push(...sub.nodes.map(p => ({ ...p, x: p.x + x, y: p.y + y })));
        block.scopes.push(...sub.scopes.map(s => ({ ...s, x: s.x + x, y: s.y + y })));
        block.edges.push(...sub.edges.map(e => shift(e, x, y)));
      } else {
        const placed: PlacedNode = { id: node.id, x, y, width: n.width, height: n.height, node };
        if (node.kind === 'map_entry' && node.id !== scope && collapsed.has(node.id)) {
          placed.hidden = hiddenCount(node.id);
        }
        block.nodes.push(placed);
      }
    }
    for (const e of g.edges()) {
      const data = g.edge(e);
      const index = Number(e.name?.slice(1));
      const placed: PlacedEdge = { edge: state.edges[index], points: data.points ?? [] };
      if (data.labelled && placed.points.length) {
        const middle = placed.points[Math.floor(placed.points.length / 2)];
        placed.labelAt = { x: middle.x + 36, y: middle.y };
      }
      block.edges.push(placed);
    }
    const info = g.graph();
    block.width = info.width ?? 0;
    block.height = info.height ?? 0;
    return block;
  };
  return layoutScope(null);
}
