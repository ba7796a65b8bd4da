"""The package's layering: the one-way tier order, no cycles, no cross-package private modules,
and third-party imports only where they belong (see ``neuron_workbench._devtools.layers``)."""

import textwrap

import pytest

from neuron_workbench._devtools import layers
from neuron_workbench._devtools.layers import check, main, module_cycles, read_imports

# Today's violations, each with why it exists and what removes it. A NEW violation fails
# test_no_new_layer_violations; a FIXED one fails test_known_violations_are_still_real, so that
# this list only shrinks (delete the entry in the change that fixes it).
KNOWN_VIOLATIONS = {
    # views/__init__.py calls IPython.display.display to show a report; the magic layer (or a
    # _repr_mimebundle_ the shell displays) should do the displaying. Owner: views; not filed yet.
    "external: views -> IPython": "views displays through IPython.display; not filed yet",
}


@pytest.fixture(scope="module")
def violations():
    return {v.key: v for v in check(read_imports())}


def test_no_new_layer_violations(violations):
    new = [v.format() for key, v in violations.items() if key not in KNOWN_VIOLATIONS]
    assert not new, "new layering violations:\n" + "\n".join(new)


def test_known_violations_are_still_real(violations):
    fixed = sorted(set(KNOWN_VIOLATIONS) - set(violations))
    assert not fixed, f"fixed, so remove from KNOWN_VIOLATIONS: {fixed}"


def test_every_unit_of_the_package_is_placed_in_a_tier():
    placed = {unit for _, units in layers.TIERS for unit in units}
    units = {layers.unit_of(i.module) for i in read_imports()}
    assert units <= placed, units - placed
    assert {"views", "report", "compare", "trace", "run", "backends", "emulator"} <= units


# -- the checker on a small package written here -----------------------------------------------


def write_package(tmp_path, files):
    root = tmp_path / "neuron_workbench"
    for name, text in {"__init__.py": '__version__ = "1"\n', **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def keys(root):
    return sorted(v.key for v in check(read_imports(root), root.name))


def test_downward_imports_pass_and_the_command_exits_0(tmp_path, capsys):
    root = write_package(
        tmp_path,
        {
            "views/__init__.py": "import plotly\nfrom neuron_workbench.report import make\n",
            "report/__init__.py": "from ..compare import diff\nfrom neuron_workbench import __version__\n",
            "compare/__init__.py": "from neuron_workbench.errors import WorkbenchError\n",
            "errors.py": "class WorkbenchError(Exception): ...\n",
        },
    )
    assert keys(root) == []
    assert main(["--root", str(root)]) == 0
    assert "0 violations" in capsys.readouterr().out


def test_upward_and_peer_imports_fail_even_inside_functions(tmp_path, capsys):
    root = write_package(
        tmp_path,
        {
            "report/__init__.py": "def show():\n    from neuron_workbench.views import view\n",
            "views/__init__.py": "from neuron_workbench.report import show\n",
            "trace/__init__.py": "from neuron_workbench.compare import tolerances\n",
            "compare/tolerances.py": "",
        },
    )
    assert keys(root) == [
        "cycle: report <-> views",
        "layer: report -> views",
        "layer: trace -> compare",
    ]
    assert main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert (
        "neuron_workbench.report:2 (in a function)" in out and "3 violations" in out
    )  # the cycle is one more


def test_type_checking_imports_do_not_count(tmp_path):
    root = write_package(
        tmp_path,
        {
            "compare/__init__.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from neuron_workbench.report import Report
                else:
                    from neuron_workbench.views import View
            """,
            "report/__init__.py": "",
            "views/__init__.py": "",
        },
    )
    assert keys(root) == ["layer: compare -> views"]


def test_private_modules_of_another_unit(tmp_path):
    root = write_package(
        tmp_path,
        {
            "cli/__init__.py": "from neuron_workbench.artifacts import _format\n",
            "artifacts/__init__.py": "from neuron_workbench.artifacts._format import X\n",
            "artifacts/_format.py": "X = 1\n",
        },
    )
    assert keys(root) == ["private: cli -> neuron_workbench.artifacts._format"]


def test_third_party_imports_outside_their_owners(tmp_path):
    root = write_package(
        tmp_path,
        {
            "report/__init__.py": "import ipywidgets\nfrom IPython.display import HTML\n",
            "magics/__init__.py": "from IPython.core.magic import Magics\n",
            "scan/__init__.py": "def f():\n    import torch\n",
            "backends/neuron.py": "def load():\n    import torch_neuronx\n",
        },
    )
    assert keys(root) == [
        "external: report -> IPython",
        "external: report -> ipywidgets",
        "external: scan -> torch",
    ]


def test_unplaced_unit_is_a_violation(tmp_path):
    root = write_package(
        tmp_path, {"newthing/__init__.py": "from neuron_workbench import errors\n"}
    )
    (root / "errors.py").write_text("")
    assert keys(root) == ["layer: newthing -> errors"]
    (violation,) = check(read_imports(root), root.name)
    assert "newthing is in no tier" in violation.detail


def test_module_cycles_inside_a_unit_are_notes(tmp_path):
    root = write_package(
        tmp_path,
        {
            "trace/__init__.py": "",
            "trace/a.py": "def f():\n    from . import b\n",
            "trace/b.py": "from neuron_workbench.trace import a\n",
        },
    )
    assert keys(root) == []
    assert module_cycles(read_imports(root), root.name) == [
        ["neuron_workbench.trace.a", "neuron_workbench.trace.b"]
    ]
