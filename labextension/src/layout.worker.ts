// Lays out large pictures off the main thread, so that the notebook stays responsive meanwhile.
import { GraphData, layoutGraph, Seed } from './layout';

interface Request {
  id: number;
  graph: GraphData;
  collapsed: string[];
  seed?: Seed;
}

const scope = self as unknown as {
  onmessage: ((e: MessageEvent<Request>) => void) | null;
  postMessage: (message: unknown) => void;
};

scope.onmessage = (e: MessageEvent<Request>) => {
  const { id, graph, collapsed, seed } = e.data;
  scope.postMessage({ id, layout: layoutGraph(graph, new Set(collapsed), seed) });
};
