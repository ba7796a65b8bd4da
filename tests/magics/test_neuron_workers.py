"""%%neuron --executor worker: targets in worker processes, in a shell and in a real notebook kernel."""

import gc
import time

import pytest
import torch
from IPython.core.error import UsageError

from neuron_workbench.cli.notebook_runner import run_notebook
from neuron_workbench.report.display import format_bytes
from neuron_workbench.testing import run_cell, write_notebook

#: A module the kernel imports from the notebook's folder; its op aborts the process in a worker.
ABORTING_OPS = """
import ctypes
import os

import torch


@torch.library.custom_op("nwtest_nb::boom", mutates_args=())
def boom(x: torch.Tensor) -> torch.Tensor:
    if os.environ.get("NEURON_WORKBENCH_WORKER"):
        ctypes.CDLL(None).abort()
    return x.clone()
"""


def test_neuron_and_tpu_cells_run_side_by_side_in_workers(ip):
    run_cell(ip, "import torch\nbase = torch.arange(4.0)")
    run_cell(ip, "%%neuron --executor worker --target tpu -o r_tpu\ny = base.cuda().cumsum(0)")
    run_cell(ip, "%%neuron --executor worker --target neuron -o r_neuron\nz = base.cuda() * 2")
    assert ip.user_ns["r_tpu"].verdict == "PASS", ip.user_ns["r_tpu"].summary()
    assert ip.user_ns["r_tpu"].target.backend.name == "tpu"
    assert ip.user_ns["r_neuron"].verdict == "PASS", ip.user_ns["r_neuron"].summary()
    table = ip.run_line_magic("neuron_workers", "")
    rows = {row.target: row for row in table.rows}
    assert {"tpu", "neuron"} <= set(rows) and all(row.alive for row in rows.values())
    assert rows["tpu"].cells_run >= 1 and rows["tpu"].memory_bytes > 0
    assert "tpu" in repr(table) and "cells run" in repr(table)
    restarted = ip.run_line_magic("neuron_workers", "restart tpu")
    new_rows = {row.target: row for row in restarted.rows}
    assert new_rows["tpu"].pid != rows["tpu"].pid and new_rows["tpu"].cells_run == 0


def test_the_workers_table_shows_the_shared_memory_kept_for_transfers(ip):
    run_cell(ip, "import torch\nbase = torch.arange(4.0)")
    for _ in range(2):
        run_cell(ip, "%%neuron --executor worker --target tpu -o r_kept\ny = base.cuda() + 1")
    assert ip.user_ns["r_kept"].verdict == "PASS", ip.user_ns["r_kept"].summary()
    run_cell(ip, "del r_kept")  # its target run maps the answer's arena until it is gone
    gc.collect()
    table = ip.run_line_magic("neuron_workers", "")
    row = next(row for row in table.rows if row.target == "tpu")
    assert row.kept_bytes > 0
    assert f"{format_bytes(row.kept_bytes)} kept for transfers" in repr(table)
    restarted = ip.run_line_magic("neuron_workers", "restart tpu")
    assert next(row for row in restarted.rows if row.target == "tpu").kept_bytes == 0


def test_one_reference_against_neuron_and_tpu(ip):
    run_cell(ip, "import torch\nbase = torch.arange(4.0)")
    run_cell(ip, "%%neuron --target neuron,tpu -o both\nsquares = base.cuda() ** 2")
    reports = ip.user_ns["both"]
    assert [r.target.backend.name for r in reports] == ["neuron", "tpu"]
    assert [r.verdict for r in reports] == ["PASS", "PASS"]
    assert reports[0].ref is reports[1].ref  # the reference ran once
    assert reports[1].options["target"] == "tpu"
    assert torch_equal(ip.user_ns["squares"], [0.0, 1.0, 4.0, 9.0])


def test_two_accelerators_in_process_is_a_usage_error(ip):
    with pytest.raises(UsageError, match="needs --executor worker"):
        run_cell(ip, "%%neuron --target neuron,tpu --executor inprocess\nx = 1")


def torch_equal(tensor, values):
    return tensor.tolist() == values


def test_keep_target_from_a_worker_keeps_host_copies_marked_with_their_device(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target tpu --keep target --executor worker\n"
        "import torch\ny = torch.ones(3, device='cuda') * 2",
    )
    # the kernel holds no accelerator: the target's tensors come back to the host
    assert ip.user_ns["y"].device.type == "cpu" and ip.user_ns["y"].tolist() == [2.0] * 3
    assert ip.user_ns["y"]._workbench_device == "tpu:0"


def test_auto_runs_accelerator_targets_in_workers_and_cpu_in_process(ip):
    run_cell(ip, "import torch")
    run_cell(ip, "%%neuron --ref cpu --target tpu -o r\nq = torch.ones(2, device='cuda') + 1")
    assert ip.user_ns["r"].target.backend.name == "tpu" and ip.user_ns["r"].verdict == "PASS"
    run_cell(ip, "%%neuron --ref cpu --target cpu -o r\nq = torch.ones(2, device='cuda') + 1")
    assert ip.user_ns["r"].verdict == "PASS"
    targets = {row.target for row in ip.run_line_magic("neuron_workers", "").rows}
    assert "tpu" in targets and "cpu" not in targets


def test_rebinding_a_name_to_the_same_text_is_an_output_each_time(ip):
    # the worker must see the names a cell rebinds, as an in-process run does; the interned
    # "cuda" is the same object the second time, yet the cell bound it again
    run_cell(ip, "import torch")
    cell = '%%neuron --executor worker -o r\ndevice = "cuda"\ny = torch.ones(2).to(device)'
    for _ in range(2):
        run_cell(ip, cell)
        assert [d.path for d in ip.user_ns["r"].comparison.diffs] == ["device", "y"]
        assert ip.user_ns["r"].verdict == "PASS"


def test_display_in_a_worker_cell_prints(ip):
    run_cell(ip, "import torch")
    run_cell(
        ip, "%%neuron --executor worker --keep target -o r\nz = torch.ones(1)\ndisplay('shown')"
    )
    assert ip.user_ns["r"].verdict == "PASS" and ip.user_ns["r"].target.stdout == "shown\n"


def test_config_selects_the_worker_executor(ip):
    run_cell(ip, "import torch")
    magics = ip.magics_manager.registry["NeuronMagics"]
    before = magics.executor  # the shell is shared by the tests: put the setting back as it was
    run_cell(ip, "%config NeuronMagics.executor = 'worker'")
    try:
        run_cell(ip, "%%neuron --target tpu -o r\nq = torch.ones(2, device='cuda') + 1")
    finally:
        magics.executor = before
    assert ip.user_ns["r"].target.backend.name == "tpu" and ip.user_ns["r"].verdict == "PASS"


def test_unshippable_object_is_a_one_line_usage_error(ip):
    run_cell(ip, "import torch\nnumbers = (i for i in range(3))")
    with pytest.raises(UsageError) as caught:
        run_cell(ip, "%%neuron --executor worker\nfirst = next(numbers)")
    message = str(caught.value)
    assert "\n" not in message
    assert "'numbers' (a generator) cannot be sent to the neuron worker process" in message
    # not --executor inprocess: both runs would draw from the one generator, each another item
    # a loop drawing several items works with the iterator made in the cell; one item also in a
    # plain cell
    assert message.endswith(
        "make it in the %%neuron cell (numbers = iter(...)), each run then draws from its own, or "
        "take a single item in a plain cell (batch = next(numbers)) and use it in the %%neuron cell"
    )
    assert "first" not in ip.user_ns


def test_a_pipe_the_cell_writes_to_keeps_the_inprocess_hint(ip):
    # a file is an iterator too, but nothing is drawn from it: --executor inprocess is the way (a
    # file on a path, opened for writing, travels: see test_neuron_default_path)
    run_cell(
        ip, "import os, torch\nread_end, write_end = os.pipe()\nlog = os.fdopen(write_end, 'w')"
    )
    with pytest.raises(UsageError) as caught:
        run_cell(ip, "%%neuron\nlog.write(str(torch.ones(1, device='cuda').sum().item()))")
    assert str(caught.value).endswith("run the cell with --executor inprocess")
    run_cell(ip, "log.close()\nos.close(read_end)")


def test_a_refused_cell_leaves_the_random_state_as_it_was(ip):
    # --profile runs the reference first: it drew before the target's values were refused
    run_cell(ip, "import torch\nnumbers = (i for i in range(3))\ntorch.manual_seed(3)")
    with pytest.raises(UsageError):
        run_cell(ip, "%%neuron --profile\na = torch.randn(2, device='cuda')\nb = next(numbers)")
    run_cell(ip, "after = torch.randn(2)\ntorch.manual_seed(3)\nexpected = torch.randn(2)")
    assert torch.equal(ip.user_ns["after"], ip.user_ns["expected"])


def test_a_seeded_cell_that_commits_nothing_leaves_the_random_state_as_it_was(ip):
    # --seed seeds each run, and the reference runs in the kernel: a cell refused after it had run
    # (--profile), or one the target raised in, left the notebook's generator seeded and drawn
    run_cell(ip, "import torch\nnumbers = (i for i in range(3))")
    cells = [
        ("--profile --seed 5", "a = torch.randn(2, device='cuda')\nb = next(numbers)"),
        (
            "--seed 5 -o r",
            "a = torch.randn(2, device='cuda')\n"
            "if a.device.type != 'cpu':\n    raise ValueError('target only')",
        ),
    ]
    for flags, cell in cells:
        run_cell(ip, "torch.manual_seed(3)")
        if "--profile" in flags:
            with pytest.raises(UsageError):
                run_cell(ip, f"%%neuron {flags}\n{cell}")
        else:
            run_cell(ip, f"%%neuron {flags}\n{cell}")
            assert ip.user_ns["r"].verdict == "ERROR", ip.user_ns["r"].summary()
        run_cell(ip, "after = torch.randn(2)\ntorch.manual_seed(3)\nexpected = torch.randn(2)")
        assert torch.equal(ip.user_ns["after"], ip.user_ns["expected"]), flags


def test_a_magic_line_in_the_cell_says_the_worker_has_no_ipython(ip):
    # `%time out = f(x)` is get_ipython().run_line_magic(...): "'get_ipython' (a method) cannot be
    # sent ... (cannot pickle '_thread.lock' object)" did not say what to do about it
    run_cell(ip, "import torch\nx = torch.ones(2)")
    with pytest.raises(UsageError) as caught:
        run_cell(ip, "%%neuron --executor worker\ny = x.cuda()\n%time z = y * 2")
    message = str(caught.value)
    assert message == (
        "the cell runs IPython itself (a %magic or !command line), which the neuron worker "
        "process does not have; move that line out of the %%neuron cell, or run the cell with "
        "--executor inprocess"
    )
    assert "z" not in ip.user_ns


def test_a_hung_target_with_timeout_5_is_reported_within_10_seconds(ip):
    run_cell(ip, "import os, time, torch\nkept = torch.ones(2)")
    run_cell(ip, "%%neuron --executor worker --target tpu\nwarm = torch.ones(1, device='cuda')")
    start = time.monotonic()
    run_cell(
        ip,
        "%%neuron --executor worker --target tpu --timeout 5 -o r\n"
        "x = kept.cuda() * 2\n"
        "if os.environ.get('NEURON_WORKBENCH_WORKER'):\n"
        "    time.sleep(600)\n",
    )
    assert time.monotonic() - start < 10
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.ok
    assert report.target.error.message == (
        # asleep in host code at line 4, after the device's multiplication at line 2 had ended
        "target process timed out after 5 s at cell line 4, after running aten::mul.Tensor; "
        "it was ended"
    )
    assert "x" not in ip.user_ns and torch.equal(ip.user_ns["kept"], torch.ones(2))


def test_timeout_needs_the_worker_executor(ip):
    with pytest.raises(UsageError, match="--timeout needs --executor worker"):
        run_cell(ip, "%%neuron --executor inprocess --timeout 5\nx = 1")


@pytest.mark.slow
def test_notebook_with_workers_keeps_the_kernel_pristine_and_survives_an_abort(tmp_path):
    (tmp_path / "nwtest_nb_ops.py").write_text(ABORTING_OPS)
    cells = [
        "import torch\nimport nwtest_nb_ops\nkept = torch.arange(4.0)",
        "%%neuron --target neuron\ny = torch.ones(3, device='cuda') * 2",
        "%%neuron --target tpu\nz = torch.ones(3, device='cuda').cumsum(0)",
        "%%neuron --target neuron,tpu\nu = torch.ones(3, device='cuda') - 1",
        "%%neuron --target neuron\nx = torch.ones(3, device='cuda')\nw = nwtest_nb_ops.boom(x)",
        "%%neuron --target neuron\nv = kept.cuda() * 3",
        # the kernel never installed a PrivateUse1 backend; the aborted cell left no trace
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'\n"
        "assert torch.equal(kept, torch.arange(4.0)) and 'w' not in globals()\n"
        "assert torch.equal(v, torch.arange(4.0) * 3)",
    ]
    path = write_notebook(tmp_path / "workers.ipynb", *cells)
    result = run_notebook(path, options={"ref": "cpu", "executor": "worker"})
    assert result.cell_errors == []
    verdicts = [(r["cell_index"], r["verdict"]) for r in result.reports]
    assert verdicts == [
        (2, "PASS"),
        (3, "PASS"),
        (4, "PASS"),
        (4, "PASS"),
        (5, "ERROR"),
        (6, "PASS"),
    ]
    assert result.reports[1]["title"].startswith("tpu (emulated) vs cpu")
    assert [r["title"].split(" vs ")[0] for r in result.reports[2:4]] == [
        "neuron (emulated)",
        "tpu (emulated)",
    ]
    crashed = result.reports[4]
    assert crashed["target"]["error"]["message"] == (
        "target process died (SIGABRT) while running nwtest_nb::boom at cell line 3"
    )
    assert crashed["ref"]["ok"]


def test_the_extension_launches_the_configured_targets_worker_as_it_loads(ip):
    # the first %%neuron cell then finds the worker's device ready, not a second or two away
    from neuron_workbench.magics.neuron import NeuronMagics

    for config, launched in (
        ({}, {"neuron"}),
        ({"target": "tpu"}, {"tpu"}),
        ({"executor": "inprocess"}, set()),
        ({"target": "cpu"}, set()),
    ):
        magic = NeuronMagics(shell=ip, **config)
        try:
            magic.launch_workers()
            rows = magic.session.workers.rows()
            assert {row.target for row in rows if row.alive} == launched, config
        finally:
            magic.session.close()
            ip.configurables.remove(magic)  # (IPython lists every Magics made for the shell)
