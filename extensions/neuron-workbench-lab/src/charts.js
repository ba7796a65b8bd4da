// Plotly figures of a %%neuron report, built from the report's JSON data only (the same data the
// Python views/figures.py builders read), so a saved output draws exactly what the live one did.
// Each builder returns {data, layout} or null when the report has nothing to draw.

const REF_COLOR = '#57606a';
const TARGET_COLOR = '#0969da';
const FALLBACK_COLOR = '#cf222e';
const FALLBACK_TIME_COLOR = '#bc4c00';

/** Base ATen name of an op spelling: sort, aten::sort, aten::sort.stable -> aten::sort. */
export function normalizeOp(name) {
  let text = String(name || '').trim();
  if (!text.includes('::')) {
    text = `aten::${text}`;
  }
  const [ns, rest] = text.split('::', 2);
  return `${ns}::${rest.split('.', 1)[0]}`;
}

/** How a source site reads: `cell [7], line 3` inside a notebook cell, else `path:line`. */
export function siteLabel(site) {
  if (!site || !site.file) {
    return 'unknown site';
  }
  const file = String(site.file);
  const line = site.line === null || site.line === undefined ? '?' : site.line;
  if (/^cell \[\d+\]$/.test(file)) {
    return `${file}, line ${line}`;
  }
  if (file.startsWith('<neuron-cell')) {
    return `cell line ${line}`;
  }
  return `${file}:${line}`;
}

/** The execution count of a site inside a notebook cell, or null. */
export function siteCell(site) {
  if (!site) {
    return null;
  }
  if (typeof site.cell === 'number') {
    return site.cell;
  }
  const m = /^cell \[(\d+)\]$/.exec(String(site.file || ''));
  return m ? Number(m[1]) : null;
}

/** The run's `label` from the report data; reports of schema_version 1 have none: derive it. */
export function backendLabel(run) {
  if (run && run.label) {
    return run.label;
  }
  const b = (run && run.backend) || {};
  if (b.emulated) {
    return `${b.name} (emulated)`;
  }
  if (b.details && b.details.kind === 'fake') {
    return `${b.name} (fake)`; // a test stand-in of the vendor SDK, as in the Python report
  }
  // the host CPU standing in for a GPU reads "cpu (as cuda)", as in the Python report
  const standsIn = b.details && b.details.stands_in_for;
  return standsIn ? `${b.name} (as ${standsIn})` : b.name || '?';
}

function timeKind(run) {
  const prof = (run && run.profile) || {};
  if (prof.time_kind) {
    return prof.time_kind;
  }
  if (run && run.time_kind) {
    return run.time_kind;
  }
  return run && run.backend && run.backend.emulated ? 'host CPU time' : 'wall time';
}

/** The target's fallback events per op: count, host CPU time, sites, modules; most calls first. */
export function fallbackRows(report) {
  const rows = new Map();
  for (const event of (report.target && report.target.fallbacks) || []) {
    const op = normalizeOp(event.op);
    let row = rows.get(op);
    if (!row) {
      row = { op, count: 0, cpuTime: 0, sites: [], modules: [], phases: [] };
      rows.set(op, row);
    }
    row.count += typeof event.count === 'number' ? event.count : 1;
    row.cpuTime += typeof event.cpu_time_s === 'number' ? event.cpu_time_s : 0;
    const label = event.site ? siteLabel(event.site) : '';
    if (label && !row.sites.includes(label)) {
      row.sites.push(label);
    }
    const module = event.module || '';
    if (!row.modules.includes(module)) {
      row.modules.push(module);
    }
    if (event.phase && !row.phases.includes(event.phase)) {
      row.phases.push(event.phase);
    }
  }
  for (const op of report.fallback_ops || []) {
    const name = normalizeOp(op);
    if (!rows.has(name)) {
      rows.set(name, { op: name, count: 0, cpuTime: 0, sites: [], modules: [], phases: [] });
    }
  }
  return [...rows.values()].sort((a, b) => b.count - a.count || (a.op < b.op ? -1 : 1));
}

/**
 * Where `op` was called from: the fallback events' sites first, then the op profiles' first sites.
 * Each entry: {site, label, cell, line, function, module, moduleType, phase, role, source}.
 */
export function callSites(report, op) {
  const name = normalizeOp(op);
  const out = [];
  const seen = new Set();
  const add = (site, extra) => {
    const label = site ? siteLabel(site) : `${extra.phase || 'backward'} (${extra.autograd || 'library code'})`;
    const key = `${label}|${extra.module || ''}`;
    if (seen.has(key)) {
      return;
    }
    seen.add(key);
    out.push({
      site,
      label,
      cell: siteCell(site),
      line: site ? site.line : null,
      function: site ? site.function || '' : '',
      ...extra
    });
  };
  for (const event of (report.target && report.target.fallbacks) || []) {
    if (normalizeOp(event.op) === name) {
      add(event.site || null, {
        module: event.module || '',
        moduleType: event.module_type || '',
        phase: event.phase || 'forward',
        autograd: event.autograd_node || '',
        role: 'target',
        source: 'fallback'
      });
    }
  }
  for (const role of ['ref', 'target']) {
    const prof = report[role] && report[role].profile;
    for (const row of (prof && prof.rows) || []) {
      if (row.op === name && row.site) {
        add(row.site, { module: row.module || '', moduleType: '', phase: '', role, source: 'op profile (first call)' });
      }
    }
  }
  return out;
}

function baseLayout(title, height) {
  return {
    title: { text: title, x: 0.01, xanchor: 'left', font: { size: 14 } },
    height,
    autosize: true,
    margin: { l: 10, r: 10, t: 60, b: 40 },
    font: { family: "system-ui, -apple-system, 'Segoe UI', sans-serif", size: 12 },
    paper_bgcolor: 'rgba(0,0,0,0)',
    plot_bgcolor: 'rgba(0,0,0,0)',
    legend: { orientation: 'h', y: -0.15 },
    hoverlabel: { align: 'left' }
  };
}

function axis(extra) {
  return { gridcolor: '#eaeef2', zerolinecolor: '#d0d7de', automargin: true, ...extra };
}

/** CPU-fallback ops of the target: calls (left) and host CPU time (right), one bar each. */
export function fallbackFigure(report) {
  const rows = fallbackRows(report).slice().reverse(); // plotly draws the first category at the bottom
  if (!rows.length) {
    return null;
  }
  const ops = rows.map(r => r.op);
  const where = rows.map(r => (r.sites.length ? r.sites.join('<br>') : 'backward / library code'));
  const data = [
    {
      type: 'bar', orientation: 'h', name: 'calls', y: ops, x: rows.map(r => r.count),
      xaxis: 'x', yaxis: 'y', marker: { color: FALLBACK_COLOR },
      text: rows.map(r => String(r.count)), textposition: 'auto', customdata: where,
      hovertemplate: '<b>%{y}</b><br>%{x} call(s) ran on the CPU<br>%{customdata}<extra></extra>'
    },
    {
      type: 'bar', orientation: 'h', name: 'host CPU time', y: ops,
      x: rows.map(r => r.cpuTime * 1e3), xaxis: 'x2', yaxis: 'y',
      marker: { color: FALLBACK_TIME_COLOR }, customdata: where,
      hovertemplate: '<b>%{y}</b><br>%{x:.6~g} ms host CPU time<br>%{customdata}<extra></extra>'
    }
  ];
  const layout = baseLayout(`CPU fallbacks on ${backendLabel(report.target)} (click a bar for its call sites)`,
    150 + 34 * rows.length);
  Object.assign(layout, {
    showlegend: false,
    bargap: 0.25,
    xaxis: axis({
      domain: [0, 0.485], title: { text: 'calls that ran on the CPU' }, rangemode: 'tozero',
      // whole calls only: small counts would otherwise get ticks at 0.5
      ...(Math.max(...rows.map(r => r.count)) <= 8 ? { dtick: 1 } : {})
    }),
    xaxis2: axis({ domain: [0.515, 1], anchor: 'y', title: { text: 'host CPU time (ms)' } }),
    yaxis: axis({}),
    margin: { l: 10, r: 10, t: 60, b: 50 }
  });
  return { data, layout };
}

/** Treemap module -> op of the target's fallbacks, sized by calls. */
export function treemapFigure(report) {
  const events = (report.target && report.target.fallbacks) || [];
  if (!events.length) {
    return null;
  }
  const target = backendLabel(report.target);
  const per = new Map();
  const types = new Map();
  for (const event of events) {
    let module = event.module || '';
    if (event.phase === 'backward' && !module) {
      module = '(backward)';
    }
    module = module || '(top level)';
    if (event.module_type && !types.has(module)) {
      types.set(module, event.module_type);
    }
    const key = `${module}\u0000${normalizeOp(event.op)}`;
    const acc = per.get(key) || [0, 0];
    acc[0] += typeof event.count === 'number' ? event.count : 1;
    acc[1] += typeof event.cpu_time_s === 'number' ? event.cpu_time_s : 0;
    per.set(key, acc);
  }
  const root = `${target} fallbacks`;
  const ids = [root];
  const labels = [root];
  const parents = [''];
  const values = [0];
  const times = [0];
  const modules = new Map();
  for (const key of [...per.keys()].sort()) {
    const [module, op] = key.split('\u0000');
    const [count, seconds] = per.get(key);
    if (!modules.has(module)) {
      modules.set(module, ids.length);
      const type = types.get(module);
      ids.push(`m:${module}`);
      labels.push(type ? (module.startsWith('(') ? `${type} ${module}` : `${module} (${type})`) : module);
      parents.push(root);
      values.push(0);
      times.push(0);
    }
    const index = modules.get(module);
    values[index] += count;
    times[index] += seconds;
    values[0] += count;
    times[0] += seconds;
    ids.push(`o:${module}/${op}`);
    labels.push(op);
    parents.push(`m:${module}`);
    values.push(count);
    times.push(seconds);
  }
  const colors = ids.map(id => (id === root ? 'rgba(128,128,128,0.1)' : id.startsWith('m:') ? '#ffd8b5' : FALLBACK_COLOR));
  const data = [{
    type: 'treemap', ids, labels, parents, values, branchvalues: 'total',
    marker: { colors, line: { color: '#ffffff', width: 1 } }, tiling: { pad: 3 },
    textinfo: 'label+value', textfont: { size: 13 },
    customdata: times.map(t => t * 1e3),
    hovertemplate: '<b>%{label}</b><br>%{value} calls<br>%{customdata:.6~g} ms host CPU time<extra></extra>'
  }];
  const layout = baseLayout(`Fallbacks by module on ${target} (size: calls)`, 150 + 30 * Math.min(per.size, 8));
  layout.margin = { l: 10, r: 10, t: 50, b: 10 };
  return { data, layout };
}

function profileTimes(run) {
  const prof = run && run.profile;
  const rows = (prof && (prof.steady || prof.rows)) || [];
  const out = new Map();
  for (const r of rows) {
    const acc = out.get(r.op) || { time: 0, calls: 0 };
    acc.time += r.total_time_s || 0;
    acc.calls += r.calls || 0;
    out.set(r.op, acc);
  }
  return out;
}

/** Per-op time of the reference and the target side by side (top n); fallback ops in red. */
export function opTimeFigure(report, n = 15) {
  const ref = profileTimes(report.ref);
  const tgt = profileTimes(report.target);
  if (!ref.size && !tgt.size) {
    return null;
  }
  const fellBack = new Set((report.fallback_ops || []).map(normalizeOp));
  const key = op => Math.max((ref.get(op) || {}).time || 0, (tgt.get(op) || {}).time || 0);
  const all = [...new Set([...ref.keys(), ...tgt.keys()])];
  all.sort((a, b) => key(b) - key(a) || (a < b ? -1 : 1));
  const ops = all.slice(0, n).reverse();
  const get = (m, op, field) => (m.get(op) || {})[field] || 0;
  const refKind = timeKind(report.ref);
  const tgtKind = timeKind(report.target);
  const data = [
    {
      type: 'bar', orientation: 'h', name: `${backendLabel(report.ref)} (${refKind})`, y: ops,
      x: ops.map(op => get(ref, op, 'time') * 1e3), marker: { color: REF_COLOR },
      customdata: ops.map(op => get(ref, op, 'calls')),
      hovertemplate: '<b>%{y}</b><br>%{x:.6~g} ms, %{customdata} calls<extra>reference</extra>'
    },
    // The target in two traces sharing one slot per op, so the legend names both colours.
    {
      type: 'bar', orientation: 'h', name: `${backendLabel(report.target)} (${tgtKind})`, y: ops,
      x: ops.map(op => (fellBack.has(op) ? null : get(tgt, op, 'time') * 1e3)),
      offsetgroup: 'target', marker: { color: TARGET_COLOR },
      customdata: ops.map(op => get(tgt, op, 'calls')),
      hovertemplate: '<b>%{y}</b><br>%{x:.6~g} ms, %{customdata} calls<extra>target</extra>'
    },
    {
      type: 'bar', orientation: 'h', name: `${backendLabel(report.target)}: ran on the CPU (fallback)`,
      y: ops, x: ops.map(op => (fellBack.has(op) ? get(tgt, op, 'time') * 1e3 : null)),
      offsetgroup: 'target', marker: { color: FALLBACK_COLOR },
      customdata: ops.map(op => get(tgt, op, 'calls')),
      hovertemplate: '<b>%{y}</b><br>%{x:.6~g} ms, %{customdata} calls, CPU fallback<extra>target</extra>'
    }
  ];
  data[0].offsetgroup = 'ref';
  // No title: the section's heading names the chart, and the legend takes the top.
  const layout = baseLayout('', 150 + 30 * ops.length);
  Object.assign(layout, {
    title: undefined,
    barmode: 'group',
    bargap: 0.2,
    xaxis: axis({
      title: { text: `ms (top ${ops.length} of ${all.length} ops); reference: ${refKind}; target: ${tgtKind}` }
    }),
    yaxis: axis({}),
    legend: { orientation: 'h', y: 1.02, x: 0, yanchor: 'bottom' },
    margin: { l: 10, r: 10, t: 60, b: 50 }
  });
  return { data, layout };
}

function formatBytes(value) {
  if (value === null || value === undefined) {
    return 'n/a';
  }
  let size = Number(value);
  for (const unit of ['B', 'KiB', 'MiB', 'GiB']) {
    if (size < 1024 || unit === 'GiB') {
      return unit === 'B' ? `${size.toFixed(0)} B` : `${size.toFixed(1)} ${unit}`;
    }
    size /= 1024;
  }
  return `${size.toFixed(1)} GiB`;
}

/** Peak device memory and bytes allocated by ops, per backend (only where known). */
export function memoryFigure(report) {
  const roles = [['ref', report.ref], ['target', report.target]];
  const names = roles.map(([, run]) => backendLabel(run));
  const peaks = roles.map(([, run]) => {
    const prof = (run && run.profile) || {};
    const peak = prof.peak_memory_bytes;
    return peak === null || peak === undefined ? ((run && run.memory) || {}).peak_bytes ?? null : peak;
  });
  const allocated = roles.map(([, run]) => {
    const prof = run && run.profile;
    return prof ? prof.bytes_allocated ?? null : null;
  });
  if (peaks.every(p => p === null) && allocated.every(a => a === null)) {
    return null;
  }
  const data = [{
    type: 'bar', name: 'peak device memory', x: names, y: peaks.map(p => p || 0),
    text: peaks.map(formatBytes), textposition: 'auto', marker: { color: TARGET_COLOR },
    hovertemplate: '<b>%{x}</b><br>peak %{y:,} bytes<extra></extra>'
  }];
  if (allocated.some(a => a !== null)) {
    data.push({
      type: 'bar', name: 'bytes allocated by ops (sum)', x: names, y: allocated.map(a => a || 0),
      text: allocated.map(formatBytes), textposition: 'auto', marker: { color: REF_COLOR },
      hovertemplate: '<b>%{x}</b><br>%{y:,} bytes allocated<extra></extra>'
    });
  }
  const layout = baseLayout('Memory per backend (the CPU keeps no allocator statistics)', 300);
  Object.assign(layout, { barmode: 'group', yaxis: axis({ title: { text: 'bytes' } }), xaxis: axis({}) });
  return { data, layout };
}

/** Difference per module call in execution order (--layers). */
export function layersFigure(report) {
  const layers = (report.layers && report.layers.layers) || [];
  if (!layers.length) {
    return null;
  }
  const raw = v => {
    const x = v === null || v === undefined || v === 'inf' ? Infinity : Number(v);
    return isFinite(x) ? x : 1e30;
  };
  // A log axis needs positive values: zeros sit a decade under the smallest difference; when every
  // module matches exactly the axis is linear and the bars are flat at 0.
  const positive = layers.flatMap(d => [raw(d.error), raw(d.grad_error ?? 0)]).filter(x => x > 0);
  const floor = positive.length ? Math.min(...positive) / 10 : 0;
  const size = v => Math.max(raw(v), floor);
  const labels = layers.map(d => `${d.order}: ${d.module}${d.call ? '#' + d.call : ''}`);
  const data = [{
    type: 'bar', name: 'output difference', x: labels, y: layers.map(d => size(d.error)),
    marker: { color: layers.map(d => (d.born ? FALLBACK_COLOR : d.diverged ? '#bf8700' : REF_COLOR)) },
    customdata: layers.map(d => `${d.module_type || ''}: ${d.born ? 'born here' : d.diverged ? 'propagated' : 'ok'}`),
    hovertemplate: '<b>%{x}</b><br>difference %{y:.6~g}<br>%{customdata}<extra></extra>'
  }];
  if (layers.some(d => d.grad_error !== null && d.grad_error !== undefined)) {
    data.push({
      type: 'scatter', mode: 'markers', name: 'output-gradient difference', x: labels,
      y: layers.map(d => (d.grad_error === null || d.grad_error === undefined ? null : size(d.grad_error))),
      marker: { color: TARGET_COLOR, symbol: 'diamond', size: 8 },
      hovertemplate: '<b>%{x}</b><br>gradient difference %{y:.6~g}<extra></extra>'
    });
  }
  const first = report.layers.first_divergence || report.first_divergence;
  const note = first ? ` (born at ${first.module})` : positive.length ? '' : ' (every module output matches exactly)';
  const layout = baseLayout(`Difference per module, in execution order${note}`, 380);
  Object.assign(layout, {
    yaxis: axis(positive.length
      ? { type: 'log', title: { text: 'difference (log)' } }
      : { title: { text: 'difference' }, range: [0, 1] }),
    xaxis: axis({ tickangle: -45 })
  });
  return { data, layout };
}

/** Per-step values of both runs (--steps N) and their difference. */
export function lossFigure(report) {
  const training = report.training;
  const series = training && training.series;
  if (!series || !Object.keys(series).length) {
    return null;
  }
  const name = 'loss' in series ? 'loss' : Object.keys(series)[0];
  const values = series[name];
  const steps = values.ref.map((_, i) => i + 1);
  const identical = values.abs_diff.every(v => !v);
  const data = [
    {
      type: 'scatter', mode: 'lines+markers', name: `${name}: ${backendLabel(report.ref)}`, x: steps,
      y: values.ref, line: { color: REF_COLOR },
      hovertemplate: 'step %{x}<br>%{y:.8~g}<extra>reference</extra>'
    },
    {
      type: 'scatter', mode: 'lines+markers', name: `${name}: ${backendLabel(report.target)}`, x: steps,
      y: values.target, line: { color: TARGET_COLOR, dash: 'dot' },
      hovertemplate: 'step %{x}<br>%{y:.8~g}<extra>target</extra>'
    }
  ];
  if (!identical) {
    data.push({
      type: 'bar', name: '|Δ| per step', x: steps, y: values.abs_diff, yaxis: 'y2',
      marker: { color: FALLBACK_COLOR }, opacity: 0.35,
      hovertemplate: 'step %{x}<br>|Δ| %{y:.6~g}<extra></extra>'
    });
  }
  const note = identical ? ' (identical on every step)' : '';
  const layout = baseLayout(`Training parity over ${steps.length} steps: ${name}${note}`, 320);
  Object.assign(layout, {
    xaxis: axis({ title: { text: 'step' }, dtick: 1 }),
    yaxis: axis({}),
    yaxis2: {
      overlaying: 'y', side: 'right', title: { text: '|Δ|' }, showgrid: false, zeroline: false,
      rangemode: 'nonnegative', exponentformat: 'e', visible: !identical, automargin: true
    },
    legend: { orientation: 'h', y: -0.3 },
    margin: { l: 10, r: identical ? 10 : 20, t: 60, b: 60 }
  });
  return { data, layout };
}

/** A charted scalar: numbers as they are; NaN/inf (JSON strings) and lists as gaps. */
function scalarValue(v) {
  return typeof v === 'number' ? v : null;
}

/**
 * The observed scalars of one call site (loss.item() in a training loop) on both runs, overlaid,
 * with |Δ| per occurrence below: the site where the runs part first, else the first site seen.
 */
export function scalarsFigure(report) {
  const scalars = report.scalars;
  const sites = ((scalars && scalars.sites) || []).filter(
    s => (s.ref || []).concat(s.target || []).some(v => typeof v === 'number'));
  if (!sites.length) {
    return null;
  }
  const first = scalars.first;
  const site = sites.find(s => first && s.site === first.site) || sites[0];
  const ref = site.ref.map(scalarValue);
  const target = site.target.map(scalarValue);
  const steps = Array.from({ length: Math.max(ref.length, target.length) }, (_, i) => i + 1);
  const mode = steps.length <= 60 ? 'lines+markers' : 'lines';
  const data = [
    {
      type: 'scatter', mode, name: backendLabel(report.ref), x: steps.slice(0, ref.length), y: ref,
      line: { color: REF_COLOR }, xaxis: 'x', yaxis: 'y',
      hovertemplate: '#%{x}<br>%{y:.8~g}<extra>reference</extra>'
    },
    {
      type: 'scatter', mode, name: backendLabel(report.target), x: steps.slice(0, target.length),
      y: target, line: { color: TARGET_COLOR, dash: 'dot' }, xaxis: 'x', yaxis: 'y',
      hovertemplate: '#%{x}<br>%{y:.8~g}<extra>target</extra>'
    },
    {
      type: 'bar', name: '|Δ|', x: steps.slice(0, site.abs_diff.length),
      y: site.abs_diff.map(scalarValue), xaxis: 'x2', yaxis: 'y2', showlegend: false,
      marker: { color: FALLBACK_COLOR }, opacity: 0.6,
      hovertemplate: '#%{x}<br>|Δ| %{y:.6~g}<extra></extra>'
    }
  ];
  const parts = site.parts_at === null || site.parts_at === undefined
    ? 'match' : `part at #${site.parts_at}`;
  const more = sites.length > 1 ? ` (+${sites.length - 1} more sites in the report)` : '';
  const layout = baseLayout(`Observed scalars at ${site.site}: ${parts}${more}`, 380);
  Object.assign(layout, {
    xaxis: axis({ anchor: 'y', showticklabels: false, matches: 'x2' }),
    yaxis: axis({ domain: [0.36, 1], title: { text: 'value' } }),
    xaxis2: axis({ anchor: 'y2', title: { text: 'occurrence (step)' } }),
    yaxis2: axis({ domain: [0, 0.26], title: { text: '|Δ|' }, rangemode: 'nonnegative', exponentformat: 'e' }),
    legend: { orientation: 'h', y: -0.3 },
    margin: { l: 10, r: 10, t: 60, b: 60 }
  });
  return { data, layout };
}

/** A measurement's value as text: `12.4 ms`, `0.044 MiB`, `(8, 0)`, or `—` (report.py's twin). */
export function measurementText(value, unit) {
  if (value === null || value === undefined) {
    return '—';
  }
  let text;
  if (typeof value === 'number') {
    text = Number.isInteger(value) ? (Math.abs(value) >= 10000 ? value.toLocaleString('en-US') : String(value))
      : String(Number(value.toPrecision(4)));
  } else {
    text = String(value);
  }
  return unit ? `${text} ${unit}` : text;
}

/**
 * Rows of the report's measurements (timings, memory figures, device properties): shown side by
 * side, never compared. Each: path, kind, ref, target (formatted with the unit), source, basis.
 */
export function measurementRows(report) {
  return (report.measurements || []).map(m => ({
    path: String(m.path),
    kind: String(m.kind || ''),
    ref: measurementText(m.ref, m.unit),
    target: measurementText(m.target, m.unit),
    source: String(m.source || ''),
    basis: `reference: ${m.ref_basis || '?'}; target: ${m.target_basis || '?'}`
  }));
}

/** R as the report writes it: `1.1`, `38`, `2.0e+06`, `inf` (OutputBudget.factor's twin). */
export function budgetFactor(ratio) {
  const r = Number(ratio);
  if (!Number.isFinite(r)) {
    return 'inf';
  }
  if (r < 10) {
    return r.toFixed(1);
  }
  return r < 1e4 ? r.toFixed(0) : r.toExponential(1);
}

/**
 * Rows of the precision budget (--judge budget, or the outputs that failed tolerance): each
 * measured output's noise floor, error and R with its class. Empty when nothing was measured.
 */
export function budgetRows(report) {
  const fmt = v => (Number.isFinite(Number(v)) ? Number(v).toExponential(2) : String(v));
  return ((report.budget && report.budget.outputs) || []).map(o => ({
    path: String(o.path),
    source: String(o.source || '') + (o.note ? ` (${o.note})` : ''),
    floor: fmt(o.floor),
    error: fmt(o.error),
    ratio: budgetFactor(o.ratio),
    label: String(o.label || ''),
    within: !!o.within
  }));
}

/** The worst output's error distribution against the reference's noise floor (budget_histogram). */
export function budgetFigure(report) {
  const outputs = ((report.budget && report.budget.outputs) || []).filter(o => o.histogram);
  if (!outputs.length) {
    return null;
  }
  const ratio = o => (Number.isFinite(Number(o.ratio)) ? Number(o.ratio) : Infinity);
  const output = outputs.reduce((a, b) => (ratio(b) > ratio(a) ? b : a));
  const edges = output.histogram.edges;
  const labels = edges.slice(1).map((e, i) => `1e${((edges[i] + e) / 2).toFixed(1)}`);
  const data = [
    ['ref', REF_COLOR], ['target', TARGET_COLOR]
  ].map(([role, color]) => ({
    type: 'bar', name: `${backendLabel(report[role])} − oracle`, x: labels, y: output.histogram[role],
    marker: { color }, opacity: 0.7, hovertemplate: '|error| ≈ %{x}<br>%{y} elements<extra></extra>'
  }));
  const title = `Error distribution of ${output.path}: R ${budgetFactor(output.ratio)}, ${output.label}`;
  const layout = baseLayout(title, 320);
  Object.assign(layout, {
    barmode: 'overlay',
    xaxis: axis({ title: { text: `|error| against the ${output.source} (log10 bins)` } }),
    yaxis: axis({ title: { text: 'elements' } }),
    legend: { orientation: 'h', y: -0.3 },
    margin: { l: 10, r: 10, t: 60, b: 60 }
  });
  return { data, layout };
}

/** Where a compiled graph or a graph break is: `cell line 4` in the cell, else `path:line`. */
export function compileWhere(entry) {
  const file = (entry && entry.file) || '';
  if (file === 'cell') {
    return `cell line ${entry.line}`;
  }
  return file ? siteLabel(entry) : '';
}

/**
 * What torch.compile did on each backend that compiled (the Python view's compile_html twin):
 * [{role, label, kind, compilers, compileMs, graphsRunMs, runMs, notCompiled, graphs, breaks,
 * recompiles, notes}], reference first; [] when neither run compiled. graphsRunMs is the time the
 * compiled graphs ran (each graph's calls and runMs are its own; null where not recorded); runMs
 * is the run's time less its compile time; `kind` says what the times measure (host CPU time on
 * an emulated device).
 */
export function compileRows(report) {
  const out = [];
  for (const role of ['ref', 'target']) {
    const run = report[role] || {};
    const record = run.compile || {};
    const graphs = record.graphs || [];
    const breaks = record.graph_breaks || [];
    const errors = record.errors || [];
    if (!graphs.length && !breaks.length && !errors.length) {
      continue;
    }
    const kind = timeKind(run);
    const label = backendLabel(run);
    const compileMs = Number(record.compile_s || 0) * 1e3;
    const wall = run.wall_time_s;
    const notes = (record.warnings || []).map(w => `warning: ${w}`)
      .concat(errors.map(e => `compile failed: ${e}`));
    const random = Object.keys(record.random_ops || {}).sort();
    if (random.length) {
      notes.push(`random functions inside compiled graphs (the compiler draws their numbers): ${random.join(', ')}`);
    }
    out.push({
      role,
      label,
      kind,
      compilers: [...new Set(graphs.map(g => String(g.backend)))],
      compileMs,
      graphsRunMs: record.run_s === null || record.run_s === undefined ? null : Number(record.run_s) * 1e3,
      runMs: wall === null || wall === undefined ? null : Math.max(0, Number(wall) * 1e3 - compileMs),
      notCompiled: [...new Set(graphs.flatMap(g => g.fallback_ops || []))].sort(),
      graphs: graphs.map((g, i) => ({
        index: i + 1,
        backend: String(g.backend || ''),
        function: String(g.function || ''),
        where: compileWhere(g),
        ops: g.ops,
        compileMs: Number(g.compile_s || 0) * 1e3,
        calls: g.calls === null || g.calls === undefined ? null : Number(g.calls),
        runMs: g.run_s === null || g.run_s === undefined ? null : Number(g.run_s) * 1e3,
        recompile: g.recompile || '',
        notCompiled: g.fallback_ops || []
      })),
      breaks: breaks.map(b => ({ where: compileWhere(b), reason: String(b.reason || '') })),
      recompiles: (record.recompiles || []).map(r => ({ function: String(r.function || ''), reason: String(r.reason || '') })),
      notes
    });
  }
  return out;
}

function callsText(calls) {
  return calls === null ? 'not timed' : `${calls} call${calls === 1 ? '' : 's'}`;
}

/**
 * Compile vs run time per graph (the Python views/compile_figures.py twin): a row per graph each
 * backend compiled (`cpu (as cuda) g1`, ...), with a bar for its compile time and one for the time
 * its compiled callable ran in the run (its calls: the forward; its backward runs inside
 * autograd's backward). Log time axis: compile time dwarfs a graph's run time.
 */
export function compileFigure(report) {
  const runs = compileRows(report).filter(r => r.graphs.length);
  if (!runs.length) {
    return null;
  }
  const comp = { y: [], x: [], hover: [] };
  const ran = { y: [], x: [], text: [], hover: [] };
  for (const r of runs) {
    for (const g of r.graphs) {
      const row = `${r.label} g${g.index}`;
      const lines = [
        `<b>graph ${g.index} of ${r.graphs.length}</b>: ${g.function} (${g.where || 'unknown site'})`,
        `${g.backend}, ${g.ops ?? '?'} ops`,
        `compile ${g.compileMs.toFixed(1)} ms ${r.kind}`,
        g.runMs !== null
          ? `run ${g.runMs.toFixed(1)} ms ${r.kind} (${callsText(g.calls)} of the compiled graph; its backward is not in it)`
          : 'run time not recorded for this graph'
      ];
      if (g.recompile) {
        lines.push(`recompiled: ${g.recompile}`);
      }
      if (g.notCompiled.length) {
        lines.push(`not compiled: ${g.notCompiled.join(', ')}`);
      }
      const hover = lines.join('<br>');
      comp.y.push(row);
      comp.x.push(g.compileMs);
      comp.hover.push(hover);
      ran.y.push(row);
      ran.x.push(g.runMs);
      ran.text.push(g.calls === null ? '' : `${g.calls}×`);
      ran.hover.push(hover);
    }
  }
  const bar = { type: 'bar', orientation: 'h', hovertemplate: '%{customdata}<extra></extra>' };
  const data = [
    { ...bar, name: 'compile time', y: comp.y, x: comp.x, customdata: comp.hover, marker: { color: '#bc4c00' } },
    {
      ...bar, name: 'run time (calls of the compiled graph)', y: ran.y, x: ran.x, text: ran.text,
      textposition: 'outside', customdata: ran.hover, marker: { color: TARGET_COLOR }
    }
  ];
  const emulated = runs.some(r => {
    const run = report[r.role] || {};
    return !!(run.backend && run.backend.emulated);
  });
  const title = `torch.compile: compile vs run time per graph${emulated ? ' (emulated device: host CPU time)' : ''}`;
  const layout = baseLayout(title, 150 + 44 * comp.y.length);
  Object.assign(layout, {
    barmode: 'group',
    bargap: 0.3,
    // compile time is often 100x a graph's run time: a log axis shows both
    xaxis: axis({ title: { text: `ms, log scale (${runs.map(r => `${r.label}: ${r.kind}`).join('; ')})` }, type: 'log' }),
    yaxis: axis({ autorange: 'reversed' }),
    legend: { orientation: 'h', y: 1.02, x: 0, yanchor: 'bottom' },
    margin: { l: 10, r: 10, t: 80, b: 50 }
  });
  return { data, layout };
}

/** Every chart of a report, by key, in display order (null entries dropped). */
export const CHARTS = {
  fallbacks: fallbackFigure,
  treemap: treemapFigure,
  ops: opTimeFigure,
  memory: memoryFigure,
  layers: layersFigure,
  loss: lossFigure,
  budget: budgetFigure,
  scalars: scalarsFigure,
  compile: compileFigure
};

export const PLOT_CONFIG = {
  displaylogo: false,
  responsive: true,
  modeBarButtonsToRemove: ['select2d', 'lasso2d', 'autoScale2d', 'toImage']
};
