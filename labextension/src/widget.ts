// SessionModel / SessionView: the session widget. The model mirrors dcnb/_src/widget.py's traits; the view
// draws them and sends requests ({event: 'apply' | 'undo' | 'reset' | 'export'}); Python does the work.
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { historyChart } from './chart';
import { el } from './dom';
import { ActionData, StepData, stepSummary } from './format';
import { GraphView } from './graphview';
import { Picture } from './layout';
import { layoutAsync } from './layoutclient';
import { drawTable, TableData } from './tables';
import { MODULE_NAME, MODULE_VERSION } from './version';

type Tab = 'forward' | 'backward';

export class SessionModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      _model_name: 'SessionModel',
      _view_name: 'SessionView',
      _model_module: MODULE_NAME,
      _view_module: MODULE_NAME,
      _model_module_version: MODULE_VERSION,
      _view_module_version: MODULE_VERSION,
      title: '',
      variable: '',
      graphs: {},
      steps: [],
      history: null,
      current: 0,
      actions: [],
      selection: [],
      busy: '',
      message: '',
      recipe: '[]'
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

export class SessionView extends DOMWidgetView {
  private graphView!: GraphView;
  private tab: Tab = 'forward';
  private tabs!: Record<Tab, HTMLButtonElement>;
  private actionBar!: HTMLDivElement;
  private selectionLine!: HTMLDivElement;
  private status!: HTMLDivElement;
  private result!: HTMLDivElement;
  private history!: HTMLDivElement;
  private titleLine!: HTMLDivElement;

  render(): void {
    this.el.classList.add('dcnb-session');
    this.titleLine = el('div', 'dcnb-title');
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
    bar.appendChild(el('span', 'dcnb-spacer'));
    for (const [label, tip, fn] of [
      ['Fit', 'show the whole graph', () => this.graphView.fit()],
      ['Collapse all', 'collapse every map scope', () => this.graphView.collapseAll(true)],
      ['Expand all', 'expand every map scope', () => this.graphView.collapseAll(false)]
    ] as [string, string, () => void][]) {
      const b = el('button', 'dcnb-small', label);
      b.title = tip;
      b.addEventListener('click', fn);
      bar.appendChild(b);
    }
    this.graphView = new GraphView({
      onSelect: labels => {
        this.model.set('selection', labels);
        this.model.save_changes();
        this.renderSelection();
      },
      layout: layoutAsync
    });
    this.actionBar = el('div', 'dcnb-actions');
    this.selectionLine = el('div', 'dcnb-selection');
    this.status = el('div', 'dcnb-status');
    this.result = el('div', 'dcnb-result');
    this.history = el('div', 'dcnb-history-box');
    this.el.append(this.titleLine, bar, this.graphView.node, this.actionBar, this.selectionLine, this.status, this.result, this.history);

    this.listenTo(this.model, 'change:graphs', () => this.renderGraph());
    this.listenTo(this.model, 'change:actions change:busy', () => this.renderActions());
    this.listenTo(this.model, 'change:steps change:current change:history', () => this.renderResults());
    this.listenTo(this.model, 'change:busy change:message', () => this.renderStatus());
    this.listenTo(this.model, 'change:selection', () => {
      this.graphView.setSelection(this.model.get('selection'));
      this.renderSelection();
    });
    this.listenTo(this.model, 'change:title', () => this.renderTitle());
    this.renderTitle();
    this.showTab('forward');
    this.renderActions();
    this.renderSelection();
    this.renderStatus();
    this.renderResults();
  }

  remove(): any {
    this.graphView?.dispose();
    return super.remove();
  }

  private showTab(tab: Tab): void {
    this.tab = tab;
    for (const t of ['forward', 'backward'] as Tab[]) {
      this.tabs[t].classList.toggle('dcnb-active', t === tab);
    }
    this.renderGraph();
  }

  private renderTitle(): void {
    this.titleLine.textContent = `dcnb session ${this.model.get('variable')}: ${this.model.get('title')}`;
  }

  private renderGraph(): void {
    const graphs = this.model.get('graphs') as Record<Tab, Picture | null>;
    this.tabs.backward.disabled = !graphs.backward;
    this.graphView.setGraph(graphs[this.tab] ?? null, this.model.get('selection'));
  }

  private renderActions(): void {
    const actions = this.model.get('actions') as ActionData[];
    const busy = Boolean(this.model.get('busy'));
    const where = this.model.get('selection') as string[];
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
      b.addEventListener('click', () => this.send({ event: 'apply', name: a.name, where: where.length ? where : null }));
      wrap.appendChild(b);
      this.actionBar.appendChild(wrap);
    }
    this.actionBar.appendChild(el('span', 'dcnb-spacer'));
    const steps = this.model.get('steps') as StepData[];
    for (const [label, event, tip, enabled] of [
      ['Undo', 'undo', 'go back to the state before the last good step', this.model.get('current') > 0],
      ['Reset', 'reset', 'go back to the naive step', steps.length > 1],
      ['Export recipe', 'export', 'write the recipe to a file that %%dcoptimize --recipe replays', true]
    ] as [string, string, string, boolean][]) {
      const b = el('button', 'dcnb-control', label);
      b.dataset.event = event;
      b.title = tip;
      b.disabled = busy || !enabled;
      b.addEventListener('click', () => this.send({ event }));
      this.actionBar.appendChild(b);
    }
  }

  private renderSelection(): void {
    const where = this.model.get('selection') as string[];
    this.selectionLine.replaceChildren();
    if (!where.length) {
      this.selectionLine.textContent = 'Actions apply everywhere; select nodes in the graph to narrow them.';
      return;
    }
    this.selectionLine.appendChild(document.createTextNode(`Actions apply where: ${where.join(', ')} `));
    const clear = el('button', 'dcnb-small', 'clear');
    clear.addEventListener('click', () => {
      this.model.set('selection', []);
      this.model.save_changes();
    });
    this.selectionLine.appendChild(clear);
  }

  private renderStatus(): void {
    const busy = this.model.get('busy') as string;
    this.status.classList.toggle('dcnb-busy', Boolean(busy));
    this.status.textContent = busy ? `working: ${busy}…` : (this.model.get('message') as string);
  }

  private renderResults(): void {
    const steps = this.model.get('steps') as StepData[];
    const current = this.model.get('current') as number;
    const last = steps[steps.length - 1];
    this.result.replaceChildren();
    if (last) {
      const shown = last.ok ? last : steps.find(s => s.index === current) ?? last;
      if (!last.ok) {
        this.result.appendChild(el('div', 'dcnb-error', stepSummary(last)));
        if (last.log) {
          const log = el('details', 'dcnb-log');
          log.append(el('summary', '', 'compiler log'), el('pre', '', last.log));
          this.result.appendChild(log);
        }
        this.result.appendChild(el('div', 'dcnb-note', `The session stays at step ${current}.`));
      }
      this.result.appendChild(el('div', 'dcnb-summary', stepSummary(shown)));
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
    for (const part of [drawTable(this.model.get('history') as TableData | null), historyChart(steps)]) {
      if (part) {
        this.history.appendChild(part);
      }
    }
    this.renderActions();
  }
}
