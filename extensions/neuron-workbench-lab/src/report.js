// Pure DOM rendering of a %%neuron report dict (application/vnd.neuron-workbench.report+json).
// Everything comes from the saved output: no kernel, no widget state, no network.

export const MIME_TYPE = 'application/vnd.neuron-workbench.report+json';

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

function backendLabel(run) {
  const b = (run && run.backend) || {};
  return b.emulated ? `${b.name} (emulated)` : b.name || '?';
}

/** The failing outputs, worst (largest max relative error, then max |Δ|) first. */
export function failingOutputs(report) {
  const outs = (report.outputs || []).filter(o => o.status && o.status !== 'match');
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
  const firstFail = (report.outputs || []).find(o => o.status && o.status !== 'match');
  return firstFail ? `output ${firstFail.path}` : '';
}

/** Fallback ops with their total call count on the target, most calls first. */
export function fallbackCounts(report) {
  const counts = new Map();
  const fallbacks = (report.target && report.target.fallbacks) || [];
  for (const f of fallbacks) {
    counts.set(f.op, (counts.get(f.op) || 0) + (typeof f.count === 'number' ? f.count : 1));
  }
  for (const op of report.fallback_ops || []) {
    if (!counts.has(op)) {
      counts.set(op, 0);
    }
  }
  return [...counts.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
}

/** A horizontal SVG-free bar chart made of divs: one row per item, label, bar(s), value. */
function barChart(cls, rows, series, valueText) {
  // rows: [{label, values: [number, ...]}]; series: [{name, cls}]
  const max = Math.max(1e-30, ...rows.flatMap(r => r.values.filter(v => isFinite(v))));
  const chart = el('div', `nw-lab-chart ${cls}`);
  if (series.length > 1) {
    const legend = el('div', 'nw-lab-legend');
    for (const s of series) {
      legend.appendChild(el('span', `nw-lab-legend-item ${s.cls}`, s.name));
    }
    chart.appendChild(legend);
  }
  for (const row of rows) {
    const bars = el('div', 'nw-lab-bars');
    row.values.forEach((v, i) => {
      const width = isFinite(v) && v > 0 ? Math.max(0.5, (82 * v) / max) : 0;
      const bar = el('div', `nw-lab-bar ${series[i].cls}`);
      bar.style.width = `${width}%`;
      bar.title = `${row.label} — ${series[i].name}: ${valueText(v)}`;
      const line = el('div', 'nw-lab-barline', null, [
        bar,
        el('span', 'nw-lab-barvalue', valueText(v))
      ]);
      bars.appendChild(line);
    });
    chart.appendChild(
      el('div', 'nw-lab-chartrow', null, [el('span', 'nw-lab-chartlabel', row.label), bars])
    );
  }
  return chart;
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
    row.appendChild(el('td', null, null, [el('span', `nw-lab-status nw-lab-status-${o.status}`, o.status)]));
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

function profileRows(run) {
  const rows = new Map();
  const prof = run && run.profile;
  for (const r of (prof && prof.rows) || []) {
    rows.set(r.op, (rows.get(r.op) || 0) + (r.total_time_s || 0));
  }
  return rows;
}

/** Render the report into a fresh element. */
export function renderReport(report) {
  const root = el('div', 'nw-lab-report');
  root.dataset.verdict = report.verdict;
  const verdict = report.verdict || '?';

  // Header: badge + title + summary line.
  const header = el('div', 'nw-lab-header', null, [
    el('span', `nw-lab-badge nw-lab-badge-${verdict}`, verdict),
    el('span', 'nw-lab-title', report.title || `${backendLabel(report.target)} vs ${backendLabel(report.ref)}`)
  ]);
  root.appendChild(header);
  let summary = (report.summary || '').replace(/^(PASS|FAIL|ERROR)\s+/, '');
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
  fact('outputs', `${nOut} (${counts.match || 0} match)`);
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

  // Per-output table, open when something failed or there are few outputs.
  if (nOut) {
    const outs = section(`Outputs (${nOut})`, [outputsTable(report)]);
    outs.classList.add('nw-lab-outputs-section');
    outs.open = verdict !== 'PASS' || nOut <= 12;
    root.appendChild(outs);
  }

  // Fallback chart.
  if (fbs.length) {
    const rows = fbs.map(([op, n]) => ({ label: op, values: [n] }));
    const chart = barChart('nw-lab-fallback-chart', rows, [{ name: 'calls', cls: 'nw-lab-s-fallback' }], v => `${v} call${v === 1 ? '' : 's'}`);
    const sites = el('ul', 'nw-lab-sites');
    for (const f of (report.target && report.target.fallbacks) || []) {
      const s = f.site;
      const where = s ? `${s.file}:${s.line}${s.function && s.function !== '<module>' ? ' in ' + s.function : ''}` : 'unknown site';
      const mod = f.module ? ` — module ${f.module}${f.module_type ? ' (' + f.module_type + ')' : ''}` : '';
      sites.appendChild(el('li', null, `${f.op} (${f.phase || 'forward'}) at ${where}${mod}`));
    }
    const fb = section(`CPU fallbacks on ${backendLabel(report.target)} (${fbs.length} op${fbs.length === 1 ? '' : 's'})`, [chart, sites]);
    fb.classList.add('nw-lab-fallbacks-section');
    fb.open = true;
    root.appendChild(fb);
  }

  // Op profile A/B.
  const refOps = profileRows(report.ref);
  const tgtOps = profileRows(report.target);
  if (refOps.size || tgtOps.size) {
    const ops = [...new Set([...refOps.keys(), ...tgtOps.keys()])];
    ops.sort((a, b) => Math.max(tgtOps.get(b) || 0, refOps.get(b) || 0) - Math.max(tgtOps.get(a) || 0, refOps.get(a) || 0));
    const top = ops.slice(0, 15);
    const rows = top.map(op => ({ label: op, values: [refOps.get(op) || 0, tgtOps.get(op) || 0] }));
    const kind = r => (r && r.profile && r.profile.time_kind) || (r && r.time_kind) || 'time';
    const chart = barChart('nw-lab-ops-chart', rows, [
      { name: `${backendLabel(report.ref)} (${kind(report.ref)})`, cls: 'nw-lab-s-ref' },
      { name: `${backendLabel(report.target)} (${kind(report.target)})`, cls: 'nw-lab-s-target' }
    ], fmtTime);
    const more = ops.length > top.length ? el('div', 'nw-lab-note', `${ops.length - top.length} more ops not shown`) : null;
    const prof = section(`Op profile A/B (top ${top.length} of ${ops.length} ops by time)`, [chart, more]);
    prof.classList.add('nw-lab-ops-section');
    prof.open = true;
    root.appendChild(prof);
  }

  const hints = report.hints || [];
  if (hints.length) {
    const list = el('ul', 'nw-lab-hints');
    for (const h of hints) {
      list.appendChild(el('li', null, typeof h === 'string' ? h : h.message || h.text || JSON.stringify(h)));
    }
    root.appendChild(section(`Hints (${hints.length})`, [list]));
  }
  root.appendChild(el('div', 'nw-lab-footer', `neuron-workbench ${report.workbench_version || ''} · native view of the saved report (renders without a kernel)`));
  return root;
}
