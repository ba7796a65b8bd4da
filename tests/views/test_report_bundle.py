"""One display per ``%%neuron`` cell (``views.report_bundle``) and source sites people recognise."""

import os
from pathlib import Path

import pytest

from neuron_workbench.magics.neuron import cell_filenames
from neuron_workbench.report.html import render_report_html
from neuron_workbench.report.report import REPORT_MIME
from neuron_workbench.sites import library_folders, relabel_site, site_label
from neuron_workbench.testing import run_cell
from neuron_workbench.views import WIDGET_VIEW_MIME, report_bundle

# --- the pure relabelling -------------------------------------------------------------------------


def test_a_notebook_cell_site_reads_cell_and_line():
    cells = {"/tmp/ipykernel_42/1234.py": 7, "<neuron-cell-3>": (9, 1)}
    site = {"file": "/tmp/ipykernel_42/1234.py", "line": 3, "function": "rank"}
    out = relabel_site(site, cells)
    assert out == {"file": "cell [7]", "line": 3, "function": "rank", "cell": 7}
    assert site_label(out) == "cell [7], line 3"
    assert site["file"] == "/tmp/ipykernel_42/1234.py"  # the input is not changed
    # the %%neuron body is compiled on its own: one line below the %%neuron line
    own = relabel_site({"file": "<neuron-cell-3>", "line": 2, "function": "<module>"}, cells)
    assert site_label(own) == "cell [9], line 3" and own["cell"] == 9
    # relabelling twice changes nothing
    assert relabel_site(own, cells) == own


def test_files_are_relative_to_the_deepest_folder_that_holds_them(tmp_path):
    inside = str(tmp_path / "pkg" / "models.py")
    site = {"file": inside, "line": 16, "function": "forward"}
    assert site_label(relabel_site(site, {}, [str(tmp_path)])) == "pkg/models.py:16"
    other = tmp_path.parent / "elsewhere.py"
    assert relabel_site({"file": str(other), "line": 1}, {}, [str(tmp_path)])["file"] == str(other)
    # the deepest folder wins (a library in a project's virtual environment: its import root)
    assert relabel_site(site, {}, [str(tmp_path), str(tmp_path / "pkg")])["file"] == "models.py"
    # relative paths, pseudo-files and unknown cells stay as they are
    assert relabel_site({"file": "x.py", "line": 1}, {}, [str(tmp_path)])["file"] == "x.py"
    assert site_label({"file": "<neuron-cell-5>", "line": 2}) == "cell line 2"
    assert site_label({"file": "<stdin>", "line": 2}) == "<stdin>:2"


def test_library_files_read_relative_to_their_import_root():
    import torch

    from neuron_workbench.magics.neuron import site_folders

    library = str(Path(torch.__file__).resolve().parents[1])  # site-packages
    assert library in library_folders()
    site = {"file": torch.__file__, "line": 1}
    assert relabel_site(site, {}, site_folders("/nonexistent"))["file"] == "torch/__init__.py"


def test_the_running_cell_count_comes_from_the_calling_cell_code():
    class Compiler:
        _filename_map = {__file__: 12, "/tmp/ipykernel_1/old.py": 3}

    class Shell:
        compile = Compiler()
        execution_count = 13  # IPython has already counted up to the next cell

    # this test function's own frame stands for the cell code that called the magic
    names = cell_filenames(Shell(), "<neuron-cell-1>")
    assert names["<neuron-cell-1>"] == 12 and names["/tmp/ipykernel_1/old.py"] == 3


# --- through the real magic -----------------------------------------------------------------------


@pytest.fixture
def shown(monkeypatch):
    """What the magic displays: (data, metadata) of each display call."""
    import neuron_workbench.magics.neuron as magic_module

    calls = []

    def display(data, metadata=None, raw=False):
        assert raw
        calls.append((data, metadata or {}))

    monkeypatch.setattr(magic_module, "display", display)
    return calls


def test_sites_in_notebook_cells_and_files_read_as_people_know_them(
    ip, shown, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "nw_sorting.py").write_text(
        "import torch\n\n\ndef order(v):\n    return torch.sort(v).indices\n"
    )
    defined = run_cell(ip, "import torch\nfrom nw_sorting import order\n\ndef middle(v):\n"
                       "    return torch.median(v)")  # fmt: skip
    result = run_cell(ip, '%%neuron --no-scan -o rep\nv = torch.randn(6, device="cuda")\n'
                      "i = order(v)\nm = middle(v)")  # fmt: skip
    data, metadata = shown[-1]
    report = data[REPORT_MIME]
    sites = {event["op"]: site_label(event["site"]) for event in report["target"]["fallbacks"]}
    # the %%neuron cell's own line (line 1 is the %%neuron line), a file, an earlier cell's function
    assert sites["aten::normal_"] == f"cell [{result.execution_count}], line 2"
    assert sites["aten::sort"] == "nw_sorting.py:5"
    assert sites["aten::median"] == f"cell [{defined.execution_count}], line 5"
    # the Report object the cell bound says the same as its display (and any artifact)
    kept = {
        e["op"]: site_label(e["site"]) for e in ip.user_ns["rep"].to_dict()["target"]["fallbacks"]
    }
    assert kept == sites
    assert str(tmp_path) not in render_report_html(report)
    assert defined.execution_count < result.execution_count
    assert metadata == {}


def test_one_display_carries_every_view(ip, shown, monkeypatch):
    run_cell(ip, "import torch")
    run_cell(ip, '%%neuron --no-scan\nv = torch.randn(4, device="cuda")\ns = torch.sort(v).values')
    assert len(shown) == 1  # one display for the whole report
    data, metadata = shown[0]
    assert set(data) == {"text/plain", "text/html", REPORT_MIME}  # no kernel: no widget
    assert "Plotly.newPlot" in data["text/html"] and "aten::sort" in data["text/html"]
    # in a kernel the widget view joins the same bundle (JupyterLab's extension ranks ahead of it)
    monkeypatch.setattr(type(ip), "kernel", object(), raising=False)
    run_cell(ip, '%%neuron --no-scan\nv = torch.randn(4, device="cuda")\ns = torch.sort(v).values')
    data, metadata = shown[1]
    assert {REPORT_MIME, WIDGET_VIEW_MIME, "text/html", "text/plain"} == set(data)
    assert data[WIDGET_VIEW_MIME]["model_id"]
    # --widget: the widget must win everywhere, so the report's data moves to the metadata
    run_cell(ip, '%%neuron --no-scan --widget\nv = torch.ones(4, device="cuda")')
    data, metadata = shown[2]
    assert REPORT_MIME not in data and WIDGET_VIEW_MIME in data
    assert metadata[REPORT_MIME]["verdict"] == "PASS"


def test_report_bundle_rejects_unknown_widget_modes(data):
    with pytest.raises(ValueError, match="widget must be"):
        report_bundle(data, widget="sometimes")


def test_a_rerun_of_the_same_cell_folds_its_migration_findings(ip, shown):
    run_cell(ip, "import torch")
    cell = f"%%neuron\nx = torch.ones({os.getpid() % 97 + 3}).cuda()\ntorch.cuda.synchronize()"
    run_cell(ip, cell)
    run_cell(ip, cell)
    first, again = (data[REPORT_MIME]["migration"] for data, _ in shown[-2:])
    assert first["findings"] and first["repeat"] is False
    assert again["findings"] == first["findings"] and again["repeat"] is True
    html_first, html_again = (data["text/html"] for data, _ in shown[-2:])
    assert "<h4>Migration findings (2)</h4>" in html_first
    assert "unchanged since this cell's first run</summary>" in html_again


def test_static_chart_ids_differ_between_runs_of_the_same_cell(data):
    import re

    from neuron_workbench.views.widget import static_html

    rerun = {**data, "ref": {**data["ref"], "wall_time_s": (data["ref"]["wall_time_s"] or 0) + 1}}

    def ids(report):
        return re.findall(r'id="(nw-[0-9a-f]+-\d)"', static_html(report))

    assert ids(data) and not set(ids(data)) & set(ids(rerun))
