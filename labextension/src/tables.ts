// The step tables as the kernel formats them (dcnb/_src/record.py, Table): the text, the static HTML and this
// view show the same header and cells, so the view only lays them out.
import { el } from './dom';

export interface RowData {
  cells: string[];
  // false for a failed step, whose row ends in its reason
  ok: boolean;
  // the step the session holds
  current: boolean;
}

export interface TableData {
  // what the table holds ('history', 'timing'), which names its class
  kind: string;
  columns: string[];
  // a row with fewer cells than columns ends in a cell that spans the columns it lacks
  rows: RowData[];
  caption: string;
  // the columns of text, read left-aligned
  left: number[];
  // whether each row's first cell names the row
  row_headers: boolean;
}

// The table, or null where it has no rows (a step that was not timed); `onRow` sees each row as it is made (the
// history's rows are steps the view can show).
export function drawTable(
  data: TableData | null | undefined,
  onRow?: (index: number, row: HTMLTableRowElement) => void
): HTMLTableElement | null {
  if (!data?.rows?.length) {
    return null;
  }
  const table = el('table', `dcnb-table dcnb-${data.kind}`);
  if (data.caption) {
    table.appendChild(el('caption', '', data.caption));
  }
  const head = el('tr');
  data.columns.forEach((text, i) => head.appendChild(cell('th', text, data.left.includes(i))));
  table.appendChild(head);
  data.rows.forEach((r, index) => {
    const row = el('tr', r.ok ? 'dcnb-ok' : 'dcnb-failed');
    row.classList.toggle('dcnb-current', r.current);
    const last = r.cells.length - 1;
    r.cells.forEach((text, i) => {
      const span = i === last ? data.columns.length - last : 1;
      const c = cell(data.row_headers && i === 0 ? 'th' : 'td', text, span > 1 || data.left.includes(i));
      if (span > 1) {
        c.colSpan = span;
      }
      row.appendChild(c);
    });
    onRow?.(index, row);
    table.appendChild(row);
  });
  return table;
}

function cell(tag: 'th' | 'td', text: string, left: boolean): HTMLTableCellElement {
  return el(tag, left ? 'dcnb-left' : '', text);
}
