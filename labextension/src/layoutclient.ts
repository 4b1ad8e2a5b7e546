// Laying out pictures without blocking the notebook: large ones in a worker (layout.worker.ts), small ones here,
// where a worker would cost more than it saves.
import { countNodes, defaultCollapsed, GraphData, Layout, layoutGraph, Picture, Seed } from './layout';
import { LayoutCache } from './layoutcache';

// above this many nodes the layout runs in a worker (dagre takes about a second per thousand nodes)
export const WORKER_ABOVE = 400;

let worker: Worker | null | undefined;
let requests = 0;

// The layout worker, or null where none can start (the layout then runs here).
function layoutWorker(): Worker | null {
  if (worker === undefined) {
    try {
      worker = new Worker(new URL('./layout.worker.js', import.meta.url));
    } catch {
      worker = null;
    }
  }
  return worker;
}

// Lay out a picture: in the worker when it is large, here when it is small or the worker fails.
export function layoutAsync(graph: GraphData, collapsed: Set<string>, seed?: Seed): Promise<Layout> {
  const w = countNodes(graph) > WORKER_ABOVE ? layoutWorker() : null;
  if (!w) {
    return Promise.resolve(layoutGraph(graph, collapsed, seed));
  }
  const id = ++requests;
  const laidOut = new Promise<Layout>((resolve, reject) => {
    const onMessage = (e: MessageEvent<{ id: number; layout: Layout }>) => {
      if (e.data.id === id) {
        done();
        resolve(e.data.layout);
      }
    };
    const onError = (e: ErrorEvent) => {
      done();
      reject(e);
    };
    // the worker outlives every request: each takes its listeners away when it is answered
    const done = () => {
      w.removeEventListener('message', onMessage);
      w.removeEventListener('error', onError);
    };
    w.addEventListener('message', onMessage);
    w.addEventListener('error', onError);
    w.postMessage({ id, graph, collapsed: [...collapsed], seed });
  });
  return laidOut.catch(() => layoutGraph(graph, collapsed, seed));
}

const cache = new LayoutCache(layoutAsync);

// Lay out a picture, or find the layout made of it before with the same scopes collapsed (and the same seed).
export function layoutCached(graph: GraphData, collapsed: Set<string>, seed?: Seed): Promise<Layout> {
  return cache.get(graph, collapsed, seed);
}

// Lay out a large picture as it opens, in the worker, before it is shown (the backward while the forward is): a
// small one is laid out quickly enough when it is shown, and here it would hold up the notebook.
export function layoutAhead(picture: Picture): void {
  if (countNodes(picture) > WORKER_ABOVE && layoutWorker()) {
    void layoutCached(picture, defaultCollapsed(picture));
  }
}
