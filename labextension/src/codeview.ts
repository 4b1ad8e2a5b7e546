// The generated code of a side, scrolled to the lines of the node clicked in the graph, those lines marked; and a
// link to download the whole source. The code is text: numbers and lines in two <pre>s, the mark a box behind
// them, so that a source of tens of thousands of lines costs a handful of elements.
import { el } from './dom';
import { SourceData } from './format';

// the height of a line of code as the style sets it (.dcnb-code pre), where it cannot be measured
export const LINE_HEIGHT = 16;

export class CodeView {
  readonly node: HTMLDivElement;
  private readonly title: HTMLSpanElement;
  private readonly download: HTMLAnchorElement;
  private readonly body: HTMLDivElement;
  private readonly mark: HTMLDivElement;
  private readonly numbers: HTMLPreElement;
  private readonly text: HTMLPreElement;
  private source: SourceData | null = null;
  private lines = 0;
  private url: string | null = null;

  constructor() {
    this.node = el('div', 'dcnb-code');
    const head = el('div', 'dcnb-code-head');
    this.title = el('span', 'dcnb-code-title');
    this.download = el('a', 'dcnb-download', 'Download source');
    const close = el('button', 'dcnb-small', '×');
    close.title = 'hide the code';
    close.addEventListener('click', () => this.hide());
    head.append(this.title, el('span', 'dcnb-spacer'), this.download, close);
    this.body = el('div', 'dcnb-code-body');
    this.mark = el('div', 'dcnb-code-mark');
    this.numbers = el('pre', 'dcnb-code-numbers');
    this.text = el('pre', 'dcnb-code-text');
    this.body.append(this.mark, this.numbers, this.text);
    this.node.append(head, this.body);
    this.hide();
  }

  // Show lines `range` of `source` (what `title` names), the whole source a download named `filename`.
  show(source: SourceData, range: [number, number], title: string, filename: string): void {
    if (source !== this.source) {
      this.source = source;
      this.text.textContent = source.text;
      // a last newline ends the last line: a <pre> draws no line after it
      this.lines = source.text.replace(/\n$/, '').split('\n').length;
      this.numbers.textContent = Array.from({ length: this.lines }, (_, i) => String(i + 1)).join('\n');
      if (this.url) {
        URL.revokeObjectURL(this.url);
      }
      this.url = URL.createObjectURL(new Blob([source.text], { type: 'text/plain' }));
      this.download.href = this.url;
    }
    this.download.download = filename;
    const [first, last] = range;
    const language = source.language === 'cuda' ? 'CUDA' : 'C++';
    this.title.textContent = `${title}: lines ${first}–${last} of the generated ${language} code`;
    this.node.style.display = 'flex';
    const line = this.lineHeight();
    this.mark.style.top = `${(first - 1) * line}px`;
    this.mark.style.height = `${(last - first + 1) * line}px`;
    // a few lines of context above the node's code
    this.body.scrollTop = Math.max(0, (first - 4) * line);
  }

  // A line's height as drawn (the page's styles may change what ours set), once the panel is shown: the text's
  // height over its lines (the body's style keeps the text as high as its lines, not stretched to the body).
  private lineHeight(): number {
    const height = this.text.offsetHeight / this.lines;
    return height > 0 ? height : LINE_HEIGHT;
  }

  // Say why there is no code to show yet (or none at all) in the panel's place.
  tell(title: string, why: string): void {
    this.source = null;
    this.text.textContent = why;
    this.lines = 1;
    this.numbers.textContent = '';
    this.mark.style.height = '0';
    this.download.removeAttribute('href');
    this.title.textContent = title;
    this.node.style.display = 'flex';
  }

  hide(): void {
    this.node.style.display = 'none';
  }

  dispose(): void {
    if (this.url) {
      URL.revokeObjectURL(this.url);
      this.url = null;
    }
  }
}
