"""run_notebook executes a real kernel; the report files (run document, JUnit) built from it."""

import json
import xml.etree.ElementTree as ET

import pytest
from nbformat.v4 import new_markdown_cell

from neuron_workbench.artifacts import load
from neuron_workbench.cli.main import main
from neuron_workbench.cli.notebook_runner import (
    InputResult,
    junit_xml,
    run_document,
    run_notebook,
)
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.testing import write_notebook

CELLS = [
    "import torch",
    "%%neuron\nok = torch.ones(3, device='cuda') * 2",
    "raise ValueError('bad <script>alert(1)</script> \\x1b[31m value')",
    "%%neuron --target gpu9000\nx = 1",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nb")
    path = write_notebook(folder / "mixed.ipynb", new_markdown_cell("# title"), *CELLS)
    seen = []
    result = run_notebook(
        path,
        options={"ref": "cpu", "target": "neuron", "rtol": 1e-3, "atol": 1e-4},
        record_dir=str(folder / "rec"),
        progress=lambda done, total: seen.append((done, total)),
    )
    return result, seen, folder


def test_reports_cell_errors_and_progress(executed):
    result, seen, _ = executed
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert result.kind == "notebook" and result.cells == 4
    assert [(r["label"], r["verdict"]) for r in result.reports] == [("cell 2", "PASS")]
    options = result.reports[0]["options"]
    assert (
        options.get("tolerance", options)["rtol"] == 1e-3
    )  # the magic's defaults came from the CLI
    assert [(e["cell_index"], e["type"]) for e in result.cell_errors] == [
        (3, "ValueError"),
        (4, "UsageError"),
    ]
    assert "unknown backend 'gpu9000'" in result.cell_errors[1]["message"]
    assert result.exit_code(strict=False) == 1


def test_record_dir_saves_each_neuron_cell(executed):
    _, _, folder = executed
    saved = sorted((folder / "rec").iterdir())
    assert len(saved) == 1 and saved[0].name.endswith(".nwrun.zip")
    artifact = load(saved[0])
    assert set(artifact.runs) == {"ref", "target"} and artifact.report["verdict"] == "PASS"
    assert artifact.cell_source.strip() == "ok = torch.ones(3, device='cuda') * 2"


def test_junit_has_a_case_per_report_and_per_cell_error(executed):
    result, _, _ = executed
    root = ET.fromstring(
        junit_xml("mixed.ipynb", result.reports, result.cell_errors).split("\n", 1)[1]
    )
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "0", "2")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["cell 2", "cell 3", "cell 4"]
    error = cases[1].find("error")
    assert error.get("type") == "ValueError"
    assert "<script>alert(1)</script>" in error.get(
        "message"
    )  # escaped on disk, intact when parsed
    assert "\x1b" not in error.get("message")  # XML cannot hold ESC; replaced


def test_run_document_counts(executed):
    result, _, _ = executed
    doc = run_document(result, strict=True, options={"ref": "cpu"})
    assert doc["summary"] == {
        "reports": 1,
        "verdicts": {"PASS": 1, "FAIL": 0, "ERROR": 0},
        "fallback_reports": 0,
        "cell_errors": 2,
        "strict": True,
        "exit_code": 1,
    }


def test_exit_code_precedence():
    fallback = {"verdict": "PASS", "fallback_ops": ["aten::sort"]}
    failed = {"verdict": "FAIL", "fallback_ops": []}
    assert InputResult("x", reports=[fallback]).exit_code(strict=False) == 0
    assert InputResult("x", reports=[fallback]).exit_code(strict=True) == 3
    assert InputResult("x", reports=[fallback, failed]).exit_code(strict=False) == 1
    assert InputResult("x", reports=[fallback, failed]).exit_code(strict=True) == 3
    assert InputResult("x", reports=[{"verdict": "ERROR"}]).exit_code(strict=True) == 1
    assert InputResult("x", reports=[]).exit_code(strict=False) == 1  # no %%neuron cell


def test_junit_escapes_and_labels_failures_and_errors():
    reports = [
        {
            "cell_index": 2,
            "verdict": "FAIL",
            "summary": 'FAIL a & b <c> "d"',
            "outputs": [{"path": "out['<x>']", "status": "differ", "max_abs": 1.0, "detail": ""}],
        },
        {
            "cell_index": 1,
            "verdict": "ERROR",
            "summary": "ERROR boom",
            "ref": {"error": {"type": "E", "message": "m"}},
        },
    ]
    text = junit_xml("suite <1>", reports)
    assert "<c>" not in text and "&lt;c&gt;" in text
    suite = ET.fromstring(text.split("\n", 1)[1]).find("testsuite")
    assert suite.get("name") == "suite <1>"
    first, second = suite.findall("testcase")
    assert first.get("name") == "cell 1" and first.find("error").get("message") == "ERROR boom"
    assert "ref raised E: m" in first.find("error").text
    assert second.find("failure").get("message") == 'FAIL a & b <c> "d"'
    assert "out['<x>']: differ max|Δ| 1.0" in second.find("failure").text


def test_junit_names_the_target_of_a_cell_compared_on_several():
    # --target neuron,tpu gave two cases named "cell 1": CI tools keep one of a name
    def report(index, target, verdict):
        return {
            "cell_index": index,
            "verdict": verdict,
            "summary": f"{verdict} {target}",
            "target": {"backend": {"name": target}},
        }

    reports = [report(1, "neuron", "PASS"), report(1, "tpu", "FAIL"), report(2, "neuron", "PASS")]
    suite = ET.fromstring(junit_xml("s", reports).split("\n", 1)[1]).find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["cell 1 (neuron)", "cell 1 (tpu)", "cell 2"]
    assert cases[1].find("failure").get("message") == "FAIL tpu"


def test_unreadable_notebooks_are_usage_errors(tmp_path):
    (tmp_path / "bad.ipynb").write_text("{")
    with pytest.raises(WorkbenchUsageError, match="is not a readable notebook"):
        run_notebook(tmp_path / "bad.ipynb")
    with pytest.raises(WorkbenchUsageError, match="no such notebook"):
        run_notebook(tmp_path / "none.ipynb")


def test_junit_times_are_the_cells_times_in_the_kernel(executed):
    # a %%neuron cell's runs are a fraction of its time (the worker, the comparison, the report):
    # CI showed every case at about a millisecond
    result, _, _ = executed
    assert sorted(result.cell_seconds) == [1, 2, 3, 4]
    report = result.reports[0]
    bodies = report["ref"]["wall_time_s"] + report["target"]["wall_time_s"]
    assert result.cell_seconds[2] > bodies
    suite = ET.fromstring(
        junit_xml("mixed.ipynb", result.reports, result.cell_errors, result.cell_seconds).split(
            "\n", 1
        )[1]
    ).find("testsuite")
    times = {case.get("name"): case.get("time") for case in suite.findall("testcase")}
    assert times == {f"cell {n}": f"{result.cell_seconds[n]:.3f}" for n in (2, 3, 4)}


LOGGING_SCRIPT = """\
import logging, sys
import torch

log = logging.getLogger("train")

def main():
    handler = logging.StreamHandler()  # stderr, as logging.basicConfig's
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    w = torch.ones(2, device="cuda", requires_grad=True)
    for epoch in range(3):
        loss = (w * (epoch + 1)).sum()
        log.info("epoch %d loss %.4f", epoch, loss.item())
    log.error("did not converge")
    return 1

if __name__ == "__main__":
    sys.exit(main())
"""


def test_a_script_that_logged_its_progress_to_stderr_then_exited_non_zero_is_reported(
    tmp_path, monkeypatch, capsys
):
    # `logging` writes to stderr, as a usage message does: the script's exit was taken for an
    # argument error, so the command printed its log, exited 1 with no report line and wrote no
    # --json / --junit file (the same script printing its progress was reported)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LOGGING_SCRIPT)
    code = main(["run", "train.py", "--json", "r.json", "--junit", "r.xml"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "INFO epoch 2 loss 6.0000\nERROR did not converge\n" in err
    assert out.startswith(
        "train.py: ERROR neuron (emulated) vs cpu (as cuda) — cpu raised SystemExit: 1"
    )
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    assert report["verdict"] == "ERROR"
    assert report["ref"]["scalars"]["total"] == 3  # what it logged before it exited
    assert (tmp_path / "r.xml").is_file()
    # `record` keeps such a run too; an argument error stays the script's own message and code
    assert main(["record", "train.py", "-q", "-o", "train.nwrun.zip"]) == 1
    assert (tmp_path / "train.nwrun.zip").is_file()
    (tmp_path / "args.py").write_text(
        "import argparse, torch\np = argparse.ArgumentParser(prog='args.py')\n"
        "p.add_argument('--epochs', type=int)\np.parse_args()\n"
    )
    capsys.readouterr()
    assert main(["run", "args.py", "--json", "a.json", "--", "--epochs", "x"]) == 2
    out, err = capsys.readouterr()
    assert err.endswith("args.py: error: argument --epochs: invalid int value: 'x'\n")
    assert not (tmp_path / "a.json").exists()
