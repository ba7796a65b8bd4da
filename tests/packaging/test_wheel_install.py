"""A user's install: the wheel that ``python -m build --wheel`` builds, in a fresh venv, no Node.js.

Once per module: the wheel is built from this checkout (the build hook reuses the JupyterLab
extension that ``scripts/setup_env.sh`` built, else builds it, which needs Node.js), a fresh venv
gets ``torch==2.13.0`` first (so no CUDA build is pulled) and then the wheel, its dependencies from
the package index, and every command in that venv runs with a ``PATH`` holding the venv's ``bin``
and the system's tools without Node.js (``node``, ``npm``, ``npx``, ``corepack``, ``yarn`` left
out). The tests check what a user gets from ``pip install neuron-workbench``: the extension listed
enabled and OK, ``%load_ext neuron_workbench`` and a ``%%neuron`` cell that passes with no warning,
the package data (the emulator's C++ core, coverage tables, report schemas), the console script,
a JupyterLab that starts with the extension and without warnings in its log, and (Debian chromium)
a saved report rendered by the extension with its Plotly chart in that JupyterLab, no kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import pytest

import neuron_workbench

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = "neuron-workbench-lab"
EXTENSION_SOURCE = ROOT / "extensions" / EXTENSION
BUILT_EXTENSION = ROOT / "workbench" / "neuron_workbench" / "labextension" / "static" / "style.js"
REPORT_MIME = "application/vnd.neuron-workbench.report+json"
NODE_TOOLS = {"node", "nodejs", "npm", "npx", "corepack", "yarn", "yarnpkg", "pnpm"}
CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
ANSI = re.compile(r"\x1b\[[0-9;]*m")

SETUP_CELL = "%load_ext neuron_workbench\nimport torch"
FALLBACK_CELL = (
    '%%neuron --profile -o report\nv = torch.randn(8, device="cuda")\nvalues, order = torch.sort(v)'
)
# Run in the fresh venv: the cells as a user runs them, in a real IPython shell; the report's one
# display (the MIME bundle a kernel would send) is saved as a notebook for the browser test.
USER_SESSION = f"""
import importlib.metadata, importlib.resources, json, sys
import nbformat
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
import neuron_workbench
from neuron_workbench.emulator import native
from neuron_workbench.testing import run_cell

shell = InteractiveShell.instance()
for line in {SETUP_CELL!r}.splitlines():
    run_cell(shell, line)
with capture_output() as captured:
    run_cell(shell, {FALLBACK_CELL!r})
report = shell.user_ns["report"]
print("SUMMARY", report.summary())
[display] = [o for o in captured.outputs if {REPORT_MIME!r} in o.data]
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell({SETUP_CELL!r}), nbformat.v4.new_code_cell({FALLBACK_CELL!r})]
nb.cells[1].outputs = [nbformat.v4.new_output("display_data", data=display.data,
                                               metadata=display.metadata)]
nbformat.write(nb, sys.argv[1])
files = [str(f) for f in importlib.metadata.files("neuron-workbench")]
package = importlib.resources.files("neuron_workbench")
print("FACTS", json.dumps({{
    "module": neuron_workbench.__file__,
    "version": importlib.metadata.version("neuron-workbench"),
    "emucore": str(native.SOURCE),
    "emucore_is_file": package.joinpath("emulator/native/emucore.cpp").is_file(),
    "files": files,
    "core": native.describe(),
}}))
"""


def _run(cmd, *, env, timeout, cwd=None) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, (
        f"{cmd} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def _path_without_node(shim: Path, venv_bin: Path) -> str:
    """The venv's bin, then the system's tools (one folder of links) without Node.js."""
    shim.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = os.path.realpath(entry.path)
            if (
                entry.name in NODE_TOOLS
                or os.path.basename(target) in NODE_TOOLS
                or "node_modules" in target
            ):
                continue
            link = shim / entry.name
            if not os.path.lexists(link):
                link.symlink_to(entry.path)
    path = os.pathsep.join([str(venv_bin), str(shim)])
    assert shutil.which("node", path=path) is None
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not BUILT_EXTENSION.exists() and shutil.which("node") is None:
        pytest.skip(
            "the JupyterLab extension is not built and Node.js is missing: the wheel cannot be built"
        )
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", out, ROOT],
         env=dict(os.environ), timeout=600)  # fmt: skip
    print(f"wheel built in {time.monotonic() - started:.0f} s")
    [built] = out.glob("neuron_workbench-*.whl")
    return built


@pytest.fixture(scope="module")
def user_venv(wheel, tmp_path_factory):
    """A fresh venv with torch 2.13.0 and the wheel; its environment without Node.js."""
    base = tmp_path_factory.mktemp("user")
    venv = base / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"}
        and not key.startswith("JUPYTER")
        and not (key.startswith("NEURON_WORKBENCH") and key != "NEURON_WORKBENCH_CACHE")
    }
    env["PATH"] = _path_without_node(base / "bin-without-node", venv / "bin")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # Isolated from the user's Jupyter folders: a labextension found there would hide a missing one.
    for name in ("config", "data", "runtime"):
        (base / "jupyter" / name).mkdir(parents=True)
        env[f"JUPYTER_{name.upper()}_DIR"] = str(base / "jupyter" / name)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--quiet"]
    _run([*pip, "torch==2.13.0"], env=env, timeout=600, cwd=base)
    _run([*pip, wheel], env=env, timeout=900, cwd=base)
    print(f"fresh venv with torch and the wheel in {time.monotonic() - started:.0f} s")
    return venv, env, base


@pytest.fixture(scope="module")
def user_session(user_venv):
    """The ``%load_ext`` + ``%%neuron`` session in the venv: (process, facts, saved notebook)."""
    venv, env, base = user_venv
    notebook = base / "saved_report.ipynb"
    out = _run([venv / "bin" / "python", "-W", "default", "-c", USER_SESSION, notebook],
               env=env, timeout=300, cwd=base)  # fmt: skip
    facts = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("FACTS "))[6:])
    return out, facts, notebook


@pytest.mark.slow
def test_wheel_ships_the_extension_and_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"neuron_workbench-{neuron_workbench.__version__}.data/data/"
    shared = f"{data}share/jupyter/labextensions/{EXTENSION}/"
    for name in ("package.json", "install.json", "static/style.js",
                 f"schemas/{EXTENSION}/plugin.json"):  # fmt: skip
        assert shared + name in names, name
    assert any(n.startswith(shared + "static/remoteEntry.") for n in names)
    assert not [n for n in names if n.startswith(data) and not n.startswith(shared)]
    for name in ("emulator/native/emucore.cpp", "emulator/coverage/neuron-2026-04.txt",
                 "emulator/coverage/tpu-0.2.0.txt", "report/report.schema.json",
                 "report/run.schema.json"):  # fmt: skip
        assert f"neuron_workbench/{name}" in names, name
    # the built extension ships once, as shared data, not inside the import package
    assert not [n for n in names if n.startswith("neuron_workbench/labextension/")]
    with zipfile.ZipFile(wheel) as archive:
        install = json.loads(archive.read(shared + "install.json"))
        entry_points = archive.read(
            f"neuron_workbench-{neuron_workbench.__version__}.dist-info/entry_points.txt"
        ).decode()
        metadata = archive.read(
            f"neuron_workbench-{neuron_workbench.__version__}.dist-info/METADATA"
        ).decode()
    assert install["packageName"] == "neuron-workbench"
    assert "neuron_workbench = neuron_workbench.emulator.autoload:autoload" in entry_points
    assert "neuron-workbench = neuron_workbench.cli.main:main" in entry_points
    assert "Provides-Extra: ray" in metadata.splitlines()
    assert "Requires-Dist: ray[client]>=2.9; extra == 'ray'" in metadata.splitlines()


@pytest.mark.slow
def test_sdist_carries_the_sources_and_the_built_extension_and_builds_without_node(wheel, tmp_path):
    # (after the wheel fixture: the extension is built by then)
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", tmp_path / "dist", ROOT],
         env=dict(os.environ), timeout=300)  # fmt: skip
    [sdist] = (tmp_path / "dist").glob("neuron_workbench-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = f"neuron_workbench-{neuron_workbench.__version__}/"
        names = {name.removeprefix(top) for name in archive.getnames()}
        archive.extractall(tmp_path / "src", filter="data")
    for name in ("pyproject.toml", "workbench/neuron_workbench/emulator/native/emucore.cpp",
                 "workbench/neuron_workbench/labextension/package.json",
                 "workbench/neuron_workbench/labextension/static/style.js",
                 f"extensions/{EXTENSION}/package.json", f"extensions/{EXTENSION}/install.json",
                 f"extensions/{EXTENSION}/src/index.js"):  # fmt: skip
        assert name in names, name
    assert not [n for n in names if "node_modules" in n]
    # A wheel from the sdist reuses its built extension: no Node.js needed.
    env = dict(os.environ)
    env["PATH"] = _path_without_node(tmp_path / "bin-without-node", Path(sys.executable).parent)
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "wheel",
          tmp_path / "src" / top],
         env=env, timeout=300)  # fmt: skip
    [built] = (tmp_path / "wheel").glob("neuron_workbench-*.whl")
    assert sorted(zipfile.ZipFile(built).namelist()) == sorted(zipfile.ZipFile(wheel).namelist())


@pytest.mark.slow
def test_labextension_is_listed_enabled_in_the_fresh_venv(user_venv):
    venv, env, base = user_venv
    out = _run([venv / "bin" / "jupyter", "labextension", "list"], env=env, timeout=120, cwd=base)
    text = ANSI.sub("", out.stdout + out.stderr)
    # the extension's line sits under the venv's own labextensions folder
    section = text.split(str(venv / "share" / "jupyter" / "labextensions"), 1)[1]
    line = next((ln for ln in section.splitlines() if EXTENSION in ln), "")
    assert f"{EXTENSION} v{neuron_workbench.__version__} enabled OK" in line, text
    assert "(python, neuron-workbench)" in line, text
    assert "warn" not in text.lower(), text


@pytest.mark.slow
def test_load_ext_and_a_neuron_cell_pass_without_warnings(user_venv, user_session):
    venv, env, base = user_venv
    out, facts, _ = user_session
    site = venv / "lib"
    assert Path(facts["module"]).is_relative_to(site), facts["module"]
    assert facts["version"] == neuron_workbench.__version__
    summary = next(ln for ln in out.stdout.splitlines() if ln.startswith("SUMMARY "))
    assert summary.startswith("SUMMARY PASS neuron (emulated) vs cpu (as cuda)"), out.stdout
    assert "2 ops fell back to CPU" in summary
    # no warning of any kind (python -W default shows every warning once), from us or anyone
    assert "warning" not in out.stderr.lower(), out.stderr
    # the facts line lists the wheel's files (run/warning_sites.py among them)
    printed = "\n".join(ln for ln in out.stdout.splitlines() if not ln.startswith("FACTS "))
    assert "warning" not in printed.lower(), out.stdout
    # the emulator's C++ core ships as package data beside its loader
    assert facts["emucore_is_file"]
    assert Path(facts["emucore"]).is_relative_to(site) and Path(facts["emucore"]).is_file()
    assert "neuron_workbench/emulator/native/emucore.cpp" in facts["files"]
    assert "neuron_workbench/emulator/coverage/neuron-2026-04.txt" in facts["files"]
    assert "neuron_workbench/report/report.schema.json" in facts["files"]
    cli = _run([venv / "bin" / "neuron-workbench", "--version"], env=env, timeout=60, cwd=base)
    assert cli.stdout.strip() == f"neuron-workbench {neuron_workbench.__version__}"


def test_version_is_one_number_for_python_and_the_extension():
    package = json.loads((EXTENSION_SOURCE / "package.json").read_text())
    assert package["version"] == neuron_workbench.__version__


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def user_lab(user_venv):
    """JupyterLab from the fresh venv (no kernel may start); yields (url, token, root, log path)."""
    venv, env, base = user_venv
    lab = base / "lab"
    dirs = {name: lab / name for name in ("root", "settings", "user-settings", "workspaces")}
    for path in dirs.values():
        path.mkdir(parents=True)
    # The news toast covers screenshots (shared/notes/ecosystem.md §3).
    (dirs["settings"] / "overrides.json").write_text(json.dumps(
        {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                         "checkForUpdates": False}}
    ))  # fmt: skip
    config = Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    config.write_text(
        json.dumps({"KernelSpecManager": {"allowed_kernelspecs": ["no-such-kernel"]}})
    )
    port = _free_port()
    token = secrets.token_hex(16)  # a real token: no "authentication is disabled" warning
    log_path = lab / "lab.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [venv / "bin" / "jupyter", "lab", "--no-browser", f"--port={port}",
             f"--IdentityProvider.token={token}", "--ServerApp.ip=127.0.0.1",
             "--ServerApp.port_retries=0", "--allow-root", f"--ServerApp.root_dir={dirs['root']}",
             f"--LabApp.app_settings_dir={dirs['settings']}",
             f"--LabApp.user_settings_dir={dirs['user-settings']}",
             f"--LabApp.workspaces_dir={dirs['workspaces']}"],
            cwd=dirs["root"], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while True:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {log_path.read_text()[-3000:]}")
                with contextlib.suppress(OSError, ValueError):
                    _fetch(url, token, "/api/status")
                    break
                assert time.monotonic() < deadline, "jupyter lab did not start within 90 s"
                time.sleep(0.25)
            yield url, token, dirs["root"], log_path
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=5)


@pytest.mark.slow
def test_jupyter_lab_serves_the_extension_and_logs_no_warning(user_lab):
    url, token, _, log_path = user_lab
    page = _fetch(url, token, "/lab").decode()
    config = re.search(
        r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S
    )
    assert config, page[:2000]
    federated = {e["name"]: e for e in json.loads(config.group(1))["federated_extensions"]}
    assert EXTENSION in federated, sorted(federated)
    assert federated[EXTENSION]["extension"].startswith("./")  # the prebuilt plugin's module
    log = log_path.read_text()
    # JupyterLab's log levels: [W ...] warnings, [E ...] errors, [C ...] critical
    flagged = [ln for ln in log.splitlines() if re.match(r"\[[WEC] ", ln) or "Traceback" in ln]
    assert not flagged, log


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed "
                    "(scripts/install_browser.sh installs it; CI runs it)")  # fmt: skip
def test_jupyter_lab_from_the_wheel_renders_a_saved_report(user_lab, user_session, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    url, token, root, log_path = user_lab
    _, _, notebook = user_session
    saved = nbformat.read(notebook, as_version=4)
    assert REPORT_MIME in saved.cells[1].outputs[0]["data"]
    (root / "report.ipynb").write_text(notebook.read_text())
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{url}/lab/tree/report.ipynb?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
            with contextlib.suppress(Exception):  # no kernel may start: decline if asked
                dialog = page.locator(".jp-Dialog")
                dialog.wait_for(timeout=5_000)
                no_kernel = dialog.locator("button", has_text="No Kernel")
                if no_kernel.count():
                    no_kernel.first.click()
                else:
                    page.keyboard.press("Escape")
            report = page.locator(".jp-OutputArea-output .nw-lab-report")
            report.first.wait_for(timeout=60_000)
            assert report.count() == 1
            assert report.first.get_attribute("data-verdict") == "PASS"
            assert report.first.locator(".nw-lab-badge").inner_text() == "PASS"
            page.wait_for_function(
                "el => el.dataset.charts === 'drawn'", arg=report.first.element_handle(),
                timeout=60_000,
            )  # fmt: skip
            chart = report.first.locator(".nw-lab-fallback-chart.js-plotly-plot")
            assert chart.count() == 1
            page.wait_for_function(
                "el => el.querySelectorAll('.ytick text').length >= 2", arg=chart.element_handle(),
                timeout=30_000,
            )  # fmt: skip
            ticks = set(chart.locator(".yaxislayer-above .ytick text").all_text_contents())
            assert ticks == {"aten::normal_", "aten::sort"}
            report.first.evaluate("el => el.scrollIntoView({block: 'start'})")
            time.sleep(0.4)
            page.screenshot(path=str(tmp_path / "wheel_lab_report.png"))
            assert not [e for e in errors if "neuron" in e.lower()], errors
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(tmp_path / "wheel_lab_failure.png"))
            raise
        finally:
            browser.close()
    assert json.loads(_fetch(url, token, "/api/kernels")) == []
    # Serving the page logs JupyterLab's own "Could not determine jupyterlab build status without
    # nodejs" and "Notebook report.ipynb is not trusted" warnings; none may name the workbench.
    log = log_path.read_text()
    flagged = [ln for ln in log.splitlines() if re.match(r"\[[WEC] ", ln) or "Traceback" in ln]
    assert not [ln for ln in flagged if "neuron" in ln.lower() or "Traceback" in ln], log


def _fetch(url: str, token: str, path: str) -> bytes:
    request = urllib.request.Request(url + path, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()
