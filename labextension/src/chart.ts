// The history chart: dcnb's median per step as bars, torch eager's and torch.compile's as lines.
import { svg } from './dom';
import { StepData } from './format';

export const BASELINES: [string, string][] = [
  ['dcnb', 'dcnb'],
  ['torch', 'torch eager'],
  ['torch_compile', 'torch.compile']
];

export interface Bar {
  index: number;
  x: number;
  width: number;
  height: number;
}

export interface Chart {
  top: number;
  // the value at the bottom of the box: 0 on a linear scale, a little below the smallest median on a log scale
  bottom: number;
  log: boolean;
  bars: Bar[];
  lines: Record<string, { x: number; y: number }[]>;
}

// medians spread wider than this go on a log scale: a slow naive step (153 ms) flattened every later one (0.5 ms)
export const LOG_SPREAD = 20;

// Bars of dcnb's median per ok step, and torch's and torch.compile's medians as lines, scaled to the box.
export function chart(steps: StepData[], width: number, height: number): Chart | null {
  const timed = steps.filter(s => s.ok && s.timings.dcnb);
  if (timed.length === 0) {
    return null;
  }
  const medians = timed.flatMap(s => Object.values(s.timings).map(t => t.median)).filter(m => m > 0);
  const top = Math.max(...medians) * 1.1;
  const log = medians.length > 0 && top / Math.min(...medians) > LOG_SPREAD;
  const bottom = log ? Math.min(...medians) / 3 : 0;
  // the height of a value above the bottom of the box
  const rise = (v: number) =>
    log ? (height * Math.log(Math.max(v, bottom) / bottom)) / Math.log(top / bottom) : (v * height) / top;
  // a bar is never wider than 60px, so one step does not fill the chart
  const slot = Math.min(width / timed.length, 60);
  const lines: Record<string, { x: number; y: number }[]> = {};
  for (const [name] of BASELINES.slice(1)) {
    const points = timed
      .map((s, i) => (s.timings[name] ? { x: (i + 0.5) * slot, y: height - rise(s.timings[name].median) } : null))
      .filter((p): p is { x: number; y: number } => p !== null);
    if (points.length) {
      lines[name] = points;
    }
  }
  return {
    top,
    bottom,
    log,
    bars: timed.map((s, i) => ({
      index: s.index,
      x: i * slot + 2,
      width: Math.max(slot - 4, 1),
      height: rise(s.timings.dcnb.median)
    })),
    lines
  };
}

export function historyChart(steps: StepData[]): SVGSVGElement | null {
  const width = 320;
  const height = 90;
  const c = chart(steps, width, height);
  if (!c) {
    return null;
  }
  const root = svg('svg', { class: 'dcnb-chart', width: width + 40, height: height + 48 });
  const title = svg('text', { x: 0, y: 11 });
  title.textContent = c.log
    ? `median ms per step, log scale (${c.bottom.toPrecision(2)} to ${c.top.toPrecision(3)})`
    : `median ms per step (top ${c.top.toPrecision(3)})`;
  root.appendChild(title);
  let x = 0;
  for (const [key, name] of BASELINES) {
    const legend = svg('text', { x, y: 25, class: `dcnb-legend-${key}` });
    legend.textContent = `■ ${name}`;
    root.appendChild(legend);
    x += name.length * 6 + 24;
  }
  const plot = svg('g', { transform: 'translate(30 32)' });
  for (const b of c.bars) {
    plot.appendChild(svg('rect', { class: 'dcnb-bar', x: b.x, y: height - b.height, width: b.width, height: b.height }));
    const label = svg('text', { x: b.x + b.width / 2, y: height + 12, 'text-anchor': 'middle' });
    label.textContent = String(b.index);
    plot.appendChild(label);
  }
  for (const [name, points] of Object.entries(c.lines)) {
    plot.appendChild(
      svg('polyline', {
        class: `dcnb-line dcnb-line-${name}`,
        points: points.map(p => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(' ')
      })
    );
    for (const p of points) {
      plot.appendChild(svg('circle', { class: `dcnb-dot dcnb-line-${name}`, cx: p.x, cy: p.y, r: 3 }));
    }
  }
  root.appendChild(plot);
  return root;
}
