// A partial plotly.js bundle: the core (with scatter, for loss curves) plus bar and treemap traces,
// which are all the report view draws.
//
// Why plotly.js from npm, bundled here, rather than JupyterLab's Plotly MIME renderer
// (jupyterlab-plotly): the report must draw its charts from the saved output alone, after a reload,
// with no kernel, and it must handle clicks on its bars (call sites, jump to the cell line). A
// bundled copy works wherever this extension is installed, whatever Plotly the Python side has, and
// hands us the graph div to listen on. The prebuilt bundles do not fit: plotly.js-basic-dist has
// no treemap, plotly.js-dist is the whole library (4.7 MB). Built from plotly.js/lib/* this chunk
// holds only what is drawn, and it is loaded lazily (import() in mime.js), when a report renders.
import Plotly from 'plotly.js/lib/core';
import bar from 'plotly.js/lib/bar';
import treemap from 'plotly.js/lib/treemap';

Plotly.register([bar, treemap]);

export default Plotly;
