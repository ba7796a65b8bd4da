// neuron-workbench JupyterLab plugins: porting dashboard, "compare this cell" command, status bar.
import { ILabShell } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { OutputArea } from '@jupyterlab/outputarea';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import { backendLabel } from './charts';
import {
  GOTO_SITE_EVENT,
  MIME_TYPE,
  NOT_COMPARED,
  UNCOMPARED,
  badgeClass,
  el,
  fallbackCounts,
  firstDivergence,
  worstOutput
} from './report';

const PLUGIN_ID = 'neuron-workbench-lab:plugin';
const COMPARE = 'neuron-workbench:compare-cell';
const DASHBOARD = 'neuron-workbench:open-dashboard';
const MAGIC_RE = /^\s*%%neuron\b/;

export const neuronIcon = new LabIcon({
  name: 'neuron-workbench:compare',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">' +
    '<g class="jp-icon3" fill="#616161"><path d="M4 7h11V4l5 4.5-5 4.5V10H4z"/>' +
    '<path d="M20 17H9v3l-5-4.5L9 11v3h11z" opacity="0.6"/></g></svg>'
});

// Evaluated in the kernel (silently, as a user expression): the configured ref/target, or None
// when the magics are not loaded. Nothing is imported unless %load_ext neuron_workbench ran.
const KERNEL_QUERY =
  "(lambda ip: None if 'NeuronMagics' not in ip.magics_manager.registry else " +
  "(lambda m, r: (lambda t, a, ref: {'ref': ref, 'ref_label': r.get_backend(ref).info().label, " +
  "'target': t, 'emulated': bool(a.emulated), 'available': bool(a)})" +
  "(m.target, r.get_backend(m.target).availability(), m.ref or r.default_reference()))" +
  "(ip.magics_manager.registry['NeuronMagics'], " +
  "__import__('neuron_workbench.backends.registry', fromlist=['get_backend'])))(get_ipython())";
const LOAD_EXT =
  "get_ipython().extension_manager.load_extension('neuron_workbench') " +
  "if 'neuron_workbench' not in get_ipython().extension_manager.loaded else None";

/** The last report among a cell model's outputs, or null. */
export function reportOfCell(cellModel) {
  const outputs = cellModel.outputs;
  if (!outputs) {
    return null;
  }
  let found = null;
  for (let i = 0; i < outputs.length; i++) {
    const output = outputs.get(i);
    const data = output.data || {};
    // `%%neuron --widget` keeps the report in the output's metadata, so the widget is what shows.
    const metadata = output.metadata || {};
    if (data[MIME_TYPE] || metadata[MIME_TYPE]) {
      found = data[MIME_TYPE] || metadata[MIME_TYPE];
    }
  }
  return typeof found === 'string' ? JSON.parse(found) : found;
}

/** Every %%neuron cell of a notebook (or cell with a report): index, report. */
export function neuronCells(notebook) {
  const rows = [];
  const cells = notebook.model ? notebook.model.cells : null;
  if (!cells) {
    return rows;
  }
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') {
      continue;
    }
    const source = cell.sharedModel.getSource();
    let report = null;
    try {
      report = reportOfCell(cell);
    } catch (err) {
      report = null;
    }
    if (report || MAGIC_RE.test(source)) {
      rows.push({ index: i, count: cell.executionCount, report, source });
    }
  }
  return rows;
}

/**
 * "12 cells: 9 PASS, 2 FAIL, 1 ERROR; 7 fallback ops" (+ ", 1 UNCOMPARED" and ", 1 not run" when
 * some are).
 */
export function summaryLine(rows) {
  const n = { PASS: 0, FAIL: 0, ERROR: 0, [UNCOMPARED]: 0 };
  let fallbacks = 0;
  let notRun = 0;
  for (const row of rows) {
    if (!row.report) {
      notRun++;
      continue;
    }
    n[row.report.verdict] = (n[row.report.verdict] || 0) + 1;
    fallbacks += fallbackCounts(row.report).length;
  }
  const cells = `${rows.length} cell${rows.length === 1 ? '' : 's'}`;
  const uncompared = n[UNCOMPARED] ? `, ${n[UNCOMPARED]} ${UNCOMPARED}` : '';
  const parts = `${n.PASS} PASS, ${n.FAIL} FAIL, ${n.ERROR} ERROR${uncompared}${notRun ? `, ${notRun} not run` : ''}`;
  return `${cells}: ${parts}; ${fallbacks} fallback op${fallbacks === 1 ? '' : 's'}`;
}

class Dashboard extends Widget {
  constructor(tracker) {
    super();
    this.id = 'neuron-workbench-dashboard';
    this.title.icon = neuronIcon;
    this.title.caption = 'Porting dashboard (%%neuron cells)';
    this.addClass('nw-lab-dashboard');
    this._tracker = tracker;
    this._timer = 0;
    this._connected = new WeakSet();
    tracker.currentChanged.connect(() => this._watch(), this);
    this._watch();
  }

  _watch() {
    const panel = this._tracker.currentWidget;
    if (panel && !this._connected.has(panel)) {
      this._connected.add(panel);
      panel.content.modelContentChanged.connect(this.schedule, this);
      panel.context.ready.then(() => {
        if (panel.content.model) {
          panel.content.model.contentChanged.connect(this.schedule, this);
          panel.content.model.cells.changed.connect(this.schedule, this);
        }
        this.schedule();
      });
    }
    this.schedule();
  }

  schedule() {
    if (this._timer) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      this.refresh();
    }, 150);
  }

  onAfterShow() {
    this.refresh();
  }

  refresh() {
    const node = this.node;
    node.textContent = '';
    node.appendChild(el('div', 'nw-lab-dash-heading', 'Porting dashboard'));
    const panel = this._tracker.currentWidget;
    if (!panel || !panel.content.model) {
      node.appendChild(el('div', 'nw-lab-dash-empty', 'Open a notebook to see its %%neuron cells.'));
      return;
    }
    const notebook = panel.content;
    const rows = neuronCells(notebook);
    node.appendChild(el('div', 'nw-lab-dash-notebook', panel.context.path));
    node.appendChild(el('div', 'nw-lab-dash-summary', summaryLine(rows)));
    if (!rows.length) {
      node.appendChild(el('div', 'nw-lab-dash-empty', 'No %%neuron cells in this notebook yet. Start a cell with %%neuron, or run the command "Compare this cell on the target" (Alt+Shift+N).'));
      return;
    }
    const list = el('div', 'nw-lab-dash-list');
    for (const row of rows) {
      const r = row.report;
      const verdict = r ? r.verdict : 'not run';
      const item = el('div', 'nw-lab-dash-row');
      item.dataset.cellIndex = String(row.index);
      item.dataset.verdict = verdict;
      item.title = r ? `${r.summary}\n(click to go to the cell)` : 'not run yet (click to go to the cell)';
      const fb = r ? fallbackCounts(r).length : null;
      const head = el('div', 'nw-lab-dash-head', null, [
        el('span', r ? badgeClass(verdict) : 'nw-lab-badge nw-lab-badge-none', verdict),
        el('span', 'nw-lab-dash-cell', `cell ${row.index + 1}${row.count ? ` [${row.count}]` : ''}`),
        r ? el('span', 'nw-lab-dash-title', r.title || '') : null
      ]);
      item.appendChild(head);
      if (r) {
        const skipped = (r.counts && r.counts[NOT_COMPARED]) || 0;
        const n = (r.outputs || []).length - skipped;
        const matched = (r.counts && r.counts.match) || 0;
        item.appendChild(el('div', 'nw-lab-dash-detail', null, [
          el('span', `nw-lab-dash-fallbacks ${fb ? 'nw-lab-warn' : ''}`, `${fb} fallback op${fb === 1 ? '' : 's'}`),
          el('span', 'nw-lab-dash-key', ` · ${matched}/${n} outputs match`),
          skipped ? el('span', 'nw-lab-dash-key nw-lab-warn', ` · ${skipped} not compared`) : null
        ]));
        const worst = worstOutput(r);
        const first = firstDivergence(r);
        if (worst) {
          item.appendChild(el('div', 'nw-lab-dash-detail', null, [
            el('span', 'nw-lab-dash-key', 'worst: '), el('span', 'nw-lab-dash-worst', worst)]));
        }
        if (first) {
          item.appendChild(el('div', 'nw-lab-dash-detail', null, [
            el('span', 'nw-lab-dash-key', 'first divergence: '), el('span', 'nw-lab-dash-first', first)]));
        }
      } else {
        item.appendChild(el('div', 'nw-lab-dash-detail nw-lab-dash-ok', 'not run yet'));
      }
      item.addEventListener('click', () => this._goto(notebook, row.index));
      list.appendChild(item);
    }
    node.appendChild(list);
    if (this.refreshed) {
      this.refreshed();
    }
  }

  _goto(notebook, index) {
    notebook.activeCellIndex = index;
    notebook.mode = 'command';
    const done = () => {
      const cell = notebook.widgets[index];
      if (cell && cell.node.scrollIntoView) {
        cell.node.scrollIntoView({ block: 'start' });
      }
    };
    if (notebook.scrollToItem) {
      notebook.scrollToItem(index, 'start').then(done, done);
    } else {
      done();
    }
    notebook.node.focus();
  }
}

/**
 * Go to a call site of a report (`cell [N], line L`): the notebook cell whose execution count is N,
 * its editor's line L selected. The report's link sends the event; the notebook holding the link is
 * searched first, then the current one.
 */
export async function gotoSite(tracker, event) {
  const detail = (event && event.detail) || {};
  const count = Number(detail.cell);
  const line = Number(detail.line);
  const target = event && event.target;
  const panel = tracker.find(p => target instanceof Node && p.node.contains(target)) || tracker.currentWidget;
  if (!panel || !Number.isFinite(count)) {
    return false;
  }
  const notebook = panel.content;
  const index = notebook.widgets.findIndex(c => c.model.type === 'code' && c.model.executionCount === count);
  if (index < 0) {
    return false;
  }
  notebook.activeCellIndex = index;
  notebook.deselectAll();
  if (notebook.scrollToItem) {
    await notebook.scrollToItem(index, 'center').catch(() => undefined);
  }
  const cell = notebook.widgets[index];
  await cell.ready;
  if (cell.editor && Number.isFinite(line) && line >= 1) {
    const last = Math.max(0, cell.editor.lineCount - 1);
    cell.editor.setCursorPosition({ line: Math.min(line - 1, last), column: 0 });
    notebook.mode = 'edit';
    cell.editor.focus();
    cell.node.scrollIntoView({ block: 'nearest' });
  }
  cell.node.dataset.nwGotoLine = String(line);
  return true;
}

/** Run the active cell through %%neuron; the cell's source stays as the user wrote it. */
async function compareCell(tracker) {
  const panel = tracker.currentWidget;
  if (!panel) {
    return;
  }
  const notebook = panel.content;
  const cell = notebook.activeCell;
  if (!cell || cell.model.type !== 'code') {
    return;
  }
  const ctx = panel.sessionContext;
  await ctx.ready;
  if (!ctx.session || !ctx.session.kernel) {
    try {
      await ctx.startKernel();
    } catch (err) {
      console.warn('neuron-workbench: no kernel to compare the cell in', err);
    }
    if (!ctx.session || !ctx.session.kernel) {
      return;
    }
  }
  const source = cell.model.sharedModel.getSource();
  if (MAGIC_RE.test(source)) {
    return NotebookActions.run(notebook, ctx);
  }
  const kernel = ctx.session.kernel;
  // Load the magics quietly (no output in the cell), then run the wrapped source into the cell.
  await kernel.requestExecute({ code: LOAD_EXT, silent: true, store_history: false }).done;
  cell.outputHidden = false;
  cell.setPrompt('*');
  try {
    const reply = await OutputArea.execute(`%%neuron\n${source}`, cell.outputArea, ctx, {
      neuron_workbench: { compare: true }
    });
    if (reply && reply.content) {
      cell.model.executionCount = reply.content.execution_count;
    }
  } catch (err) {
    cell.setPrompt('');
    throw err;
  }
}

const plugin = {
  id: PLUGIN_ID,
  description: 'neuron-workbench porting dashboard, compare command and status bar',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILabShell, IStatusBar],
  activate: (app, tracker, palette, labShell, statusBar) => {
    // Call-site links of the report renderer (a MIME renderer cannot see the notebook itself).
    document.addEventListener(GOTO_SITE_EVENT, event => {
      void gotoSite(tracker, event);
    });

    const dashboard = new Dashboard(tracker);
    app.shell.add(dashboard, 'right', { rank: 600 });

    app.commands.addCommand(COMPARE, {
      label: 'Compare this cell on the target',
      caption: 'Run the active cell through %%neuron (reference vs target) without editing it',
      icon: args => (args.toolbar ? neuronIcon : undefined),
      isEnabled: () => {
        const cell = tracker.activeCell;
        return !!cell && cell.model.type === 'code';
      },
      execute: () => compareCell(tracker)
    });
    app.commands.addCommand(DASHBOARD, {
      label: 'Show the porting dashboard',
      caption: 'Every %%neuron cell of the notebook with its verdict',
      execute: () => app.shell.activateById(dashboard.id)
    });
    if (palette) {
      palette.addItem({ command: COMPARE, category: 'neuron-workbench' });
      palette.addItem({ command: DASHBOARD, category: 'neuron-workbench' });
    }

    // Refresh the dashboard and status bar when cells finish running.
    NotebookActions.executed.connect(() => {
      dashboard.schedule();
      status.schedule(true);
    });
    dashboard.refreshed = () => status.schedule(false);

    const status = new StatusItem(tracker);
    if (statusBar) {
      statusBar.registerStatusItem('neuron-workbench-lab:status', {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => !!tracker.currentWidget
      });
    }
  }
};

/** How long an unanswered status query may stay pending before it is asked again (ms). */
const KERNEL_QUERY_PATIENCE = 20000;

/** How long the status bar waits for a busy kernel to be idle before it asks anyway (ms). */
const KERNEL_BUSY_PATIENCE = 10000;

/** Queries in a row that may go unanswered before the status bar stops asking (until next time). */
const KERNEL_QUERY_TRIES = 3;

/**
 * Ask the kernel for its ref/target: the answer dict, null when the magics are not loaded, or
 * undefined when no reply came (a lost message, a closed connection, or none within
 * KERNEL_QUERY_PATIENCE).
 *
 * The execute reply is enough: waiting for `future.done` also waits for the request's idle status
 * on iopub, and a status message lost there (a reconnecting websocket, a busy host) would leave
 * the query pending forever and the status bar never asking again.
 */
function askKernel(kernel) {
  return new Promise(resolve => {
    let settled = false;
    const settle = value => {
      if (!settled) {
        settled = true;
        window.clearTimeout(timer);
        resolve(value);
      }
    };
    const timer = window.setTimeout(() => settle(undefined), KERNEL_QUERY_PATIENCE);
    let future;
    try {
      future = kernel.requestExecute({ code: '', silent: true, store_history: false, user_expressions: { nw: KERNEL_QUERY } });
    } catch (err) {
      settle(undefined);
      return;
    }
    const read = reply => {
      try {
        settle(parseKernelAnswer(reply));
      } catch (err) {
        settle(undefined);
      }
    };
    future.onReply = read;
    future.done.then(read, () => settle(undefined));
  });
}

/** The status query's reply as `{ref, ref_label, target, emulated, available, source}` or null. */
function parseKernelAnswer(reply) {
  const value = reply.content.user_expressions && reply.content.user_expressions.nw;
  const text = value && value.status === 'ok' ? value.data['text/plain'] : null;
  if (!text || text === 'None') {
    return null; // not loaded, or the query failed there: the notebook's last report speaks
  }
  // A Python dict repr of names and booleans: make it JSON.
  const answer = JSON.parse(text.replace(/'/g, '"').replace(/\bTrue\b/g, 'true').replace(/\bFalse\b/g, 'false'));
  answer.source = 'kernel';
  return answer;
}

/** `cpu → neuron (emulated)`: asked from the kernel, else read from the notebook's last report. */
class StatusItem extends Widget {
  constructor(tracker) {
    super();
    this.addClass('nw-lab-statusbar');
    this.addClass('jp-StatusBar-TextItem');
    this._tracker = tracker;
    this._timer = 0;
    this._connected = new WeakSet();
    this._cache = new WeakMap();
    tracker.currentChanged.connect(() => {
      this._connect(tracker.currentWidget);
      this.schedule(true);
    }, this);
    tracker.widgetAdded.connect((_, panel) => this._connect(panel), this);
    tracker.forEach(panel => this._connect(panel));
    this.schedule(true);
  }

  _connect(panel) {
    if (!panel || this._connected.has(panel)) {
      return;
    }
    this._connected.add(panel);
    panel.sessionContext.kernelChanged.connect(() => this.schedule(true), this);
    panel.sessionContext.statusChanged.connect((_, status) => {
      if (status === 'restarting' || status === 'autorestarting') {
        this._cache = new WeakMap(); // %load_ext is gone with the old process
        this.schedule(true);
      }
    }, this);
  }

  schedule(ask = false, delay = 300) {
    this._ask = this._ask || ask;
    if (this._timer) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      const askNow = this._ask;
      this._ask = false;
      void this.refresh(askNow);
    }, delay);
  }

  /**
   * Whether the kernel has been busy for KERNEL_BUSY_PATIENCE while an ask waited: it runs a long
   * cell, or the idle status of what it ran was lost (then it would never look idle again). The
   * query is sent anyway and waits in the kernel's queue behind what runs.
   */
  _busyTooLong(kernel) {
    if (kernel.status !== 'busy') {
      this._busySince = 0; // starting or restarting: wait for it
      return false;
    }
    const now = Date.now();
    this._busySince = this._busySince || now;
    return now - this._busySince >= KERNEL_BUSY_PATIENCE;
  }

  async refresh(ask) {
    const panel = this._tracker.currentWidget;
    if (!panel) {
      this.node.textContent = '';
      return;
    }
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const busy = kernel && kernel.status !== 'idle' && kernel.status !== 'dead';
    if (!busy) {
      this._busySince = 0;
    }
    if (ask && busy && !this._busyTooLong(kernel)) {
      // Ask once the kernel is idle (a cell is running, or it is starting).
      this.schedule(true, 1000);
    } else if (ask && kernel && this._asking) {
      // An answer is on its way, but it may predate what made us ask (e.g. %load_ext just ran).
      this._askAgain = true;
    } else if (ask && kernel) {
      this._asking = true;
      this._busySince = 0; // the next wait for idle starts afresh
      try {
        const answer = await askKernel(kernel);
        if (answer === undefined) {
          this._cache.delete(kernel);
          // No reply: ask again once the kernel is idle, a few times.
          this._unanswered = (this._unanswered || 0) + 1;
          this._askAgain = this._askAgain || this._unanswered < KERNEL_QUERY_TRIES;
        } else {
          this._unanswered = 0;
          this._cache.set(kernel, answer);
        }
      } finally {
        this._asking = false;
        if (this._askAgain) {
          this._askAgain = false;
          this.schedule(true, 1000);
        }
      }
    }
    let info = kernel ? this._cache.get(kernel) || null : null;
    if (!info) {
      const rows = panel.content.model ? neuronCells(panel.content).filter(r => r.report) : [];
      const last = rows.length ? rows[rows.length - 1].report : null;
      if (last && last.target && last.ref) {
        info = {
          ref: last.ref.backend.name,
          ref_label: backendLabel(last.ref),
          target: last.target.backend.name,
          emulated: !!last.target.backend.emulated,
          available: true,
          source: 'report'
        };
      }
    }
    if (!info) {
      this.node.textContent = '';
      this.node.title = '';
      return;
    }
    const state = info.emulated ? ' (emulated)' : info.available ? '' : ' (unavailable)';
    // The reference as reports name it: `cpu (as cuda)` when the host CPU stands in for a GPU.
    this.node.textContent = `⇄ ${info.ref_label || info.ref} → ${info.target}${state}`;
    this.node.dataset.source = info.source;
    this.node.title = info.source === 'kernel'
      ? 'neuron-workbench: reference → target of %%neuron in this kernel (%config NeuronMagics.ref/target)'
      : 'neuron-workbench: reference → target of the last report in this notebook (no kernel answer)';
  }
}

export default [plugin];
