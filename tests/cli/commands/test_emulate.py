"""``neuron-workbench emulate``: the command's own errors are one line and exit 2."""

import subprocess
import sys


def test_an_unwritable_json_path_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "prog.py").write_text("import torch\nx = torch.ones(2, device='neuron') * 2\n")
    (tmp_path / "file").write_text("")  # a file where the report's folder would be
    target = tmp_path / "file" / "em.json"
    done = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", "emulate", "--json", str(target),
         "--", sys.executable, "prog.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"neuron-workbench: error: cannot write {target}: ")
    assert "Traceback" not in done.stderr


def test_a_missing_script_is_one_line_and_exit_2_with_nothing_run(tmp_path):
    # `python nothere.py` fails at once; emulate printed a traceback through its own runner, then
    # a summary saying the program ran with no fallback, and exited 1
    done = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", "emulate",
         "--", "python", "nothere.py", "--epochs", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == "neuron-workbench: error: emulate: no such script: nothere.py\n"
    assert done.stdout == ""


def test_json_to_stdout_is_refused_before_the_program_runs(tmp_path, capsys):
    # the program's own output is the command's stdout: a report there would be mixed into it (it
    # was written to a file named "-")
    from neuron_workbench.cli.main import main

    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    assert main(["emulate", "--json", "-", "--", sys.executable, str(tmp_path / "prog.py")]) == 2
    assert capsys.readouterr().err == (
        "neuron-workbench: error: emulate: --json - would mix the report into the program's "
        "output; give a file\n"
    )
    assert not (tmp_path / "ran").exists()


def test_a_module_that_does_not_exist_is_pythons_one_line(tmp_path):
    # `python -m nosuchmod` prints one line and exits 1; emulate printed a traceback through its
    # runner and runpy; a package without __main__ is python's line too
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for module in ("nosuchmod", "pkg"):
        emulated = subprocess.run(
            [sys.executable, "-m", "neuron_workbench.cli.main", "emulate",
             "--", "python", "-m", module],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        plain = subprocess.run(
            [sys.executable, "-m", module], capture_output=True, text=True, cwd=tmp_path
        )
        assert emulated.returncode == plain.returncode == 1
        assert "Traceback" not in emulated.stderr
        assert emulated.stderr.splitlines()[0] == plain.stderr.strip()
        assert f": No module named {module}" in plain.stderr
