import json

import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run import LAST_EXPRESSION, RunSpec, commit, compile_cell, execute


def _ns(**values):
    ns = {"__name__": "__main__", "torch": torch}
    ns.update(values)
    return ns


def test_run_leaves_namespace_untouched_and_reports_outputs():
    weights = torch.ones(3)
    ns = _ns(weights=weights, unrelated=torch.zeros(2))
    program = compile_cell("weights.mul_(2)\nnew = weights.sum()\nnew * 1")
    run = execute(RunSpec(program, ns), get_backend("cpu"))
    assert run.ok
    assert ns["weights"] is weights and torch.equal(weights, torch.ones(3))
    assert "new" not in ns
    assert set(run.outputs) == {"new", "weights", LAST_EXPRESSION}  # weights was mutated in place
    assert float(run.outputs["new"]) == 6.0
    commit(ns, run)
    assert torch.equal(ns["weights"], torch.full((3,), 2.0)) and float(ns["new"]) == 6.0


def test_error_is_recorded_with_its_cell_line_and_namespace_restored():
    ns = _ns(a=1)
    program = compile_cell("a = 2\nb = 3\nraise RuntimeError('boom')")
    run = execute(RunSpec(program, ns), get_backend("cpu"))
    assert not run.ok
    assert (run.error.type, run.error.message, run.error.lineno) == ("RuntimeError", "boom", 3)
    assert run.error.line == "raise RuntimeError('boom')"
    assert ns["a"] == 1 and "b" not in ns


def test_a_run_that_need_not_restore_leaves_the_namespace_as_it_ended():
    # a target process's run: a thread the cell started read its namespace put back under it
    # (NameError on a name the cell bound)
    ns = _ns(a=1)
    program = compile_cell("a = 2\nb = [a]")
    run = execute(RunSpec(program, ns, restore_namespace=False), get_backend("cpu"))
    assert run.ok and set(run.outputs) == {"a", "b"}
    assert ns["a"] == 2 and ns["b"] is run.outputs["b"]


def test_a_run_that_raised_keeps_its_script_record(tmp_path):
    # its report names the script's line (train.py, line 2), not a cell's, when both runs raise
    import contextlib

    from neuron_workbench.run.script import ScriptContext

    @contextlib.contextmanager
    def partial(backend):
        yield {"ops": 0}

    context = ScriptContext(("train.py", "--lr=1"), str(tmp_path), str(tmp_path))
    program = compile_cell("x = 1\nraise ValueError('boom')")
    spec = RunSpec(program, _ns(), instruments={"script": context, "partial": partial})
    run = execute(spec, get_backend("cpu"))
    assert run.error.lineno == 2
    assert run.extras == {"script": context}  # not the other instruments' partial records


def test_each_run_starts_from_the_same_seed():
    program = compile_cell("sample = torch.rand(4)")
    first = execute(RunSpec(program, _ns(), seed=7), get_backend("cpu"))
    second = execute(RunSpec(program, _ns(), seed=7), get_backend("cpu"))
    other = execute(RunSpec(program, _ns(), seed=8), get_backend("cpu"))
    assert torch.equal(first.outputs["sample"], second.outputs["sample"])
    assert not torch.equal(first.outputs["sample"], other.outputs["sample"])


def test_seeding_skips_runtimes_the_build_lacks_and_restores_them(monkeypatch):
    # torch.manual_seed queues a seed with a formatted stack trace for a runtime that is not
    # initialised; for xpu/mtia in a build without them that costs time and can never matter.
    import traceback

    from neuron_workbench.run import executor

    originals = {name: getattr(torch, name).manual_seed_all for name in ("xpu", "mtia")}
    stacks = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: stacks.append(1) or [])
    executor.seed_everything(5)
    ours, stacks[:] = len(stacks), []
    first = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(first, torch.rand(3))  # the host generator is seeded as torch seeds it
    for name, original in originals.items():
        assert getattr(torch, name).manual_seed_all is original
    lacking = [name for name in originals if not getattr(torch, name)._is_compiled()]
    assert ours == len(stacks) - len(lacking)  # no seed queued for a runtime that cannot start


def test_uncopyable_values_are_shared_and_named():
    def numbers():
        yield from range(10)

    ns = _ns(stream=numbers())
    run = execute(RunSpec(compile_cell("first = next(stream)"), ns), get_backend("cpu"))
    assert run.ok and run.shared_names == ["stream"]


def test_deleted_names_are_reported_and_committed():
    ns = _ns(tmp=torch.ones(1))
    run = execute(RunSpec(compile_cell("del tmp"), ns), get_backend("cpu"))
    assert run.deleted == ["tmp"] and "tmp" in ns
    commit(ns, run)
    assert "tmp" not in ns


def test_instruments_wrap_the_cell_and_keep_what_they_recorded():
    import contextlib

    seen = []

    @contextlib.contextmanager
    def count_ops(backend):
        log = {"backend": backend.name, "ops": 0}

        class Counter(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                log["ops"] += 1
                return func(*args, **(kwargs or {}))

        with Counter():
            yield log
        seen.append(log)

    spec = RunSpec(compile_cell("y = torch.ones(2) + 1"), _ns(), instruments={"ops": count_ops})
    run = execute(spec, get_backend("cpu"))
    assert run.extras["ops"]["backend"] == "cpu" and run.extras["ops"]["ops"] >= 2
    assert seen == [run.extras["ops"]]


def test_repeat_runs_the_cell_as_consecutive_steps_and_records_scalars():
    ns = _ns(w=torch.tensor(1.0))
    program = compile_cell("w = w * 2\nloss = w.sum()\nfloat(loss)")
    run = execute(RunSpec(program, ns, steps=3), get_backend("cpu"))
    assert [step["loss"] for step in run.steps] == [2.0, 4.0, 8.0]
    assert [step[LAST_EXPRESSION] for step in run.steps] == [2.0, 4.0, 8.0]
    assert float(run.outputs["w"]) == 8.0 and float(ns["w"]) == 1.0


def test_a_name_sharing_state_that_cannot_be_copied_stays_as_it_is():
    # A DataLoader iterator over the dataset the cell reads shares its tensors; it cannot be copied,
    # and it is no input: the cell runs, and nothing is reported shared.
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.randn(8, 3)
    loader = DataLoader(TensorDataset(data), batch_size=4)
    ns = _ns(data=data, loader=loader, it=iter(loader))
    run = execute(
        RunSpec(compile_cell("first = data[0] * 2\ndata.add_(1)"), ns), get_backend("cpu")
    )
    assert run.ok, run.error
    assert run.shared_names == []
    assert "loader" in run.bindings and "it" not in run.bindings
    commit(ns, run)
    assert ns["loader"].dataset.tensors[0] is ns["data"]  # copied and kept together


def test_a_runs_captured_streams_behave_as_the_real_ones():
    # a StringIO capture has no buffer, reconfigure or fileno and no encoding: a script calling
    # faulthandler.enable() or sys.stdout.reconfigure(line_buffering=True) raised in every run
    import pickle
    import sys

    program = compile_cell(
        "import faulthandler, sys\n"
        "faulthandler.enable()\n"
        "sys.stdout.reconfigure(line_buffering=True)\n"
        "print('loss', 0.5, sys.stdout.encoding)\n"
        "sys.stdout.buffer.write('caf\\u00e9\\n'.encode())\n"
        "print('odd \\ud800', file=sys.stderr)\n"
        "held = sys.stdout\n"
    )
    try:
        run = execute(RunSpec(program, _ns()), get_backend("cpu"))
    finally:
        import faulthandler

        faulthandler.disable()
    assert run.ok, run.error
    assert run.stdout == "loss 0.5 utf-8\ncaf\u00e9\n"  # text and bytes, in order
    assert run.stderr == "odd \ud800\n"  # every code point kept, as a StringIO kept it
    assert sys.stdout is not run.outputs.get("held")
    # a value holding the stream (a progress bar) travels as a copy of its text
    copy = pickle.loads(pickle.dumps(run.outputs["held"]))
    assert copy.getvalue() == "loss 0.5 utf-8\ncaf\u00e9\n"


@pytest.mark.parametrize(
    "rewrap",
    [
        "sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding='utf-8')",
        "raw = sys.stdout.detach()\nsys.stdout = io.TextIOWrapper(raw, encoding='utf-8')",
    ],
    ids=["wrapped", "detached"],
)
def test_a_script_that_wraps_its_stdout_again_keeps_what_it_printed(rewrap):
    # The usual UTF-8 fix for Windows consoles: freed when the run ended, the script's wrapper
    # closed the capture's buffer under it, and reading the run's output raised a traceback out of
    # `record` ("I/O operation on closed file")
    program = compile_cell(f"import io, sys\nprint('before')\n{rewrap}\nprint('after')\n")
    run = execute(RunSpec(program, _ns()), get_backend("cpu"))
    assert run.ok, run.error
    assert run.stdout.split() == ["before", "after"]


def test_a_capture_below_python_keeps_fd_output_in_order_and_restores_the_fds(tmp_path, capfd):
    # A target's worker shares the kernel's fds 1 and 2: its os.system output reached the notebook
    # next to the reference's. Captured below Python, it is the run's, where it came, and the fds
    # are the process's again however the run ended (an interrupt here).
    import os
    import subprocess
    import sys

    from neuron_workbench.run.executor import capture_text

    with pytest.raises(KeyboardInterrupt):
        with capture_text(below=str(tmp_path)) as captured:
            print("one")
            os.system("echo two")
            print("three", file=sys.stderr)
            subprocess.run(["sh", "-c", "echo four >&2"])
            sys.stdout.buffer.write(b"five\n")
            os.write(1, b"six\n")
            raise KeyboardInterrupt
    os.write(1, b"the process's own\n")
    assert (captured.stdout, captured.stderr) == ("one\ntwo\nfive\nsix\n", "three\nfour\n")
    assert capfd.readouterr() == ("the process's own\n", "")
    assert list(tmp_path.iterdir()) == []  # its files went with it


def test_a_runs_stream_descriptor_is_the_one_of_the_stream_it_replaced(tmp_path, capfd):
    # subprocess.run(cmd, stdout=sys.stdout) in a run wrote to the process's own fd 1 whatever
    # sys.stdout was: in a kernel, whose sys.stdout has a descriptor of its own (ipykernel's copy
    # of the terminal's), not where a plain cell's goes. Here sys.stdout is a file on another fd.
    import contextlib

    program = compile_cell(
        "import subprocess, sys\n"
        "subprocess.run(['echo', 'from a subprocess'], stdout=sys.stdout)\n"
        "subprocess.run(['sh', '-c', 'echo to stderr >&2'], stderr=sys.stderr)\n"
        "print('printed')\n"
    )
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            run = execute(RunSpec(program, _ns(), live_run="ref"), get_backend("cpu"), run_id="ref")
    assert run.ok, run.error
    assert out_path.read_text() == "from a subprocess\nprinted\n"  # as plain code writes there
    assert err_path.read_text() == "to stderr\n"
    assert capfd.readouterr() == ("", "")  # nothing went around it, to the process's fds


STEPPED_SCRIPT = """\
import argparse, sys
import torch

def main():
    parser = argparse.ArgumentParser(prog="stepped.py")
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    w = torch.ones(2, device="cuda")
    loss = (w * args.lr).sum()
    print(f"loss {loss.item():.4f}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
"""


def test_steps_repeat_a_script_that_ends_in_sys_exit_0_as_one_that_just_ends(
    tmp_path, monkeypatch, capsys
):
    # `sys.exit(main())` ended every repetition, not its own: `run train.py --steps 3` ran such a
    # script once and passed with options.steps 3 and no training section, while the same script
    # without sys.exit ran three times
    from neuron_workbench.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "stepped.py").write_text(STEPPED_SCRIPT)
    assert main(["run", "stepped.py", "--steps", "3", "--json", "r.json"]) == 0
    assert capsys.readouterr().out.startswith("loss 1.0000\n" * 3 + "stepped.py: PASS")
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    assert report["training"]["steps"] == 3
    assert [(s["site"], s["ref_count"], s["target_count"]) for s in report["scalars"]["sites"]] == [
        ("stepped.py:10", 3, 3)
    ]
    # the script's own --help is printed once, as under python
    assert main(["run", "stepped.py", "--steps", "3", "--", "--help"]) == 0
    assert capsys.readouterr().out.count("usage: stepped.py") == 1
