// Just enough of a DOM for the view code under node: elements that keep their children, attributes and
// listeners, and a window that counts its listeners.

type Listener = (event: unknown) => void;

export class FakeTarget {
  readonly listeners = new Map<string, Set<Listener>>();

  addEventListener(type: string, listener: Listener): void {
    const set = this.listeners.get(type) ?? new Set<Listener>();
    set.add(listener);
    this.listeners.set(type, set);
  }

  removeEventListener(type: string, listener: Listener): void {
    this.listeners.get(type)?.delete(listener);
  }

  dispatch(type: string, event: unknown = {}): void {
    for (const listener of [...(this.listeners.get(type) ?? [])]) {
      listener(event);
    }
  }

  count(): number {
    return [...this.listeners.values()].reduce((n, set) => n + set.size, 0);
  }
}

export class FakeElement extends FakeTarget {
  readonly children: FakeElement[] = [];
  readonly attributes = new Map<string, string>();
  readonly dataset: Record<string, string> = {};
  readonly style: Record<string, string> = {};
  className = '';
  textContent = '';
  title = '';
  colSpan = 1;
  // the size the layout gave it (0 until a test gives it one: a canvas not attached yet)
  clientWidth = 0;
  clientHeight = 0;

  constructor(readonly tagName: string) {
    super();
  }

  // laid out at the page's top left corner; as a browser does, the box is moved and scaled by a CSS transform
  // (only `translate(Xpx, Ypx) scale(K)` about the top left corner, what the graph view sets)
  getBoundingClientRect() {
    const m = /translate\(([-\d.]+)px, ([-\d.]+)px\) scale\(([-\d.]+)\)/.exec(this.style.transform ?? '');
    const [x, y, k] = m ? [Number(m[1]), Number(m[2]), Number(m[3])] : [0, 0, 1];
    const [width, height] = [this.clientWidth * k, this.clientHeight * k];
    return { left: x, top: y, right: x + width, bottom: y + height, width, height };
  }

  get classList() {
    const names = () => new Set(this.className.split(' ').filter(Boolean));
    return {
      contains: (name: string) => names().has(name),
      toggle: (name: string, force?: boolean) => {
        const set = names();
        if (force ?? !set.has(name)) {
          set.add(name);
        } else {
          set.delete(name);
        }
        this.className = [...set].join(' ');
      }
    };
  }

  setAttribute(name: string, value: string): void {
    if (name === 'class') {
      this.className = value; // as the DOM's class attribute and className are one
    } else {
      this.attributes.set(name, value);
    }
  }

  getAttribute(name: string): string | null {
    return this.attributes.get(name) ?? null;
  }

  appendChild(child: FakeElement): FakeElement {
    this.children.push(child);
    return child;
  }

  append(...children: FakeElement[]): void {
    this.children.push(...children);
  }

  replaceChildren(...children: FakeElement[]): void {
    this.children.splice(0, this.children.length, ...children);
  }
}

// The ResizeObservers made, each with the elements it watches: a test resizes an element and tells them.
export const observers: { callback: () => void; targets: FakeElement[] }[] = [];

class FakeResizeObserver {
  private readonly entry: { callback: () => void; targets: FakeElement[] };

  constructor(callback: () => void) {
    this.entry = { callback, targets: [] };
    observers.push(this.entry);
  }

  observe(target: FakeElement): void {
    this.entry.targets.push(target);
  }

  disconnect(): void {
    this.entry.targets.splice(0);
  }
}

// Give an element a size, as the browser does once it is attached, and tell whoever observes it.
export function resize(target: FakeElement, width: number, height: number): void {
  target.clientWidth = width;
  target.clientHeight = height;
  for (const o of observers) {
    if (o.targets.includes(target)) {
      o.callback();
    }
  }
}

// Installs `window`, `document` and `ResizeObserver` for the code under test; returns the window.
export function installFakeDom(): FakeTarget {
  const window = new FakeTarget();
  const document = {
    createElement: (tag: string) => new FakeElement(tag),
    createElementNS: (_ns: string, tag: string) => new FakeElement(tag),
    createTextNode: (text: string) => Object.assign(new FakeElement('#text'), { textContent: text })
  };
  Object.assign(globalThis, { window, document, ResizeObserver: FakeResizeObserver });
  return window;
}
