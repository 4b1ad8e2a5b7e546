// SessionModel / SessionView: the session widget. The model holds dcnb/_src/views/widget.py's traits (protocol.ts,
// generated from them, types them); the view draws them and sends the requests protocol.ts lists; Python does the
// work.
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { Asks } from './asks';
import { historyChart, searchChart } from './chart';
import { CodeView } from './codeview';
import { el } from './dom';
import { BeforeData, elapsed, MatchData, percent, Tab } from './format';
import { GraphView } from './graphview';
import { countNodes, displayName, NodeData, Picture } from './layout';
import { layoutAhead, layoutCached } from './layoutclient';
import { Overlay, overlayChoices } from './overlay';
import { DEFAULTS, SessionMessage, SessionState } from './protocol';
import { drawTable } from './tables';

// the nodes whose generated code the code panel shows
const CODE_KINDS = new Set(['map_entry', 'map_exit', 'tasklet', 'library', 'nested']);

// What a widget manager in JupyterLab holds (@jupyter-widgets/jupyterlab-manager's WidgetManager.kernel); a
// manager without a kernel has no such property.
interface KernelHolder {
  kernel?: { interrupt(): Promise<void> } | null;
}

// A comm as JupyterLab 4.6's services have it: where its messages go, a subshell of their own or the main shell.
interface SubshellRouting {
  commsOverSubshells?: string;
}

export class SessionModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return { ...super.defaults(), ...DEFAULTS };
  }

  initialize(attributes: Backbone.ObjectHash, options: any): void {
    super.initialize(attributes, options);
    // JupyterLab sends comm messages to a kernel subshell where the kernel has them (ipykernel 7): a request would
    // then run on a thread of its own, where the kernel's interrupt (Cancel, the stop button) cannot reach it, since
    // Python delivers SIGINT to the main thread only. The session's requests go to the main shell, as cells do.
    const routing = (this.comm as { jsServicesComm?: SubshellRouting } | undefined)?.jsServicesComm;
    if (routing && 'commsOverSubshells' in routing) {
      routing.commsOverSubshells = 'disabled';
    }
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

export class SessionView extends DOMWidgetView {
  private graphView!: GraphView;
  private codeView!: CodeView;
  private tab: Tab = 'forward';
  // whether the graph shows the step the shown one was made from (`before`)
  private previous = false;
  // the side, step and `previous` of the picture drawn last
  private drawing = '';
  private tabs!: Record<Tab, HTMLButtonElement>;
  private previousButton!: HTMLButtonElement;
  private overlayChoice!: HTMLLabelElement;
  private whereLine!: HTMLDivElement;
  private actionBar!: HTMLDivElement;
  private selectionLine!: HTMLDivElement;
  private status!: HTMLDivElement;
  private statusText!: HTMLSpanElement;
  private cancel!: HTMLButtonElement;
  private profileBox!: HTMLDivElement;
  private searchBox!: HTMLDivElement;
  // the budget in seconds the Search button searches for (kept across the action bar's redraws)
  private searchBudget!: HTMLInputElement;
  private result!: HTMLDivElement;
  private history!: HTMLDivElement;
  private titleLine!: HTMLDivElement;
  // the node whose details are shown (its code too, where the kernel sent it)
  private detailed: NodeData | null = null;
  // the phase `busy` names, since when it runs, and since when the request runs
  private phase = '';
  private phaseSince = 0;
  private requestSince = 0;
  private ticker: number | null = null;
  // closes the open list of an action's matches
  private closeMatches: (() => void) | null = null;
  private readonly asks = new Asks(message => this.request(message));

  // One trait, typed as protocol.ts declares it.
  private get<K extends keyof SessionState>(key: K): SessionState[K] {
    return this.model.get(key);
  }

  private setSelection(labels: string[]): void {
    this.model.set('selection', labels);
    this.model.save_changes();
  }

  private request(message: SessionMessage): void {
    this.send(message);
  }

  render(): void {
    this.el.classList.add('dcnb-session');
    this.titleLine = el('div', 'dcnb-title');
    this.graphView = new GraphView({
      onSelect: labels => {
        this.setSelection(labels);
        this.renderSelection();
      },
      onDetails: node => {
        this.detailed = node;
        if (node && CODE_KINDS.has(node.kind)) {
          this.asks.want(key => this.get(key));
        }
        this.renderCode();
      },
      layout: layoutCached,
      constants: this.get('constants'),
      missing: overlay => this.missing(overlay)
    });
    this.codeView = new CodeView();
    this.whereLine = el('div', 'dcnb-where');
    this.actionBar = el('div', 'dcnb-actions');
    this.selectionLine = el('div', 'dcnb-selection');
    this.buildStatus();
    this.profileBox = el('div', 'dcnb-profile');
    this.searchBox = el('div', 'dcnb-search-box');
    this.searchBudget = el('input', 'dcnb-search-budget');
    this.searchBudget.type = 'number';
    this.searchBudget.min = '1';
    this.searchBudget.value = '120';
    this.searchBudget.title = 'seconds the search may take (the best found then becomes steps)';
    this.result = el('div', 'dcnb-result');
    this.history = el('div', 'dcnb-history-box');
    this.el.append(
      this.titleLine,
      this.buildBar(),
      this.whereLine,
      this.graphView.node,
      this.codeView.node,
      this.actionBar,
      this.selectionLine,
      this.status,
      this.profileBox,
      this.searchBox,
      this.result,
      this.history
    );

    this.listenTo(this.model, 'change:graphs', () => {
      this.renderGraph(false);
      this.renderOverlayChoice();
    });
    this.listenTo(this.model, 'change:inspected', () => {
      this.renderOverlayChoice();
      this.graphView.drawLegend();
      this.renderCode();
    });
    this.listenTo(this.model, 'change:before', () => {
      // a new step's `before` comes with its `graphs`, which redraw: only a toggle left without pictures redraws
      if (this.previous && !this.hasBefore()) {
        this.setPrevious(false);
      } else {
        this.renderPrevious();
      }
    });
    this.listenTo(this.model, 'change:actions change:matches', () => this.renderActions());
    this.listenTo(this.model, 'change:steps change:current change:history change:shown', () => {
      this.renderResults();
      this.renderWhere();
    });
    this.listenTo(this.model, 'change:busy', () => this.onBusy());
    this.listenTo(this.model, 'change:message', () => this.renderStatus());
    this.listenTo(this.model, 'change:sources', () => this.renderCode());
    this.listenTo(this.model, 'change:profile', () => this.renderProfile());
    this.listenTo(this.model, 'change:search', () => this.renderSearch());
    this.listenTo(this.model, 'change:selection', () => {
      this.graphView.setSelection(this.get('selection'));
      this.renderSelection();
    });
    this.listenTo(this.model, 'change:title', () => this.renderTitle());
    this.renderTitle();
    this.renderPrevious();
    this.renderOverlayChoice();
    this.showTab('forward');
    this.renderSelection();
    this.onBusy();
    this.renderProfile();
    this.renderSearch();
    this.renderResults();
    this.renderWhere();
  }

  remove(): any {
    this.graphView?.dispose();
    this.codeView?.dispose();
    this.closeMatches?.();
    this.stopTicking();
    return super.remove();
  }

  // Forward / Backward, the step before, the overlay, and the view's buttons.
  private buildBar(): HTMLDivElement {
    const bar = el('div', 'dcnb-tabs');
    this.tabs = {
      forward: el('button', 'dcnb-tab', 'Forward'),
      backward: el('button', 'dcnb-tab', 'Backward')
    };
    for (const t of ['forward', 'backward'] as Tab[]) {
      this.tabs[t].dataset.tab = t;
      this.tabs[t].addEventListener('click', () => this.showTab(t));
      bar.appendChild(this.tabs[t]);
    }
    this.previousButton = el('button', 'dcnb-small dcnb-previous', 'Previous step');
    this.previousButton.addEventListener('click', () => this.setPrevious(!this.previous));
    bar.appendChild(this.previousButton);
    bar.appendChild(el('span', 'dcnb-spacer'));
    this.overlayChoice = el('label', 'dcnb-overlay', 'Overlay: ');
    const select = el('select');
    for (const [value, name] of overlayChoices(this.get('constants').overlays)) {
      const option = el('option', '', name);
      option.value = value;
      select.appendChild(option);
    }
    select.addEventListener('change', () => {
      if (select.value) {
        this.asks.want(key => this.get(key));
      }
      this.graphView.setOverlay((select.value as Overlay) || null);
    });
    this.overlayChoice.appendChild(select);
    bar.appendChild(this.overlayChoice);
    for (const [label, tip, fn] of [
      ['Fit', 'show the whole graph', () => this.graphView.fit()],
      ['Collapse all', 'collapse every map scope and nested SDFG', () => this.graphView.collapseAll(true)],
      ['Expand all', 'expand every map scope and nested SDFG', () => this.graphView.collapseAll(false)]
    ] as [string, string, () => void][]) {
      const b = el('button', 'dcnb-small', label);
      b.title = tip;
      b.addEventListener('click', fn);
      bar.appendChild(b);
    }
    return bar;
  }

  private buildStatus(): void {
    this.status = el('div', 'dcnb-status');
    this.statusText = el('span', 'dcnb-status-text');
    this.cancel = el('button', 'dcnb-small dcnb-cancel', 'Cancel');
    this.cancel.title = 'interrupt the kernel: the session stays at its last good step';
    this.cancel.addEventListener('click', () => {
      this.cancel.disabled = true;
      this.cancel.textContent = 'Cancelling…';
      void this.kernel()?.interrupt();
    });
    this.status.append(this.statusText, this.cancel);
  }

  private showTab(tab: Tab): void {
    this.tab = tab;
    for (const t of ['forward', 'backward'] as Tab[]) {
      this.tabs[t].classList.toggle('dcnb-active', t === tab);
    }
    this.renderGraph(true);
  }

  private renderTitle(): void {
    this.titleLine.textContent = `dcnb session ${this.get('variable')}: ${this.get('title')}`;
  }

  private before(): BeforeData {
    return this.get('before');
  }

  // The picture the tab shows: the shown step's, or the one of the step it was made from.
  private picture(): Picture | null {
    const graphs = this.get('graphs');
    return (this.previous ? this.before()[this.tab] : graphs[this.tab]) ?? null;
  }

  private renderGraph(fresh: boolean): void {
    const graphs = this.get('graphs');
    this.tabs.backward.disabled = !graphs.backward;
    // another step, side or the step before: what that step changed comes into view (not where the same picture
    // comes again, with its metrics)
    const drawing = `${this.tab} ${this.shown()} ${this.previous}`;
    const reveal = drawing !== this.drawing;
    this.drawing = drawing;
    this.graphView.setGraph(this.picture(), this.get('selection'), fresh, reveal);
    // the other tab's picture, laid out while this one is looked at (the worker takes this one's first)
    const other = graphs[this.tab === 'forward' ? 'backward' : 'forward'];
    if (other && !this.previous) {
      layoutAhead(other);
    }
  }

  private hasBefore(): boolean {
    const before = this.before();
    return Boolean(before.forward || before.backward);
  }

  private setPrevious(on: boolean): void {
    this.previous = on;
    this.renderPrevious();
    this.renderGraph(false);
  }

  // Back from the step before to the shown step's picture (a kernel or a place to show is on the shown step);
  // true where the graph must be drawn again.
  private leavePrevious(): boolean {
    const was = this.previous;
    this.previous = false;
    this.renderPrevious();
    return was;
  }

  // The "Previous step" toggle: there where the kernel sent the pictures of the step before.
  private renderPrevious(): void {
    const available = this.hasBefore();
    this.previousButton.style.display = available ? '' : 'none';
    this.previousButton.classList.toggle('dcnb-active', this.previous);
    this.previousButton.title = this.previous
      ? 'back to the picture of the step shown'
      : `show the picture of step ${this.before().step ?? ''}, which this step was made from`;
    this.renderWhere();
    this.renderCode();
  }

  // Why the shown step's code or metrics are not in the view (null: they are, or the step has none to give):
  // worked out as the user asks on a graph past the kernel's INSPECT_AT_ONCE nodes; time needs a profile.
  private missing(what: 'code' | Overlay): string | null {
    const nodes = Object.values(this.get('graphs')).reduce((n, g) => n + countNodes(g), 0);
    const inspecting = this.phase.startsWith('reading the generated code');
    if (what === 'ms') {
      return `no kernel of step ${this.shown()} is timed yet: Profile times each kernel of the current step`;
    }
    if (this.get('inspected')) {
      return what === 'code' ? null : `no node of this picture carries ${this.get('constants').overlays[what] ?? what}`;
    }
    const asked = `the code and the bytes and FLOPs of a graph of ${nodes} nodes are worked out when asked`;
    return inspecting ? `${asked}: working them out now…` : `${asked}: asked for, once the kernel is free`;
  }

  // The overlay selector: there where some node or memlet carries a metric, or where the kernel can work them out.
  private renderOverlayChoice(): void {
    const graphs = this.get('graphs');
    const pictures = Object.values(graphs) as (Picture | null)[];
    const measured = pictures.some(g => g && hasMetrics(g));
    const askable = !this.get('inspected') && pictures.some(g => g);
    this.overlayChoice.style.display = measured || askable ? '' : 'none';
  }

  private shown(): number {
    return this.get('shown');
  }

  // Which step the graph shows, where it is not the session's current one.
  private renderWhere(): void {
    const current = this.get('current');
    const shown = this.shown();
    const steps = this.get('steps');
    this.whereLine.replaceChildren();
    if (shown !== current) {
      const step = steps.find(s => s.index === shown);
      this.whereLine.appendChild(
        el('span', '', `Showing step ${shown}${step ? ` (${step.title})` : ''}; the session is at step ${current}. `)
      );
      const back = el('button', 'dcnb-small dcnb-back', 'Back to the current step');
      back.addEventListener('click', () => this.request({ event: 'show', index: null }));
      this.whereLine.appendChild(back);
    }
    if (this.previous) {
      this.whereLine.appendChild(
        el('span', '', ` The graph shows step ${this.before().step ?? ''}, the step this one was made from.`)
      );
    }
    this.whereLine.style.display = this.whereLine.children.length ? '' : 'none';
  }

  // The generated code of the node whose details are shown, where the kernel sent it; where it has not yet, why.
  private renderCode(): void {
    const node = this.detailed;
    const sources = this.get('sources');
    const source = sources[this.tab];
    const range = node?.guid && source ? source.nodes[node.guid] : undefined;
    // the code is the shown step's: a node of the step before may have none or other lines
    if (!node || this.previous || !CODE_KINDS.has(node.kind)) {
      this.codeView.hide();
      return;
    }
    if (!source || !range) {
      const why = this.missing('code');
      if (why) {
        this.codeView.tell(displayName(node), why);
      } else {
        this.codeView.hide();
      }
      return;
    }
    const filename = `${this.get('variable') || 'session'}.${this.tab}.${source.language === 'cuda' ? 'cu' : 'cpp'}`;
    this.codeView.show(source, range, displayName(node), filename);
  }

  private renderActions(): void {
    this.closeMatches?.();
    const actions = this.get('actions');
    const matches = this.get('matches');
    const busy = Boolean(this.get('busy'));
    const where = this.get('selection');
    this.actionBar.replaceChildren();
    for (const a of actions) {
      // a disabled button shows no tooltip in every browser: the tip sits on a wrapper
      const wrap = el('span', 'dcnb-action-wrap');
      const b = el('button', 'dcnb-action', a.matches ? `${a.name} (${a.matches})` : a.name);
      b.dataset.action = a.name;
      b.disabled = busy || a.matches === 0;
      wrap.title =
        `${a.description}\n${a.phase}; ` +
        (a.matches ? `matches ${a.matches} place(s)` : 'matches nothing here') +
        (where.length ? ` in the selection` : '');
      b.addEventListener('click', () => this.request({ event: 'apply', name: a.name, where: where.length ? where : null }));
      wrap.appendChild(b);
      const places = matches[a.name] ?? [];
      if (places.length) {
        const more = el('button', 'dcnb-more', '▾');
        more.dataset.places = a.name;
        more.title = `apply ${a.name} at one of its ${places.length} place(s)`;
        more.disabled = busy;
        more.addEventListener('click', () => this.toggleMatches(wrap, a.name, places));
        wrap.appendChild(more);
      }
      this.actionBar.appendChild(wrap);
    }
    this.actionBar.appendChild(el('span', 'dcnb-spacer'));
    const steps = this.get('steps');
    for (const [label, event, tip, enabled] of [
      ['Undo', 'undo', 'go back to the state before the last good step', this.get('current') > 0],
      ['Reset', 'reset', 'go back to the naive step', steps.length > 1],
      ['Profile', 'profile', 'build with instrumentation and time each kernel of the current step', true],
      ['Export recipe', 'export', 'write the recipe to a file that %%dcoptimize --recipe replays', true]
    ] as [string, 'undo' | 'reset' | 'profile' | 'export', string, boolean][]) {
      const b = el('button', 'dcnb-control', label);
      b.dataset.event = event;
      b.title = tip;
      b.disabled = busy || !enabled;
      b.addEventListener('click', () => this.request({ event }));
      this.actionBar.appendChild(b);
    }
    const search = el('button', 'dcnb-control dcnb-search-button', 'Search');
    search.title = 'try sequences of actions from the current step, each built, checked and timed; the best becomes steps';
    search.disabled = busy;
    search.addEventListener('click', () => {
      const budget = Number(this.searchBudget.value);
      if (budget > 0) {
        this.request({ event: 'search', budget });
      }
    });
    this.searchBudget.disabled = busy;
    this.actionBar.append(search, this.searchBudget, el('span', 'dcnb-unit', 's'));
  }

  // The list of an action's places under its ▾: hovering one marks its nodes, clicking applies the action there.
  private toggleMatches(wrap: HTMLSpanElement, name: string, places: MatchData[]): void {
    const here = wrap.querySelector('.dcnb-matches') !== null;
    this.closeMatches?.();
    if (here) {
      return;
    }
    const list = el('div', 'dcnb-matches');
    places.forEach((place, index) => {
      const names = place.names.length ? place.names : place.labels;
      const item = el('div', 'dcnb-match', names.join(', ') + (place.side === 'backward' ? ' (backward)' : ''));
      item.title = `apply ${name} here only (${place.side}: ${place.labels.join(', ')})`;
      if (place.guids) {
        // what the graph marks while the pointer is on the place (a browser test compares the two)
        item.dataset.guids = place.guids.join(' ');
      }
      item.addEventListener('mouseenter', () => this.preview(place));
      item.addEventListener('mouseleave', () => this.graphView.highlight(null));
      item.addEventListener('click', () => {
        this.closeMatches?.();
        this.request({ event: 'apply', name, match: index });
      });
      list.appendChild(item);
    });
    wrap.appendChild(list);
    const outside = (e: MouseEvent) => {
      if (!wrap.contains(e.target as Node)) {
        this.closeMatches?.();
      }
    };
    document.addEventListener('mousedown', outside, true);
    this.closeMatches = () => {
      document.removeEventListener('mousedown', outside, true);
      list.remove();
      this.graphView.highlight(null);
      this.closeMatches = null;
    };
  }

  // Mark a place's nodes in the graph, on the tab of its side.
  private preview(place: MatchData): void {
    this.showSide(place.side);
    this.graphView.highlight(place);
  }

  private renderSelection(): void {
    const where = this.get('selection');
    this.selectionLine.replaceChildren();
    if (!where.length) {
      this.selectionLine.textContent = 'Actions apply everywhere; select nodes in the graph to narrow them.';
      return;
    }
    // by the names the graph draws; DaCe's labels (what a recipe keeps) in the tooltip
    const names = where.map(label => this.graphView.nameOf(label));
    this.selectionLine.appendChild(document.createTextNode(`Actions apply where: ${names.join(', ')} `));
    this.selectionLine.title = where.join(', ');
    const clear = el('button', 'dcnb-small', 'clear');
    clear.addEventListener('click', () => this.setSelection([]));
    this.selectionLine.appendChild(clear);
  }

  // A request's progress: its phase (what `busy` says) and the seconds it and the whole request took so far,
  // every second.
  private onBusy(): void {
    const busy = this.get('busy');
    const now = Date.now();
    if (busy && !this.phase) {
      this.requestSince = now;
      this.cancel.disabled = false;
      this.cancel.textContent = 'Cancel';
    }
    if (busy !== this.phase) {
      this.phaseSince = now;
    }
    this.phase = busy;
    if (!this.get('inspected')) {
      this.graphView.drawLegend();
      this.renderCode();
    }
    if (busy && this.ticker === null) {
      this.ticker = window.setInterval(() => this.renderStatus(), 1000);
    } else if (!busy) {
      this.stopTicking();
    }
    this.renderStatus();
    this.renderActions();
  }

  private stopTicking(): void {
    if (this.ticker !== null) {
      window.clearInterval(this.ticker);
      this.ticker = null;
    }
  }

  private kernel(): KernelHolder['kernel'] {
    return (this.model.widget_manager as unknown as KernelHolder).kernel ?? null;
  }

  private renderStatus(): void {
    const busy = this.phase;
    const now = Date.now();
    this.status.classList.toggle('dcnb-busy', Boolean(busy));
    this.statusText.textContent = busy
      ? `working: ${busy}… ${elapsed(this.phaseSince, now)} in this phase, ${elapsed(this.requestSince, now)} in all `
      : this.get('message');
    this.cancel.style.display = busy && this.kernel() ? '' : 'none';
  }

  // The profile's top kernels beside PyTorch eager's top ops; a click on a kernel shows it in the graph.
  private renderProfile(): void {
    const profile = this.get('profile');
    this.profileBox.replaceChildren();
    this.profileBox.style.display = profile.rows?.length ? '' : 'none';
    if (!profile.rows?.length) {
      return;
    }
    // one row per op, its kernels summed (the slowest shown in the graph on a click)
    const kernels = profileTable(`dcnb: top ops (step ${profile.step ?? ''})`, ['op', 'side', 'ms', 'share']);
    for (const row of profile.rows) {
      const tr = profileRow(kernels, [row.name, row.side, row.ms.toFixed(3), percent(row.share)]);
      tr.classList.toggle('dcnb-clickable', true);
      tr.title = "show this op's slowest kernel in the graph";
      tr.addEventListener('click', () => this.showKernel(row.side, row.guid));
    }
    this.profileBox.appendChild(kernels);
    if (profile.eager?.length) {
      const eager = profileTable('PyTorch eager: top ops', ['op', 'ms', 'share']);
      for (const row of profile.eager) {
        profileRow(eager, [row.name, row.ms.toFixed(3), percent(row.share)]);
      }
      this.profileBox.appendChild(eager);
    }
  }

  // The last search: the best against the start, its candidates against time and memory, and their table.
  private renderSearch(): void {
    const found = this.get('search');
    this.searchBox.replaceChildren();
    this.searchBox.style.display = found.table ? '' : 'none';
    if (!found.table) {
      return;
    }
    this.searchBox.appendChild(el('div', 'dcnb-heading', 'Search'));
    this.searchBox.appendChild(el('div', 'dcnb-summary', found.summary ?? ''));
    const plot = searchChart(found.points ?? []);
    if (plot) {
      this.searchBox.appendChild(plot);
    }
    const table = drawTable(found.table);
    if (table) {
      this.searchBox.appendChild(table);
    }
  }

  // The shown step's picture of a side (a place or a kernel is there).
  private showSide(side: Tab): void {
    const graphs = this.get('graphs');
    const redraw = this.leavePrevious();
    if (side !== this.tab && graphs[side]) {
      this.showTab(side);
    } else if (redraw) {
      this.renderGraph(false);
    }
  }

  private showKernel(side: Tab, guid: string): void {
    this.showSide(side);
    this.graphView.focus(guid);
  }

  private renderResults(): void {
    const steps = this.get('steps');
    const current = this.get('current');
    const shownIndex = this.shown();
    const last = steps[steps.length - 1];
    this.result.replaceChildren();
    if (last) {
      const other = shownIndex !== current ? steps.find(s => s.index === shownIndex) : undefined;
      const shown = other ?? (last.ok ? last : steps.find(s => s.index === current) ?? last);
      if (!last.ok && !other) {
        this.result.appendChild(el('div', 'dcnb-error', last.summary));
        if (last.log) {
          const log = el('details', 'dcnb-log');
          log.append(el('summary', '', 'compiler log'), el('pre', '', last.log));
          this.result.appendChild(log);
        }
        this.result.appendChild(el('div', 'dcnb-note', `The session stays at step ${current}.`));
      }
      this.result.appendChild(el('div', 'dcnb-summary', shown.summary));
      if (shown.cuda?.state === 'pending') {
        const stop = el('button', 'dcnb-small dcnb-cancel-cuda', 'Cancel the CUDA build');
        stop.title = `stop step ${shown.index}'s CUDA build in the background, with its compilers`;
        stop.addEventListener('click', () => this.request({ event: 'cancel_cuda', index: shown.index }));
        this.result.appendChild(stop);
      }
      if (shown.cuda?.log) {
        const log = el('details', 'dcnb-log');
        log.append(el('summary', '', 'CUDA build log'), el('pre', '', shown.cuda.log));
        this.result.appendChild(log);
      }
      const table = drawTable(shown.timing);
      if (table) {
        this.result.appendChild(table);
      }
      for (const note of shown.notes ?? []) {
        this.result.appendChild(el('div', 'dcnb-note', note));
      }
    }
    this.history.replaceChildren(el('div', 'dcnb-heading', 'History'));
    // a row of the history is a step (both come from the session's history): a click shows its graphs
    const history = drawTable(this.get('history'), (i, row) => {
      const step = steps[i];
      if (!step?.ok) {
        return;
      }
      row.classList.toggle('dcnb-clickable', true);
      row.classList.toggle('dcnb-shown', step.index === shownIndex && shownIndex !== current);
      row.title = step.index === current ? 'the current step' : `show the graphs of step ${step.index}`;
      row.addEventListener('click', () => this.request({ event: 'show', index: step.index }));
    });
    for (const part of [history, historyChart(steps)]) {
      if (part) {
        this.history.appendChild(part);
      }
    }
    this.renderActions();
  }
}

// Whether a picture (nested SDFGs included) carries a metric the overlays show.
function hasMetrics(graph: { states: Picture['states'] }): boolean {
  return graph.states.some(s =>
    s.nodes.some(n => (n.metrics && Object.keys(n.metrics).length) || (n.sdfg && hasMetrics(n.sdfg))) ||
    s.edges.some(e => e.bytes !== undefined)
  );
}

function profileTable(caption: string, columns: string[]): HTMLTableElement {
  const table = el('table', 'dcnb-table dcnb-profile-table');
  table.appendChild(el('caption', '', caption));
  const head = el('tr');
  columns.forEach((c, i) => head.appendChild(el('th', i ? '' : 'dcnb-left', c)));
  table.appendChild(head);
  return table;
}

function profileRow(table: HTMLTableElement, cells: string[]): HTMLTableRowElement {
  const row = el('tr');
  cells.forEach((c, i) => row.appendChild(el('td', i ? '' : 'dcnb-left', c)));
  table.appendChild(row);
  return row;
}
