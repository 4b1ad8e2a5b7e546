// One SDFG drawn in SVG the way DaCe's SDFV draws it: states, map scopes, SDFV's node shapes, memlets.
import { el, svg } from './dom';
import { countNodes, GraphData, Layout, NodeData, nodeText, Picture, PlacedEdge, PlacedNode, scopeIds } from './layout';

export interface GraphViewOptions {
  // node labels (what `where` matches) chosen by clicking; called whenever the selection changes
  onSelect: (labels: string[]) => void;
  // lays out a picture with these scopes collapsed (layoutclient.ts: in a worker when it is large)
  layout: (graph: GraphData, collapsed: Set<string>) => Promise<Layout>;
}

// One SDFG: pan (drag), zoom (wheel), click a node for its details (shift-click adds to the selection),
// click a map's [-]/[+] to collapse or expand its scope.
export class GraphView {
  readonly node: HTMLDivElement;
  private readonly canvas: SVGSVGElement;
  private readonly root: SVGGElement;
  private readonly details: HTMLDivElement;
  private readonly notice: HTMLDivElement;
  private drawn = 0;
  private graph: Picture | null = null;
  private layout: Layout | null = null;
  private collapsed = new Set<string>();
  private selected = new Set<string>();
  private view = { x: 0, y: 0, scale: 1 };
  private drag: { x: number; y: number; moved: boolean } | null = null;
  // a drag goes on outside the canvas: the window follows it, as long as the view lives
  private readonly onMouseMove = (e: MouseEvent): void => this.onDrag(e);
  private readonly onMouseUp = (): void => {
    this.drag = null;
  };

  constructor(private readonly options: GraphViewOptions) {
    this.node = el('div', 'dcnb-graph');
    this.canvas = svg('svg', { class: 'dcnb-canvas' });
    this.root = svg('g');
    this.canvas.appendChild(this.root);
    this.details = el('div', 'dcnb-details');
    this.notice = el('div', 'dcnb-notice');
    this.node.append(this.canvas, this.notice, this.details);
    this.canvas.addEventListener('wheel', e => this.onWheel(e), { passive: false });
    this.canvas.addEventListener('mousedown', e => {
      this.drag = { x: e.clientX, y: e.clientY, moved: false };
    });
    window.addEventListener('mousemove', this.onMouseMove);
    window.addEventListener('mouseup', this.onMouseUp);
    this.showDetails(null);
  }

  // Take the window's listeners away (they would keep the view alive and draggable after it is gone).
  dispose(): void {
    window.removeEventListener('mousemove', this.onMouseMove);
    window.removeEventListener('mouseup', this.onMouseUp);
    ++this.drawn; // a layout still under way draws nothing
  }

  // Show a new picture; keeps collapsed scopes and the selection where their ids and labels still exist.
  setGraph(graph: Picture | null, selection: string[]): void {
    const first = this.graph === null || this.graph.name !== graph?.name;
    if (graph !== this.graph) {
      this.showDetails(null);
    }
    this.graph = graph;
    this.selected = new Set(selection);
    if (graph && first) {
      this.collapsed = new Set(countNodes(graph) > graph.collapse_above ? scopeIds(graph) : []);
    } else if (graph) {
      const ids = new Set(scopeIds(graph));
      this.collapsed = new Set([...this.collapsed].filter(id => ids.has(id)));
    }
    this.redraw(first);
  }

  setSelection(labels: string[]): void {
    this.selected = new Set(labels);
    if (!labels.length) {
      this.showDetails(null);
    }
    this.root.querySelectorAll<SVGGElement>('g.dcnb-node').forEach(g => {
      g.classList.toggle('dcnb-selected', this.selected.has(g.dataset.label ?? ''));
    });
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

  // Show the whole picture (`overview`), or, as a picture first opens, as much of it as stays readable: the
  // whole picture where that needs no scale below 0.5, else its top left corner at scale 0.75.
  fit(overview = true): void {
    if (!this.layout) {
      return;
    }
    const width = this.canvas.clientWidth || 800;
    const height = this.canvas.clientHeight || 480;
    const whole = Math.min(1.2, (width - 20) / Math.max(this.layout.width, 1), (height - 20) / Math.max(this.layout.height, 1));
    if (overview || whole >= 0.5) {
      this.view = {
        scale: whole,
        x: (width - this.layout.width * whole) / 2,
        y: Math.max(10, (height - this.layout.height * whole) / 2)
      };
    } else {
      this.view = { scale: 0.75, x: 10, y: 10 };
    }
    this.applyView();
  }

  private redraw(fit: boolean): void {
    const graph = this.graph;
    const turn = ++this.drawn;
    if (!graph) {
      this.root.replaceChildren();
      this.layout = null;
      return;
    }
    this.notice.textContent = `laying out ${countNodes(graph)} nodes…`;
    this.notice.style.display = 'block';
    void this.options.layout(graph, this.collapsed).then(layout => {
      if (turn !== this.drawn) {
        return; // a newer picture, a scope change or the view's end superseded this one
      }
      this.notice.style.display = 'none';
      this.layout = layout;
      this.root.replaceChildren();
      this.draw(layout);
      if (fit) {
        // the canvas has its size only once it is attached
        requestAnimationFrame(() => this.fit(false));
      }
    });
  }

  private draw(layout: Layout): void {
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
    for (const s of layout.states) {
      const g = svg('g', { class: 'dcnb-state' });
      g.appendChild(svg('rect', { x: s.x, y: s.y, width: s.width, height: s.height, rx: 4 }));
      const label = svg('text', { x: s.x + 6, y: s.y + 14 });
      label.textContent = s.state.label;
      g.appendChild(label);
      this.root.appendChild(g);
    }
    for (const s of layout.scopes) {
      this.root.appendChild(
        svg('rect', { class: 'dcnb-scope', x: s.x, y: s.y, width: s.width, height: s.height, rx: 3 })
      );
    }
    const labels = new LabelSpace();
    for (const e of [...layout.edges, ...layout.interstate]) {
      this.root.appendChild(this.drawEdge(e, layout.interstate.includes(e), labels));
    }
    for (const n of layout.nodes) {
      this.root.appendChild(this.drawNode(n));
    }
  }

  private drawEdge(e: PlacedEdge, interstate: boolean, labels: LabelSpace): SVGGElement {
    const g = svg('g', { class: interstate ? 'dcnb-edge dcnb-interstate' : 'dcnb-edge' });
    const d = e.points.map((p, i) => `${i ? 'L' : 'M'} ${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(' ');
    g.appendChild(svg('path', { d, 'marker-end': 'url(#dcnb-arrow)' }));
    const title = svg('title');
    title.textContent = [e.edge.label, e.edge.volume ? `volume ${e.edge.volume}` : '', e.edge.wcr ? `wcr ${e.edge.wcr}` : '']
      .filter(Boolean)
      .join('\n');
    g.appendChild(title);
    const label = e.edge.volume ? `${e.edge.label} (${e.edge.volume})` : e.edge.label;
    // a label that would overlap one already drawn is left to the edge's tooltip
    if (e.labelAt && label && labels.take(e.labelAt.x - 30, e.labelAt.y - 6, label.length * 5.5, 12)) {
      const text = svg('text', { x: e.labelAt.x - 30, y: e.labelAt.y + 4 });
      text.textContent = label;
      g.appendChild(text);
    }
    return g;
  }

  private drawNode(p: PlacedNode): SVGGElement {
    const node = p.node;
    const g = svg('g', { class: `dcnb-node dcnb-${node.kind}` });
    g.dataset.id = node.id;
    g.dataset.label = node.label;
    g.classList.toggle('dcnb-selected', this.selected.has(node.label));
    g.appendChild(shape(p));
    // a map entry's label leaves room for its collapse box
    const shift = node.kind === 'map_entry' ? 12 : 0;
    const text = svg('text', { x: p.x + p.width / 2 + shift, y: p.y + p.height / 2 + 4, 'text-anchor': 'middle' });
    text.textContent = clip(nodeText(node) + (p.hidden ? ` (${p.hidden} inside)` : ''), p.width - 2 * shift);
    g.appendChild(text);
    const title = svg('title');
    title.textContent = nodeText(node);
    g.appendChild(title);
    if (node.kind === 'map_entry') {
      // SDFV's collapse box, in the entry's lower left corner
      const toggle = svg('g', { class: 'dcnb-toggle' });
      toggle.appendChild(svg('rect', { x: p.x + 22, y: p.y + 3, width: 14, height: 14, rx: 2 }));
      const sign = svg('text', { x: p.x + 29, y: p.y + 14, 'text-anchor': 'middle' });
      sign.textContent = p.hidden !== undefined ? '+' : '−';
      toggle.appendChild(sign);
      const tip = svg('title');
      tip.textContent = p.hidden !== undefined ? 'expand this map scope' : 'collapse this map scope';
      toggle.appendChild(tip);
      toggle.addEventListener('click', e => {
        e.stopPropagation();
        this.toggle(node.id);
      });
      g.appendChild(toggle);
    }
    g.addEventListener('click', e => {
      if (this.drag?.moved) {
        return;
      }
      this.onNodeClick(node, e.shiftKey);
    });
    return g;
  }

  private onNodeClick(node: NodeData, add: boolean): void {
    if (add) {
      if (this.selected.has(node.label)) {
        this.selected.delete(node.label);
      } else {
        this.selected.add(node.label);
      }
    } else {
      this.selected = this.selected.size === 1 && this.selected.has(node.label) ? new Set() : new Set([node.label]);
    }
    this.setSelection([...this.selected]);
    this.showDetails(this.selected.has(node.label) ? node : null);
    this.options.onSelect([...this.selected]);
  }

  private showDetails(node: NodeData | null): void {
    this.details.replaceChildren();
    if (!node) {
      this.details.appendChild(
        el('p', 'dcnb-hint', 'Click a node for its details; shift-click to select several. Actions then apply there.')
      );
      return;
    }
    this.details.appendChild(el('div', 'dcnb-details-kind', node.kind.replace('_', ' ')));
    const table = el('table');
    for (const [key, value] of Object.entries(node.info)) {
      const row = el('tr');
      row.appendChild(el('th', '', key));
      const cell = el('td');
      cell.appendChild(key === 'code' ? el('pre', '', value) : document.createTextNode(value));
      row.appendChild(cell);
      table.appendChild(row);
    }
    this.details.appendChild(table);
    const edges = this.graph?.states.flatMap(s => s.edges.filter(e => e.src === node.id || e.dst === node.id)) ?? [];
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

  private onWheel(e: WheelEvent): void {
    e.preventDefault();
    const box = this.canvas.getBoundingClientRect();
    const mx = e.clientX - box.left;
    const my = e.clientY - box.top;
    const factor = Math.exp(-e.deltaY * 0.0015);
    const scale = Math.min(8, Math.max(0.02, this.view.scale * factor));
    const k = scale / this.view.scale;
    this.view = { scale, x: mx - (mx - this.view.x) * k, y: my - (my - this.view.y) * k };
    this.applyView();
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
    this.root.setAttribute('transform', `translate(${this.view.x.toFixed(1)} ${this.view.y.toFixed(1)}) scale(${this.view.scale.toFixed(4)})`);
  }
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
      const g = svg('g');
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
