// Layouts already made, by picture and collapsed scopes: a tab shown again, or one laid out ahead while the other
// was shown, draws at once (dagre takes a second or more on a ResNet-18's backward). Pictures are told apart by
// object: the kernel sends new ones with every step, and an old picture's layouts go with it. Pure code, tested
// under node.
import { GraphData, Layout, Seed } from './layout';

export type LayoutFn = (graph: GraphData, collapsed: Set<string>, seed?: Seed) => Promise<Layout>;

export class LayoutCache {
  private readonly made = new WeakMap<GraphData, Map<string, Promise<Layout>>>();
  // seeds told apart by object, as pictures are
  private readonly seeds = new WeakMap<Seed, number>();

  // `perPicture`: the layouts kept of one picture (each collapse or expand makes another), the oldest used first
  // to go
  constructor(
    private readonly layout: LayoutFn,
    private readonly perPicture = 6
  ) {}

  // (a seeded layout is another layout of the picture)
  get(graph: GraphData, collapsed: Set<string>, seed?: Seed): Promise<Layout> {
    const key = [...collapsed].sort().join('\n') + (seed ? `\nseed ${this.seedId(seed)}` : '');
    let layouts = this.made.get(graph);
    if (!layouts) {
      layouts = new Map();
      this.made.set(graph, layouts);
    }
    const known = layouts.get(key);
    if (known) {
      // (a Map iterates in insertion order: the one used now goes last)
      layouts.delete(key);
      layouts.set(key, known);
      return known;
    }
    const made = this.layout(graph, collapsed, seed);
    layouts.set(key, made);
    // a layout that failed is made again next time
    made.catch(() => layouts.get(key) === made && layouts.delete(key));
    if (layouts.size > this.perPicture) {
      layouts.delete(layouts.keys().next().value!);
    }
    return made;
  }

  private seedId(seed: Seed): number {
    let id = this.seeds.get(seed);
    if (id === undefined) {
      id = ++seedsMade;
      this.seeds.set(seed, id);
    }
    return id;
  }
}

let seedsMade = 0;
