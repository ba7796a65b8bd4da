"""The guided notebooks as committed: portable outputs, and a static HTML export with the charts."""

import json
import re
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# Paths that say which machine (and which run) executed a notebook: temporary folders (the kernel's
# cell files, mkdtemp), home folders, and this checkout.
MACHINE_PATHS = re.compile(
    "|".join(
        re.escape(p)
        for p in {tempfile.gettempdir() + "/", str(Path.home()) + "/", str(ROOT) + "/"}
        if len(p) > 2
    )
    + r"|/tmp/|/var/folders/|/private/var/|ipykernel_\d+|[A-Za-z]:\\\\Users\\\\|/home/[^/\s\"']+/"
    r"|/Users/[^/\s\"']+/"
)


def _outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            yield index, json.dumps(output)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_machine_specific_paths(path):
    found = [
        (index, match.group(0), text[max(0, match.start() - 60) : match.end() + 40])
        for index, text in _outputs(path)
        for match in [MACHINE_PATHS.search(text)]
        if match
    ]
    assert found == [], f"{path.name}: cell, path, context: {found[:5]}"


def test_the_pattern_finds_what_it_is_for():
    for text in ("/tmp/ipykernel_12/3.py:15", "/tmp/nw-fallbacks-abc/models.py", "/home/ann/x.py"):
        assert MACHINE_PATHS.search(text), text
    for text in ("models.py:16", "cell [7], line 3", "notebooks/models.py:2"):
        assert not MACHINE_PATHS.search(text), text


def test_html_export_of_the_fallbacks_notebook_holds_the_fallback_chart():
    from nbconvert import HTMLExporter

    path = ROOT / "notebooks" / "02_fallbacks_and_profiling.ipynb"
    nb = nbformat.read(path, as_version=4)
    html, _ = HTMLExporter().from_notebook_node(nb)
    # the first %%neuron cell's report: its static HTML, with the Plotly fallback chart
    assert "CPU fallbacks on neuron (emulated)" in html
    assert "Plotly.newPlot" in html and "aten::max_pool2d_with_indices" in html
    # no widget placeholder: the notebook stores no widget state, so the HTML view is exported
    assert "application/vnd.jupyter.widget-view+json" not in html
