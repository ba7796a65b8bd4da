// The MIME renderer extension: draws %%neuron reports from the saved output alone.
import { Widget } from '@lumino/widgets';
import { MIME_TYPE, renderReport } from './report';

export class ReportRenderer extends Widget {
  constructor(options) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('nw-lab-renderer');
  }

  renderModel(model) {
    const data = model.data[this._mimeType];
    this.node.textContent = '';
    try {
      this.node.appendChild(renderReport(typeof data === 'string' ? JSON.parse(data) : data));
    } catch (err) {
      const msg = document.createElement('pre');
      msg.textContent = `neuron-workbench: cannot render this report (${err})`;
      this.node.appendChild(msg);
    }
    return Promise.resolve();
  }
}

export const rendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  // Lower rank wins; text/html is 50, so the native renderer is picked over the static HTML.
  defaultRank: 10,
  createRenderer: options => new ReportRenderer(options)
};

const extension = {
  id: 'neuron-workbench-lab:report-renderer',
  rendererFactory,
  rank: 10,
  dataType: 'json'
};

export default extension;
