// The graph view on a fake DOM: nested SDFGs drawn in place, names, fitting, a step's marks, overlays, focus;
// and the code panel (node's test runner; `npm test`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';

import { FakeElement, installFakeDom, resize } from './fakedom';
import { fixture, graph, mapState, nestedPicture, node } from './pictures';
import { CodeView, LINE_HEIGHT } from '../codeview';
import { GraphView, ZOOM_REST_MS } from '../graphview';
import { layoutGraph, NodeData, Picture, StateData } from '../layout';
import { Constants, DEFAULTS } from '../protocol';

installFakeDom();

interface Parts {
  view: GraphView;
  canvas: FakeElement;
  root: FakeElement;
  details: FakeElement;
  legend: FakeElement;
  removed: FakeElement;
  selections: string[][];
}

function makeView(constants: Constants = DEFAULTS.constants, missing?: (overlay: string) => string | null): Parts {
  const selections: string[][] = [];
  const view = new GraphView({
    onSelect: labels => selections.push(labels),
    layout: (g, collapsed, seed) => Promise.resolve(layoutGraph(g, collapsed, seed)),
    constants,
    missing
  });
  const [row, removed] = (view.node as unknown as FakeElement).children;
  const [canvas, , legend, details] = row.children;
  return { view, canvas, root: canvas.children[0], details, legend, removed, selections };
}

const settle = () => new Promise(resolve => setImmediate(resolve));

function all(e: FakeElement, found: FakeElement[] = []): FakeElement[] {
  for (const c of e.children) {
    found.push(c);
    all(c, found);
  }
  return found;
}

// the drawn nodes by id (open nested SDFGs' boxes included)
function drawn(root: FakeElement): Map<string, FakeElement> {
  return new Map(all(root).filter(e => e.dataset.id).map(e => [e.dataset.id, e]));
}

function transform(root: FakeElement): { x: number; y: number; scale: number } {
  const m = /translate\(([-\d.]+) ([-\d.]+)\) scale\(([-\d.]+)\)/.exec(root.getAttribute('transform') ?? '');
  assert.ok(m, 'the view has a transform');
  return { x: Number(m[1]), y: Number(m[2]), scale: Number(m[3]) };
}

// Whether a placed node is inside the canvas under the view's transform.
function visible(parts: Parts, picture: Picture, id: string, collapsed = new Set<string>()): boolean {
  const n = layoutGraph(picture, collapsed).nodes.find(p => p.id === id)!;
  const { x, y, scale } = transform(parts.root);
  const left = x + n.x * scale;
  const top = y + n.y * scale;
  return left >= 0 && top >= 0 && left + n.width * scale <= parts.canvas.clientWidth && top + n.height * scale <= parts.canvas.clientHeight;
}

test('a nested SDFG is drawn in place: its box with [−] behind its states, its nodes inside, names drawn', async () => {
  const parts = makeView();
  resize(parts.canvas, 900, 500);
  const picture = nestedPicture(1);
  picture.states[0].nodes[0].name = 'input x';
  parts.view.setGraph(picture, [], true);
  await settle();
  const shapes = drawn(parts.root);
  const box = shapes.get('s0n1')!;
  assert.ok(box.classList.contains('dcnb-open') && box.classList.contains('dcnb-nested'));
  assert.equal(box.dataset.name, 'layer norm');
  const texts = all(box).map(e => e.textContent);
  assert.ok(texts.includes('layer norm') && texts.includes('−'));
  for (const id of ['s0n1.x', 's0n1.m0', 's0n1.t', 's0n1.m0x', 's0n1.y']) {
    assert.ok(shapes.has(id), id);
  }
  // the box comes before (is drawn behind) the nested SDFG's state, which comes before its nodes
  const order = parts.root.children;
  const state = order.findIndex(e => e.className === 'dcnb-state' && all(e).some(t => t.textContent === 'state'));
  assert.ok(order.indexOf(box) < state && state < order.indexOf(shapes.get('s0n1.t')!));
  // the readable name is drawn, the label kept for selections
  const x = shapes.get('s0n0')!;
  assert.equal(x.dataset.label, 's0n0');
  assert.equal(x.dataset.name, 'input x');
  assert.ok(all(x).some(e => e.textContent === 'input x'));
  // its [−] collapses it into one node
  const toggle = all(box).find(e => e.className === 'dcnb-toggle')!;
  toggle.dispatch('click', { stopPropagation: () => undefined });
  await settle();
  const closed = drawn(parts.root);
  assert.deepEqual([...closed.keys()].sort(), ['s0n0', 's0n1', 's0n2']);
  assert.ok(all(closed.get('s0n1')!).some(e => e.textContent === 'layer norm (5 inside)'));
  parts.view.dispose();
});

test('a click on a node shows everything in its info, and selects it by its label', async () => {
  const parts = makeView();
  const picture = nestedPicture(1);
  const t = picture.states[0].nodes[1].sdfg!.states[0].nodes.find(n => n.kind === 'tasklet')!;
  Object.assign(t, { label: '_Mult_', name: 'x * w', info: { 'DaCe name': '_Mult_', code: 'out = a * b' } });
  parts.view.setGraph(picture, [], true);
  await settle();
  drawn(parts.root).get('s0n1.t')!.dispatch('click', { shiftKey: false });
  assert.deepEqual(parts.selections, [['_Mult_']]);
  const text = all(parts.details).map(e => e.textContent);
  assert.ok(text.includes('x * w') && text.includes('DaCe name') && text.includes('_Mult_') && text.includes('out = a * b'));
  assert.ok(drawn(parts.root).get('s0n1.t')!.classList.contains('dcnb-selected'));
  // the selection line names it as the graph does; a label not in the picture stays as it is
  assert.equal(parts.view.nameOf('_Mult_'), 'x * w');
  assert.equal(parts.view.nameOf('elsewhere'), 'elsewhere');
  parts.view.dispose();
});

// a first node above a wide rank: dagre centres it, far right of the picture's left edge
function widePicture(): Picture {
  const nodes: NodeData[] = [node('top', 'access', null)];
  const edges: StateData['edges'] = [];
  for (let i = 0; i < 60; i++) {
    nodes.push(node(`t${i}`, 'tasklet', null, `task_${i}`));
    edges.push({ src: 'top', dst: `t${i}`, label: '' });
  }
  return { ...graph([{ id: 's0', label: 'call_213_0', nodes, edges }]), collapse_above: 250 };
}

test('a picture too large to show whole opens on its first node, not on an empty corner', async () => {
  const parts = makeView();
  resize(parts.canvas, 900, 500);
  const picture = widePicture();
  parts.view.setGraph(picture, [], true);
  await settle();
  assert.equal(transform(parts.root).scale, 0.75);
  assert.ok(visible(parts, picture, 'top'));
  parts.view.dispose();
});

test('a picture shown while the canvas has no size yet is fitted once it has one', async () => {
  const parts = makeView();
  const picture = widePicture();
  parts.view.setGraph(picture, [], true);
  await settle();
  // not attached: no size to fit to, so no fit yet (a fit to a guessed size would put the graph off screen)
  assert.equal(parts.root.getAttribute('transform'), null);
  resize(parts.canvas, 900, 500);
  assert.ok(visible(parts, picture, 'top'));
  parts.view.dispose();
});

test("another step's picture keeps the view where it shows a node, and is fitted where it would show none", async () => {
  const parts = makeView();
  resize(parts.canvas, 900, 500);
  const picture = widePicture();
  parts.view.setGraph(picture, [], true);
  await settle();
  const before = parts.root.getAttribute('transform');
  parts.view.setGraph({ ...picture, states: [{ ...picture.states[0], nodes: [...picture.states[0].nodes] }] }, [], false);
  await settle();
  assert.equal(parts.root.getAttribute('transform'), before);
  // a small picture far from where the view looks: fitted
  const small: Picture = { ...graph([mapState('', 1)]), collapse_above: 250 };
  parts.view.setGraph(small, [], false);
  await settle();
  assert.ok(visible(parts, small, 't'));
  parts.view.dispose();
});

test("a step's marks: added and changed nodes, changes inside a collapsed scope, the removed nodes' line", async () => {
  const parts = makeView();
  const picture = nestedPicture(2);
  const inner = picture.states[0].nodes[1].sdfg!.states[0].nodes;
  inner.find(n => n.id === 's0n1.t')!.change = 'changed';
  picture.states[0].nodes[2].change = 'added';
  picture.removed = [
    { state: 's0', name: 'tmp', kind: 'access' },
    { state: 's0n1.s', name: 'exp', kind: 'tasklet' },
    { state: null, name: 'copy', kind: 'map_entry' }
  ];
  parts.view.setGraph(picture, [], true);
  await settle();
  let shapes = drawn(parts.root);
  assert.ok(shapes.get('s0n2')!.classList.contains('dcnb-added'));
  assert.ok(shapes.get('s0n1.t')!.classList.contains('dcnb-changed'));
  assert.ok(!shapes.get('s0n0')!.classList.contains('dcnb-added'));
  assert.equal(parts.removed.textContent, 'removed: tmp (access, in outer), exp (tasklet, in state), copy (map entry)');
  assert.equal(parts.removed.style.display, 'block');
  parts.view.collapseAll(true);
  await settle();
  shapes = drawn(parts.root);
  assert.ok(shapes.get('s0n1')!.classList.contains('dcnb-changed-inside'));
  parts.view.setGraph(nestedPicture(2), [], false);
  assert.equal(parts.removed.style.display, 'none');
  parts.view.dispose();
  // as many removed nodes as the kernel says the line names
  const fewer = makeView({ ...DEFAULTS.constants, removed_shown: 2 });
  fewer.view.setGraph(picture, [], true);
  assert.equal(fewer.removed.textContent, 'removed: tmp (access, in outer), exp (tasklet, in state), and 1 more');
  fewer.view.dispose();
});

test('an overlay colours the nodes that carry the metric, on a log scale with a legend', async () => {
  const parts = makeView();
  const picture = nestedPicture(1);
  const inner = picture.states[0].nodes[1].sdfg!.states[0];
  inner.nodes.find(n => n.id === 's0n1.t')!.metrics = { bytes: 4096, ms: 0.5 };
  inner.nodes.find(n => n.id === 's0n1.m0')!.metrics = { bytes: 64 };
  inner.edges[0].bytes = 2048;
  parts.view.setGraph(picture, [], true);
  await settle();
  assert.equal(parts.legend.style.display, 'none');
  parts.view.setOverlay('bytes');
  const shapes = drawn(parts.root);
  const t = shapes.get('s0n1.t')!;
  assert.ok(t.classList.contains('dcnb-heat'));
  assert.equal(t.getAttribute('style'), '--dcnb-heat: rgb(189, 0, 38)');
  assert.ok(all(t).some(e => e.tagName === 'title' && e.textContent.includes('bytes: 4.10 kB')));
  assert.equal(shapes.get('s0n1.m0')!.getAttribute('style'), '--dcnb-heat: rgb(255, 255, 178)');
  assert.ok(!shapes.get('s0n0')!.classList.contains('dcnb-heat'));
  assert.equal(parts.legend.style.display, 'flex');
  assert.ok(parts.legend.children[0].textContent.includes('64 B') && parts.legend.children[2].textContent === '4.10 kB');
  const ramp = DEFAULTS.constants.heat_colours.join(', ');
  assert.equal(parts.legend.children[1].getAttribute('style'), `background: linear-gradient(to right, ${ramp})`);
  // the memlet's width and label follow its bytes
  const labels = all(parts.root).filter(e => e.tagName === 'text').map(e => e.textContent);
  assert.ok(labels.includes('x[0:4] (2.05 kB)'), labels.join('|'));
  parts.view.setOverlay(null);
  assert.ok(!drawn(parts.root).get('s0n1.t')!.classList.contains('dcnb-heat'));
  parts.view.dispose();
});

test('an overlay no node carries says why in the legend, as the owner tells, until the values come', async () => {
  let why: string | null = 'worked out when asked: working them out now…';
  const parts = makeView(DEFAULTS.constants, overlay => (overlay === 'flops' ? why : null));
  const picture = nestedPicture(1);
  parts.view.setGraph(picture, [], true);
  await settle();
  parts.view.setOverlay('flops');
  assert.equal(parts.legend.style.display, 'flex');
  assert.equal(parts.legend.textContent, why);
  assert.ok(parts.legend.classList.contains('dcnb-legend-missing'));
  // the values came: the legend is the scale again
  picture.states[0].nodes[1].sdfg!.states[0].nodes.find(n => n.id === 's0n1.t')!.metrics = { flops: 10 };
  why = null;
  parts.view.setGraph({ ...picture }, [], false);
  await settle();
  assert.ok(!parts.legend.classList.contains('dcnb-legend-missing'));
  assert.equal(parts.legend.children[2].textContent, '10 FLOP');
  parts.view.dispose();
});

test('a drag that starts on a node pans the view and selects nothing; a click selects', async () => {
  const parts = makeView();
  const picture = nestedPicture(1);
  resize(parts.canvas, 800, 480);
  parts.view.setGraph(picture, [], true);
  await settle();
  const before = transform(parts.root);
  const t = drawn(parts.root).get('s0n1.t')!;
  parts.canvas.dispatch('mousedown', { clientX: 10, clientY: 10 });
  (globalThis as any).window.dispatch('mousemove', { clientX: 70, clientY: 40 });
  (globalThis as any).window.dispatch('mouseup', {});
  t.dispatch('click', { shiftKey: false });
  const after = transform(parts.root);
  assert.deepEqual([after.x - before.x, after.y - before.y], [60, 30]);
  assert.deepEqual(parts.selections, []);
  parts.canvas.dispatch('mousedown', { clientX: 70, clientY: 40 });
  (globalThis as any).window.dispatch('mouseup', {});
  t.dispatch('click', { shiftKey: false });
  assert.deepEqual(parts.selections, [['s0n1.t']]);
  parts.view.dispose();
});

test('focus on a guid expands what holds the node, selects it and centres it', async () => {
  const parts = makeView();
  resize(parts.canvas, 900, 500);
  const picture = nestedPicture(2);
  picture.states[0].nodes[1].sdfg!.states[0].nodes.find(n => n.id === 's0n1.t')!.guid = 'g-t';
  parts.view.setGraph(picture, [], true);
  parts.view.collapseAll(true);
  await settle();
  assert.ok(!drawn(parts.root).has('s0n1.t'));
  assert.equal(parts.view.focus('nowhere'), false);
  assert.equal(parts.view.focus('g-t'), true);
  await settle();
  assert.ok(drawn(parts.root).get('s0n1.t')!.classList.contains('dcnb-selected'));
  assert.deepEqual(parts.selections.at(-1), ['s0n1.t']);
  assert.ok(visible(parts, picture, 's0n1.t'));
  parts.view.dispose();
});

test('focus right after another step is shown wins over bringing the step\'s changes into view', async () => {
  const parts = makeView();
  resize(parts.canvas, 160, 90);
  const picture = nestedPicture(2);
  picture.states[0].nodes[0].change = 'added';
  picture.states[0].nodes[1].sdfg!.states[0].nodes.find(n => n.id === 's0n1.t')!.guid = 'g-t';
  parts.view.setGraph(picture, [], true, true);
  assert.equal(parts.view.focus('g-t'), true);
  await settle();
  resize(parts.canvas, 160, 90);
  assert.ok(visible(parts, picture, 's0n1.t'));
  assert.ok(!visible(parts, picture, 's0n0'));
  parts.view.dispose();
});

test("hovering a place highlights its nodes, or the collapsed scope that hides them", async () => {
  const parts = makeView();
  parts.view.setGraph(nestedPicture(2), [], true);
  await settle();
  parts.view.highlight({ labels: ['s0n1.t', 's0n0'] });
  let shapes = drawn(parts.root);
  assert.ok(shapes.get('s0n1.t')!.classList.contains('dcnb-highlight'));
  assert.ok(shapes.get('s0n0')!.classList.contains('dcnb-highlight'));
  assert.ok(!shapes.get('s0n2')!.classList.contains('dcnb-highlight'));
  parts.view.toggle('s0n1.m0');
  await settle();
  shapes = drawn(parts.root);
  assert.ok(shapes.get('s0n1.m0')!.classList.contains('dcnb-highlight'));
  parts.view.highlight(null);
  assert.ok(!drawn(parts.root).get('s0n1.m0')!.classList.contains('dcnb-highlight'));
  parts.view.dispose();
});

test('a place named by guids marks its own node, not the others of the same label', async () => {
  const parts = makeView();
  // two states of one map each: two tasklets labelled `_Add_`, told apart only by their guids
  const states = [mapState('a', 1), mapState('b', 1)];
  states.forEach((s, i) => {
    const t = s.nodes.find(n => n.kind === 'tasklet')!;
    t.label = '_Add_';
    t.guid = `guid-${i}`;
  });
  const picture: Picture = { ...graph(states), collapse_above: 250 };
  parts.view.setGraph(picture, [], true);
  await settle();
  const lit = () => all(parts.root).filter(e => e.dataset.id && e.classList.contains('dcnb-highlight')).map(e => e.dataset.id);
  parts.view.highlight({ labels: ['_Add_'], guids: ['guid-1'] });
  assert.deepEqual(lit(), ['bt']);
  assert.equal(drawn(parts.root).get('bt')!.dataset.guid, 'guid-1');
  // a kernel that sends no guids: the label names both
  parts.view.highlight({ labels: ['_Add_'] });
  assert.deepEqual(lit().sort(), ['at', 'bt']);
  // a place whose guid the picture lacks marks nothing rather than falling back to its labels
  parts.view.highlight({ labels: ['_Add_'], guids: ['elsewhere'] });
  assert.deepEqual(lit(), []);
  parts.view.dispose();
});

test('the prenorm block after auto_optimize: its nested SDFGs open, the first node in view, the marks', async () => {
  const parts = makeView();
  resize(parts.canvas, 1000, 500);
  const { forward, backward } = fixture('prenorm_auto_optimize.json');
  for (const picture of [forward, backward]) {
    parts.view.setGraph(picture, [], true);
    await settle();
    const shapes = [...drawn(parts.root).values()];
    // what sits in nested SDFGs is drawn (before, the state showed one closed box)
    assert.ok(shapes.some(g => g.classList.contains('dcnb-open')));
    assert.ok(shapes.filter(g => g.dataset.id.includes('.')).length > 10);
    const first = layoutGraph(picture, new Set()).nodes.reduce((a, n) => (n.y < a.y ? n : a));
    assert.ok(visible(parts, picture, first.id), first.id);
    assert.ok(shapes.some(g => g.classList.contains('dcnb-added')) && shapes.some(g => g.classList.contains('dcnb-changed')));
    assert.match(parts.removed.textContent, /^removed: /);
  }
  // the forward's removed library nodes and the backward's readable names
  parts.view.setGraph(forward, [], true);
  assert.match(parts.removed.textContent, /^removed: fc · Transpose \(library\), norm · LayerNormalization \(library\)/);
  parts.view.setGraph(backward, [], true);
  await settle();
  const output = [...drawn(parts.root).values()].find(g => g.dataset.label === 'gradient___return')!;
  assert.equal(output.dataset.name, '∇output');
  parts.view.dispose();
});

test('the code panel shows the whole source as text, the node lines marked and scrolled to, and a download', () => {
  const code = new CodeView();
  const root = code.node as unknown as FakeElement;
  assert.equal(root.style.display, 'none');
  const text = Array.from({ length: 100 }, (_, i) => `line ${i + 1} <b>${i}</b>\n`).join('');
  code.show({ language: 'cpp', text, nodes: {} }, [40, 42], 'x * w', 'evil.forward.cpp');
  const [head, body] = root.children;
  const [title, , link] = head.children;
  const [mark, numbers, pre] = body.children;
  assert.equal(root.style.display, 'flex');
  assert.equal(title.textContent, 'x * w: lines 40–42 of the generated C++ code');
  assert.equal(pre.textContent, text);
  assert.equal(numbers.textContent.split('\n').length, 100);
  assert.equal(mark.style.top, `${39 * LINE_HEIGHT}px`);
  assert.equal(mark.style.height, `${3 * LINE_HEIGHT}px`);
  assert.equal((body as unknown as { scrollTop: number }).scrollTop, 36 * LINE_HEIGHT);
  assert.equal((link as unknown as { download: string }).download, 'evil.forward.cpp');
  assert.match((link as unknown as { href: string }).href, /^blob:/);
  code.hide();
  assert.equal(root.style.display, 'none');
  code.dispose();
});

test('a wheel zoom scales the painted canvas at once and draws the SVG at the new scale once the wheel rests', async () => {
  const parts = makeView();
  resize(parts.canvas, 900, 500);
  parts.view.setGraph(nestedPicture(2), [], true);
  await settle();
  const before = transform(parts.root);
  const wheel = { clientX: 450, clientY: 250, deltaY: -200, preventDefault: () => undefined };
  parts.canvas.dispatch('wheel', wheel);
  parts.canvas.dispatch('wheel', wheel);
  assert.deepEqual(transform(parts.root), before);
  const m = /translate\(([-\d.]+)px, ([-\d.]+)px\) scale\(([-\d.]+)\)/.exec(parts.canvas.style.transform);
  assert.ok(m, `the canvas is scaled: ${parts.canvas.style.transform}`);
  const zoom = Math.exp(2 * 200 * 0.0015);
  assert.ok(Math.abs(Number(m[3]) - zoom) < 1e-3);
  await new Promise(resolve => setTimeout(resolve, ZOOM_REST_MS + 50));
  const after = transform(parts.root);
  assert.equal(parts.canvas.style.transform, '');
  assert.ok(Math.abs(after.scale - before.scale * zoom) < 1e-3 * after.scale);
  // the point under the pointer stays where it was: what the preview showed is what is drawn
  const under = (v: { x: number; y: number; scale: number }) => [(450 - v.x) / v.scale, (250 - v.y) / v.scale];
  under(after).forEach((c, i) => assert.ok(Math.abs(c - under(before)[i]) < 0.5));
  assert.ok(Math.abs(Number(m[1]) - (after.x - before.x * zoom)) < 0.5);
  parts.view.dispose();
});
