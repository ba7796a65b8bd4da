"""`neuron-workbench scan`: linter lines, JSON, exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_workbench.cli.main import main

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "tests" / "scan" / "fixtures" / "scripts"
CLEAN = "import torch\nx = torch.ones(1)\n"
INFO_ONLY = 'import torch\nx = torch.ones(1, device="cuda")\n'
WARNING = "import torch\nx = torch.ones(1, dtype=torch.float64)\n"
ERROR = 'import torch.distributed as dist\ndist.init_process_group("nccl")\n'


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("source", "fail_on", "code"),
    [
        (CLEAN, "error", 0),
        (INFO_ONLY, "error", 0),
        (INFO_ONLY, "info", 1),
        (WARNING, "error", 0),
        (WARNING, "warning", 1),
        (ERROR, "error", 1),
    ],
)
def test_exit_codes(tmp_path, capsys, source, fail_on, code):
    path = write(tmp_path, "s.py", source)
    assert main(["scan", path, "--fail-on", fail_on]) == code


def test_default_fail_on_is_error(tmp_path):
    assert main(["scan", write(tmp_path, "w.py", WARNING)]) == 0
    assert main(["scan", write(tmp_path, "e.py", ERROR)]) == 1


def test_linter_lines_then_help_then_summary(tmp_path, capsys):
    path = write(tmp_path, "t.py", INFO_ONLY)
    main(["scan", path])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f'{path}:2:26: NW101 [*] device string "cuda" names a CUDA GPU (`device=`)',
        '    help: use "neuron"',
        "1 finding: 0 errors, 0 warnings, 1 info (1 fixable)",
    ]
    main(["scan", path, "--no-help", "--target", "tpu"])
    assert capsys.readouterr().out.splitlines()[0].endswith("(`device=`)")


def test_json_report(tmp_path, capsys):
    out = tmp_path / "findings.json"
    code = main(["scan", str(SCRIPTS), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["target"] == "neuron"
    assert doc["summary"]["total"] == len(doc["findings"]) > 50
    assert doc["summary"]["error"] > 0 and code == 1
    first = doc["findings"][0]
    assert set(first) == {
        "rule_id",
        "severity",
        "message",
        "suggestion",
        "source",
        "path",
        "line",
        "col",
        "cell",
        "fixable",
    }
    capsys.readouterr()
    main(["scan", str(SCRIPTS / "lookalikes.py"), "--json", "-"])
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_ignore(tmp_path):
    path = write(tmp_path, "e.py", ERROR)
    assert main(["scan", path, "--ignore", "NW140"]) == 0


def test_usage_errors(tmp_path, capsys):
    assert main(["scan", str(tmp_path / "missing.py")]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err
    bad = write(tmp_path, "bad.py", "x = 1\ndef f(:\n")
    assert main(["scan", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"neuron-workbench: error: {bad}:2:") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main(["scan", bad, "--ignore", "NW999"])
    assert exc.value.code == 2


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    bad = write(tmp_path, "bad.py", "def f(:\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "workbench")}
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", "scan", bad],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("neuron-workbench: error:")
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", "scan", str(SCRIPTS / "ddp_nccl.py")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1 and "NW140" in proc.stdout


def test_a_file_that_does_not_parse_or_decode_is_one_line_and_the_rest_is_scanned(tmp_path):
    # a linter reports the file it cannot read and goes on: one bad file in a repository must
    # not hide every finding of the others
    write(tmp_path, "a_broken.py", "import torch\nx = torch.ones((1,\n")
    cells = [["import torch\n", "x = torch.ones(2).cuda()\n"], ["x = (\n"]]
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": c,
            }
            for c in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    write(tmp_path, "a_cells.ipynb", json.dumps(notebook))
    (tmp_path / "b_latin.py").write_bytes(b"# caf\xe9\nimport torch\n")
    write(tmp_path, "c_cuda.py", INFO_ONLY)
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", "scan", ".", "--json", "out.json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "./c_cuda.py:2:" in proc.stdout  # the readable file's finding
    assert "./a_cells.ipynb:cell 1:2:" in proc.stdout  # and the notebook's cell that parses
    errors = proc.stderr.splitlines()
    assert (
        errors[0]
        == "neuron-workbench: error: ./a_broken.py:2:16: cannot parse: '(' was never closed"
    )
    assert errors[1].startswith("neuron-workbench: error: ./a_cells.ipynb:cell 2:1:")
    assert errors[2].startswith("neuron-workbench: error: ./b_latin.py: cannot read: ")
    assert len(errors) == 3 and "Traceback" not in proc.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert [f["path"] for f in document["findings"]] == ["./a_cells.ipynb", "./c_cuda.py"]
    assert [e.split(":", 1)[0] for e in document["errors"]] == [
        "./a_broken.py",
        "./a_cells.ipynb",
        "./b_latin.py",
    ]


def test_a_script_with_a_bom_or_a_coding_line_is_scanned_as_python_reads_it(tmp_path, capsys):
    # python runs both; scan said "cannot parse: invalid non-printable character U+FEFF" for the
    # byte order mark and "cannot read" for the latin-1 one, exit 2 and no findings
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + INFO_ONLY.encode())
    (tmp_path / "latin.py").write_bytes(
        ("# -*- coding: latin-1 -*-\nname = 'caf\u00e9'\n" + INFO_ONLY).encode("latin-1")
    )
    assert main(["scan", str(tmp_path / "bom.py"), str(tmp_path / "latin.py")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert f"{tmp_path / 'bom.py'}:2:" in captured.out
    assert f"{tmp_path / 'latin.py'}:4:" in captured.out
