"""%neuron_scan / %neuron_migrate on a real IPython shell."""

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from neuron_workbench.magics.scan import ScanMagics
from neuron_workbench.scan import Migration, ScanReport


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.register_magics(ScanMagics)
    yield sh
    sh.reset(new_session=False)


def run(sh, source):
    result = sh.run_cell(source, store_history=True)
    if result.error_in_exec is not None and not isinstance(result.error_in_exec, UsageError):
        raise result.error_in_exec
    return result


def test_cell_magic_scans_without_running(shell):
    result = run(shell, "%%neuron_scan\n%matplotlib inline\nboom = 1 / 0\nx = t.cuda()\n")
    report = result.result
    assert isinstance(report, ScanReport) and "boom" not in shell.user_ns
    assert [(f.rule_id, f.line) for f in report] == [("NW102", 3)]
    bundle = report._repr_mimebundle_()
    assert (
        bundle["text/plain"].splitlines()[0]
        == "<cell>:3:7: NW102 [*] `.cuda()` moves to a CUDA GPU"
    )
    assert "<table" in bundle["text/html"] and "&lt;cell&gt;:3:7" in bundle["text/html"]


def test_line_magic_scans_previous_cell_with_its_imports(shell):
    run(shell, "import torch as T")
    run(shell, "def f():\n    T.cuda.synchronize()\n")
    report = run(shell, "%neuron_scan").result
    assert [(f.rule_id, f.line) for f in report] == [("NW103", 2)]
    assert report.findings[0].suggestion == "use `torch.neuron.synchronize`"


def test_line_magic_scans_a_file(shell, tmp_path):
    path = tmp_path / "train.py"
    path.write_text('import torch\nx = torch.ones(1, device="cuda")\n')
    report = run(shell, f"%neuron_scan {path} --target tpu").result
    assert report.target == "tpu" and report.findings[0].suggestion == 'use "tpu"'


def test_cell_migrate_shows_diff_and_can_fill_next_cell(shell, monkeypatch):
    calls = []
    monkeypatch.setattr(shell, "set_next_input", lambda text, replace=False: calls.append(text))
    migration = run(shell, "%%neuron_migrate --next\nx = t.cuda()  # keep me\n").result
    assert isinstance(migration, Migration)
    assert '+x = t.to("neuron")  # keep me' in migration.diff
    assert calls == ['x = t.to("neuron")  # keep me']
    assert "1 rewritten" in migration._repr_mimebundle_()["text/plain"]


def test_line_migrate_writes_a_file(shell, tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\nx = torch.ones(1).cuda()\n")
    migration = run(shell, f"%neuron_migrate {path} --write").result
    assert migration.changed and '.to("neuron")' in path.read_text()
    assert not run(shell, f"%neuron_migrate {path}").result.changed


@pytest.mark.parametrize(
    "line",
    [
        "%neuron_scan /no/such/file.py",
        "%neuron_scan --target gpu",
        "%%neuron_scan some/path.py\nx = 1",
        "%neuron_migrate --write",
        "%%neuron_migrate --next path.py\nx = 1",
        "%%neuron_scan\nx = (\n",
    ],
)
def test_usage_errors_are_one_liners(shell, line):
    result = run(shell, line)
    assert isinstance(result.error_in_exec, UsageError)
    assert "\n" not in str(result.error_in_exec)


def test_no_previous_cell_is_explained(shell, monkeypatch):
    monkeypatch.setattr(shell.history_manager, "input_hist_raw", ["%neuron_scan"])
    with pytest.raises(UsageError, match="no previous cell"):
        ScanMagics(shell=shell).neuron_scan("")


def test_help_is_the_docstring():
    doc = ScanMagics.neuron_scan.__doc__
    assert "%neuron_scan [PATH]" in doc and "--target" in doc
    assert "%%neuron_migrate" in ScanMagics.neuron_migrate.__doc__
