// DOM rendering of a %%neuron report dict (application/vnd.neuron-workbench.report+json), with
// Plotly charts (src/charts.js, drawn by drawCharts once plotly.js has loaded).
// Everything comes from the saved output: no kernel, no widget state, no network.
import {
  CHARTS, PLOT_CONFIG, backendLabel, budgetRows, callSites, compileRows, fallbackRows,
  measurementRows
} from './charts';

export const MIME_TYPE = 'application/vnd.neuron-workbench.report+json';
/** An output's status when it could not be compared: neither a match nor a failure. */
export const NOT_COMPARED = 'not-compared';
/** The verdict of a report that compared nothing (never a pass). */
export const UNCOMPARED = 'UNCOMPARED';
/** Every verdict a report can have (report.schema.json). */
export const VERDICTS = ['PASS', 'FAIL', 'ERROR', UNCOMPARED];

/** Classes of a verdict badge; UNCOMPARED (and anything unknown) looks neutral. */
export function badgeClass(verdict) {
  const known = verdict === 'PASS' || verdict === 'FAIL' || verdict === 'ERROR';
  return `nw-lab-badge nw-lab-badge-${verdict}${known ? '' : ' nw-lab-badge-none'}`;
}

/**
 * Whether an output fails the verdict: under --judge budget its R's judgment (budget_judged,
 * 'within' or 'beyond') where measured, else compared and not matching (report/display.py's
 * output_fails).
 */
export function isFailing(output) {
  if (output.budget_judged) {
    return output.budget_judged === 'beyond';
  }
  return !!output.status && output.status !== 'match' && output.status !== NOT_COMPARED;
}

/** Create an element with a class, text and children. */
export function el(tag, cls, text, children) {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  for (const child of children || []) {
    if (child) {
      node.appendChild(child);
    }
  }
  return node;
}

/** A number in the compact style of the Python report (1.0e+00, 0.5, 12). */
export function fmt(value) {
  if (value === null || value === undefined) {
    return '–';
  }
  if (typeof value === 'string') {
    return value;
  }
  if (typeof value === 'boolean') {
    return value ? 'true' : 'false';
  }
  if (typeof value !== 'number') {
    return String(value);
  }
  if (!isFinite(value)) {
    return String(value);
  }
  if (value === 0) {
    return '0';
  }
  if (Number.isInteger(value) && Math.abs(value) < 1e6) {
    return String(value);
  }
  const abs = Math.abs(value);
  if (abs >= 1e-3 && abs < 1e4) {
    return String(Number(value.toPrecision(4)));
  }
  return value.toExponential(1).replace(/e([+-])(\d)$/, 'e$10$2');
}

/** A number as the Python summary line writes errors: 1.0e+00. */
export function fmtSci(value) {
  if (typeof value !== 'number' || !isFinite(value)) {
    return fmt(value);
  }
  return value.toExponential(1).replace(/e([+-])(\d)$/, 'e$10$2');
}

/** A duration in seconds as µs/ms/s. */
export function fmtTime(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '–';
  }
  if (seconds < 1e-3) {
    return `${(seconds * 1e6).toFixed(1)} µs`;
  }
  if (seconds < 1) {
    return `${(seconds * 1e3).toFixed(2)} ms`;
  }
  return `${seconds.toFixed(2)} s`;
}


/** The failing outputs, worst (largest max relative error, then max |Δ|) first. */
export function failingOutputs(report) {
  const outs = (report.outputs || []).filter(isFailing);
  const key = o => {
    const r = typeof o.max_rel === 'number' && isFinite(o.max_rel) ? o.max_rel : Infinity;
    const a = typeof o.max_abs === 'number' && isFinite(o.max_abs) ? o.max_abs : Infinity;
    return [r, a];
  };
  return outs.sort((x, y) => {
    const [rx, ax] = key(x);
    const [ry, ay] = key(y);
    return ry - rx || ay - ax;
  });
}

/** The worst output as a short string, e.g. "delta max|Δ| 1.0e+00", or '' when all match. */
export function worstOutput(report) {
  const worst = failingOutputs(report)[0];
  if (!worst) {
    return '';
  }
  if (worst.status === 'differ' && worst.max_abs !== null && worst.max_abs !== undefined) {
    return `${worst.path} max|Δ| ${fmtSci(worst.max_abs)}`;
  }
  return `${worst.path} (${worst.status}${worst.detail ? ': ' + worst.detail : ''})`;
}

/** Where outputs first diverged: the module (with --layers), else the first failing output. */
export function firstDivergence(report) {
  const first = report.first_divergence;
  if (first && typeof first === 'object') {
    const name = first.module || first.path || first.label || '';
    if (name) {
      const call = first.call ? `#${first.call}` : '';
      const type = first.module_type ? ` (${first.module_type})` : '';
      return `${name}${call}${type}`;
    }
  }
  if (report.verdict === 'ERROR') {
    const err = (report.target && report.target.error) || (report.ref && report.ref.error);
    if (err) {
      return err.lineno ? `cell line ${err.lineno}` : err.type || '';
    }
  }
  const firstFail = (report.outputs || []).find(isFailing);
  return firstFail ? `output ${firstFail.path}` : '';
}

/** Fallback ops with their total call count on the target, most calls first. */
export function fallbackCounts(report) {
  return fallbackRows(report).map(row => [row.op, row.count]);
}

/** The event a call-site link sends up the DOM; the lab plugin scrolls the notebook there. */
export const GOTO_SITE_EVENT = 'neuron-workbench:goto-site';

/** List the call sites of `op` in `pane` (cell sites are links to the cell line). */
export function showCallSites(pane, report, op) {
  pane.textContent = '';
  pane.dataset.op = op;
  const sites = callSites(report, op);
  pane.appendChild(el('div', 'nw-lab-sites-title', null, [
    el('span', null, 'Call sites of '), el('code', null, op)
  ]));
  if (!sites.length) {
    pane.appendChild(el('div', 'nw-lab-note', 'No user source line recorded (called from library code).'));
    return;
  }
  const list = el('ul', 'nw-lab-sites');
  for (const s of sites) {
    const item = el('li', 'nw-lab-site');
    let where;
    if (s.cell !== null && s.line !== null) {
      where = el('a', 'nw-lab-site-link', s.label);
      where.href = '#';
      where.title = 'Go to this line of the notebook';
      where.dataset.cell = String(s.cell);
      where.dataset.line = String(s.line);
      where.addEventListener('click', event => {
        event.preventDefault();
        where.dispatchEvent(new CustomEvent(GOTO_SITE_EVENT, {
          bubbles: true, detail: { cell: s.cell, line: s.line }
        }));
      });
    } else {
      where = el('code', 'nw-lab-site-file', s.label);
    }
    item.appendChild(where);
    if (s.function && s.function !== '<module>') {
      item.appendChild(el('span', null, ` in ${s.function}`));
    }
    if (s.module) {
      item.appendChild(el('span', 'nw-lab-site-module', ` — module ${s.module}${s.moduleType ? ' (' + s.moduleType + ')' : ''}`));
    }
    const how = [s.phase, s.role === 'ref' ? 'reference' : '', s.source === 'fallback' ? '' : s.source].filter(Boolean);
    if (how.length) {
      item.appendChild(el('span', 'nw-lab-note', ` (${how.join(', ')})`));
    }
    list.appendChild(item);
  }
  pane.appendChild(list);
}

function plotDiv(key, cls) {
  const div = el('div', `nw-lab-plot ${cls || ''}`);
  div.dataset.chart = key;
  return div;
}

function sitesPane(cls) {
  return el('div', `nw-lab-sites-pane ${cls}`, null, [
    el('div', 'nw-lab-note', 'Click a bar to list the lines that call the op.')
  ]);
}

/** The layout in JupyterLab's theme colours (text, grid), so dark themes read too. */
function themed(layout) {
  // The theme's variables live on the document (a report may draw before it is attached).
  const style = window.getComputedStyle(document.body);
  const fg = style.getPropertyValue('--jp-ui-font-color1').trim();
  const grid = style.getPropertyValue('--jp-border-color2').trim();
  const out = { ...layout };
  if (fg) {
    out.font = { ...(layout.font || {}), color: fg };
  }
  if (grid) {
    for (const key of Object.keys(out)) {
      if (/^[xy]axis\d*$/.test(key) && out[key]) {
        out[key] = { ...out[key], gridcolor: grid };
      }
    }
  }
  return out;
}

/**
 * Draw every chart placeholder of a rendered report whose section is open; closed sections draw
 * when first opened. Clicking a bar of the fallback or op-time chart lists the op's call sites.
 */
export async function drawCharts(root, report, Plotly) {
  const draw = async div => {
    if (div.dataset.drawn) {
      return;
    }
    div.dataset.drawn = 'pending';
    const fig = CHARTS[div.dataset.chart](report);
    if (!fig) {
      div.remove();
      return;
    }
    await Plotly.newPlot(div, fig.data, themed(fig.layout), PLOT_CONFIG);
    div.dataset.drawn = 'yes';
    const pane = div.parentElement && div.parentElement.querySelector('.nw-lab-sites-pane');
    if (pane && typeof div.on === 'function') {
      div.on('plotly_click', event => {
        const point = event && event.points && event.points[0];
        if (point) {
          showCallSites(pane, report, String(point.y));
        }
      });
    }
  };
  const pending = [];
  for (const div of root.querySelectorAll('.nw-lab-plot')) {
    const details = div.closest('details');
    if (!details || details.open) {
      pending.push(draw(div));
    } else {
      details.addEventListener('toggle', () => {
        if (details.open) {
          void draw(div);
        }
      });
    }
  }
  await Promise.all(pending);
  root.dataset.charts = 'drawn';
}

/** Resize every drawn chart to its container (after the output area is shown or resized). */
export function resizeCharts(root, Plotly) {
  for (const div of root.querySelectorAll('.nw-lab-plot[data-drawn="yes"]')) {
    if (div.offsetWidth > 0) {
      Plotly.Plots.resize(div);
    }
  }
}

function section(title, children) {
  return el('details', 'nw-lab-section', null, [el('summary', null, title), ...children]);
}

function outputsTable(report) {
  const table = el('table', 'nw-lab-table nw-lab-outputs');
  const head = el('tr');
  for (const h of ['output', 'status', 'dtype', 'shape', 'max |Δ|', 'max rel', 'mismatched', 'worst (ref → target)']) {
    head.appendChild(el('th', null, h));
  }
  table.appendChild(el('thead', null, null, [head]));
  const body = el('tbody');
  for (const o of report.outputs || []) {
    const row = el('tr', `nw-lab-row-${o.status}`);
    row.appendChild(el('td', 'nw-lab-path', o.path));
    // under --judge budget, R's judgment where it overrules the tolerance's status
    const overruled = o.budget_judged && isFailing(o) !== (o.status !== 'match' && o.status !== NOT_COMPARED);
    const statusText = overruled ? `${o.budget_judged} budget (tolerance: ${o.status})` : o.status;
    const statusClass = overruled ? (isFailing(o) ? 'differ' : 'match') : o.status;
    row.appendChild(el('td', null, null, [el('span', `nw-lab-status nw-lab-status-${statusClass}`, statusText)]));
    const dtype = o.ref_dtype === o.target_dtype ? o.ref_dtype : `${o.ref_dtype} / ${o.target_dtype}`;
    row.appendChild(el('td', null, dtype || o.kind || ''));
    const shape = s => (Array.isArray(s) ? `[${s.join(', ')}]` : '');
    row.appendChild(el('td', null, shape(o.ref_shape)));
    row.appendChild(el('td', 'nw-lab-num', fmt(o.max_abs)));
    row.appendChild(el('td', 'nw-lab-num', fmt(o.max_rel)));
    const mism = o.numel ? `${o.mismatched ?? 0} / ${o.numel}` : fmt(o.mismatched);
    row.appendChild(el('td', 'nw-lab-num', mism));
    let worst = '';
    if (o.worst_ref !== null && o.worst_ref !== undefined) {
      const at = Array.isArray(o.worst_index) ? ` at [${o.worst_index.join(', ')}]` : '';
      worst = `${fmt(o.worst_ref)} → ${fmt(o.worst_target)}${at}`;
    } else if (o.detail) {
      worst = o.detail;
    }
    row.appendChild(el('td', null, worst));
    body.appendChild(row);
    for (const hint of o.hints || []) {
      const hintRow = el('tr', 'nw-lab-hintrow');
      const td = el('td', 'nw-lab-hint', `hint: ${hint}`);
      td.colSpan = 8;
      hintRow.appendChild(td);
      body.appendChild(hintRow);
    }
  }
  table.appendChild(body);
  return table;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

function simpleTable(cls, headers, rows) {
  const head = el('tr', null, null, headers.map(h => el('th', null, h)));
  const body = rows.map(cells => el('tr', null, null, cells.map(([text, c]) => el('td', c || null, text))));
  return el('table', `nw-lab-table ${cls}`, null, [el('thead', null, null, [head]), el('tbody', null, null, body)]);
}

/** The torch.compile section of compileRows(report): starts closed (it is long on a real model). */
export function compileSection(compiled) {
  const ms = (value, kind) => (value === null ? '–' : `${value.toFixed(1)} ms (${kind})`);
  const children = [simpleTable('nw-lab-compile', [
    'backend', 'compiler', 'graphs', 'graph breaks', 'recompiles', 'compile time', 'compiled graphs ran', 'run time', 'ops not compiled'
  ], compiled.map(r => [
    [r.label], [r.compilers.join(', ') || '—'], [r.graphs.length, 'nw-lab-num'], [r.breaks.length, 'nw-lab-num'],
    [r.recompiles.length, 'nw-lab-num'], [ms(r.compileMs, r.kind), 'nw-lab-num'], [ms(r.graphsRunMs, r.kind), 'nw-lab-num'],
    [ms(r.runMs, r.kind), 'nw-lab-num'],
    [r.notCompiled.join(', ') || 'none', r.notCompiled.length ? 'nw-lab-bad' : null]
  ]))];
  children.push(plotDiv('compile', 'nw-lab-compile-chart'));
  const graphs = compiled.flatMap(r => r.graphs.map(g => [
    [r.label], [g.index, 'nw-lab-num'], [g.backend], [g.function, 'nw-lab-path'], [g.where, 'nw-lab-path'],
    [g.ops ?? '', 'nw-lab-num'], [ms(g.compileMs, r.kind), 'nw-lab-num'], [g.calls ?? '–', 'nw-lab-num'],
    [ms(g.runMs, r.kind), 'nw-lab-num'], [g.recompile],
    [g.notCompiled.join(', '), g.notCompiled.length ? 'nw-lab-bad' : null]
  ]));
  if (graphs.length) {
    children.push(el('div', 'nw-lab-subtitle', 'Graphs'));
    children.push(simpleTable('nw-lab-compile-graphs', [
      'backend', '#', 'compiler', 'function', 'where', 'ops', 'compile time', 'calls', 'run time', 'recompiled because', 'ops not compiled'
    ], graphs));
  }
  const breaks = compiled.flatMap(r => r.breaks.map(b => [[r.label], [b.where, 'nw-lab-path'], [b.reason]]));
  if (breaks.length) {
    children.push(el('div', 'nw-lab-subtitle', 'Graph breaks'));
    children.push(simpleTable('nw-lab-compile-breaks', ['backend', 'where', 'reason'], breaks));
  }
  const recompiles = compiled.flatMap(r => r.recompiles.map(c => [[r.label], [c.function, 'nw-lab-path'], [c.reason]]));
  if (recompiles.length) {
    children.push(el('div', 'nw-lab-subtitle', 'Recompiles'));
    children.push(simpleTable('nw-lab-compile-recompiles', ['backend', 'function', 'reason'], recompiles));
  }
  for (const r of compiled) {
    for (const note of r.notes) {
      children.push(el('div', 'nw-lab-note', `${r.label}: ${note}`));
    }
  }
  children.push(el('div', 'nw-lab-note',
    'Compile time is the time torch.compile spent compiling; a graph\'s run time is the time its compiled callable ran in the run, over its calls (the forward; a training graph\'s backward runs inside autograd\'s backward and is not in it); run time is the run\'s time less its compile time (the graphs running plus the cell\'s eager code). Emulated devices run on the host CPU: their times are host CPU time, never Trainium or TPU performance.'));
  const counts = compiled.map(r =>
    `${r.label}: ${plural(r.graphs.length, 'graph')}, ${plural(r.breaks.length, 'graph break')}, ${plural(r.recompiles.length, 'recompile')}`);
  const block = section(`torch.compile (${counts.join('; ')})`, children);
  block.classList.add('nw-lab-compile-section');
  block.open = false; // opened on demand, like the precision budget
  return block;
}

/** Render the report into a fresh element. */
export function renderReport(report) {
  const root = el('div', 'nw-lab-report');
  root.dataset.verdict = report.verdict;
  const verdict = report.verdict || '?';

  // Header: badge + title + summary line.
  const header = el('div', 'nw-lab-header', null, [
    el('span', badgeClass(verdict), verdict),
    el('span', 'nw-lab-title', report.title || `${backendLabel(report.target)} vs ${backendLabel(report.ref)}`)
  ]);
  root.appendChild(header);
  let summary = (report.summary || '').replace(/^(PASS|FAIL|ERROR|UNCOMPARED)\s+/, '');
  if (report.title && summary.startsWith(`${report.title} — `)) {
    summary = summary.slice(report.title.length + 3);
  }
  root.appendChild(el('div', 'nw-lab-summary', summary));

  // Key facts.
  const facts = el('div', 'nw-lab-facts');
  const fact = (label, value, cls) => {
    facts.appendChild(el('span', `nw-lab-fact ${cls || ''}`, null, [
      el('span', 'nw-lab-factlabel', label),
      el('span', 'nw-lab-factvalue', value)
    ]));
  };
  fact('reference', backendLabel(report.ref));
  fact('target', backendLabel(report.target));
  const counts = report.counts || {};
  const nOut = (report.outputs || []).length;
  const skipped = counts[NOT_COMPARED] || 0;
  fact('outputs', `${nOut - skipped} (${counts.match || 0} match)`);
  if (skipped || verdict === UNCOMPARED) {
    fact('not compared', String(skipped), 'nw-lab-warn');
  }
  const fbs = fallbackCounts(report);
  fact('CPU fallbacks', `${fbs.length} op${fbs.length === 1 ? '' : 's'}`, fbs.length ? 'nw-lab-warn' : '');
  const divergence = firstDivergence(report);
  if (divergence) {
    fact('first divergence', divergence, 'nw-lab-bad nw-lab-first-divergence');
  }
  root.appendChild(facts);

  // Errors.
  if (verdict === 'ERROR') {
    const list = el('ul', 'nw-lab-errors');
    for (const [name, run] of [['reference', report.ref], ['target', report.target]]) {
      const err = run && run.error;
      if (err) {
        const where = err.lineno ? ` (cell line ${err.lineno}${err.line ? ': ' + err.line.trim() : ''})` : '';
        list.appendChild(el('li', null, `${backendLabel(run)} (${name}) raised ${err.type}: ${err.message}${where}`));
      }
    }
    root.appendChild(list);
  }

  for (const warning of report.warnings || []) {
    root.appendChild(el('div', 'nw-lab-warning', `warning: ${warning}`));
  }

  // How the runs were compared: autocast's tolerance floor, a cpu reference standing in for cuda
  // and what stays different from a real GPU.
  const notes = report.notes || [];
  if (notes.length) {
    const list = el('ul', 'nw-lab-notes');
    for (const note of notes) {
      list.appendChild(el('li', null, String(note)));
    }
    root.appendChild(section(`Notes (${notes.length})`, [list]));
  }

  // Per-output table, open when something failed or there are few outputs.
  if (nOut) {
    const outs = section(`Outputs (${nOut})`, [outputsTable(report)]);
    outs.classList.add('nw-lab-outputs-section');
    outs.open = verdict !== 'PASS' || nOut <= 12;
    root.appendChild(outs);
  }

  // Measurements: values from timers, memory statistics and device properties, side by side.
  const measured = measurementRows(report);
  if (measured.length) {
    const head = el('tr', null, null,
      ['output', 'kind', 'reference', 'target', 'source', 'what the values are'].map(h => el('th', null, h)));
    const rows = measured.map(m => el('tr', null, null, [
      el('td', 'nw-lab-path', m.path), el('td', null, m.kind), el('td', 'nw-lab-num', m.ref),
      el('td', 'nw-lab-num', m.target), el('td', null, m.source), el('td', null, m.basis)
    ]));
    const table = el('table', 'nw-lab-table nw-lab-measurements', null,
      [el('thead', null, null, [head]), el('tbody', null, null, rows)]);
    const note = el('div', 'nw-lab-note',
      'Values from timers, memory statistics or device properties: shown side by side, never compared, not in the verdict.');
    const block = section(`Measurements (${measured.length})`, [note, table]);
    block.classList.add('nw-lab-measurements-section');
    block.open = true;
    root.appendChild(block);
  }

  // Precision budget: R per measured output against a float64 oracle, tolerances to paste, and
  // the worst output's error distribution.
  const budget = report.budget || {};
  const budgeted = budgetRows(report);
  if (budgeted.length || budget.oracle_error) {
    const children = [el('div', 'nw-lab-note',
      'R = ‖target − oracle‖ / ‖ref − oracle‖ against a float64 rerun of the reference (the oracle): about 1 means the target is as accurate as the reference.')];
    if (budget.oracle_error) {
      children.push(el('div', 'nw-lab-note', String(budget.oracle_error)));
    }
    if (budgeted.length) {
      const head = el('tr', null, null,
        ['output', 'floor from', '‖ref − oracle‖', '‖target − oracle‖', 'R', 'class'].map(h => el('th', null, h)));
      const rows = budgeted.map(b => el('tr', b.within ? null : 'nw-lab-budget-beyond', null, [
        el('td', 'nw-lab-path', b.path), el('td', null, b.source), el('td', 'nw-lab-num', b.floor),
        el('td', 'nw-lab-num', b.error), el('td', 'nw-lab-num', b.ratio), el('td', null, b.label)
      ]));
      children.push(el('table', 'nw-lab-table nw-lab-budget', null,
        [el('thead', null, null, [head]), el('tbody', null, null, rows)]));
    }
    if ((budget.tolerances || []).length) {
      children.push(el('div', 'nw-lab-note', 'Tolerances that would pass:'));
      children.push(el('pre', 'nw-lab-tolerances', budget.tolerances.join('\n')));
    }
    children.push(plotDiv('budget', 'nw-lab-budget-chart'));
    const block = section(`Precision budget (${budgeted.length} output${budgeted.length === 1 ? '' : 's'})`, children);
    block.classList.add('nw-lab-budget-section');
    block.open = false; // opened on demand: an open table and chart make the report tall
    root.appendChild(block);
  }

  // Fallbacks: by count and by time, call sites on click, module -> op treemap.
  if (fbs.length) {
    const fb = section(`CPU fallbacks on ${backendLabel(report.target)} (${fbs.length} op${fbs.length === 1 ? '' : 's'})`, [
      plotDiv('fallbacks', 'nw-lab-fallback-chart'),
      sitesPane('nw-lab-fallback-sites'),
      plotDiv('treemap', 'nw-lab-treemap')
    ]);
    fb.classList.add('nw-lab-fallbacks-section');
    fb.open = true;
    root.appendChild(fb);
  }

  // torch.compile: graphs, graph breaks, recompiles, compile vs run time, ops not compiled.
  const compiled = compileRows(report);
  if (compiled.length) {
    root.appendChild(compileSection(compiled));
  }

  // Op profile A/B (--profile) and memory per backend.
  const profiled = !!((report.ref && report.ref.profile) || (report.target && report.target.profile));
  if (profiled) {
    const prof = section('Op profile, reference vs target', [
      plotDiv('ops', 'nw-lab-ops-chart'),
      sitesPane('nw-lab-ops-sites')
    ]);
    prof.classList.add('nw-lab-ops-section');
    prof.open = true;
    root.appendChild(prof);
  }
  if (CHARTS.memory(report)) {
    const memory = section('Memory per backend', [plotDiv('memory', 'nw-lab-memory-chart')]);
    memory.classList.add('nw-lab-memory-section');
    memory.open = profiled;
    root.appendChild(memory);
  }

  // Difference per module (--layers) and loss curves (--steps).
  if (report.layers && (report.layers.layers || []).length) {
    const layers = section('Difference per module (--layers)', [plotDiv('layers', 'nw-lab-layers-chart')]);
    layers.classList.add('nw-lab-layers-section');
    layers.open = true;
    root.appendChild(layers);
  }
  if (report.training && report.training.series && Object.keys(report.training.series).length) {
    const loss = section('Training parity (--steps)', [plotDiv('loss', 'nw-lab-loss-chart')]);
    loss.classList.add('nw-lab-loss-section');
    loss.open = true;
    root.appendChild(loss);
  }

  if (report.scalars && (report.scalars.sites || []).length) {
    const curves = section('Observed scalars (loss curves by call site)', [plotDiv('scalars', 'nw-lab-scalars-chart')]);
    curves.classList.add('nw-lab-scalars-section');
    curves.open = true;
    root.appendChild(curves);
  }

  // Migration findings: open at a cell's first run, folded when a rerun found the same.
  const migration = report.migration;
  if (migration && (migration.findings || []).length) {
    const rows = migration.findings.map(f => el('tr', null, null, [
      el('td', 'nw-lab-num', f.line ?? ''),
      el('td', null, f.rule_id || f.rule || ''),
      el('td', null, f.severity || ''),
      el('td', null, f.message || ''),
      el('td', null, f.suggestion || '')
    ]));
    const head = el('tr', null, null, ['line', 'rule', 'severity', 'message', 'suggestion'].map(h => el('th', null, h)));
    const table = el('table', 'nw-lab-table nw-lab-migration', null, [el('thead', null, null, [head]), el('tbody', null, null, rows)]);
    const n = migration.findings.length;
    const title = `Migration findings (${n})${migration.repeat ? ', unchanged since this cell\'s first run' : ''}`;
    const mig = section(title, [table]);
    mig.classList.add('nw-lab-migration-section');
    mig.open = !migration.repeat;
    root.appendChild(mig);
  }

  const hints = report.hints || [];
  if (hints.length) {
    const list = el('ul', 'nw-lab-hints');
    for (const h of hints) {
      list.appendChild(el('li', null, typeof h === 'string' ? h : h.message || h.text || JSON.stringify(h)));
    }
    root.appendChild(section(`Hints (${hints.length})`, [list]));
  }
  root.appendChild(el('div', 'nw-lab-footer', `neuron-workbench ${report.workbench_version || ''} · native view of the saved report (renders without a kernel; hover a bar for exact values)`));
  return root;
}
