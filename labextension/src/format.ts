// Numbers and rows for the step tables and the history chart. Pure code, tested under node.

export interface Timing {
  min: number;
  mean: number;
  median: number;
  stdev: number;
  max: number;
  runs: number;
}

export interface StepData {
  index: number;
  name: string;
  title: string;
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
}

export interface ActionData {
  name: string;
  description: string;
  before_autodiff: boolean;
  phase: string;
  matches: number;
}

export const BASELINES: [string, string][] = [
  ['dcnb', 'dcnb'],
  ['torch', 'torch eager'],
  ['torch_compile', 'torch.compile']
];

const MIB = 1 << 20;

export function num(value: number | null | undefined, digits = 3): string {
  return value === null || value === undefined ? '' : value.toFixed(digits);
}

export function sci(value: number | null | undefined): string {
  return value === null || value === undefined ? '' : value.toExponential(2);
}

export function mib(bytes: number | null | undefined): string {
  return bytes === null || bytes === undefined ? '' : (bytes / MIB).toFixed(2);
}

// Median of a baseline over dcnb's: above 1, dcnb is faster.
export function speedup(step: StepData, baseline = 'torch'): number | null {
  const d = step.timings.dcnb;
  const b = step.timings[baseline];
  return d && b && d.median > 0 ? b.median / d.median : null;
}

export const HISTORY_HEADER = [
  '#',
  'step',
  'ok',
  'max abs err',
  'interm. MiB',
  'compile s',
  'dcnb ms',
  'torch ms',
  'torch.compile ms',
  'vs torch'
];

// One row of the history table, as text cells (a failed step puts its reason in the fourth cell).
export function historyRow(step: StepData): string[] {
  if (!step.ok) {
    return [String(step.index), step.title, 'no', step.error ?? ''];
  }
  const ratio = speedup(step);
  return [
    String(step.index),
    step.title,
    'yes',
    sci(step.max_abs_error),
    mib(step.intermediate_bytes),
    num(step.compile_seconds, 1),
    num(step.timings.dcnb?.median),
    num(step.timings.torch?.median),
    num(step.timings.torch_compile?.median),
    ratio === null ? '' : `${ratio.toFixed(2)}x`
  ];
}

// The one-line summary of a step: allclose, memory, compile time.
export function stepSummary(step: StepData): string {
  if (!step.ok) {
    return `step ${step.index}: ${step.title} failed: ${step.error ?? ''}`;
  }
  const parts = [`step ${step.index}: ${step.title}`];
  if (step.max_abs_error !== null) {
    parts.push(`allclose: yes (max abs error ${sci(step.max_abs_error)})`);
  }
  if (step.intermediate_bytes !== null) {
    parts.push(`intermediate memory: ${mib(step.intermediate_bytes)} MiB`);
  }
  if (step.compile_seconds !== null) {
    parts.push(`compile: ${num(step.compile_seconds, 1)} s${step.compile_seconds === 0 ? ' (cached)' : ''}`);
  }
  return parts.join(' · ');
}

export interface Bar {
  index: number;
  x: number;
  width: number;
  height: number;
}

export interface Chart {
  top: number;
  bars: Bar[];
  lines: Record<string, { x: number; y: number }[]>;
}

// Bars of dcnb's median per ok step, and torch's and torch.compile's medians as lines, scaled to the box.
export function chart(steps: StepData[], width: number, height: number): Chart | null {
  const timed = steps.filter(s => s.ok && s.timings.dcnb);
  if (timed.length === 0) {
    return null;
  }
  const top = Math.max(...timed.flatMap(s => Object.values(s.timings).map(t => t.median))) * 1.1;
  // a bar is never wider than 60px, so one step does not fill the chart
  const slot = Math.min(width / timed.length, 60);
  const scale = height / top;
  const lines: Record<string, { x: number; y: number }[]> = {};
  for (const [name] of BASELINES.slice(1)) {
    const points = timed
      .map((s, i) => (s.timings[name] ? { x: (i + 0.5) * slot, y: height - s.timings[name].median * scale } : null))
      .filter((p): p is { x: number; y: number } => p !== null);
    if (points.length) {
      lines[name] = points;
    }
  }
  return {
    top,
    bars: timed.map((s, i) => ({
      index: s.index,
      x: i * slot + 2,
      width: Math.max(slot - 4, 1),
      height: s.timings.dcnb.median * scale
    })),
    lines
  };
}
