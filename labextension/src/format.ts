// What the session widget's traits hold (dcnb/_src/views/widget.py; protocol.ts, generated from it, names which
// trait holds which), and how the view writes a share and a duration. Pure code, tested under node.
import { Picture } from './layout';
import { TableData } from './tables';

export interface Timing {
  min: number;
  mean: number;
  median: number;
  stdev: number;
  max: number;
  runs: number;
}

// The CUDA build a CPU step also makes in the background (dcnb/_src/cuda_check.py): it changes as it goes on.
export interface CudaData {
  state: 'pending' | 'ok' | 'failed' | 'skipped' | 'cancelled';
  arch: string;
  seconds: number | null;
  reason: string | null;
  log: string | null;
  // one line, as the text and the static HTML show it
  text: string;
}

export interface StepData {
  index: number;
  name: string;
  title: string;
  // the step in one line, as the kernel words it (Step.summary)
  summary: string;
  ok: boolean;
  error: string | null;
  applied: number;
  max_abs_error: number | null;
  intermediate_bytes: number | null;
  compile_seconds: number | null;
  timings: Record<string, Timing>;
  notes: string[];
  // the compiler's output, when the step's code did not compile
  log?: string | null;
  // its timing table, as the kernel formats it
  timing: TableData;
  cuda?: CudaData | null;
}

export interface ActionData {
  name: string;
  description: string;
  before_autodiff: boolean;
  phase: string;
  matches: number;
}

export type Tab = 'forward' | 'backward';

// `graphs`: the pictures of the shown step
export type Graphs = Partial<Record<Tab, Picture | null>>;

// `before`: the pictures of the step the shown one was made from ({} where there is none).
export interface BeforeData {
  forward?: Picture | null;
  backward?: Picture | null;
  step?: number;
}

// One side's generated code (`sources`): its text and each node's lines in it (by guid; 1-based, inclusive).
export interface SourceData {
  language: 'cpp' | 'cuda';
  text: string;
  nodes: Record<string, [number, number]>;
}

// `sources`: each side's generated code ({} where it was not read)
export type Sources = Partial<Record<Tab, SourceData | null>>;

// `profile`: the instrumented build's top kernels, beside PyTorch eager's top ops ({} before a profile).
// A candidate of the last search as its plot draws it (search.py, SearchResult.points).
export interface SearchPoint {
  index: number;
  title: string;
  // dcnb's time over eager's, or dcnb's ms where eager was not timed (`unit`)
  time: number;
  unit: string;
  bytes: number;
  // on the front between time and memory: no other candidate as fast with as little stored
  front: boolean;
  best: boolean;
}

// The last search (widget.py's `search`): its candidates' table, their points, the best against the start.
export interface SearchData {
  table?: TableData;
  points?: SearchPoint[];
  summary?: string;
}

export interface ProfileData {
  step?: number;
  rows?: { guid: string; name: string; side: Tab; ms: number; share: number }[];
  eager?: { name: string; ms: number; share: number }[];
}

// One place an action matches (`matches`, by action name): the labels `where` takes, their readable names.
export interface MatchData {
  side: Tab;
  labels: string[];
  names: string[];
  // the guids of the place's nodes (the pictures' `guid`): two nodes of one label are two places
  guids?: string[];
}

// A share of the total time (a fraction) as a percentage.
export function percent(share: number): string {
  return `${(100 * share).toFixed(1)}%`;
}

// Seconds elapsed, as the progress line counts them.
export function elapsed(since: number, now: number): string {
  const s = Math.max(0, Math.floor((now - since) / 1000));
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${s % 60} s`;
}
