// The renderer of dcnb's output: the live session widget where its kernel holds it, the static rendering (the
// output's own text/html: SVGs of the graphs, the step tables) wherever it does not, e.g. a notebook opened
// without its kernel. Updates of the output (after every step) keep the live view as it is.
import { MimeModel, IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

import { el } from './dom';
import { GraphView } from './graphview';
import { Picture } from './layout';
import { layoutCached } from './layoutclient';
import { Constants, DEFAULTS } from './protocol';

export const SESSION_MIME = 'application/vnd.dcnb.session+json';
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';
// ahead of the widget renderer (-10), so that the output's update does not rebuild the live view
export const RANK = -20;

export class SessionRenderer extends Panel implements IRenderMime.IRenderer {
  private modelId = '';
  private static_: Panel | null = null;
  private live: IRenderMime.IRenderer | null = null;
  private observer: MutationObserver | null = null;
  private pending: { modelId: string; trusted: boolean } | null = null;

  constructor(private readonly rendermime: IRenderMimeRegistry) {
    super();
    this.addClass('dcnb-output');
  }

  // The registry of the notebook this output is in: it holds the widget renderer bound to the notebook's
  // kernel (an output area keeps it as `rendermime`).
  private notebookRegistry(): IRenderMimeRegistry | null {
    for (let w: Widget | null = this.parent; w !== null; w = w.parent) {
      const registry = (w as unknown as { rendermime?: IRenderMimeRegistry }).rendermime;
      if (registry) {
        return registry;
      }
    }
    return null;
  }

  get isLive(): boolean {
    return this.live !== null && this.live.node.querySelector('.dcnb-session') !== null;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[SESSION_MIME] as SavedSession | undefined;
    const modelId = data?.model_id ?? '';
    if (this.isLive && modelId === this.modelId) {
      // the live view already shows what changed; only the saved static rendering moved on
      return;
    }
    this.modelId = modelId;
    this.clear();
    await this.showStatic(model);
    if (modelId) {
      // an output is rendered before it is placed: the notebook's registry is found once it is attached
      this.pending = { modelId, trusted: model.trusted };
      if (this.isAttached) {
        this.startLive();
      }
    }
  }

  protected onAfterAttach(): void {
    this.startLive();
  }

  private startLive(): void {
    const registry = this.notebookRegistry();
    if (this.pending && registry?.mimeTypes.includes(WIDGET_MIME)) {
      const { modelId, trusted } = this.pending;
      this.pending = null;
      this.showLive(registry, modelId, trusted);
    }
  }

  private clear(): void {
    this.observer?.disconnect();
    this.observer = null;
    this.pending = null;
    for (const w of [...this.widgets]) {
      w.dispose();
    }
    this.static_ = null;
    this.live = null;
  }

  private async showStatic(model: IRenderMime.IMimeModel): Promise<void> {
    const html = model.data['text/html'];
    if (html === undefined) {
      return;
    }
    const box = new Panel();
    this.static_ = box;
    this.addWidget(box);
    const saved = model.data[SESSION_MIME] as SavedSession | undefined;
    if (saved?.graphs?.forward) {
      // the pictures, drawn as the live widget draws them (in place of the static SVGs); an output saved before
      // the kernel sent its constants (or some of them) takes Python's defaults for what it lacks
      box.addWidget(new KernelFreeGraphs(saved.graphs, { ...DEFAULTS.constants, ...saved.constants }));
      box.addClass('dcnb-has-graphs');
    }
    // the text/html renderer sanitizes the markup of untrusted notebooks
    const renderer = this.rendermime.createRenderer('text/html');
    renderer.addClass('dcnb-static-output');
    box.addWidget(renderer);
    await renderer.renderModel(new MimeModel({ data: { 'text/html': html }, trusted: model.trusted }));
  }

  // The widget renderer shows the view once the kernel's widget manager has the model; until then (or
  // never, without the kernel) the static rendering stays.
  private showLive(registry: IRenderMimeRegistry, modelId: string, trusted: boolean): void {
    const live = registry.createRenderer(WIDGET_MIME);
    live.hide();
    this.live = live;
    this.addWidget(live);
    const swap = () => {
      if (live.node.querySelector('.dcnb-session')) {
        this.observer?.disconnect();
        this.observer = null;
        this.static_?.hide();
        live.show();
      }
    };
    this.observer = new MutationObserver(swap);
    this.observer.observe(live.node, { childList: true, subtree: true });
    void live
      .renderModel(
        new MimeModel({ data: { [WIDGET_MIME]: { model_id: modelId, version_major: 2, version_minor: 0 } }, trusted })
      )
      .then(swap)
      .catch(() => undefined);
  }

  dispose(): void {
    this.observer?.disconnect();
    super.dispose();
  }
}

// What dcnb's output carries beside its text/html (widget.py's _repr_mimebundle_).
interface SavedSession {
  model_id?: string;
  graphs?: Record<string, Picture | null>;
  constants?: Constants;
}

// Forward / Backward tabs over a graph view: what a reader without the kernel can still explore. Disposed with
// the renderer (a Panel disposes its widgets), which takes the view's window listeners away.
class KernelFreeGraphs extends Widget {
  private readonly view: GraphView;

  constructor(graphs: Record<string, Picture | null>, constants: Constants) {
    super({ node: el('div', 'dcnb-session dcnb-kernel-free') });
    this.view = new GraphView({ onSelect: () => undefined, layout: layoutCached, constants });
    const bar = el('div', 'dcnb-tabs');
    const tabs: HTMLButtonElement[] = [];
    for (const name of ['forward', 'backward']) {
      const graph = graphs[name];
      const tab = el('button', 'dcnb-tab', name === 'forward' ? 'Forward' : 'Backward');
      tab.dataset.tab = name;
      tab.disabled = !graph;
      tab.addEventListener('click', () => {
        tabs.forEach(t => t.classList.toggle('dcnb-active', t === tab));
        this.view.setGraph(graph ?? null, [], true);
      });
      tabs.push(tab);
      bar.appendChild(tab);
    }
    bar.appendChild(el('span', 'dcnb-note', ' the graphs as saved (no kernel: actions need the kernel)'));
    this.node.append(bar, this.view.node);
    tabs[0].click();
  }

  dispose(): void {
    this.view.dispose();
    super.dispose();
  }
}
