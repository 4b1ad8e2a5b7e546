// The history chart: dcnb's median per step as bars, torch eager's and torch.compile's as lines; and a search's
// candidates, time against intermediate memory.
import { svg } from './dom';
import { SearchPoint, StepData } from './format';
import { metricText } from './overlay';

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

// Where each candidate of a search goes in a box of this size: intermediate bytes across (from 0), time up (from 0),
// the front's points joined left to right.
export function searchPlot(points: SearchPoint[], width: number, height: number) {
  const most = { time: Math.max(...points.map(p => p.time), 1e-9) * 1.1, bytes: Math.max(...points.map(p => p.bytes), 1) * 1.1 };
  const placed = points.map(p => ({ ...p, x: (p.bytes / most.bytes) * width, y: height - (p.time / most.time) * height }));
  const front = placed.filter(p => p.front).sort((a, b) => a.x - b.x || b.y - a.y);
  return { most, placed, front };
}

export function searchChart(points: SearchPoint[]): SVGSVGElement | null {
  if (!points.length) {
    return null;
  }
  const width = 320;
  const height = 120;
  const { most, placed, front } = searchPlot(points, width, height);
  const unit = points[0].unit;
  const time = unit === 'ms' ? "dcnb's ms" : "dcnb's time / eager's";
  const root = svg('svg', { class: 'dcnb-chart dcnb-search-chart', width: width + 60, height: height + 60 });
  const title = svg('text', { x: 0, y: 11 });
  title.textContent = `${time} ↑ against intermediate memory →`;
  root.appendChild(title);
  const plot = svg('g', { transform: 'translate(44 22)' });
  plot.appendChild(svg('rect', { class: 'dcnb-plot-box', x: 0, y: 0, width, height }));
  // the scale: the top's time, the right edge's bytes, 0 at the bottom left
  for (const [x, y, anchor, text] of [
    [-4, 8, 'end', unit === 'ms' ? most.time.toPrecision(2) : `${most.time.toPrecision(2)}x`],
    [-4, height, 'end', '0'],
    [width, height + 12, 'end', metricText('bytes', Math.round(most.bytes))]
  ] as [number, number, string, string][]) {
    const tick = svg('text', { x, y, 'text-anchor': anchor, class: 'dcnb-tick' });
    tick.textContent = text;
    plot.appendChild(tick);
  }
  if (front.length > 1) {
    const line = front.map(p => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(' ');
    plot.appendChild(svg('polyline', { class: 'dcnb-front', points: line }));
  }
  for (const p of placed) {
    const dot = svg('circle', {
      class: `dcnb-candidate${p.front ? ' dcnb-on-front' : ''}${p.best ? ' dcnb-best' : ''}`,
      cx: p.x,
      cy: p.y,
      r: p.best ? 5 : 3.5
    });
    dot.dataset.index = String(p.index);
    const tip = svg('title');
    tip.textContent = `#${p.index} ${p.title}: ${p.time.toPrecision(3)} ${unit}, ${metricText('bytes', p.bytes)} stored`;
    dot.appendChild(tip);
    plot.appendChild(dot);
    const label = svg('text', { x: p.x + 6, y: p.y - 4, class: 'dcnb-candidate-label' });
    label.textContent = `#${p.index}`;
    plot.appendChild(label);
  }
  const axis = svg('text', { x: 0, y: height + 28 });
  axis.textContent = 'violet: the front (none faster and smaller); pink: the best';
  plot.appendChild(axis);
  root.appendChild(plot);
  return root;
}
