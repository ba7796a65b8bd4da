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
