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
  colSpan = 1;

  constructor(readonly tagName: string) {
    super();
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
    this.attributes.set(name, value);
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

// Installs `window` and `document` for the code under test; returns the window.
export function installFakeDom(): FakeTarget {
  const window = new FakeTarget();
  const document = {
    createElement: (tag: string) => new FakeElement(tag),
    createElementNS: (_ns: string, tag: string) => new FakeElement(tag)
  };
  Object.assign(globalThis, { window, document });
  return window;
}
