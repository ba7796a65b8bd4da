"""Notebooks are scanned cell by cell; findings map to the code-cell index and the line in the cell."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.scan import ScanSyntaxError, migrate_path, scan_path, scan_paths

NOTEBOOK = Path(__file__).parent / "fixtures" / "notebooks" / "cuda_training.ipynb"
_EXPECT = re.compile(r"#\s*expect:\s*(NW\d{3}(?:\s*,\s*NW\d{3})*)")


def expected(path):
    """Counter of (code-cell index, line, rule id) from `# expect:` comments in code cells."""
    found = Counter()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for index, cell in enumerate(cells, 1):
        for line_no, line in enumerate("".join(cell["source"]).split("\n"), 1):
            if m := _EXPECT.search(line):
                for rule in re.split(r"\s*,\s*", m.group(1)):
                    found[(index, line_no, rule)] += 1
    return found


def test_findings_map_to_cell_and_line():
    got = Counter((f.cell, f.line, f.rule_id) for f in scan_path(NOTEBOOK))
    assert got == expected(NOTEBOOK)
    # `%time T.cuda.synchronize()` inside a loop is a magic line: masked, not scanned.
    assert (5, 2, "NW103") not in got


def test_notebook_linter_format():
    first = scan_path(NOTEBOOK)[0]
    assert first.format().startswith(f"{NOTEBOOK}:cell 1:3:1: NW131 ")


def test_directories_include_notebooks():
    assert scan_paths([NOTEBOOK.parent]) == scan_path(NOTEBOOK)


def test_notebook_migration_keeps_magics_and_other_cells(tmp_path):
    path = tmp_path / "nb.ipynb"
    path.write_text(NOTEBOOK.read_text())
    migration = migrate_path(path, write=True)
    assert "(cell 3)" in migration.diff and "(cell 2)" in migration.diff
    nb = json.loads(path.read_text())
    sources = ["".join(c["source"]) for c in nb["cells"]]
    assert sources[0] == "".join(json.loads(NOTEBOOK.read_text())["cells"][0]["source"])
    assert sources[4].startswith("%%neuron --target neuron\n")
    assert 'nn.Linear(4, 2).to("neuron")' in sources[4]
    assert "    %time T.cuda.synchronize()" in sources[6]  # magic lines are never rewritten
    assert "T.neuron.empty_cache()" in sources[6]
    assert sources[5].startswith("%%bash")
    assert not migrate_path(path).changed
    assert {f.rule_id for f in migration.remaining} == {"NW120", "NW111", "NW131"}


def test_bad_notebooks(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    with pytest.raises(WorkbenchUsageError, match="cannot read notebook"):
        scan_path(broken)
    bad_cell = tmp_path / "bad_cell.ipynb"
    nb = json.loads(NOTEBOOK.read_text())
    nb["cells"].append(
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": ["x = (\n"],
        }
    )
    bad_cell.write_text(json.dumps(nb))
    with pytest.raises(
        ScanSyntaxError, match=r"bad_cell\.ipynb:cell 6:1:\d+: cannot parse"
    ) as raised:
        scan_path(bad_cell)

    # the other cells were scanned all the same: one broken cell hid every finding of the notebook
    def places(findings):
        return [(f.rule_id, f.cell, f.line, f.col) for f in findings]

    assert places(raised.value.findings) == places(scan_path(NOTEBOOK))
    assert raised.value.findings
