"""The JupyterLab extension (extensions/neuron-workbench-lab) in a real JupyterLab + Debian chromium.

A notebook with three ``%%neuron`` cells (pass, numeric fail, fallback) and one plain cell is run:
each cell shows exactly one report, the extension's native view, whose fallback and op-time charts
are Plotly plots (hover shows the count; a click lists the op's call sites as ``cell [N], line L``,
and a click on a site selects that line of the cell); the porting dashboard lists the three
verdicts, the "Compare this cell on the target" shortcut runs the plain cell through ``%%neuron``
without editing it, and the status bar names ``ref → target``. The notebook is saved and opened
again in a second JupyterLab that has no kernel at all: every report, Plotly charts included, still
renders from the saved output. With the extension disabled, the same cell shows the ipywidgets view
instead. Screenshots go to ``test-artifacts/``.

The server helper is the one of ``tests/views/test_browser.py``, loaded as a private copy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from compiled_cells import MLP_SETUP, compiled_mlp_cell

_spec = importlib.util.spec_from_file_location(
    "_nw_lab_browser_helpers", Path(__file__).resolve().parents[1] / "views" / "test_browser.py"
)
lab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
MIME = "application/vnd.neuron-workbench.report+json"
EXTENSION = "neuron-workbench-lab"
INSTALLED = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / EXTENSION / "package.json"

SETUP = "%load_ext neuron_workbench\nimport torch"
PASS_CELL = '%%neuron\nx = torch.ones(3, device="cuda") * 2\ny = x + 1'
FAIL_CELL = (
    "%%neuron\n"
    'big = torch.tensor([1e8, 2.0], dtype=torch.float64, device="cuda")\n'
    "delta = (big + 1.0) - big"
)
FALLBACK_CELL = (
    '%%neuron --profile\nv = torch.randn(8, device="cuda")\nvalues, order = torch.sort(v)'
)
PLAIN_CELL = 'w = torch.full((2, 2), 3.0, device="cuda")\nz = w @ w'
FALLBACK_OPS = {"aten::normal_", "aten::sort"}

needs_extension = pytest.mark.skipif(
    not INSTALLED.exists(),
    reason=f"{EXTENSION} is not built (scripts/setup_env.sh builds it; it needs Node.js)",
)


def in_jupyterlab(test):
    """A test driving the extension in a real JupyterLab and chromium (marked browser, slow)."""
    for mark in (
        pytest.mark.skipif(
            lab.CHROMIUM is None,
            reason="Debian chromium is not installed "
            "(scripts/install_browser.sh installs it; CI runs it)",
        ),
        pytest.mark.slow,
        pytest.mark.browser,
        needs_extension,
    ):
        test = mark(test)
    return test


@needs_extension
def test_labextension_is_listed_enabled():
    out = subprocess.run(
        [sys.executable, "-m", "jupyterlab.labextensions", "list"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    text = out.stdout + out.stderr
    line = next((ln for ln in text.splitlines() if EXTENSION in ln), "")
    assert "enabled" in line and "OK" in line, text


def _rows(page):
    return page.locator("#neuron-workbench-dashboard .nw-lab-dash-row")


def _wait_rows(page, verdicts, timeout=120_000):
    page.wait_for_function(
        """want => {
          const rows = [...document.querySelectorAll('#neuron-workbench-dashboard .nw-lab-dash-row')];
          return JSON.stringify(rows.map(r => r.dataset.verdict)) === JSON.stringify(want);
        }""",
        arg=verdicts,
        timeout=timeout,
    )


def _open_dashboard(page):
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="neuron-workbench-dashboard"]')
    tab.wait_for(timeout=30_000)
    tab.click()
    page.locator("#neuron-workbench-dashboard .nw-lab-dash-summary").wait_for(timeout=30_000)


def _saved(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _plot_ticks(page, chart):
    """The y tick labels of a Plotly chart, once it has drawn them."""
    page.wait_for_function(
        "el => el.querySelectorAll('.ytick text').length >= 1", arg=chart.element_handle(),
        timeout=30_000,
    )  # fmt: skip
    return set(chart.locator(".yaxislayer-above .ytick text").all_text_contents())


def _check_reports(page, expected):
    """One native report per %%neuron cell: verdict badge, Plotly fallback and op-time charts."""
    reports = page.locator(".jp-OutputArea-output .nw-lab-report")
    page.wait_for_function(
        f"() => document.querySelectorAll('.jp-OutputArea-output .nw-lab-report').length"
        f" === {len(expected)}",
        timeout=60_000,
    )
    for i, verdict in enumerate(expected):
        report = reports.nth(i)
        assert report.get_attribute("data-verdict") == verdict
        assert report.locator(".nw-lab-badge").inner_text() == verdict
    # Exactly one view per cell: neither the widget nor the static HTML next to the native view.
    for cell_outputs in page.locator(".jp-Cell .jp-OutputArea").all():
        assert cell_outputs.locator(".nw-lab-report").count() <= 1
    assert page.locator(".jp-OutputArea-output .widget-tab").count() == 0
    assert page.locator(".jp-OutputArea-output .nw-report").count() == 0
    fail = reports.nth(1)
    assert "delta" in fail.locator(".nw-lab-outputs").inner_text()
    assert "output delta" in fail.locator(".nw-lab-first-divergence").inner_text()
    fallback = reports.nth(2)
    page.wait_for_function(
        "el => el.dataset.charts === 'drawn'", arg=fallback.element_handle(), timeout=60_000
    )
    chart = fallback.locator(".nw-lab-fallback-chart.js-plotly-plot")
    assert chart.count() == 1
    assert _plot_ticks(page, chart) == FALLBACK_OPS
    assert fallback.locator(".nw-lab-treemap.js-plotly-plot").count() == 1
    ops_chart = fallback.locator(".nw-lab-ops-chart.js-plotly-plot")
    assert {"aten::sort", "aten::randn"} <= _plot_ticks(page, ops_chart)
    # Reports without fallbacks have no fallback chart.
    assert reports.nth(0).locator(".nw-lab-fallback-chart").count() == 0
    return fallback


def _bar(chart, index):
    """The centre of bar ``index`` of a chart's first trace (plotly's drag layer takes the clicks)."""
    bar = chart.locator(".trace.bars").first.locator(".point path").nth(index)
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def _sort_bar_index(chart) -> int:
    return chart.evaluate("gd => gd.data[0].y.indexOf('aten::sort')")


def _wait_status(page, source: str, text: str, timeout: int = 30_000) -> None:
    """Wait for the status bar item to read ``text`` from ``source``; say what it read if not."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.locator(f'.nw-lab-statusbar[data-source="{source}"]', has_text=text).wait_for(
            timeout=timeout
        )
    except PlaywrightTimeout:
        status = page.locator(".nw-lab-statusbar")
        raise AssertionError(
            f"status bar reads {status.inner_text()!r} from {status.get_attribute('data-source')!r},"
            f" not {text!r} from {source!r}"
        ) from None


def _hover_and_click_sort(page, fallback, cell_number: int):
    """Hover the aten::sort bar (its count), click it (its call site), return the sites pane."""
    chart = fallback.locator(".nw-lab-fallback-chart")
    x, y = _bar(chart, _sort_bar_index(chart))
    page.mouse.move(x, y)
    hover = page.locator(".nw-lab-fallback-chart .hoverlayer .hovertext")
    hover.first.wait_for(timeout=10_000)
    text = hover.first.text_content()
    assert "aten::sort" in text and "1 call(s) ran on the CPU" in text, text
    assert f"cell [{cell_number}], line 3" in text, text
    page.mouse.click(x, y)
    pane = fallback.locator(".nw-lab-fallback-sites")
    page.wait_for_function(
        "el => el.dataset.op === 'aten::sort'", arg=pane.element_handle(), timeout=10_000
    )
    assert "Call sites of aten::sort" in pane.inner_text()
    link = pane.locator(".nw-lab-site-link")
    assert link.first.inner_text() == f"cell [{cell_number}], line 3"
    return pane


@in_jupyterlab
def test_dashboard_compare_command_and_reports_without_kernel_after_reload(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.monotonic()
    saved: Path | None = None
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS)
        page = None
        try:
            # 1. Run the notebook with a kernel.
            with lab.jupyter_lab(tmp_path / "live") as (url, root):
                lab.write_notebook(root / "port.ipynb",
                                   [SETUP, PASS_CELL, FAIL_CELL, FALLBACK_CELL, PLAIN_CELL])  # fmt: skip
                page = browser.new_page(viewport={"width": 1500, "height": 1500})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{url}/lab/tree/port.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(
                    timeout=60_000
                )
                _open_dashboard(page)
                summary = page.locator("#neuron-workbench-dashboard .nw-lab-dash-summary")
                assert summary.inner_text() == (
                    "3 cells: 0 PASS, 0 FAIL, 0 ERROR, 3 not run; 0 fallback ops"
                )
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                _wait_rows(page, ["PASS", "FAIL", "PASS"])
                assert summary.inner_text() == "3 cells: 2 PASS, 1 FAIL, 0 ERROR; 2 fallback ops"
                rows = _rows(page)
                fallbacks = [rows.nth(i).locator(".nw-lab-dash-fallbacks").inner_text()
                             for i in range(3)]  # fmt: skip
                assert fallbacks == ["0 fallback ops", "0 fallback ops", "2 fallback ops"]
                assert (
                    rows.nth(1).locator(".nw-lab-dash-worst").inner_text() == "delta max|Δ| 1.0e+00"
                )
                assert rows.nth(1).locator(".nw-lab-dash-first").inner_text() == "output delta"
                fallback = _check_reports(page, ["PASS", "FAIL", "PASS"])

                # Hover and click the sort bar; its call site is a link to the cell line.
                pane = _hover_and_click_sort(page, fallback, cell_number=4)
                _show_top(fallback)
                page.screenshot(path=str(ARTIFACTS / "lab_report_live.png"))
                fallback.screenshot(path=str(ARTIFACTS / "lab_report_fallback_live.png"))
                cells = page.locator(".jp-Notebook .jp-Cell")
                cells.nth(0).locator(".jp-InputPrompt").click()  # another cell is active
                pane.locator(".nw-lab-site-link").first.click()
                page.wait_for_function(
                    "() => { const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];"
                    " const cell = cells[3]; return cell.classList.contains('jp-mod-active')"
                    " && cell.dataset.nwGotoLine === '3'; }",
                    timeout=10_000,
                )
                # the cursor is on that line (JupyterLab's status bar: "Ln 3, Col 1")
                page.locator(".jp-StatusBar-TextItem", has_text="Ln 3, Col 1").wait_for(
                    timeout=10_000
                )

                # Status bar: ref → target, asked from the kernel.
                _wait_status(page, "kernel", "cpu (as cuda) → neuron (emulated)")

                # The plain cell through the magic: keyboard shortcut on the active cell.
                cells = page.locator(".jp-Notebook .jp-Cell")
                cells.nth(4).locator(".jp-InputPrompt").click()
                toolbar_button = page.locator(
                    '.jp-cell-toolbar [data-command="neuron-workbench:compare-cell"]'
                )
                toolbar_button.first.wait_for(timeout=15_000)
                page.keyboard.press("Alt+Shift+N")
                _wait_rows(page, ["PASS", "FAIL", "PASS", "PASS"])
                assert cells.nth(4).locator(".nw-lab-report").count() == 1
                assert cells.nth(4).locator(".jp-InputArea-editor").inner_text().strip() == (
                    PLAIN_CELL
                )

                # Command palette lists the command.
                page.keyboard.press("Control+Shift+C")
                page.locator(".jp-mod-left .lm-CommandPalette-input, .lm-CommandPalette-input") \
                    .first.fill("Compare this cell")  # fmt: skip
                palette_item = page.locator(
                    ".lm-CommandPalette-item", has_text="Compare this cell on the target"
                )
                palette_item.first.wait_for(timeout=10_000)
                page.keyboard.press("Escape")

                # Clicking a dashboard row makes that cell active.
                rows.nth(1).click()
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]"
                    ".findIndex(c => c.classList.contains('jp-mod-active')) === 2",
                    timeout=10_000,
                )
                rows.nth(2).click()
                time.sleep(0.5)
                page.screenshot(path=str(ARTIFACTS / "lab_dashboard.png"))

                # Save and check the file: four reports, the plain cell's source untouched.
                cells.nth(2).locator(".jp-InputPrompt").click()
                page.keyboard.press("Control+s")
                path = root / "port.ipynb"
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with contextlib.suppress(Exception):
                        nb = _saved(path)
                        if sum(MIME in o.get("data", {}) for c in nb.cells
                               for o in c.get("outputs", [])) == 4:  # fmt: skip
                            break
                    time.sleep(0.5)
                nb = _saved(path)
                assert [c.source for c in nb.cells] == [
                    SETUP,
                    PASS_CELL,
                    FAIL_CELL,
                    FALLBACK_CELL,
                    PLAIN_CELL,
                ]
                assert sum(MIME in o.get("data", {}) for c in nb.cells
                           for o in c.get("outputs", [])) == 4  # fmt: skip
                saved = tmp_path / "saved.ipynb"
                saved.write_text(path.read_text())
                assert not [e for e in errors if "neuron" in e.lower()], errors
                page.close()

            # 2. A fresh JupyterLab with no kernel to start: the reports render from the file.
            config = tmp_path / "offline" / "config"
            config.mkdir(parents=True)
            (config / "jupyter_server_config.json").write_text(
                json.dumps({"KernelSpecManager": {"allowed_kernelspecs": ["no-such-kernel"]}})
            )
            with lab.jupyter_lab(tmp_path / "offline") as (url, root):
                (root / "port.ipynb").write_text(saved.read_text())
                page = browser.new_page(viewport={"width": 1500, "height": 1100})
                page.goto(f"{url}/lab/tree/port.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                # JupyterLab may ask for a kernel; decline.
                with contextlib.suppress(Exception):
                    dialog = page.locator(".jp-Dialog")
                    dialog.wait_for(timeout=5_000)
                    no_kernel = dialog.locator("button", has_text="No Kernel")
                    if no_kernel.count():
                        no_kernel.first.click()
                    else:
                        page.keyboard.press("Escape")
                fallback = _check_reports(page, ["PASS", "FAIL", "PASS", "PASS"])
                _hover_and_click_sort(page, fallback, cell_number=4)
                assert lab._get(f"{url}/api/kernels") == []
                _open_dashboard(page)
                _wait_rows(page, ["PASS", "FAIL", "PASS", "PASS"], timeout=30_000)
                summary = page.locator("#neuron-workbench-dashboard .nw-lab-dash-summary")
                assert summary.inner_text() == "4 cells: 3 PASS, 1 FAIL, 0 ERROR; 2 fallback ops"
                # Status bar falls back to the last report of the notebook.
                _wait_status(page, "report", "cpu (as cuda) → neuron (emulated)")
                report = page.locator(".jp-OutputArea-output .nw-lab-report").nth(2)
                _show_top(report)
                page.screenshot(path=str(ARTIFACTS / "lab_report_after_reload.png"))
                report.screenshot(path=str(ARTIFACTS / "lab_report_fallback.png"))
                fail = page.locator(".jp-OutputArea-output .nw-lab-report").nth(1)
                fail.screenshot(path=str(ARTIFACTS / "lab_report_fail.png"))
                assert lab._get(f"{url}/api/kernels") == []
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "lab_extension_failure.png"))
            for name in ("live", "offline"):
                with contextlib.suppress(Exception):
                    (ARTIFACTS / f"lab_extension_failure_{name}.log").write_bytes(
                        (tmp_path / name / "lab.log").read_bytes()
                    )
            raise
        finally:
            browser.close()
    assert time.monotonic() - started < 300


class _IdleDropper:
    """Routes a page's kernel websockets, dropping the iopub idle status of one request: the
    status bar's first kernel query, or the second cell the notebook runs. Its execute reply
    arrives, its idle status never does (a message lost to a reconnecting websocket or a loaded
    host)."""

    def __init__(self, of: str) -> None:
        self.of = of  # "query" or "cell"
        self.queries: list[str] = []
        self.cells: list[str] = []
        self.dropped = 0

    def route(self, ws) -> None:
        server = ws.connect_to_server()
        ws.on_message(lambda message: self._to_server(server, message))
        server.on_message(lambda message: self._to_page(ws, message))

    @staticmethod
    def _parts(message) -> tuple[str, list[dict]] | None:
        from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1

        if isinstance(message, str):  # the legacy JSON protocol
            msg = json.loads(message)
            return msg.get("channel", ""), [msg["header"], msg["parent_header"], {}, msg["content"]]
        channel, parts = deserialize_msg_from_ws_v1(message)
        return channel, [json.loads(part) for part in parts[:4]]

    def _to_server(self, server, message) -> None:
        channel, (header, _parent, _meta, content) = self._parts(message)
        if header.get("msg_type") == "execute_request":
            query = "nw" in content.get("user_expressions", {})
            (self.queries if query else self.cells).append(header["msg_id"])
        server.send(message)

    def _to_page(self, ws, message) -> None:
        channel, (header, parent, _meta, content) = self._parts(message)
        requests = self.queries[:1] if self.of == "query" else self.cells[1:2]
        if (
            channel == "iopub"
            and header.get("msg_type") == "status"
            and content.get("execution_state") == "idle"
            and parent.get("msg_id") in requests
        ):
            self.dropped += 1
            return
        ws.send(message)


@in_jupyterlab
@pytest.mark.parametrize("lost", ["query", "cell"])
def test_status_bar_answers_from_the_kernel_when_an_idle_status_is_lost(tmp_path, lost):
    # "query": the status bar's query (sent before the magics are loaded) stayed pending forever
    # and every later ask was dropped. "cell": the kernel looked busy forever after the cell that
    # follows the one loading the magics, and the bar waited for it to be idle before asking.
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    dropper = _IdleDropper(lost)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS)
        page = None
        try:
            with lab.jupyter_lab(tmp_path) as (url, root):
                lab.write_notebook(root / "status.ipynb", [SETUP, "z = 1"])
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.route_web_socket("**/api/kernels/**", dropper.route)
                page.goto(f"{url}/lab/tree/status.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                deadline = time.monotonic() + 60
                while not dropper.queries and time.monotonic() < deadline:
                    page.wait_for_timeout(200)  # the bar asked (the magics are not loaded yet)
                page.wait_for_timeout(500)
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                _wait_status(page, "kernel", "cpu (as cuda) → neuron (emulated)")
                assert dropper.dropped == 1, (dropper.queries, dropper.cells, dropper.dropped)
                assert len(dropper.queries) >= 2  # asked again after the cell ran
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / f"lab_status_lost_{lost}_idle_failure.png"))
            raise
        finally:
            browser.close()


def _show_top(element) -> None:
    element.evaluate("el => el.scrollIntoView({block: 'start'})")
    time.sleep(0.4)


@in_jupyterlab
def test_with_the_extension_disabled_the_cell_shows_the_widget(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    config = tmp_path / "config"
    config.mkdir()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
    subprocess.run(
        [sys.executable, "-m", "jupyterlab.labextensions", "disable", "--level=user", EXTENSION],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS)
        page = None
        try:
            with lab.jupyter_lab(tmp_path) as (url, root):
                lab.write_notebook(root / "plain.ipynb", [SETUP, FALLBACK_CELL])
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(f"{url}/lab/tree/plain.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(
                    timeout=60_000
                )
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                tab = page.locator(".jp-OutputArea-output .widget-tab")
                tab.first.wait_for(timeout=90_000)
                time.sleep(1.0)
                assert tab.count() == 1
                assert page.locator(".nw-lab-report").count() == 0  # the extension is off
                assert page.locator(".jp-OutputArea-output .nw-report").count() == 0
                summary = tab.locator(".nw-summary").first
                summary.wait_for(timeout=30_000)
                assert "2 ops fell back to CPU" in summary.inner_text()
                page.screenshot(path=str(ARTIFACTS / "lab_extension_disabled_widget.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "lab_extension_disabled_failure.png"))
            raise
        finally:
            browser.close()


COMPILE_SETUP = "%load_ext neuron_workbench\n" + MLP_SETUP
#: Two batch sizes (a recompile on the target) and a print inside a compiled function (a break).
COMPILE_CELL = compiled_mlp_cell(flags="")


@in_jupyterlab
def test_a_compiled_cell_shows_what_compile_did_in_a_closed_section(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS)
        page = None
        try:
            with lab.jupyter_lab(tmp_path) as (url, root):
                lab.write_notebook(root / "compiled.ipynb", [COMPILE_SETUP, COMPILE_CELL])
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{url}/lab/tree/compiled.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(
                    timeout=60_000
                )
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                report = page.locator(".jp-OutputArea-output .nw-lab-report")
                report.first.wait_for(timeout=120_000)
                assert report.get_attribute("data-verdict") == "PASS"
                section = report.locator(".nw-lab-compile-section")
                title = section.locator("summary").inner_text()
                assert title.startswith("torch.compile (cpu (as cuda): "), title
                assert "neuron (emulated): " in title and "1 graph break" in title, title
                # closed at first: its chart is drawn only when the section opens
                assert section.evaluate("el => el.open") is False
                chart = section.locator(".nw-lab-compile-chart")
                assert chart.get_attribute("data-drawn") is None
                section.locator("summary").click()
                page.wait_for_function(
                    "el => el.dataset.drawn === 'yes'", arg=chart.element_handle(), timeout=30_000
                )
                ticks = " ".join(_plot_ticks(page, chart))
                assert "cpu (as cuda)" in ticks and "neuron (emulated)" in ticks, ticks
                assert "host CPU time" in chart.locator(".gtitle").text_content()
                breaks = section.locator(".nw-lab-compile-breaks").inner_text()
                assert breaks.count("cell line 7") == 2, breaks  # both backends, the print's line
                recompiles = section.locator(".nw-lab-compile-recompiles").inner_text()
                assert "new shape for args[0]: (3, 8) → (5, 8)" in recompiles, recompiles
                # a row per graph, its compile time beside its run time (with its calls)
                assert "cpu (as cuda) g1" in ticks and "neuron (emulated) g1" in ticks, ticks
                assert "1×" in chart.locator(".trace.bars text").all_text_contents()
                # hovering a graph's compile bar says which graph it is and how long it ran; on
                # the log axis a bar's path starts far left of the plot, so point near its end
                segment = chart.locator(".trace.bars").first.locator(".point path").first
                box = segment.bounding_box()
                page.mouse.move(box["x"] + box["width"] - 8, box["y"] + box["height"] / 2)
                hover = chart.locator(".hoverlayer .hovertext")
                hover.first.wait_for(timeout=10_000)
                text = hover.first.text_content()
                assert "graph 1 of" in text and "call of the compiled graph" in text, text
                _show_top(section)
                section.screenshot(path=str(ARTIFACTS / "lab_report_compile.png"))
                assert not [e for e in errors if "neuron" in e.lower()], errors
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "lab_compile_failure.png"))
            with contextlib.suppress(Exception):
                (ARTIFACTS / "lab_compile_failure.log").write_bytes(
                    (tmp_path / "lab.log").read_bytes()
                )
            raise
        finally:
            browser.close()
