"""The package's import layering: the import-linter contracts in pyproject's ``[tool.importlinter]``.

``lint-imports`` reads every import of the package (inside functions too, not under
``if TYPE_CHECKING:``) and checks the contracts: one-way layers, private modules, and which layers
import IPython, plotly, ipywidgets, the device SDKs and torch. A known violation is an
``ignore_imports`` entry of its contract, and one that no longer matches an import fails the run.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="import-linter 2.17 (the test extra) needs Python 3.11"
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "neuron_workbench"
FAKE = "fake_workbench"


def config() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "importlinter"
    ]


def lint_imports(*config_files: Path, cwd: Path, pythonpath: Path) -> tuple[int, str]:
    exe = Path(sys.executable).with_name("lint-imports")
    assert exe.exists(), f"no {exe}: install the test extra (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "NO_COLOR": "1", "COLUMNS": "300"}
    done = subprocess.run(
        [str(exe), "--no-cache", "--no-logo", *map(str, config_files)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def layer_units(cfg: dict) -> list[str]:
    (layers,) = [c for c in cfg["contracts"] if c["type"] == "layers"]
    return [unit.strip() for layer in layers["layers"] for unit in re.split(r"[|:]", layer)]


def test_the_package_keeps_every_contract():
    rc, out = lint_imports(cwd=REPO, pythonpath=REPO / "workbench")
    n = len(config()["contracts"])
    assert rc == 0 and f"Contracts: {n} kept, 0 broken." in out, out


def test_the_device_sdk_contract_covers_every_layer_but_backends():
    # Its source modules are listed by hand (see pyproject): keep them in step with the layers.
    cfg = config()
    (sdks,) = [c for c in cfg["contracts"] if c["id"] == "device-sdks"]
    expected = {f"{PACKAGE}.{unit}" for unit in layer_units(cfg)} - {f"{PACKAGE}.backends"}
    assert set(sdks["source_modules"]) == expected


# -- the same contracts on a small package written here -----------------------------------------


def toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return json.dumps(value)  # a str: JSON's escapes are TOML's


def renamed(value):
    if isinstance(value, str):
        return re.sub(rf"\b{PACKAGE}\b", FAKE, value)
    if isinstance(value, list):
        return [renamed(v) for v in value]
    return value


def write_contracts(path: Path) -> int:
    """pyproject's contracts with neuron_workbench renamed; returns how many contracts."""
    cfg = config()
    lines = ["[tool.importlinter]"]
    lines += [f"{k} = {toml(renamed(v))}" for k, v in cfg.items() if k != "contracts"]
    for contract in cfg["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{k} = {toml(renamed(v))}" for k, v in contract.items()]
        # The small package need not repeat every known violation that the real one ignores.
        lines.append('unmatched_ignore_imports_alerting = "none"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(cfg["contracts"])


# Allowed imports: downward ones, third-party packages where they belong, a unit's own private
# module, the version (a leaf of the bottom layer) and, under TYPE_CHECKING, an upward one.
CLEAN = {
    "version/__init__.py": '__version__ = "1"\n',
    "__init__.py": """\
        from fake_workbench.version import __version__
        def load_ipython_extension(ipython):
            from fake_workbench.magics import register
        def emulate():
            from fake_workbench.emulator import emulate
    """,
    "magics/__init__.py": "import IPython\nfrom fake_workbench.views import show\n",
    "views/__init__.py": "import plotly\nimport ipywidgets\nfrom fake_workbench.report import report\n",
    "report/report.py": "from fake_workbench.version import __version__\nfrom ..compare import diff\n",
    "compare/__init__.py": """\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from fake_workbench.report.report import Report
        def diff():
            from fake_workbench.trace import ops
    """,
    "trace/ops.py": "import torch\nfrom fake_workbench.backends import load\n",
    "scan/__init__.py": "import libcst\nfrom fake_workbench.errors import WorkbenchError\n",
    "backends/__init__.py": "def load():\n    import torch_neuronx\n    from fake_workbench import emulator\n",
    "emulator/__init__.py": "import torch\nfrom fake_workbench.emulator._core import emulate\n",
    "emulator/_core.py": "from fake_workbench.cuda_semantics import semantics\n",
}

# One of each kind of violation, each breaking one contract.
VIOLATIONS = {
    "trace/layers.py": "def f():\n    from fake_workbench.compare import diff\n",  # upward
    "run/cell.py": "from fake_workbench.scan import cells\n",  # a peer of the same layer
    "report/display.py": "from IPython.display import HTML\nimport ipywidgets\n",
    "scan/checks.py": "def f():\n    import torch\n",
    "emulator/device.py": "import torch_tpu\n",
    "cli/__init__.py": "from fake_workbench.emulator._core import emulate\n",
    "newthing.py": "",  # placed in no layer
}


def write_package(root: Path, files: dict[str, str]) -> None:
    units = layer_units(config())
    for name, text in {**{f"{u}/__init__.py": "" for u in units}, **CLEAN, **files}.items():
        path = root / FAKE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_contracts_keep_a_package_with_allowed_imports_only(tmp_path):
    n = write_contracts(tmp_path / "contracts.toml")
    write_package(tmp_path, {})
    rc, out = lint_imports(tmp_path / "contracts.toml", cwd=tmp_path, pythonpath=tmp_path)
    assert rc == 0 and f"Contracts: {n} kept, 0 broken." in out, out


def test_each_kind_of_violation_breaks_its_contract(tmp_path):
    n = write_contracts(tmp_path / "contracts.toml")
    write_package(tmp_path, VIOLATIONS)
    rc, out = lint_imports(tmp_path / "contracts.toml", cwd=tmp_path, pythonpath=tmp_path)
    assert rc == 1 and f"Contracts: 0 kept, {n} broken." in out, out
    names = {c["id"]: c["name"] for c in config()["contracts"]}
    for contract in names.values():
        assert f"{contract} BROKEN" in out, out
    for expected in [
        # layers: exhaustive, then upward (in a function) and peer imports
        "- fake_workbench.newthing",
        "fake_workbench.trace is not allowed to import fake_workbench.compare",
        "- fake_workbench.trace.layers -> fake_workbench.compare (l.2)",
        "fake_workbench.run is not allowed to import fake_workbench.scan",
        # private modules, third-party packages
        "fake_workbench.cli -> fake_workbench.emulator._core",
        "- fake_workbench.report.display -> IPython (l.1)",
        "- fake_workbench.report.display -> ipywidgets (l.2)",
        "fake_workbench.emulator.device -> torch_tpu",
        "fake_workbench.scan.checks -> torch",
    ]:
        assert expected in out, f"{expected!r} not in:\n{out}"


def test_no_module_of_the_package_imports_itself_back():
    """No import cycle: not even through a function-level import (grimp sees those too)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("neuron_workbench")
    # Tarjan's strongly connected components, iteratively: any component of two or more is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert cycles == []
