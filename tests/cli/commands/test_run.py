"""``neuron-workbench run`` executes a real notebook in a real kernel, or a CUDA script in-process.

One notebook with three ``%%neuron`` cells (a pass, a numeric failure, a fallback) is executed twice
per module: once plain (exit 1) and once ``--strict`` with every report file (exit 3).
"""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import resources

import jsonschema
import pytest
from referencing import Registry, Resource

from neuron_workbench.artifacts import load
from neuron_workbench.cli.main import main
from neuron_workbench.report.html import esc
from neuron_workbench.testing import run_cell, write_notebook

PROBE = "<script>alert('x')</script>"
PASS_CELL = (
    "%%neuron\n"
    f"# {PROBE} in the source\n"
    "import torch\n"
    "ok = torch.ones(3, device='cuda') * 2\n"
    f"probe = {{{PROBE!r}: torch.ones(2, device='cuda'), '<img src=x onerror=alert(1)>': 1}}\n"
    f"print({PROBE!r})"
)
FAIL_CELL = (
    "%%neuron\nflag = torch.tensor([1.0]) + "
    "(1.0 if torch.zeros(1, device='cuda').device.type != 'cpu' else 0.0)"
)
FALLBACK_CELL = "%%neuron\nvalues, order = torch.sort(torch.tensor([3.0, 1.0, 2.0], device='cuda'))"


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def schema(name):
    return json.loads(resources.files("neuron_workbench.report").joinpath(name).read_text())


def validator(name):
    report, run = schema("report.schema.json"), schema("run.schema.json")
    registry = Registry().with_resources(
        [(s["$id"], Resource.from_contents(s)) for s in (report, run)]
    )
    chosen = report if name == "report" else run
    jsonschema.Draft202012Validator.check_schema(chosen)
    return jsonschema.Draft202012Validator(chosen, registry=registry)


@pytest.fixture(scope="module")
def three_cells(tmp_path_factory):
    path = tmp_path_factory.mktemp("nb") / "three.ipynb"
    write_notebook(path, PASS_CELL, FAIL_CELL, FALLBACK_CELL)
    return path


@pytest.fixture(scope="module")
def strict_run(three_cells, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    files = {kind: out / f"r.{kind}" for kind in ("json", "html", "xml")}
    done = cli(
        "run",
        str(three_cells),
        "--ref",
        "cpu",
        "--target",
        "neuron",
        "--strict",
        "--json",
        str(files["json"]),
        "--html",
        str(files["html"]),
        "--junit",
        str(files["xml"]),
    )
    return done, files


def test_run_reports_every_cell_and_exits_1_on_a_failure(three_cells):
    done = cli("run", str(three_cells), "--ref", "cpu", "--target", "neuron")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cell 1: PASS neuron (emulated) vs cpu (as cuda)")
    assert lines[1].startswith("cell 2: FAIL neuron (emulated) vs cpu (as cuda)")
    assert lines[2].startswith("cell 3: PASS neuron (emulated) vs cpu (as cuda)")
    assert lines[2].endswith("1 op fell back to CPU")
    assert lines[3] == "3 reports: 2 PASS, 1 FAIL, 0 ERROR; 1 with CPU fallbacks; 0 cell errors"
    assert "cell 1/3" not in done.stderr  # progress only on a terminal


def test_strict_exits_3_when_ops_fell_back(strict_run):
    done, _ = strict_run
    assert done.returncode == 3, done.stdout + done.stderr
    # and says which ops, where (the exit code alone did not)
    assert done.stderr.splitlines() == [
        "cell 3: --strict: on neuron these ops fell back to CPU: aten::sort "
        "(--allow-fallback OP accepts one)"
    ], done.stderr


def test_json_html_and_junit_agree(strict_run):
    _, files = strict_run
    data = json.loads(files["json"].read_text())
    validator("run").validate(data)
    for report in data["reports"]:
        validator("report").validate(report)
    assert data["input"] == {"path": data["input"]["path"], "kind": "notebook", "cells": 3}
    assert data["summary"]["verdicts"] == {"PASS": 2, "FAIL": 1, "ERROR": 0}
    assert data["summary"]["exit_code"] == 3 and data["summary"]["fallback_reports"] == 1
    reports = data["reports"]
    assert [r["verdict"] for r in reports] == ["PASS", "FAIL", "PASS"]
    assert [r["label"] for r in reports] == ["cell 1", "cell 2", "cell 3"]
    assert reports[2]["fallback_ops"] == ["aten::sort"]
    assert reports[2]["target"]["fallbacks"][0]["count"] == 1
    assert reports[0]["target"]["backend"]["emulated"] is True
    assert reports[0]["ref"]["backend"]["emulated"] is False

    suite = ET.parse(files["xml"]).getroot().find("testsuite")
    assert suite.get("name") == "three.ipynb"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["cell 1", "cell 2", "cell 3"]
    assert {c.get("classname") for c in cases} == {"three.ipynb"}
    assert [c.find("failure") is not None for c in cases] == [False, True, False]
    assert cases[1].find("failure").get("message") == reports[1]["summary"]
    assert [c.find("system-out").text for c in cases] == [r["summary"] for r in reports]

    html = files["html"].read_text()
    assert html.count('class="nw-report"') == 3
    verdicts = re.findall(r'<span class="nw-verdict"[^>]*>(\w+)</span>', html)
    assert verdicts == ["PASS", "FAIL", "PASS"]
    for report in reports:
        assert esc(report["summary"].split(" ", 1)[1]) in html


def test_html_of_script_probes_has_no_live_markup(strict_run):
    _, files = strict_run
    html = files["html"].read_text()
    lowered = html.lower()
    assert "<script" not in lowered and "<img" not in lowered
    assert not re.search(r"<[^>]*\bonerror", lowered)  # no tag carries an event handler
    assert esc(f"probe[{PROBE!r}]") in html  # the output path, shown escaped
    assert esc(PROBE) in html  # the printed text, shown escaped
    # And the JUnit XML still parses with the probe in it.
    ET.parse(files["xml"])


def test_usage_errors_exit_2_with_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.ipynb")]) == 2
    assert capsys.readouterr().err == (
        f"neuron-workbench: error: no such notebook: {tmp_path / 'missing.ipynb'}\n"
    )
    path = tmp_path / "x.ipynb"
    write_notebook(path, "x = 1")
    assert main(["run", str(path), "--target", "gpu9000"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'gpu9000'" in err and err.count("\n") == 1


def test_a_report_over_the_notebook_or_another_report_is_refused(tmp_path, capsys):
    # `run nb.ipynb --html nb.ipynb` wrote the HTML report over the notebook (exit 1), and
    # `--json F --html F` kept one of the two reports: both are refused before anything runs.
    path = tmp_path / "nb.ipynb"
    write_notebook(path, "%%neuron\nx = 1")
    kept = path.read_text()
    assert main(["run", str(path), "--html", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"neuron-workbench: error: --html {path} is also the input {path}: one would overwrite "
        "the other\n"
    )
    assert path.read_text() == kept
    same = tmp_path / "report.out"
    assert main(["run", str(path), "--json", str(same), "--junit", str(same)]) == 2
    assert "--junit " + str(same) + " is also --json" in capsys.readouterr().err
    assert not same.exists()


def test_record_into_the_recording_it_runs_against_is_refused(tmp_path, monkeypatch, capsys):
    # `run nb.ipynb --record rec --against rec` saved each cell's target-only artifact over the
    # recording it had compared with: the recorded reference runs were gone after one run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("import torch\ny = torch.ones(3, device='cuda') * 2\n")
    (tmp_path / "rec").mkdir()
    assert main(["record", "s.py", "-q", "-o", "rec/s.nwrun.zip"]) == 0
    capsys.readouterr()
    for against in ("rec", "rec/s.nwrun.zip"):
        assert main(["run", "s.py", "-q", "--against", against, "--record", "rec"]) == 2
        assert capsys.readouterr().err == (
            f"neuron-workbench: error: --record rec would overwrite the recording --against "
            f"{against} compares with: record into another folder\n"
        )
    assert set(load(tmp_path / "rec" / "s.nwrun.zip").runs) == {"ref"}
    write_notebook(tmp_path / "nb.ipynb", "%%neuron\nx = 1")
    assert main(["run", "nb.ipynb", "--against", "rec", "--record", "./rec/"]) == 2
    assert "would overwrite the recording --against rec" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["notes.txt"], "notes.txt: expected a notebook (.ipynb) or a script (.py)"),
        (["x.py", "--rtol", "1e-3"], "give --rtol and --atol together, or neither"),
        (
            ["x.py", "--preset", "strict", "--rtol", "1e-3", "--atol", "0"],
            "--rtol and --atol set every output's tolerance, which replaces --preset",
        ),
        (["missing.py"], "no such script: missing.py"),
        (["broken.py"], "broken.py: syntax error line 2: "),
        (["broken.ipynb"], "broken.ipynb is not a readable notebook"),
        (["x.py", "--on", "10.0.0.1:10001"], "--on takes ray://HOST:PORT"),
        (["x.py", "--target", "neuron", "--list-fallbacks"], "--list-fallbacks applies to a tpu"),
        (["x.py", "--target", "tpu", "--track-per-op"], "--track-per-op applies to a neuron"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("x = 1\ny = (\n")
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert main(["run", *args]) == 2
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and out.err.startswith("neuron-workbench: error: ")
    assert message in out.err, out.err


SCRIPT = """\
import torch
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
x = torch.randn(8, 4, device=device)
loss = F.mse_loss(model(x), torch.zeros(8, 2, device=device))
loss.backward()
if __name__ == "__main__":
    ran_as_main = True
"""


def test_script_runs_as_one_cell_with_the_cuda_remap(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "sorty.py").write_text(SCRIPT + "values, order = torch.sort(x[:, 0])\n")
    (tmp_path / "drift.py").write_text(
        SCRIPT + "flag = loss.detach().cpu() + (1.0 if x.device.type != 'cpu' else 0.0)\n"
    )
    code = main(
        [
            "run",
            "train.py",
            "--ref",
            "cpu",
            "--json",
            "t.json",
            "--junit",
            "t.xml",
            "--record",
            "rec",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert out[0].startswith(
        "train.py: PASS neuron (emulated) vs cpu (as cuda) — 7 outputs, 7 match"
    )
    document = json.loads((tmp_path / "t.json").read_text())
    validator("run").validate(document)
    assert document["input"] == {"path": "train.py", "kind": "script", "cells": 1}
    paths = [o["path"] for o in document["reports"][0]["outputs"]]
    assert "model.weight.grad" in paths and "ran_as_main" in paths
    case = ET.parse(tmp_path / "t.xml").getroot().find("testsuite/testcase")
    assert (case.get("classname"), case.get("name")) == ("train.py", "cell 1")
    recorded = load(tmp_path / "rec" / "train.nwrun.zip")
    assert set(recorded.runs) == {"ref", "target"}
    assert recorded.report["summary"] == document["reports"][0]["summary"]

    assert document["reports"][0]["fallback_ops"]  # the emulator runs some ops on the CPU
    assert main(["run", "train.py", "--ref", "cpu", "--strict"]) == 3
    assert main(["run", "drift.py", "--ref", "cpu", "--junit", "d.xml"]) == 1
    assert capsys.readouterr().out.splitlines()[-2].startswith("drift.py: FAIL")
    failure = ET.parse(tmp_path / "d.xml").getroot().find("testsuite/testcase/failure")
    assert failure.get("message").startswith("FAIL neuron (emulated) vs cpu (as cuda)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "d.xml",
        "drift.py",
        "rec",
        "sorty.py",
        "t.json",
        "t.xml",
        "train.py",
    ]


def test_script_run_in_a_fresh_process_installs_the_target_before_backward(tmp_path):
    # The reference (cpu) run calls backward() first; the target's emulated device must already be
    # registered with autograd, or the target run's backward would fail.
    (tmp_path / "train.py").write_text(SCRIPT)
    done = cli("run", "train.py", "--ref", "cpu", "--target", "neuron", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("train.py: PASS neuron (emulated) vs cpu (as cuda)")


def test_a_live_magic_report_follows_the_schema(ip):
    run_cell(ip, "import torch")
    run_cell(ip, "%%neuron --ref cpu -o report\nv, i = torch.sort(torch.randn(4, device='cuda'))")
    data = ip.user_ns["report"].to_dict()
    validator("report").validate(data)
    broken = dict(data, verdict="MAYBE")
    assert not validator("report").is_valid(broken)


def test_notebook_on_emulated_tpu_gets_the_tpu_numerics_and_its_missing_op_error(tmp_path):
    # The target must reach the kernel before the extension installs an emulated device.
    path = tmp_path / "tpu.ipynb"
    write_notebook(
        path,
        "%%neuron\nimport torch\nm = torch.nn.Linear(4, 2).cuda()\ny = m(torch.ones(3, 4, device='cuda'))",
        "%%neuron\nv = torch.special.i0(torch.ones(3, device='cuda'))",
    )
    json_path = tmp_path / "tpu.json"
    done = cli("run", str(path), "--ref", "cpu", "--target", "tpu", "--json", str(json_path))
    assert done.returncode == 1, done.stdout + done.stderr
    reports = json.loads(json_path.read_text())["reports"]
    assert [r["target"]["backend"]["name"] for r in reports] == ["tpu", "tpu"]
    hints = [h for o in reports[0]["outputs"] for h in o["hints"]]
    assert any(h.startswith("TPU fp32 matmuls default to 1-pass bfloat16") for h in hints)
    assert reports[1]["target"]["error"]["message"] == (
        "operator 'aten::i0.out' is not implemented for TPU. Please file a feature request"
    )


def test_run_against_a_recording_of_the_notebook(tmp_path):
    # Three %%neuron cells recorded once (the "GPU host"), then run again with every reference
    # taken from the recording: same verdicts, same exit code, no reference run.
    nb = tmp_path / "three.ipynb"
    # a cell recording itself is in the folder too (a later --against found no reference for it)
    own = "%%neuron --record own.nwrun.zip\nz = torch.arange(3.0).cuda() + 1"
    # an empty cell takes no execution count: the files' numbers drifted from the labels after it
    write_notebook(nb, "import torch", PASS_CELL, "", FALLBACK_CELL, own)
    recorded = cli(
        "run", str(nb), "--record", str(tmp_path / "rec"), "--json", str(tmp_path / "a.json")
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    # named as the report lines name the cells ("cell 2: PASS ..."), not by the kernel's counts,
    # which the command's own set-up cell shifted by one
    labels = [r["label"] for r in json.loads((tmp_path / "a.json").read_text())["reports"]]
    assert labels == ["cell 2", "cell 4", "cell 5"]
    files = sorted(p.name for p in (tmp_path / "rec").glob("cell-*.nwrun.zip"))
    assert files == ["cell-2.nwrun.zip", "cell-4.nwrun.zip", "cell-5.nwrun.zip"]
    assert (tmp_path / "own.nwrun.zip").is_file()
    against = cli(
        "run", str(nb), "--against", str(tmp_path / "rec"), "--json", str(tmp_path / "b.json")
    )
    assert against.returncode == 0, against.stdout + against.stderr
    reports = json.loads((tmp_path / "b.json").read_text())["reports"]
    assert [r["verdict"] for r in reports] == ["PASS", "PASS", "PASS"]
    first = json.loads((tmp_path / "a.json").read_text())["reports"]
    assert [r["summary"] for r in reports] == [r["summary"] for r in first]
    # each report says which recording it was held to (a CI log could not tell)
    recording = str(tmp_path / "rec" / "cell-2.nwrun.zip")
    assert any(n.startswith(f"the reference is the run recorded in {recording} (recorded ")
               for n in reports[0]["notes"]), reports[0]["notes"]  # fmt: skip
    # a changed cell: its recorded reference no longer matches, and run exits 1 as it would
    write_notebook(
        nb,
        "import torch",
        PASS_CELL,
        "",
        FALLBACK_CELL,
        "%%neuron --record own.nwrun.zip\nz = torch.arange(3.0).cuda() + 2",
    )
    changed = cli("run", str(nb), "--against", str(tmp_path / "rec"))
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "FAIL" in changed.stdout.splitlines()[2]


def test_run_against_usage_errors(tmp_path):
    nb = tmp_path / "one.ipynb"
    write_notebook(nb, "%%neuron\nx = 1")
    missing = cli("run", str(nb), "--against", str(tmp_path / "none"))
    assert missing.returncode == 2 and missing.stderr.strip().endswith(
        "no such recording: " + str(tmp_path / "none")
    )
    (tmp_path / "file.nwrun.zip").write_bytes(b"")
    wrong = cli("run", str(nb), "--against", str(tmp_path / "file.nwrun.zip"))
    assert wrong.returncode == 2 and "takes the folder" in wrong.stderr


def test_run_script_against_its_recording(tmp_path):
    script = tmp_path / "step.py"
    script.write_text("import torch\nw = torch.ones(4, device='cuda') * 3\nloss = (w * w).sum()\n")
    assert cli("run", str(script), "--record", str(tmp_path / "rec")).returncode == 0
    folder = cli("run", str(script), "--against", str(tmp_path / "rec"))
    artifact = cli("run", str(script), "--against", str(tmp_path / "rec" / "step.nwrun.zip"))
    for done in (folder, artifact):
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("step.py: PASS")


def test_script_on_tpu_with_list_fallbacks_lists_every_missing_op(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURON_WORKBENCH_TPU_LIST_FALLBACKS", raising=False)
    (tmp_path / "ops.py").write_text(
        "import torch\nx = torch.ones(2, 4, device='cuda')\n"
        "a = torch.special.i0(x)\nb = x.kthvalue(2).values\n"
    )
    assert main(["run", "ops.py", "--ref", "cpu", "--target", "tpu"]) == 1
    capsys.readouterr()
    args = [
        "run",
        "ops.py",
        "--ref",
        "cpu",
        "--target",
        "tpu",
        "--list-fallbacks",
        "--json",
        "o.json",
    ]
    assert main(args) == 0
    document = json.loads((tmp_path / "o.json").read_text())
    (report,) = document["reports"]
    assert {e["op"] for e in report["target"]["fallbacks"]} == {"aten::i0", "aten::kthvalue"}
    assert report["options"]["list_fallbacks"] is True


def test_html_lists_the_cells_that_raised(tmp_path):
    # the text, JSON and JUnit list a cell that raised outside %%neuron: the page must too, or a
    # failed CI run's artifact shows only green reports
    path = write_notebook(
        tmp_path / "err.ipynb",
        "%%neuron\nimport torch\nok = torch.ones(2, device='cuda')",
        "assert False, 'data check <failed>'",
    )
    done = cli("run", str(path), "--html", str(tmp_path / "err.html"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cell 2: raised AssertionError: data check <failed>" in done.stdout
    html = (tmp_path / "err.html").read_text()
    assert "<h3>Cell errors</h3>" in html
    assert "1 cell raised outside %%neuron" in html
    assert f"<pre>{esc('data check <failed>')}</pre>" in html


def test_html_of_a_report_judged_by_its_scalars_does_not_say_nothing_was_checked(tmp_path):
    # the values live in main(): only the logged loss.item() is compared, and that is a check
    (tmp_path / "logged.py").write_text(
        "import torch\n\ndef main():\n    x = torch.ones(3, device='cuda')\n"
        "    print((x * 2).sum().item())\n\nmain()\n"
    )
    done = cli("run", "logged.py", "--html", "l.html", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "6.0\nlogged.py: PASS neuron (emulated) vs cpu (as cuda) — 1 scalar"
    )
    html = (tmp_path / "l.html").read_text()
    assert "Observed scalars (by call site and occurrence)" in html
    assert "nothing was checked" not in html


def test_a_cell_past_timeout_or_a_dead_kernel_ends_the_run_in_one_line(tmp_path):
    # With the blocking kernel manager nbclient's reply poll never timed out: a cell ran past
    # --timeout to its end, and a kernel that died left `run` waiting for ever (found by trying
    # the command line as CI uses it)
    import time

    slow = write_notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(120)")
    died = write_notebook(tmp_path / "died.ipynb", "import os\nos._exit(1)", "x = 1")
    for notebook, cause in ((slow, "CellTimeoutError"), (died, "DeadKernelError")):
        started = time.monotonic()
        done = cli("run", str(notebook), "--timeout", "5")
        assert done.returncode == 2, done.stderr
        assert time.monotonic() - started < 90
        assert done.stderr.count("\n") == 1 and cause in done.stderr, done.stderr


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_notebook_run_ended_by_a_signal_says_so_in_one_line(tmp_path, signal_name):
    # Ctrl-C (or CI's SIGTERM) while a cell ran: nbclient's handler ended the kernel and its
    # cleanup then failed, so the line read "the notebook could not be executed: AssertionError: "
    import signal
    import time

    started = tmp_path / "started"
    notebook = write_notebook(
        tmp_path / "long.ipynb",
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(120)",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_workbench.cli.main", "run", str(notebook)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a background process may start with SIGINT ignored; the user's terminal would not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert started.exists(), proc.communicate()
    proc.send_signal(getattr(signal, signal_name))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    assert err == (
        f"neuron-workbench: error: {notebook}: interrupted (SIGINT or SIGTERM) while a cell ran; "
        "the kernel was ended\n"
    )


def test_a_notebook_without_a_neuron_cell_is_not_a_pass(tmp_path):
    # a CUDA notebook as it was written ran every cell and exited 0 with "0 reports": a CI job
    # guarding a port checked nothing and went green
    path = write_notebook(tmp_path / "plain.ipynb", "import torch\nx = torch.ones(2).sum()")
    done = cli("run", str(path), "--json", str(tmp_path / "plain.json"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("0 reports: ")
    assert done.stderr == (
        "no %%neuron cell in plain.ipynb: nothing was compared; put %%neuron at the top of each "
        "cell to compare\n"
    )
    assert json.loads((tmp_path / "plain.json").read_text())["summary"]["exit_code"] == 1
    # a %%neuron cell that raised a usage error is no missing %%neuron cell
    bad = write_notebook(tmp_path / "bad.ipynb", "%%neuron --rtol 1\nx = 1")
    done = cli("run", str(bad))
    assert done.returncode == 1 and "no %%neuron cell" not in done.stderr, done.stderr


def test_a_report_path_that_cannot_be_written_fails_before_the_script_runs(tmp_path):
    # the reports and the artifact are written after the runs: a long training run ended with
    # "cannot write ..." and nothing to show for it
    (tmp_path / "train.py").write_text(
        "import pathlib, torch\npathlib.Path('ran').touch()\nx = torch.ones(2, device='cuda')\n"
    )
    (tmp_path / "taken").mkdir()
    blocked = tmp_path / "file"
    blocked.write_text("")
    for args, message in (
        (["run", "train.py", "--json", "taken"], "cannot write taken: it is a folder"),
        (["run", "train.py", "--html", "file/r.html"], "cannot write file/r.html: "),
        (["run", "train.py", "--record", "file/rec"], "cannot write file/rec: "),
        (["record", "train.py", "-o", "taken"], "cannot write taken: it is a folder"),
    ):
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"neuron-workbench: error: {message}"), done.stderr
        assert done.stderr.count("\n") == 1
        assert not (tmp_path / "ran").exists(), args  # nothing ran


def test_a_recording_keeps_the_scripts_arguments_and_a_run_with_others_is_warned(tmp_path):
    # recorded with --steps 5, compared with --steps 4: a FAIL with nothing saying why
    (tmp_path / "sa.py").write_text(
        "import argparse, torch\np = argparse.ArgumentParser()\n"
        "p.add_argument('--steps', type=int, default=3)\nargs = p.parse_args()\n"
        "x = torch.ones(2, device='cuda') * args.steps\n"
    )
    recorded = cli("record", "sa.py", "-o", "a.nwrun.zip", "--", "--steps", "5", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    shown = cli("show", "a.nwrun.zip", cwd=tmp_path)
    assert "    ran: python sa.py --steps 5\n" in shown.stdout
    warning = "the recording ran the script with --steps 5, this run with --steps 4"
    live = cli("run", "sa.py", "--against", "a.nwrun.zip", "--", "--steps", "4", cwd=tmp_path)
    assert live.returncode == 1 and f"sa.py: warning: {warning}" in live.stderr, live.stderr
    same = cli("run", "sa.py", "--against", "a.nwrun.zip", "--", "--steps", "5", cwd=tmp_path)
    assert same.returncode == 0 and "warning" not in same.stderr, same.stdout + same.stderr
    target = cli(
        "record", "sa.py", "--backend", "neuron", "--role", "target", "-o", "b.nwrun.zip",
        "--", "--steps", "4", cwd=tmp_path,
    )  # fmt: skip
    assert target.returncode == 0, target.stderr
    compared = cli("compare", "a.nwrun.zip", "b.nwrun.zip", cwd=tmp_path)
    assert f"warning: {warning}" in compared.stderr, compared.stderr


def test_a_plain_cells_syntax_error_names_its_line_in_the_notebooks_order(tmp_path):
    # the kernel compiles each cell under a temporary file named by a hash of its code: a
    # SyntaxError's message names that file ("(3395539720.py, line 1)"), which no user can find;
    # and the cell that raised is listed where it is in the notebook, not after every report
    path = write_notebook(
        tmp_path / "syntax.ipynb",
        "import torch\nx = torch.ones(3)",
        "y = (x +\n",
        "%%neuron\nz = x.cuda() * 2",
    )
    done = cli("run", str(path), "--json", str(tmp_path / "syntax.json"))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "cell 2: raised SyntaxError: incomplete input (line 1)",
        "cell 3: PASS neuron (emulated) vs cpu (as cuda) — 1 output, 1 match",
    ]
    document = json.loads((tmp_path / "syntax.json").read_text())
    assert document["cell_errors"][0]["message"] == "incomplete input (line 1)"


def test_a_scripts_target_worker_is_launched_before_torch_is_imported_and_runs_it(tmp_path):
    # both processes import torch at once: the script's run waits for neither after the other
    script = tmp_path / "tiny.py"
    script.write_text('import torch\ny = (torch.ones(3, device="cuda") * 2).sum()\n')
    code = (
        "import sys\n"
        "import neuron_workbench.worker_launch as launch\n"
        "spawned, spawn = [], launch.launch_worker\n"
        "def counted(target):\n"
        "    spawned.append((target, 'torch' in sys.modules))\n"
        "    return spawn(target)\n"
        "launch.launch_worker = counted\n"
        "from neuron_workbench.cli.main import main\n"
        "try:\n"
        f"    code = main(['run', {str(script)!r}, '--quiet'])\n"
        "except SystemExit as end:\n"
        "    code = end.code\n"
        "print('exit', code, spawned)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "exit 0 [('neuron', False)]" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "launched"),
    [
        ({}, {"neuron"}),
        ({"target": "neuron,tpu"}, {"neuron", "tpu"}),
        ({"target": "cpu"}, set()),
        ({"executor": "inprocess"}, set()),
        ({"cluster": "local"}, set()),
    ],
)
def test_only_targets_that_run_in_a_worker_here_are_launched_ahead(values, launched, monkeypatch):
    from neuron_workbench import worker_launch
    from neuron_workbench.cli.commands.run import _launch_workers_ahead

    for name in (
        "NEURON_WORKBENCH_TARGET",
        "NEURON_WORKBENCH_EMULATE",
        "NEURON_WORKBENCH_EXECUTOR",
    ):
        monkeypatch.delenv(name, raising=False)
    try:
        _launch_workers_ahead(values)
        assert set(worker_launch._AHEAD) == launched
    finally:
        worker_launch._end_untaken()
