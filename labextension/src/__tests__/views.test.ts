// The view code that draws into the DOM, on a fake DOM (node's test runner; `npm test`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';

import { FakeElement, installFakeDom } from './fakedom';
import { graph, mapState } from './pictures';
import { Asks, StateReader } from '../asks';
import { GraphView } from '../graphview';
import { countNodes, Picture } from '../layout';
import { overlayChoices } from '../overlay';
import { DEFAULTS, EVENTS, SessionMessage, SessionState } from '../protocol';
import { drawTable, TableData } from '../tables';

const window = installFakeDom();

test('a graph view takes its window listeners away when it goes', () => {
  const before = window.count();
  const view = new GraphView({
    onSelect: () => undefined,
    layout: () => new Promise(() => undefined),
    constants: DEFAULTS.constants
  });
  assert.equal(window.count(), before + 2);
  // a drag that leaves the canvas still pans: the window's listeners follow it
  const [row] = (view.node as unknown as FakeElement).children;
  const [canvas] = row.children;
  const root = canvas.children[0];
  canvas.dispatch('mousedown', { clientX: 0, clientY: 0 });
  window.dispatch('mousemove', { clientX: 10, clientY: 5 });
  assert.match(root.getAttribute('transform') ?? '', /^translate\(10\.0 5\.0\)/);
  window.dispatch('mouseup');
  view.dispose();
  assert.equal(window.count(), before);
});

const history: TableData = {
  kind: 'history',
  columns: ['#', 'step', 'ok', 'dcnb ms', 'vs torch'],
  rows: [
    { cells: ['0', 'naive', 'yes', '2.000', '2.00x'], ok: true, current: false },
    { cells: ['1', 'vectorization', 'no', 'the generated code does not compile'], ok: false, current: false },
    { cells: ['2', 'map_fusion', 'yes', '1.000', '4.00x'], ok: true, current: true }
  ],
  caption: '',
  left: [1],
  row_headers: false
};

const texts = (row: FakeElement) => row.children.map(c => [c.tagName, c.textContent, c.colSpan, c.className]);

test('a table shows the cells the kernel formatted, a failed step its reason across the rest', () => {
  const table = drawTable(history) as unknown as FakeElement;
  assert.equal(table.className, 'dcnb-table dcnb-history');
  const [head, naive, failed, current] = table.children;
  assert.deepEqual(head.children.map(c => c.textContent), history.columns);
  assert.equal(head.children[1].className, 'dcnb-left');
  assert.deepEqual(texts(naive)[1], ['td', 'naive', 1, 'dcnb-left']);
  assert.deepEqual(texts(naive)[4], ['td', '2.00x', 1, '']);
  assert.equal(naive.className, 'dcnb-ok');
  assert.equal(failed.className, 'dcnb-failed');
  assert.deepEqual(texts(failed)[3], ['td', 'the generated code does not compile', 2, 'dcnb-left']);
  assert.ok(current.classList.contains('dcnb-current') && !naive.classList.contains('dcnb-current'));
});

test('a timing table names its rows and has a caption; a table without rows is not drawn', () => {
  const timing: TableData = {
    kind: 'timing',
    columns: ['', 'Min', 'Median'],
    rows: [{ cells: ['torch eager', '1.000', '2.000'], ok: true, current: false }],
    caption: 'ms per forward+backward',
    left: [0],
    row_headers: true
  };
  const table = drawTable(timing) as unknown as FakeElement;
  const [caption, , row] = table.children;
  assert.equal(caption.textContent, 'ms per forward+backward');
  assert.deepEqual(texts(row)[0], ['th', 'torch eager', 1, 'dcnb-left']);
  assert.equal(drawTable({ ...timing, rows: [] }), null);
  assert.equal(drawTable(null), null);
});

test('asked for, the view requests the code and metrics of a large graph shown without them, once per pictures', () => {
  const sent: SessionMessage[] = [];
  const asks = new Asks(message => sent.push(message));
  const large: Picture = { ...graph(Array.from({ length: 30 }, (_, i) => mapState(`s${i}`, 12))), collapse_above: 250 };
  assert.ok(countNodes(large) > 400);
  const state: SessionState = { ...DEFAULTS, graphs: { forward: large, backward: null }, shown: 3 };
  const get: StateReader = key => state[key];
  asks.want(get);
  assert.deepEqual(sent, [{ event: 'inspect', index: 3 }]);
  assert.ok(EVENTS.includes(sent[0].event));
  // the same pictures are not asked about again (a failed inspect is not repeated)
  asks.want(get);
  assert.equal(sent.length, 1);
  // their code and metrics came: nothing to ask; new pictures without them (another step shown) are asked about
  state.graphs = { forward: large };
  state.inspected = true;
  asks.want(get);
  assert.equal(sent.length, 1);
  state.inspected = false;
  state.shown = 4;
  asks.want(get);
  assert.deepEqual(sent[1], { event: 'inspect', index: 4 });
  // no pictures, nothing to ask about
  asks.want(key => ({ ...DEFAULTS, graphs: {} })[key]);
  assert.equal(sent.length, 2);
});

test('the overlay selector offers what the kernel names, in its order, after none', () => {
  assert.deepEqual(overlayChoices(DEFAULTS.constants.overlays), [
    ['', 'none'],
    ['bytes', 'bytes'],
    ['flops', 'FLOPs'],
    ['intensity', 'intensity'],
    ['ms', 'time']
  ]);
  assert.deepEqual(overlayChoices({ ms: 'time' }), [['', 'none'], ['ms', 'time']]);
});
