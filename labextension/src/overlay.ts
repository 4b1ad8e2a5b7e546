// The overlays: a node metric (the kernel's estimate or the profile's time) as a heat colour on a log scale, between
// the colours the kernel sends (`constants.heat_colours`, those of the static rendering). Pure code, tested under
// node.
import { Metrics } from './layout';

export type Overlay = keyof Metrics;

// The selector's choices, in the kernel's order with the kernel's names (`constants.overlays`, those of the static
// rendering); '' shows no overlay.
export function overlayChoices(names: Record<string, string>): [Overlay | '', string][] {
  return [['', 'none'], ...(Object.entries(names) as [Overlay, string][])];
}

export interface Heat {
  min: number;
  max: number;
}

// The range of the positive values (metrics of 0 or unknown ones are not coloured), or null where there is none.
export function heatScale(values: (number | undefined)[]): Heat | null {
  const positive = values.filter((v): v is number => v !== undefined && Number.isFinite(v) && v > 0);
  if (!positive.length) {
    return null;
  }
  return { min: Math.min(...positive), max: Math.max(...positive) };
}

// Where a value sits on the scale, from 0 (its minimum) to 1 (its maximum), logarithmically: the metrics of one
// SDFG span orders of magnitude.
export function heatPosition(heat: Heat, value: number): number {
  if (heat.max <= heat.min) {
    return 1;
  }
  const t = (Math.log(value) - Math.log(heat.min)) / (Math.log(heat.max) - Math.log(heat.min));
  return Math.min(1, Math.max(0, t));
}

// The colour of a value: between the two of `colours` (low to high, evenly spaced) its position falls between.
export function heatColour(heat: Heat, value: number, colours: string[]): string {
  const t = heatPosition(heat, value) * (colours.length - 1);
  const i = Math.min(Math.floor(t), colours.length - 2);
  const [a, b] = [rgb(colours[i]), rgb(colours[i + 1])];
  const mix = a.map((c, k) => Math.round(c + (b[k] - c) * (t - i)));
  return `rgb(${mix.join(', ')})`;
}

function rgb(hex: string): number[] {
  return [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
}

const UNITS: Record<Overlay, string> = { bytes: 'B', flops: 'FLOP', intensity: 'FLOP/byte', ms: 'ms' };
const PREFIXES = ['', 'k', 'M', 'G', 'T', 'P'];

// A metric as a tooltip or the legend shows it: bytes and FLOPs with SI prefixes, 3 significant digits.
export function metricText(overlay: Overlay, value: number): string {
  if (overlay === 'bytes' || overlay === 'flops') {
    let i = 0;
    while (Math.abs(value) >= 1000 && i < PREFIXES.length - 1) {
      value /= 1000;
      i++;
    }
    return `${i ? value.toPrecision(3) : value.toString()} ${PREFIXES[i]}${UNITS[overlay]}`;
  }
  return `${value.toPrecision(3)} ${UNITS[overlay]}`;
}
