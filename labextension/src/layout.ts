// The SDFG pictures the kernel sends (dcnb/_src/views/graph.py) and their layout, scope by scope, with dagre.
//
// Like DaCe's SDFV, each map scope and each nested SDFG is laid out on its own and then placed as one box in its
// parent, so a collapsed one costs one node and its body is never laid out. Pure code: no DOM, tested under node.
import * as dagre from '@dagrejs/dagre';

export type Kind = 'access' | 'map_entry' | 'map_exit' | 'tasklet' | 'library' | 'nested' | 'other';

// What the kernel measured or estimated for a node (the overlays colour nodes by one of them).
export interface Metrics {
  bytes?: number;
  flops?: number;
  intensity?: number;
  ms?: number;
}

export interface NodeData {
  // unique across the picture: a nested SDFG's nodes carry its id as a prefix (`s0n3.s0n1`)
  id: string;
  kind: Kind;
  // DaCe's label: what selections and `where` name
  label: string;
  // the readable name the view draws (absent in older pictures: the label then)
  name?: string;
  // the node's guid, which the generated code's line ranges and the profile name it by
  guid?: string;
  scope: string | null;
  info: Record<string, string>;
  exit?: string;
  sdfg?: GraphData;
  // what the step that made this picture did to the node; in the picture of the step before it, 'gone': what the
  // step shown took away or changed
  change?: 'added' | 'changed' | 'gone';
  metrics?: Metrics;
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
  bytes?: number;
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

// A node the step that made this picture took away: `state` is the id of the state of this picture that took
// the place of its own (null where none did).
export interface Removed {
  state: string | null;
  name: string;
  kind: string;
}

// A whole SDFG's picture (graph.describe): a picture of more nodes than `collapse_above` opens with only as many
// of its map scopes and nested SDFGs expanded as keep it readable (defaultCollapsed).
export interface Picture extends GraphData {
  collapse_above: number;
  removed?: Removed[];
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
  // the nodes hidden inside a collapsed map scope or nested SDFG
  hidden?: number;
}

export interface PlacedEdge {
  edge: EdgeData;
  points: { x: number; y: number }[];
  // where dagre left room for the memlet's label, if it is drawn at this level
  labelAt?: { x: number; y: number };
}

// An expanded map scope (`entry` its map entry) or nested SDFG (`entry` the nested SDFG's node), drawn behind
// what it holds; `depth` counts the nested SDFGs around it.
export interface PlacedScope extends Box {
  entry: NodeData;
  depth: number;
}

export interface PlacedState extends Box {
  state: StateData;
  depth: number;
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
// an expanded nested SDFG: its name and toggle above its states, a margin around them
export const NESTED_HEADER = 24;
const NESTED_PADDING = 10;

// The size a node's label needs (map entries and exits also show their range).
export function nodeSize(node: NodeData): { width: number; height: number } {
  const text = nodeText(node);
  const extra = node.kind === 'map_entry' || node.kind === 'map_exit' ? 50 : node.kind === 'tasklet' ? 30 : 24;
  return { width: Math.max(60, Math.min(420, text.length * CHAR_WIDTH + extra)), height: NODE_HEIGHT };
}

// The name the view shows: the readable one where the picture has it.
export function displayName(node: NodeData): string {
  return node.name || node.label;
}

export function nodeText(node: NodeData): string {
  if (node.kind === 'map_entry' || node.kind === 'map_exit') {
    return `${displayName(node)} [${node.info.range ?? ''}]`;
  }
  return displayName(node);
}

// What can be collapsed: map scopes, and nested SDFGs whose picture came along.
export function isContainer(node: NodeData): boolean {
  return node.kind === 'map_entry' || (node.kind === 'nested' && node.sdfg !== undefined);
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

// The map entries and nested SDFGs of a picture, nested ones included (what can be collapsed).
export function scopeIds(graph: GraphData): string[] {
  return [...nodeTree(graph).byId.values()].filter(isContainer).map(n => n.id);
}

// Every node of a picture by id, and what holds it: its map entry, else the nested SDFG node whose picture it is
// in, else null (the top level).
export interface NodeTree {
  byId: Map<string, NodeData>;
  parent: Map<string, string | null>;
  // the nodes each container (null: the top level) shows when it is expanded
  members: Map<string | null, NodeData[]>;
  // the state each node is in (its memlets are there)
  stateOf: Map<string, StateData>;
}

export function nodeTree(graph: GraphData): NodeTree {
  const tree: NodeTree = { byId: new Map(), parent: new Map(), members: new Map(), stateOf: new Map() };
  const walk = (g: GraphData, holder: string | null): void => {
    for (const state of g.states) {
      for (const node of state.nodes) {
        const parent = node.scope ?? holder;
        tree.byId.set(node.id, node);
        tree.parent.set(node.id, parent);
        tree.stateOf.set(node.id, state);
        const list = tree.members.get(parent) ?? [];
        list.push(node);
        tree.members.set(parent, list);
        if (node.sdfg) {
          walk(node.sdfg, node.id);
        }
      }
    }
  };
  walk(graph, null);
  return tree;
}

// Every state of a picture, nested SDFGs' included, by id.
export function statesById(graph: GraphData): Map<string, StateData> {
  const found = new Map<string, StateData>();
  const walk = (g: GraphData): void => {
    for (const state of g.states) {
      found.set(state.id, state);
      state.nodes.forEach(n => n.sdfg && walk(n.sdfg));
    }
  };
  walk(graph);
  return found;
}

// The containers around a node, innermost first.
export function ancestors(tree: NodeTree, id: string): string[] {
  const result: string[] = [];
  for (let p = tree.parent.get(id) ?? null; p !== null; p = tree.parent.get(p) ?? null) {
    result.push(p);
  }
  return result;
}

// Where a node is drawn with these containers collapsed: itself, or the outermost collapsed container around it.
export function shownAs(tree: NodeTree, id: string, collapsed: Set<string>): string {
  let shown = id;
  for (const a of ancestors(tree, id)) {
    if (collapsed.has(a)) {
      shown = a;
    }
  }
  return shown;
}

// A place an action would apply at, as the kernel names its nodes: by guid, or (a kernel that sends no guids) by
// label, which also names every other node of the same label.
export interface PlaceNodes {
  labels: string[];
  guids?: string[];
}

// The ids of a place's nodes in a picture (nested SDFGs included).
export function placeIds(tree: NodeTree, place: PlaceNodes): string[] {
  const [key, wanted] = place.guids
    ? [(n: NodeData) => n.guid, new Set(place.guids)]
    : [(n: NodeData) => n.label, new Set(place.labels)];
  return [...tree.byId.values()].filter(n => wanted.has(key(n) ?? '')).map(n => n.id);
}

// The containers a picture opens with collapsed: none where it has at most `collapse_above` nodes; else they open
// from the outside in, each while the nodes shown stay within that many, so that a picture whose work sits in
// nested SDFGs (DaCe's auto_optimize makes them) still opens on that work rather than on one closed box.
export function defaultCollapsed(graph: Picture): Set<string> {
  const tree = nodeTree(graph);
  const budget = graph.collapse_above;
  if (tree.byId.size <= budget) {
    return new Set();
  }
  const opened = new Set<string>();
  const top = tree.members.get(null) ?? [];
  let shown = top.length;
  const queue = top.filter(isContainer);
  for (let i = 0; i < queue.length; i++) {
    const members = tree.members.get(queue[i].id) ?? [];
    if (shown + members.length <= budget) {
      opened.add(queue[i].id);
      shown += members.length;
      queue.push(...members.filter(isContainer));
    }
  }
  return new Set(scopeIds(graph).filter(id => !opened.has(id)));
}

// Where the nodes of a picture drawn before were, by nodeKeys' key: a layout seeded with it keeps the nodes both
// pictures have in the order they had, rank by rank, so that what a step left alone stays where it was.
export type Seed = Record<string, { x: number; y: number }>;

// Each node's key across pictures of one SDFG: what it is (kind and DaCe label) and which of the nodes alike it is,
// in the picture's order. A step makes a new picture with new ids; the nodes it left alone keep their keys.
export function nodeKeys(graph: GraphData): Map<string, string> {
  const keys = new Map<string, string>();
  const seen = new Map<string, number>();
  for (const node of nodeTree(graph).byId.values()) {
    const what = `${node.kind} ${node.label}`;
    const k = seen.get(what) ?? 0;
    seen.set(what, k + 1);
    keys.set(node.id, `${what} ${k}`);
  }
  return keys;
}

// The seed a layout of `graph` gives the next picture (each node's centre).
export function seedOf(graph: GraphData, layout: Layout): Seed {
  const keys = nodeKeys(graph);
  const seed: Seed = {};
  for (const p of [...layout.nodes, ...layout.scopes]) {
    const key = keys.get(p.id);
    if (key !== undefined) {
      seed[key] = { x: p.x + p.width / 2, y: p.y + p.height / 2 };
    }
  }
  return seed;
}

// Lay out a whole picture; map entries and nested SDFGs in `collapsed` stand for what they hold as one node. With
// a `seed`, the nodes it places keep their left-to-right order within each rank they shared.
export function layoutGraph(graph: GraphData, collapsed: Set<string>, seed?: Seed): Layout {
  const keys = seed ? nodeKeys(graph) : null;
  const seeded = (id: string) => (keys && seed ? seed[keys.get(id) ?? ''] : undefined);
  return layoutSdfg(graph, collapsed, 0, seeded);
}

// A node's place in the picture a layout is seeded with, or undefined (no seed, or a node it lacks).
type Seeded = (id: string) => { x: number; y: number } | undefined;

function layoutSdfg(graph: GraphData, collapsed: Set<string>, depth: number, seeded: Seeded): Layout {
  const blocks = new Map<string, Layout>();
  for (const state of graph.states) {
    blocks.set(state.id, layoutState(state, collapsed, depth, seeded));
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
    result.states.push({ id: state.id, ...box, state, depth });
    place(result, blocks.get(state.id)!, box.x + STATE_PADDING, box.y + STATE_PADDING);
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

// Add what was laid out on its own (a state, a scope, a nested SDFG) to `into`, its top left corner at (dx, dy).
function place(into: Layout, b: Layout, dx: number, dy: number): void {
  into.states.push(...b.states.map(s => ({ ...s, x: s.x + dx, y: s.y + dy })));
  into.nodes.push(...b.nodes.map(p => ({ ...p, x: p.x + dx, y: p.y + dy })));
  into.scopes.push(...b.scopes.map(s => ({ ...s, x: s.x + dx, y: s.y + dy })));
  into.edges.push(...b.edges.map(e => shift(e, dx, dy)));
  into.interstate.push(...b.interstate.map(e => shift(e, dx, dy)));
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

// `members` with the seeded ones in their former order (top to bottom, left to right), in the slots they held.
function seededOrder(members: NodeData[], seeded: Seeded): NodeData[] {
  const slots = members.map(m => seeded(m.id));
  const placed = members
    .filter((_, i) => slots[i])
    .sort((a, b) => seeded(a.id)!.y - seeded(b.id)!.y || seeded(a.id)!.x - seeded(b.id)!.x);
  let next = 0;
  return members.map((m, i) => (slots[i] ? placed[next++] : m));
}

// dagre's ordering of each rank (crossings minimized), then the seeded members of each rank put back in their
// former left-to-right order, in the slots they took: a step's picture keeps what the step left alone in place.
function seededRanks(members: NodeData[], seeded: Seeded): dagre.LayoutConfig['customOrder'] {
  const former = new Map(members.filter(m => seeded(m.id)).map(m => [m.id, seeded(m.id)!.x]));
  if (former.size < 2) {
    return undefined;
  }
  return (g, order) => {
    order(g, {});
    const ranks = new Map<number, { id: string; order: number }[]>();
    for (const id of g.nodes()) {
      const n = g.node(id) as unknown as { rank?: number; order?: number };
      if (former.has(id) && n.rank !== undefined && n.order !== undefined) {
        ranks.set(n.rank, [...(ranks.get(n.rank) ?? []), { id, order: n.order }]);
      }
    }
    for (const rank of ranks.values()) {
      const slots = rank.map(r => r.order).sort((a, b) => a - b);
      rank.sort((a, b) => former.get(a.id)! - former.get(b.id)!);
      rank.forEach((r, i) => ((g.node(r.id) as unknown as { order: number }).order = slots[i]));
    }
  };
}

// Lay out one state: its outermost scope, whose map scopes and nested SDFGs are laid out first, each on its own.
export function layoutState(
  state: StateData,
  collapsed: Set<string>,
  depth = 0,
  seeded: Seeded = () => undefined
): Layout {
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
      total += 1 + (child.kind === 'map_entry' ? hiddenCount(child.id) : countNodes(child.sdfg));
    }
    return total;
  };

  const layoutScope = (scope: string | null): Layout => {
    const members = [...(scope !== null ? [byId.get(scope)!] : []), ...(children.get(scope) ?? [])];
    const inner = new Map<string, Layout>();
    const g = newGraph();
    const nested = new Map<string, Layout>();
    // dagre orders each rank starting from the order nodes were added in: seeded ones go in their former order
    for (const node of seededOrder(members, seeded)) {
      const container = isContainer(node) && node.id !== scope;
      if (container && node.kind === 'nested' && !collapsed.has(node.id)) {
        const sub = layoutSdfg(node.sdfg!, collapsed, depth + 1, seeded);
        nested.set(node.id, sub);
        const width = Math.max(sub.width, nodeSize(node).width) + 2 * NESTED_PADDING;
        g.setNode(node.id, { width, height: sub.height + NESTED_HEADER + NESTED_PADDING });
      } else if (container && !collapsed.has(node.id)) {
        const block = layoutScope(node.id);
        inner.set(node.id, block);
        g.setNode(node.id, { width: block.width, height: block.height });
      } else if (container) {
        // a collapsed scope also says how many nodes it hides
        const size = nodeSize(node);
        g.setNode(node.id, { width: Math.min(size.width + 110, 520), height: size.height });
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
    dagre.layout(g, { customOrder: seededRanks(members, seeded) });
    const block: Layout = { width: 0, height: 0, states: [], nodes: [], scopes: [], edges: [], interstate: [] };
    for (const node of members) {
      const n = g.node(node.id);
      const x = n.x - n.width / 2;
      const y = n.y - n.height / 2;
      const sub = inner.get(node.id);
      const sdfg = nested.get(node.id);
      if (sub || sdfg) {
        // the box goes first: it is drawn behind what it holds
        block.scopes.push({ id: node.id, x, y, width: n.width, height: n.height, entry: node, depth });
      }
      if (sub) {
        place(block, sub, x, y);
      } else if (sdfg) {
        // the nested SDFG's states, centred below its header
        place(block, sdfg, x + (n.width - sdfg.width) / 2, y + NESTED_HEADER);
      } else {
        const placed: PlacedNode = { id: node.id, x, y, width: n.width, height: n.height, node };
        if (isContainer(node) && node.id !== scope && collapsed.has(node.id)) {
          placed.hidden = node.kind === 'nested' ? countNodes(node.sdfg) : hiddenCount(node.id);
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
