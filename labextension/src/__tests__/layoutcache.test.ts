// The layout cache: a picture shown again with the same scopes collapsed is not laid out again (node's test runner;
// `npm test`).
import { test } from 'node:test';
import * as assert from 'node:assert/strict';

import { nestedPicture } from './pictures';
import { GraphData, Layout, layoutGraph } from '../layout';
import { LayoutCache } from '../layoutcache';

function counted(): { cache: LayoutCache; made: string[][] } {
  const made: string[][] = [];
  const cache = new LayoutCache((g: GraphData, collapsed: Set<string>) => {
    made.push([...collapsed]);
    return Promise.resolve(layoutGraph(g, collapsed));
  }, 2);
  return { cache, made };
}

test('the same picture with the same scopes collapsed is laid out once, in whatever order they are named', async () => {
  const { cache, made } = counted();
  const picture = nestedPicture(2);
  const first = await cache.get(picture, new Set(['s0n1', 's0n1.m0']));
  const again = await cache.get(picture, new Set(['s0n1.m0', 's0n1']));
  assert.equal(again, first);
  assert.equal(made.length, 1);
  const expanded = await cache.get(picture, new Set());
  assert.notEqual(expanded, first);
  assert.equal(made.length, 2);
});

test('another picture (the next step sends new ones) is laid out anew, even where it looks the same', async () => {
  const { cache, made } = counted();
  await cache.get(nestedPicture(2), new Set());
  await cache.get(nestedPicture(2), new Set());
  assert.equal(made.length, 2);
});

test('a picture keeps its layouts used last; the oldest used goes first', async () => {
  const { cache, made } = counted();
  const picture = nestedPicture(2);
  const [a, b, c] = [new Set<string>(), new Set(['s0n1']), new Set(['s0n1.m0'])];
  await cache.get(picture, a);
  await cache.get(picture, b);
  await cache.get(picture, a); // a is now used later than b
  await cache.get(picture, c); // three: b goes
  assert.equal(made.length, 3);
  await cache.get(picture, a);
  assert.equal(made.length, 3);
  await cache.get(picture, b);
  assert.equal(made.length, 4);
});

test('a layout that failed is made again next time', async () => {
  let calls = 0;
  const cache = new LayoutCache((g: GraphData, collapsed: Set<string>): Promise<Layout> => {
    calls++;
    return calls === 1 ? Promise.reject(new Error('worker gone')) : Promise.resolve(layoutGraph(g, collapsed));
  });
  const picture = nestedPicture(1);
  await assert.rejects(cache.get(picture, new Set()));
  const layout = await cache.get(picture, new Set());
  assert.ok(layout.nodes.length > 0);
  assert.equal(calls, 2);
});
