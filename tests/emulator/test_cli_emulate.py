"""`neuron-workbench emulate` / `coverage` commands and the env-var autoload, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from neuron_workbench.cli.main import main

SCRIPT = textwrap.dedent(
    """\
    import sys
    import torch
    import torch.nn as nn

    device = "neuron"
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2)).to(device)
    x = torch.ones(2, 3, 8, 8).to(device)
    out = model(x)  # line 8
    out.sum().backward()
    values, _ = torch.sort(out.flatten())  # line 10
    print("result", out.device, round(out.sum().item(), 3))
    sys.exit(int(sys.argv[1]))
    """
)


def _cli(args, env_extra=None, timeout=180):
    import os

    from neuron_workbench.emulator import _core  # noqa: F401  (path of the package below)

    env = dict(os.environ)
    env.pop("NEURON_WORKBENCH_EMULATE", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("emu") / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def emulate_run(script, tmp_path_factory):
    report = tmp_path_factory.mktemp("emu") / "report.json"
    proc = _cli(["emulate", "--json", str(report), "--", "python", str(script), "3"])
    return proc, json.loads(report.read_text())


def test_emulate_runs_script_and_keeps_exit_code(emulate_run):
    proc, _ = emulate_run
    assert proc.returncode == 3, proc.stderr
    assert "result neuron:0" in proc.stdout


def test_emulate_prints_fallback_summary(emulate_run, script):
    proc, _ = emulate_run
    lines = proc.stderr.splitlines()
    assert any("emulated neuron (profile neuron-2026-04" in line for line in lines)
    pool = [line for line in lines if "aten::max_pool2d_with_indices " in line]
    assert pool and pool[0].strip().startswith("aten::max_pool2d_with_indices  x1  first at")
    assert pool[0].strip().endswith(f"{script}:8 in <module>")
    assert any(f"aten::sort  x1  first at {script}:10" in line for line in lines)


def test_emulate_json_report(emulate_run, script):
    _, report = emulate_run
    assert report["device"] == "neuron" and report["emulated"] is True
    assert report["profile"] == "neuron-2026-04" and report["exit_code"] == 3
    ops = {f["op"]: f for f in report["fallbacks"]}
    assert set(ops) == {
        "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward", "aten::sort"
    }  # fmt: skip
    assert ops["aten::max_pool2d_with_indices"]["count"] == 1
    assert ops["aten::max_pool2d_with_indices"]["sites"] == [
        {"file": str(script), "line": 8, "module": "2"}
    ]


def test_emulate_tpu_raises_unless_fallback_enabled(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\nx = torch.ones(3, device='tpu')\nprint(torch.special.i0(x).sum().item())\n"
    )
    proc = _cli(["emulate", "--device", "tpu", "--", "python", str(script)])
    assert proc.returncode == 1
    assert (
        "RuntimeError: operator 'aten::i0.out' is not implemented for TPU. Please file a feature "
        "request" in proc.stderr
    )
    proc = _cli(["emulate", "--device", "tpu", "--cpu-fallback", "on", "--",
                 "python", str(script)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "emulated tpu (profile tpu-0.2.0" in proc.stderr
    assert f"aten::i0  x1  first at {script}:3 in <module>" in proc.stderr


def test_a_program_ending_with_os_exit_keeps_its_fallback_report(tmp_path):
    # os._exit skips atexit: emulate said "no fallback report (the program did not start on the
    # emulated device ...)" for a program that ran there, and wrote no --json
    program = tmp_path / "hard.py"
    program.write_text(
        "import multiprocessing as mp, os\n"
        "import torch\n"
        "x = torch.ones(3, device='neuron')\n"
        "values, _ = torch.sort(x)  # line 4\n"
        "child = mp.get_context('fork').Process(target=print, args=('child',))\n"
        "child.start(); child.join()  # a forked child ends with os._exit too\n"
        "print('done', child.exitcode, flush=True)\n"
        "os._exit(3)\n"
    )
    report = tmp_path / "report.json"
    proc = _cli(["emulate", "--json", str(report), "--", "python", str(program)])
    assert proc.returncode == 3, proc.stderr
    assert "done 0" in proc.stdout
    assert "no fallback report" not in proc.stderr
    assert any(f"aten::sort  x1  first at {program}:4" in line for line in proc.stderr.splitlines())
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3 and [f["op"] for f in data["fallbacks"]] == ["aten::sort"]


def test_emulate_usage_errors(capsys):
    assert main(["emulate"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["emulate", "--", "python"]) == 2


def test_coverage_show_and_op(capsys):
    assert main(["coverage", "show"]) == 0
    out = capsys.readouterr().out
    assert "neuron-2026-04" in out and "native ops: 195" in out
    assert main(["coverage", "show", "--op", "aten::sort.stable"]) == 1
    assert "not native on neuron" in capsys.readouterr().out
    assert main(["coverage", "show", "--device", "tpu", "--op", "sort"]) == 0
    assert main(["coverage", "show", "--device", "tpu", "--op", "add_"]) == 0
    assert "structured family rule" in capsys.readouterr().out


def test_coverage_show_of_a_name_no_op_has_is_a_usage_error(capsys):
    # `--op softmx` (a typo) said "not native on neuron ...: runs on CPU (fallback)", exit 1
    assert main(["coverage", "show", "--op", "softmx"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("neuron-workbench: error: coverage: no ATen op named 'softmx'")
    # a real op that is not native (a composite one) keeps its answer
    assert main(["coverage", "show", "--device", "tpu", "--op", "aten::softmax.int"]) == 1
    assert "aten::softmax: not native on tpu" in capsys.readouterr().out


def test_coverage_export_needs_real_backend(capsys):
    assert main(["coverage", "export"]) == 2
    assert "export needs the real backend" in capsys.readouterr().err


def test_user_coverage_file(tmp_path, run_py):
    cov = tmp_path / "mini-neuron.txt"
    cov.write_text("# Provenance: a tiny test list\n# comment\naten::add.Tensor\nmm\n")
    proc = run_py(
        f"""
        import torch, neuron_workbench.emulator as E
        st = E.emulate("neuron", coverage={str(cov)!r})
        print(st.profile, st.native_ops, st.provenance)
        x = torch.ones(2, 2).to("neuron")
        with E.record_fallbacks() as log:
            (x + x) @ x
            x * 2
        print(log.ops())
        """
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "mini-neuron 2 a tiny test list (2 ops)"
    assert second == "['aten::mul']"


def test_env_var_autoload_at_import_torch(run_py):
    code = """
    import sys, torch
    print(torch.ones(1, device="neuron").device, torch.neuron.is_emulated(),
          "neuron_workbench.emulator._core" in sys.modules)
    """
    proc = run_py(code, env={"NEURON_WORKBENCH_EMULATE": "neuron"})
    if "neuron" not in proc.stdout and "Expected one of" in proc.stderr:
        pytest.skip("the package is not installed (no torch.backends entry point)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["neuron:0", "True", "True"]
    plain = run_py(
        """
        import sys, torch
        print(torch._C._get_privateuse1_backend_name(), "neuron_workbench.emulator._core" in sys.modules)
        """
    )
    assert plain.stdout.split() == ["privateuseone", "False"]
