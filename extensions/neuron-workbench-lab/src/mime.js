// The MIME renderer extension: draws %%neuron reports, with Plotly charts, from the saved output alone.
import { Widget } from '@lumino/widgets';
import { MIME_TYPE, drawCharts, renderReport, resizeCharts } from './report';

let plotlyPromise = null;

/** plotly.js (the partial bundle of src/plotly.js), loaded once, when the first report renders. */
export function loadPlotly() {
  if (!plotlyPromise) {
    plotlyPromise = import(/* webpackChunkName: "nw-plotly" */ './plotly').then(m => m.default || m);
  }
  return plotlyPromise;
}

export class ReportRenderer extends Widget {
  constructor(options) {
    super();
    this._mimeType = options.mimeType;
    this._plotly = null;
    this.addClass('nw-lab-renderer');
  }

  async renderModel(model) {
    const data = model.data[this._mimeType];
    this.node.textContent = '';
    let report;
    let root;
    try {
      report = typeof data === 'string' ? JSON.parse(data) : data;
      root = renderReport(report);
      this.node.appendChild(root);
    } catch (err) {
      const msg = document.createElement('pre');
      msg.textContent = `neuron-workbench: cannot render this report (${err})`;
      this.node.appendChild(msg);
      return;
    }
    try {
      this._plotly = await loadPlotly();
      await drawCharts(root, report, this._plotly);
    } catch (err) {
      // The report (tables, facts) is on screen; only the charts are missing.
      const msg = document.createElement('div');
      msg.className = 'nw-lab-note';
      msg.textContent = `neuron-workbench: charts unavailable (${err})`;
      root.appendChild(msg);
      console.warn('neuron-workbench: charts unavailable', err);
    }
  }

  onAfterAttach(msg) {
    super.onAfterAttach(msg);
    this._resize();
  }

  onAfterShow(msg) {
    super.onAfterShow(msg);
    this._resize();
  }

  onResize(msg) {
    super.onResize(msg);
    this._resize();
  }

  _resize() {
    if (this._plotly) {
      // Charts drawn while the output was detached took a default width.
      window.requestAnimationFrame(() => resizeCharts(this.node, this._plotly));
    }
  }
}

export const rendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  // Lower rank wins. The %%neuron display bundle also carries the ipywidgets view (rank -10, for
  // front ends without this extension) and static HTML (text/html, 50): -20 makes JupyterLab show
  // this one view of the report, and never the widget next to it.
  defaultRank: -20,
  createRenderer: options => new ReportRenderer(options)
};

const extension = {
  id: 'neuron-workbench-lab:report-renderer',
  rendererFactory,
  rank: -20,
  dataType: 'json'
};

export default extension;
