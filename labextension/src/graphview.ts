// One SDFG drawn in SVG the way DaCe's SDFV draws it: states, map scopes, nested SDFGs drawn in place, SDFV's node
// shapes, memlets; what the step changed marked; an overlay of a node metric.
import { el, svg } from './dom';
import {
  ancestors,
  defaultCollapsed,
  displayName,
  isContainer,
  Layout,
  NESTED_HEADER,
  NodeData,
  nodeText,
  NodeTree,
  nodeTree,
  Picture,
  PlaceNodes,
  placeIds,
  PlacedEdge,
  PlacedNode,
  PlacedScope,
  scopeIds,
  Seed,
  seedOf,
  shownAs,
  StateData,
  statesById
} from './layout';
import { Heat, heatColour, heatPosition, heatScale, metricText, Overlay } from './overlay';
import { Constants } from './protocol';

export interface GraphViewOptions {
  // node labels (what `where` matches) chosen by clicking; called whenever the selection changes
  onSelect: (labels: string[]) => void;
  // lays out a picture with these scopes collapsed (layoutclient.ts: in a worker when it is large)
  layout: (graph: Picture, collapsed: Set<string>, seed?: Seed) => Promise<Layout>;
  // the node whose details are shown, or null (the session widget shows its generated code beside them)
  onDetails?: (node: NodeData | null) => void;
  // the heat colours and the most removed nodes the line under the graph names (its tooltip names them all), as
  // the kernel sends them (the widget's `constants`)
  constants: Constants;
  // why the picture carries no value of an overlay (shown in the legend's place), or null
  missing?: (overlay: Overlay) => string | null;
}
// how long the wheel rests before the SVG is drawn at the scale it zoomed to
export const ZOOM_REST_MS = 150;

// One SDFG: pan (drag), zoom (wheel), click a node for its details (shift-click adds to the selection),
// click a map's or nested SDFG's [-]/[+] to collapse or expand it.
export class GraphView {
  readonly node: HTMLDivElement;
  private readonly canvas: SVGSVGElement;
  private readonly root: SVGGElement;
  private readonly details: HTMLDivElement;
  private readonly notice: HTMLDivElement;
  private readonly legend: HTMLDivElement;
  private readonly removed: HTMLDivElement;
  private readonly resizes: ResizeObserver | null = null;
  private drawn = 0;
  private graph: Picture | null = null;
  private tree: NodeTree | null = null;
  private layout: Layout | null = null;
  private laying = false;
  private collapsed = new Set<string>();
  private selected = new Set<string>();
  private highlighted: PlaceNodes | null = null;
  private overlay: Overlay | null = null;
  // each drawn node's group by node id (open nested SDFGs included), for re-marking without a redraw
  private shapes = new Map<string, SVGGElement>();
  private view = { x: 0, y: 0, scale: 1 };
  // the view the SVG is drawn at; a wheel zoom first only scales that picture (see onWheel)
  private drawnView = { x: 0, y: 0, scale: 1 };
  private zoomTimer: ReturnType<typeof setTimeout> | null = null;
  // a fit asked for while the canvas had no size (not attached yet, or hidden): done once it has one
  private fitPending = false;
  // the node to centre once the layout under way is drawn
  private focusPending: string | null = null;
  // the nodes to bring into view once the layout under way is drawn and the canvas has its size
  private framePending: string[] | null = null;
  // where the nodes of the picture shown before this one were: this one's layout keeps them in their order
  private seed: Seed | undefined = undefined;
  private drag: { x: number; y: number; moved: boolean } | null = null;
  // whether the last press of the button moved the view: the click that ends it then selects nothing
  private dragged = false;
  // a drag goes on outside the canvas: the window follows it, as long as the view lives
  private readonly onMouseMove = (e: MouseEvent): void => this.onDrag(e);
  private readonly onMouseUp = (): void => {
    this.dragged = this.drag?.moved ?? false;
    this.drag = null;
  };

  constructor(private readonly options: GraphViewOptions) {
    this.node = el('div', 'dcnb-graph-view');
    const row = el('div', 'dcnb-graph');
    this.canvas = svg('svg', { class: 'dcnb-canvas' });
    this.root = svg('g');
    this.canvas.appendChild(this.root);
    this.details = el('div', 'dcnb-details');
    this.notice = el('div', 'dcnb-notice');
    this.legend = el('div', 'dcnb-legend');
    this.removed = el('div', 'dcnb-removed');
    row.append(this.canvas, this.notice, this.legend, this.details);
    this.node.append(row, this.removed);
    this.canvas.addEventListener('wheel', e => this.onWheel(e), { passive: false });
    // a drag pans wherever it starts, on a node too; a click (no move) selects
    this.canvas.addEventListener('mousedown', e => {
      this.drag = { x: e.clientX, y: e.clientY, moved: false };
      this.dragged = false;
    });
    window.addEventListener('mousemove', this.onMouseMove);
    window.addEventListener('mouseup', this.onMouseUp);
    if (typeof ResizeObserver !== 'undefined') {
      this.resizes = new ResizeObserver(() => this.fitIfSized());
      this.resizes.observe(this.canvas);
    }
    // (the hint, not showDetails: the owner hears of details only once it has made the view)
    this.showHint();
    this.drawLegend();
  }

  // Take the window's listeners away (they would keep the view alive and draggable after it is gone).
  dispose(): void {
    window.removeEventListener('mousemove', this.onMouseMove);
    window.removeEventListener('mouseup', this.onMouseUp);
    this.resizes?.disconnect();
    this.stopZoomTimer();
    ++this.drawn; // a layout still under way draws nothing
  }

  // Show a picture. `fresh` (another tab, a first show) opens it fitted, with the default scopes collapsed;
  // otherwise (the same SDFG after a step, or the step before) it is laid out with the nodes it shares with the
  // picture shown before in their places, the view stays where it is as long as it shows a node, and scopes stay
  // collapsed where their ids were collapsible before. `reveal` (another step's picture) brings the nodes the step
  // added, changed or (in the picture of the step before) took away into view. The selection is by labels.
  setGraph(graph: Picture | null, selection: string[], fresh: boolean, reveal = false): void {
    if (graph !== this.graph) {
      this.showDetails(null);
      this.seed = !fresh && graph && this.graph && this.layout ? seedOf(this.graph, this.layout) : undefined;
    }
    const former = this.tree;
    this.graph = graph;
    this.tree = graph ? nodeTree(graph) : null;
    this.selected = new Set(selection);
    if (graph) {
      const initial = defaultCollapsed(graph);
      const known = (id: string) => former !== null && isContainer(former.byId.get(id) ?? NOT_A_NODE);
      this.collapsed =
        fresh || former === null
          ? initial
          : new Set(scopeIds(graph).filter(id => (known(id) ? this.collapsed.has(id) : initial.has(id))));
    }
    this.drawRemoved();
    this.drawLegend();
    const marked = reveal && this.tree ? [...this.tree.byId.values()].filter(n => n.change).map(n => n.id) : [];
    this.framePending = marked.length ? marked : null;
    this.redraw(fresh);
  }

  // The name the view shows for a label a selection or a place holds: its node's readable name in this picture
  // (each one the nodes of that label have), else the label as it is.
  nameOf(label: string): string {
    for (const node of this.tree?.byId.values() ?? []) {
      if (node.label === label) {
        return [...new Set([...this.tree!.byId.values()].filter(n => n.label === label).map(displayName))].join(' / ');
      }
    }
    return label;
  }

  setSelection(labels: string[]): void {
    this.selected = new Set(labels);
    if (!labels.length) {
      this.showDetails(null);
    }
    this.mark();
  }

  // Mark a place's nodes (where an action would apply), or none, and bring them into view; a node inside a
  // collapsed scope marks the scope.
  highlight(place: PlaceNodes | null): void {
    this.highlighted = place;
    this.mark();
    const ids = place && this.tree ? placeIds(this.tree, place) : [];
    if (ids.length) {
      this.framePending = ids;
      this.frameIfReady();
    }
  }

  collapseAll(collapse: boolean): void {
    this.collapsed = new Set(collapse && this.graph ? scopeIds(this.graph) : []);
    this.redraw(true);
  }

  toggle(id: string): void {
    if (this.collapsed.has(id)) {
      this.collapsed.delete(id);
    } else {
      this.collapsed.add(id);
    }
    this.redraw(false);
  }

  setOverlay(overlay: Overlay | null): void {
    this.overlay = overlay;
    this.drawLegend();
    if (this.layout && !this.laying) {
      this.root.replaceChildren();
      this.draw(this.layout);
    }
  }

  // Select the node with this guid and centre it, expanding what holds it; false where the picture lacks it.
  focus(guid: string): boolean {
    const node = this.tree && [...this.tree.byId.values()].find(n => n.guid === guid);
    if (!node || !this.tree) {
      return false;
    }
    this.choose([node.label], node);
    const closed = ancestors(this.tree, node.id).filter(id => this.collapsed.has(id));
    // the node asked for, not what the step changed (a tab switched to show it asked for that)
    this.focusPending = node.id;
    this.framePending = null;
    if (closed.length) {
      closed.forEach(id => this.collapsed.delete(id));
      this.redraw(false);
    } else if (!this.laying) {
      this.centre();
    }
    return true;
  }

  // Show the whole picture (`overview`), or, as a picture first opens, as much of it as stays readable: the
  // whole picture where that needs no scale below 0.5, else its top at scale 0.75, centred on its first node.
  fit(overview = true): void {
    if (!this.layout) {
      return;
    }
    const width = this.canvas.clientWidth || 800;
    const height = this.canvas.clientHeight || 480;
    const layout = this.layout;
    const whole = Math.min(1.2, (width - 20) / Math.max(layout.width, 1), (height - 20) / Math.max(layout.height, 1));
    if (overview || whole >= 0.5) {
      this.view = {
        scale: whole,
        x: (width - layout.width * whole) / 2,
        y: Math.max(10, (height - layout.height * whole) / 2)
      };
    } else {
      // a state is as wide as its widest rank: its first nodes sit in its middle, not at its left edge
      const scale = 0.75;
      const first = layout.nodes.reduce<PlacedNode | null>((a, n) => (a === null || n.y < a.y ? n : a), null);
      const centre = first ? first.x + first.width / 2 : layout.width / 2;
      const x = Math.min(10, Math.max(width - 10 - layout.width * scale, width / 2 - centre * scale));
      this.view = { scale, x, y: 10 };
    }
    this.applyView();
  }

  private fitWhenSized(): void {
    this.fitPending = true;
    this.fitIfSized();
  }

  private fitIfSized(): void {
    if (this.fitPending && this.layout && this.canvas.clientWidth > 0 && this.canvas.clientHeight > 0) {
      this.fitPending = false;
      this.fit(false);
    }
    this.frameIfReady();
  }

  // Pan and zoom to the nodes framePending names (as drawn: a node in a collapsed scope is its scope), once the
  // picture is laid out and the canvas has its size: all of them where that keeps them readable (scale 0.5 or
  // more), else the first of them at scale 0.75.
  private frameIfReady(): void {
    const tree = this.tree;
    const ids = this.framePending;
    const width = this.canvas.clientWidth;
    const height = this.canvas.clientHeight;
    if (!ids || !tree || !this.layout || this.laying || width <= 0 || height <= 0) {
      return;
    }
    this.framePending = null;
    const shown = new Set(ids.map(id => shownAs(tree, id, this.collapsed)));
    const boxes = [...this.layout.nodes, ...this.layout.scopes].filter(p => shown.has(p.id));
    if (!boxes.length) {
      return;
    }
    const left = Math.min(...boxes.map(b => b.x));
    const top = Math.min(...boxes.map(b => b.y));
    const right = Math.max(...boxes.map(b => b.x + b.width));
    const bottom = Math.max(...boxes.map(b => b.y + b.height));
    const whole = Math.min(1.2, (width - 40) / Math.max(right - left, 1), (height - 40) / Math.max(bottom - top, 1));
    const first = boxes.reduce((a, b) => (b.y < a.y || (b.y === a.y && b.x < a.x) ? b : a));
    const [scale, box] =
      whole >= 0.5 ? [whole, { x: left, y: top, width: right - left, height: bottom - top }] : [0.75, first];
    this.fitPending = false;
    this.view = {
      scale,
      x: width / 2 - (box.x + box.width / 2) * scale,
      y: height / 2 - (box.y + Math.min(box.height, height / scale - 40) / 2) * scale
    };
    this.applyView();
  }

  // Whether some node is in the canvas as the view is now.
  private showsANode(): boolean {
    const width = this.canvas.clientWidth;
    const height = this.canvas.clientHeight;
    const { x, y, scale } = this.view;
    return (this.layout?.nodes ?? []).some(
      n => x + n.x * scale < width && x + (n.x + n.width) * scale > 0 && y + n.y * scale < height && y + (n.y + n.height) * scale > 0
    );
  }

  private redraw(fit: boolean): void {
    const graph = this.graph;
    const turn = ++this.drawn;
    if (!graph) {
      this.root.replaceChildren();
      this.shapes.clear();
      this.layout = null;
      return;
    }
    this.laying = true;
    this.notice.textContent = `laying out ${this.tree?.byId.size ?? 0} nodes…`;
    this.notice.style.display = 'block';
    void this.options.layout(graph, this.collapsed, this.seed).then(layout => {
      if (turn !== this.drawn) {
        return; // a newer picture, a scope change or the view's end superseded this one
      }
      this.laying = false;
      this.notice.style.display = 'none';
      this.layout = layout;
      this.root.replaceChildren();
      this.draw(layout);
      if (this.focusPending) {
        this.centre();
      } else if (this.framePending) {
        this.frameIfReady();
      } else if (fit || !this.showsANode()) {
        // a new picture, or one the view would show none of (the canvas may not have its size yet)
        this.fitWhenSized();
      }
    });
  }

  // Centre the node asked for (focus) at a readable scale.
  private centre(): void {
    const id = this.focusPending;
    this.focusPending = null;
    const placed = [...(this.layout?.nodes ?? []), ...(this.layout?.scopes ?? [])].find(p => p.id === id);
    if (!placed) {
      return;
    }
    const width = this.canvas.clientWidth || 800;
    const height = this.canvas.clientHeight || 480;
    const scale = Math.max(this.view.scale, 0.9);
    this.fitPending = false;
    this.view = {
      scale,
      x: width / 2 - (placed.x + placed.width / 2) * scale,
      y: height / 2 - (placed.y + Math.min(placed.height, 60) / 2) * scale
    };
    this.applyView();
  }

  private draw(layout: Layout): void {
    this.shapes.clear();
    const defs = svg('defs');
    const marker = svg('marker', {
      id: 'dcnb-arrow',
      viewBox: '0 0 10 10',
      refX: 10,
      refY: 5,
      markerWidth: 7,
      markerHeight: 7,
      orient: 'auto-start-reverse'
    });
    marker.appendChild(svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'dcnb-arrowhead' }));
    defs.appendChild(marker);
    this.root.appendChild(defs);
    // what holds other things is drawn behind them: a nested SDFG's box after the state it sits in, before its
    // own states
    const frames = [
      ...layout.states.map(s => ({ order: 2 * s.depth, draw: () => this.drawState(s) })),
      ...layout.scopes.map(s => ({ order: 2 * s.depth + 1, draw: () => this.drawScope(s) }))
    ].sort((a, b) => a.order - b.order);
    for (const f of frames) {
      this.root.appendChild(f.draw());
    }
    const heat = this.overlay === 'bytes' ? heatScale(layout.edges.map(e => e.edge.bytes)) : null;
    const labels = new LabelSpace();
    for (const e of [...layout.edges, ...layout.interstate]) {
      this.root.appendChild(this.drawEdge(e, layout.interstate.includes(e), labels, heat));
    }
    const nodeHeat = this.nodeHeat();
    for (const n of layout.nodes) {
      this.root.appendChild(this.drawNode(n, false, nodeHeat));
    }
    this.mark();
  }

  private drawState(s: Layout['states'][number]): SVGGElement {
    const g = svg('g', { class: 'dcnb-state' });
    g.appendChild(svg('rect', { x: s.x, y: s.y, width: s.width, height: s.height, rx: 4 }));
    const label = svg('text', { x: s.x + 6, y: s.y + 14 });
    label.textContent = s.state.label;
    g.appendChild(label);
    return g;
  }

  private drawScope(s: PlacedScope): SVGElement {
    if (s.entry.kind === 'nested') {
      return this.drawNode({ id: s.id, x: s.x, y: s.y, width: s.width, height: s.height, node: s.entry }, true, null);
    }
    return svg('rect', { class: 'dcnb-scope', x: s.x, y: s.y, width: s.width, height: s.height, rx: 3 });
  }

  private drawEdge(e: PlacedEdge, interstate: boolean, labels: LabelSpace, heat: Heat | null): SVGGElement {
    const g = svg('g', { class: interstate ? 'dcnb-edge dcnb-interstate' : 'dcnb-edge' });
    const d = e.points.map((p, i) => `${i ? 'L' : 'M'} ${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(' ');
    const path = svg('path', { d, 'marker-end': 'url(#dcnb-arrow)' });
    const bytes = heat && e.edge.bytes ? metricText('bytes', e.edge.bytes) : '';
    if (heat && e.edge.bytes) {
      // under the bytes overlay an edge is as wide as the data it moves (log scale)
      path.setAttribute('stroke-width', (1 + 5 * heatPosition(heat, e.edge.bytes)).toFixed(1));
    }
    g.appendChild(path);
    const title = svg('title');
    title.textContent = [
      e.edge.label,
      e.edge.volume ? `volume ${e.edge.volume}` : '',
      e.edge.wcr ? `wcr ${e.edge.wcr}` : '',
      e.edge.bytes ? `bytes ${metricText('bytes', e.edge.bytes)}` : ''
    ]
      .filter(Boolean)
      .join('\n');
    g.appendChild(title);
    const amount = bytes || e.edge.volume;
    const label = amount ? `${e.edge.label} (${amount})` : e.edge.label;
    // a label that would overlap one already drawn is left to the edge's tooltip
    if (e.labelAt && label && labels.take(e.labelAt.x - 30, e.labelAt.y - 6, label.length * 5.5, 12)) {
      const text = svg('text', { x: e.labelAt.x - 30, y: e.labelAt.y + 4 });
      text.textContent = label;
      g.appendChild(text);
    }
    return g;
  }

  // The overlay's scale over every node of the picture (hidden ones too: expanding a scope keeps the colours).
  private nodeHeat(): Heat | null {
    const overlay = this.overlay;
    return overlay && this.tree ? heatScale([...this.tree.byId.values()].map(n => n.metrics?.[overlay])) : null;
  }

  // A node, or (`open`) an expanded nested SDFG's box, which its states are drawn over.
  private drawNode(p: PlacedNode, open: boolean, heat: Heat | null): SVGGElement {
    const node = p.node;
    const g = svg('g', { class: `dcnb-node dcnb-${node.kind}${open ? ' dcnb-open' : ''}` });
    g.dataset.id = node.id;
    g.dataset.label = node.label;
    g.dataset.name = displayName(node);
    if (node.guid) {
      g.dataset.guid = node.guid;
    }
    if (node.change) {
      g.classList.toggle(`dcnb-${node.change}`, true);
    }
    g.appendChild(shape(p));
    const value = this.overlay ? node.metrics?.[this.overlay] : undefined;
    if (heat && value && value > 0) {
      g.classList.toggle('dcnb-heat', true);
      g.setAttribute('style', `--dcnb-heat: ${heatColour(heat, value, this.options.constants.heat_colours)}`);
    }
    const toggle = isContainer(node) ? toggleAt(p, open) : null;
    const text = open
      ? svg('text', { x: p.x + 28, y: p.y + 16 })
      : svg('text', { x: p.x + p.width / 2 + (toggle ? 12 : 0), y: p.y + p.height / 2 + 4, 'text-anchor': 'middle' });
    const room = open ? p.width - 40 : p.width - (toggle ? 24 : 0);
    text.textContent = clip(nodeText(node) + (p.hidden ? ` (${p.hidden} inside)` : ''), room);
    g.appendChild(text);
    const title = svg('title');
    title.textContent = [
      nodeText(node),
      node.change ? changeText(node.change) : '',
      this.overlay && value !== undefined ? `${this.overlayName(this.overlay)}: ${metricText(this.overlay, value)}` : ''
    ]
      .filter(Boolean)
      .join('\n');
    g.appendChild(title);
    if (toggle) {
      g.appendChild(this.drawToggle(node, toggle, p.hidden === undefined));
    }
    g.addEventListener('click', e => {
      if (!this.dragged) {
        this.select(node, e.shiftKey);
      }
    });
    this.shapes.set(node.id, g);
    return g;
  }

  // SDFV's collapse box: [−] on an expanded map scope or nested SDFG, [+] on a collapsed one.
  private drawToggle(node: NodeData, at: { x: number; y: number }, expanded: boolean): SVGGElement {
    const toggle = svg('g', { class: 'dcnb-toggle' });
    toggle.appendChild(svg('rect', { x: at.x, y: at.y, width: 14, height: 14, rx: 2 }));
    const sign = svg('text', { x: at.x + 7, y: at.y + 11, 'text-anchor': 'middle' });
    sign.textContent = expanded ? '−' : '+';
    toggle.appendChild(sign);
    const tip = svg('title');
    const what = node.kind === 'nested' ? 'nested SDFG' : 'map scope';
    tip.textContent = `${expanded ? 'collapse' : 'expand'} this ${what}`;
    toggle.appendChild(tip);
    toggle.addEventListener('click', e => {
      e.stopPropagation();
      if (!this.dragged) {
        this.toggle(node.id);
      }
    });
    return toggle;
  }

  // Selection, highlights and the marks of changes hidden in collapsed scopes, on the drawn nodes.
  private mark(): void {
    const tree = this.tree;
    const lit = new Set<string>();
    const changedInside = new Set<string>();
    if (tree && this.highlighted) {
      placeIds(tree, this.highlighted).forEach(id => lit.add(shownAs(tree, id, this.collapsed)));
    }
    for (const node of tree?.byId.values() ?? []) {
      const shown = () => shownAs(tree!, node.id, this.collapsed);
      if (node.change && shown() !== node.id) {
        changedInside.add(shown());
      }
    }
    for (const [id, g] of this.shapes) {
      g.classList.toggle('dcnb-selected', this.selected.has(g.dataset.label ?? ''));
      g.classList.toggle('dcnb-highlight', lit.has(id));
      g.classList.toggle('dcnb-changed-inside', changedInside.has(id));
    }
  }

  // A click: the node alone, or (shift) the node added to or taken from the selection.
  private select(node: NodeData, add: boolean): void {
    const chosen = new Set(this.selected);
    if (add) {
      if (chosen.has(node.label)) {
        chosen.delete(node.label);
      } else {
        chosen.add(node.label);
      }
    } else {
      chosen.clear();
      if (!(this.selected.size === 1 && this.selected.has(node.label))) {
        chosen.add(node.label);
      }
    }
    this.choose([...chosen], node);
  }

  private choose(labels: string[], node: NodeData): void {
    this.setSelection(labels);
    this.showDetails(labels.includes(node.label) ? node : null);
    this.options.onSelect(labels);
  }

  private showDetails(node: NodeData | null): void {
    this.options.onDetails?.(node);
    if (!node) {
      this.showHint();
      return;
    }
    this.details.replaceChildren();
    this.details.appendChild(el('div', 'dcnb-details-kind', node.kind.replace('_', ' ')));
    this.details.appendChild(el('div', 'dcnb-details-name', displayName(node)));
    if (node.change) {
      this.details.appendChild(el('div', `dcnb-details-change dcnb-${node.change}`, changeText(node.change)));
    }
    const rows: [string, string][] = Object.entries(node.info);
    for (const [key, name] of Object.entries(this.options.constants.overlays) as [Overlay, string][]) {
      const value = node.metrics?.[key];
      if (value !== undefined) {
        rows.push([name, metricText(key, value)]);
      }
    }
    const table = el('table');
    for (const [key, value] of rows) {
      const row = el('tr');
      row.appendChild(el('th', '', key));
      const cell = el('td');
      cell.appendChild(key === 'code' ? el('pre', '', value) : document.createTextNode(value));
      row.appendChild(cell);
      table.appendChild(row);
    }
    this.details.appendChild(table);
    const state = this.tree?.stateOf.get(node.id);
    const edges = state?.edges.filter(e => e.src === node.id || e.dst === node.id) ?? [];
    if (edges.length) {
      this.details.appendChild(el('div', 'dcnb-details-kind', 'memlets'));
      const list = el('ul');
      for (const e of edges.slice(0, 20)) {
        const dir = e.dst === node.id ? 'in' : 'out';
        list.appendChild(el('li', '', `${dir}: ${e.label}${e.volume ? ` (volume ${e.volume})` : ''}`));
      }
      this.details.appendChild(list);
    }
  }

  private showHint(): void {
    this.details.replaceChildren(
      el('p', 'dcnb-hint', 'Click a node for its details; shift-click to select several. Actions then apply there.')
    );
  }

  // The nodes the step took away, in one line under the graph.
  private drawRemoved(): void {
    const removed = this.graph?.removed ?? [];
    const states = this.graph ? statesById(this.graph) : new Map<string, StateData>();
    const where = (id: string | null) => (id === null ? '' : `, in ${states.get(id)?.label ?? id}`);
    const names = removed.map(r => `${r.name} (${r.kind.replace('_', ' ')}${where(r.state)})`);
    const shown = this.options.constants.removed_shown;
    const more = names.length > shown ? `, and ${names.length - shown} more` : '';
    this.removed.textContent = names.length ? `removed: ${names.slice(0, shown).join(', ')}${more}` : '';
    this.removed.title = names.join('\n');
    this.removed.style.display = names.length ? 'block' : 'none';
  }

  // The overlay's scale: its lowest and highest value either side of the colours.
  private overlayName(overlay: Overlay): string {
    return this.options.constants.overlays[overlay] ?? overlay;
  }

  // The overlay's legend; where no node carries its metric, why not (as the owner tells).
  drawLegend(): void {
    const overlay = this.overlay;
    const heat = this.nodeHeat();
    const edges = overlay === 'bytes' && this.layout?.edges.some(e => e.edge.bytes);
    const why = overlay && !heat && !edges ? this.options.missing?.(overlay) : null;
    this.legend.replaceChildren();
    this.legend.classList.toggle('dcnb-legend-missing', Boolean(why));
    this.legend.style.display = (overlay && heat) || why ? 'flex' : 'none';
    if (why) {
      this.legend.textContent = why;
      return;
    }
    if (!overlay || !heat) {
      return;
    }
    const bar = el('span', 'dcnb-legend-bar');
    const colours = this.options.constants.heat_colours.join(', ');
    bar.setAttribute('style', `background: linear-gradient(to right, ${colours})`);
    this.legend.append(
      el('span', '', `${this.overlayName(overlay)} (log scale): ${metricText(overlay, heat.min)}`),
      bar,
      el('span', '', metricText(overlay, heat.max))
    );
  }

  // A wheel turn scales the picture already painted (a CSS transform of the canvas, which the browser composites
  // without painting again) and draws the SVG at the new scale once the wheel rests: drawing a ResNet-18's
  // backward at a new scale took 130-150 ms a frame in headless Chromium (benchmarks/view.py), a pan 16-36 ms.
  private onWheel(e: WheelEvent): void {
    e.preventDefault();
    const box = this.canvas.getBoundingClientRect();
    // (the box as laid out: the preview's transform moves and scales what getBoundingClientRect reports)
    const k0 = this.view.scale / this.drawnView.scale;
    const left = box.left - (this.view.x - this.drawnView.x * k0);
    const top = box.top - (this.view.y - this.drawnView.y * k0);
    const mx = e.clientX - left;
    const my = e.clientY - top;
    const factor = Math.exp(-e.deltaY * 0.0015);
    const scale = Math.min(8, Math.max(0.02, this.view.scale * factor));
    const k = scale / this.view.scale;
    this.view = { scale, x: mx - (mx - this.view.x) * k, y: my - (my - this.view.y) * k };
    const z = this.view.scale / this.drawnView.scale;
    const tx = this.view.x - this.drawnView.x * z;
    const ty = this.view.y - this.drawnView.y * z;
    this.canvas.style.transformOrigin = '0 0';
    this.canvas.style.transform = `translate(${tx.toFixed(1)}px, ${ty.toFixed(1)}px) scale(${z.toFixed(4)})`;
    this.stopZoomTimer();
    this.zoomTimer = setTimeout(() => this.applyView(), ZOOM_REST_MS);
  }

  private stopZoomTimer(): void {
    if (this.zoomTimer !== null) {
      clearTimeout(this.zoomTimer);
      this.zoomTimer = null;
    }
  }

  private onDrag(e: MouseEvent): void {
    if (!this.drag) {
      return;
    }
    const dx = e.clientX - this.drag.x;
    const dy = e.clientY - this.drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 2) {
      this.drag.moved = true;
    }
    this.drag.x = e.clientX;
    this.drag.y = e.clientY;
    this.view = { ...this.view, x: this.view.x + dx, y: this.view.y + dy };
    this.applyView();
  }

  private applyView(): void {
    this.stopZoomTimer();
    this.drawnView = this.view;
    this.canvas.style.transform = '';
    this.root.setAttribute('transform', `translate(${this.view.x.toFixed(1)} ${this.view.y.toFixed(1)}) scale(${this.view.scale.toFixed(4)})`);
  }
}

// What a node's mark says: the step shown added or changed it, or (the picture of the step before) it is gone.
function changeText(change: NonNullable<NodeData['change']>): string {
  return change === 'gone' ? 'removed or changed by the step after this one' : `${change} by this step`;
}

// stands in for a node a former picture lacked
const NOT_A_NODE: NodeData = { id: '', kind: 'other', label: '', scope: null, info: {} };

// Where a container's collapse box goes: in a map entry's lower left, a nested SDFG's upper left (its header,
// where it is expanded).
function toggleAt(p: PlacedNode, open: boolean): { x: number; y: number } {
  if (p.node.kind === 'map_entry') {
    return { x: p.x + 22, y: p.y + 3 };
  }
  return open ? { x: p.x + 7, y: p.y + (NESTED_HEADER - 14) / 2 + 1 } : { x: p.x + 8, y: p.y + 8 };
}

// Where memlet labels were drawn, in cells of 100px, so that a new one can check for overlaps quickly.
class LabelSpace {
  private readonly cells = new Map<string, [number, number, number, number][]>();

  take(x: number, y: number, w: number, h: number): boolean {
    const keys: string[] = [];
    for (let cx = Math.floor(x / 100); cx <= Math.floor((x + w) / 100); cx++) {
      for (let cy = Math.floor(y / 100); cy <= Math.floor((y + h) / 100); cy++) {
        keys.push(`${cx},${cy}`);
      }
    }
    for (const key of keys) {
      for (const [bx, by, bw, bh] of this.cells.get(key) ?? []) {
        if (x < bx + bw && bx < x + w && y < by + bh && by < y + h) {
          return false;
        }
      }
    }
    for (const key of keys) {
      const list = this.cells.get(key) ?? [];
      list.push([x, y, w, h]);
      this.cells.set(key, list);
    }
    return true;
  }
}

// SDFV's shapes: ellipse (access node), octagon (tasklet), trapezoid (map entry, wider at the bottom) and its
// mirror (map exit), box with cut corners (library node), double box (nested SDFG).
function shape(p: PlacedNode): SVGElement {
  const { x, y, width: w, height: h } = p;
  const c = Math.min(10, h / 3);
  switch (p.node.kind) {
    case 'access':
      return svg('ellipse', { cx: x + w / 2, cy: y + h / 2, rx: w / 2, ry: h / 2 });
    case 'tasklet':
      return polygon([
        [x + c, y], [x + w - c, y], [x + w, y + c], [x + w, y + h - c],
        [x + w - c, y + h], [x + c, y + h], [x, y + h - c], [x, y + c]
      ]);
    case 'map_entry':
      return polygon([[x + 20, y], [x + w - 20, y], [x + w, y + h], [x, y + h]]);
    case 'map_exit':
      return polygon([[x, y], [x + w, y], [x + w - 20, y + h], [x + 20, y + h]]);
    case 'library':
      return polygon([
        [x + c, y], [x + w - c, y], [x + w, y + c], [x + w, y + h], [x, y + h], [x, y + c]
      ]);
    case 'nested': {
      const g = svg('g', { class: 'dcnb-shape' });
      g.appendChild(svg('rect', { x, y, width: w, height: h }));
      g.appendChild(svg('rect', { x: x + 3, y: y + 3, width: w - 6, height: h - 6 }));
      return g;
    }
    default:
      return svg('rect', { x, y, width: w, height: h });
  }
}

function polygon(points: number[][]): SVGPolygonElement {
  return svg('polygon', { points: points.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(' ') });
}

function clip(text: string, width: number): string {
  const room = Math.floor((width - 16) / 7);
  return text.length > room ? text.slice(0, Math.max(room - 1, 1)) + '…' : text;
}
