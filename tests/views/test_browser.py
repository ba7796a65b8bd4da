"""Real browser: JupyterLab + Debian chromium (Playwright) runs a ``%%neuron --profile`` notebook.

The test starts its own JupyterLab on a free localhost port with isolated config, data, runtime,
settings and workspace folders, opens a notebook it wrote, runs all cells through the Run menu, and
checks the DOM: the report's tab widget (``--widget``: the cell's one view, even with the
neuron-workbench-lab extension installed) with its titles, and, on the Fallbacks tab, the Plotly
bar chart naming the ops that fell back. It saves screenshots to ``test-artifacts/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium")
LAB_EXTENSION = Path(sys.prefix, "share/jupyter/labextensions/neuron-workbench-lab/package.json")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
# The "get notified about Jupyter news?" toast covers screenshots (shared/notes/ecosystem.md §3);
# the kernel dialog must not wait for a click.
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"autoStartDefaultKernel": True},
}  # fmt: skip

MODEL_CELL = """import torch
import torch.nn as nn
import torch.nn.functional as F

class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        logits = self.fc(torch.flatten(x, 1))
        return torch.sort(logits, dim=1).values

images = torch.randn(4, 3, 16, 16)"""
PROFILE_CELL = """%%neuron --profile --widget
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = TinyNet().to(device)
out = model(images.to(device))
out.sum().backward()"""
EXPECTED_FALLBACK_OPS = [
    "aten::max_pool2d_with_indices",
    "aten::max_pool2d_with_indices_backward",
    "aten::sort",
]
# The magic attaches the scanner's findings for a neuron target, hence the Migration tab.
TAB_TITLES = ["Summary", "Numerics", "Layers", "Ops", "Fallbacks", "Migration"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def jupyter_lab(tmp: Path):
    """A JupyterLab server in its own process group, with every folder under ``tmp``."""
    dirs = {name: tmp / name for name in ("root", "config", "data", "runtime", "settings",
                                          "user-settings", "workspaces")}  # fmt: skip
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    (dirs["settings"] / "overrides.json").write_text(json.dumps(LAB_OVERRIDES))
    env = dict(os.environ)
    env.pop("NEURON_WORKBENCH_EMULATE", None)  # the kernel's %load_ext picks the device
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(tmp / "ipython"),
    )
    port = _free_port()
    log = open(tmp / "lab.log", "wb")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.port_retries=0", "--ServerApp.disable_check_xsrf=True", "--allow-root",
         f"--ServerApp.root_dir={dirs['root']}",
         f"--LabApp.app_settings_dir={dirs['settings']}",
         f"--LabApp.user_settings_dir={dirs['user-settings']}",
         f"--LabApp.workspaces_dir={dirs['workspaces']}",
         "--FileContentsManager.delete_to_trash=False"],
        cwd=dirs["root"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {(tmp / 'lab.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError, ValueError):
                _get(f"{url}/api/status")
                break
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter lab did not start within 60 s")
            time.sleep(0.25)
        yield url, dirs["root"]
    finally:
        # Kernels first (through the API), then the server's own process group.
        with contextlib.suppress(Exception):
            for kernel in _get(f"{url}/api/kernels"):
                request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}",
                                                 method="DELETE")  # fmt: skip
                urllib.request.urlopen(request, timeout=10).close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)
        log.close()


def _show_top(element) -> None:
    """Scroll the notebook so the element's top (the tab bar) is at the top of the viewport."""
    element.evaluate("el => el.scrollIntoView({block: 'start'})")
    time.sleep(0.3)


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed "
                    "(scripts/install_browser.sh installs it; CI runs it)")  # fmt: skip
def test_profile_cell_renders_report_tabs_and_fallback_chart_in_jupyterlab(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.monotonic()
    with jupyter_lab(tmp_path) as (url, root):
        write_notebook(root / "profile.ipynb",
                       ["%load_ext neuron_workbench", MODEL_CELL, PROFILE_CELL])  # fmt: skip
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1500})
                page_errors: list[str] = []
                page.on("pageerror", lambda exc: page_errors.append(str(exc)))
                page.goto(f"{url}/lab/tree/profile.ipynb")
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
                # The kernel is connected once the status bar names it and says Idle.
                page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(
                    timeout=60_000
                )
                # Run → Run All Cells, through the real menu.
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

                tab = page.locator(".widget-tab").first
                tab.wait_for(timeout=90_000)
                # --widget: the widget is the cell's one view, also where the lab extension is
                assert page.locator(".widget-tab").count() == 1
                assert page.locator(".jp-OutputArea-output .nw-lab-report").count() == 0
                labels = tab.locator(".lm-TabBar-tabLabel")
                assert labels.all_inner_texts() == TAB_TITLES

                # The summary tab (selected) shows the verdict, times labelled by kind.
                summary = tab.locator(".nw-summary").first
                summary.wait_for(timeout=30_000)
                assert "PASS" in summary.inner_text()
                assert "host CPU time" in summary.inner_text()

                # The Fallbacks tab: the bar chart names exactly the ops that fell back.
                labels.filter(has_text="Fallbacks").click()
                panel = tab.locator(".widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)")
                chart = panel.locator(".js-plotly-plot").first
                chart.wait_for(timeout=60_000)
                page.wait_for_function(
                    "el => el.querySelectorAll('.ytick text').length >= 3",
                    arg=chart.element_handle(),
                    timeout=30_000,
                )
                ticks = chart.locator(".yaxislayer-above .ytick text").all_text_contents()
                assert sorted(set(ticks)) == EXPECTED_FALLBACK_OPS, ticks
                assert "CPU fallbacks on neuron (emulated)" in chart.text_content()
                assert "3 ops fell back to CPU" in panel.locator(".nw-fallbacks").inner_text()

                # Clicking a bar shows that op's call sites.
                # (plotly's drag layer takes the pointer events, so click where the bar is)
                bar = chart.locator(".point path").first
                bar.scroll_into_view_if_needed()
                box = bar.bounding_box()
                page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.wait_for_selector(".nw-sites li", timeout=15_000)
                sites = panel.locator(".nw-sites").inner_text()
                assert "Call sites of" in sites

                _show_top(tab)
                page.screenshot(path=str(ARTIFACTS / "browser_report_view.png"))

                # The Ops tab: reference and target op times side by side.
                labels.filter(has_text="Ops").click()
                ops_chart = panel.locator(".js-plotly-plot").first
                ops_chart.wait_for(timeout=60_000)
                page.wait_for_function(
                    "el => el.querySelectorAll('.ytick text').length >= 3",
                    arg=ops_chart.element_handle(),
                    timeout=30_000,
                )
                op_ticks = set(ops_chart.locator(".ytick text").all_text_contents())
                assert {"aten::convolution", "aten::addmm"} <= op_ticks, op_ticks
                legend = ops_chart.locator(".legendtext").all_text_contents()
                assert any("host CPU time" in text for text in legend), legend
                _show_top(tab)
                page.screenshot(path=str(ARTIFACTS / "browser_report_ops.png"))

                if LAB_EXTENSION.exists():
                    # The porting dashboard still finds the report (in the output's metadata).
                    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="neuron-workbench-dashboard"]'
                                 ).click()  # fmt: skip
                    summary = page.locator("#neuron-workbench-dashboard .nw-lab-dash-summary")
                    summary.wait_for(timeout=30_000)
                    page.wait_for_function(
                        "el => el.textContent.includes('1 PASS')", arg=summary.element_handle(),
                        timeout=30_000,
                    )  # fmt: skip
                    assert summary.inner_text() == (
                        "1 cell: 1 PASS, 0 FAIL, 0 ERROR; 3 fallback ops"
                    )
                assert not [e for e in page_errors if "widget" in e.lower()], page_errors
                assert page.locator("text=Error displaying widget").count() == 0
            except BaseException:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / "browser_failure.png"))
                    (ARTIFACTS / "browser_failure_lab.log").write_bytes(
                        (tmp_path / "lab.log").read_bytes()
                    )
                raise
            finally:
                browser.close()
    assert time.monotonic() - started < 120
