import gc
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

# Fixture notebooks are inputs of tests (the scanner's), not guided notebooks for nbval to run.
collect_ignore_glob = ["**/fixtures/*", "**/fixtures/**/*"]


def _real_backend(name: str) -> bool:
    return importlib.util.find_spec(f"torch_{'neuronx' if name == 'neuron' else name}") is not None


#: Test files that need the emulated device *in the test process* (the emulator itself, adapters,
#: recorders, and the tests that are about ``--executor inprocess``). Everything else runs as users
#: run it: this process holds no accelerator, so ``%%neuron`` resolves ``auto`` to a worker process.
IN_PROCESS_DEVICE = (
    "tests/emulator/",
    "tests/backends/",
    "tests/artifacts/",
    "tests/trace/",
    "tests/views/",
    "tests/extensions/test_charts_js.py",
    "tests/report/test_display.py",
    "tests/run/test_remap.py",
    "tests/cli/commands/test_doctor.py",
)


def _marked_in_process(item: pytest.Item) -> bool:
    """Whether ``item`` is marked ``inprocess_device`` (collection marks the listed paths too)."""
    return item.get_closest_marker("inprocess_device") is not None


def _needs_device_in_process(item: pytest.Item) -> bool:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return _marked_in_process(item) or any(
        path == entry or path.startswith(entry.rstrip("/") + "/") for entry in IN_PROCESS_DEVICE
    )


@pytest.hookimpl(tryfirst=True)  # markers first: `-m inprocess_device` selects by them
def pytest_collection_modifyitems(config, items):
    skips = {
        "cuda": (not torch.cuda.is_available(), "needs a CUDA GPU"),
        "neuron": (not _real_backend("neuron"), "needs Trainium with torch-neuronx"),
        "tpu": (not _real_backend("tpu"), "needs a TPU with torch-tpu"),
    }
    for item in items:
        for marker, (skip, why) in skips.items():
            if skip and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=why))
        if _needs_device_in_process(item):
            item.add_marker(pytest.mark.inprocess_device)


def pytest_collection_finish(session):
    """Both kinds in one session: the in-process ones are skipped, saying how to run them.

    The emulated device must be installed before the process's first backward pass, and the
    default-path tests need a process without it, so each kind runs in a session of its own
    (``scripts/test.sh`` runs both).

    Collection also freezes what the imports made (torch, IPython, the test modules): those
    objects live as long as the session does, and every ``gc.collect()`` (each ``ip`` test's
    ``shell.reset()`` runs two) walked them all again, most of a second per test late in a
    session. Only the garbage of tests is collected; no test has run yet, so none is frozen.
    """
    gc.collect()
    gc.freeze()
    kinds = {_marked_in_process(item) for item in session.items}
    if kinds == {True, False}:
        skip = pytest.mark.skip(
            reason="needs a session of its own: pytest -m inprocess_device (scripts/test.sh "
            "runs both kinds)"
        )
        for item in session.items:
            if _marked_in_process(item):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def emulated_neuron():
    """``neuron`` emulated in the test process (one PrivateUse1 backend per process; tpu tests use
    subprocesses). Only tests marked ``inprocess_device`` (or listed in :data:`IN_PROCESS_DEVICE`)
    get it, in a pytest session of their own."""
    from neuron_workbench import emulate

    return emulate("neuron")


@pytest.fixture(scope="session", autouse=True)
def _device_before_any_backward(request):
    """An in-process session installs the device before any other fixture runs a backward pass.

    Session-scoped fixtures (``tests/artifacts``' runs) are set up before the per-test placement
    below; with the tests spread over several processes (``pytest -n``), any of them may be a
    process's first.
    """
    items = request.session.items
    # (a session holding both kinds skips the in-process ones: see pytest_collection_finish)
    if items and all(_marked_in_process(item) for item in items):
        request.getfixturevalue("emulated_neuron")


@pytest.fixture(autouse=True)
def _device_placement(request):
    """Install the emulated device for in-process tests; check that the others run without it."""
    if _marked_in_process(request.node):
        request.getfixturevalue("emulated_neuron")
    else:
        # the default path: the test process holds no accelerator backend
        assert torch._C._get_privateuse1_backend_name() == "privateuseone", (
            "an in-process device test ran before a default-path test"
        )


@pytest.fixture(autouse=True)
def _intra_op_threads_kept():
    """Torch's thread count for threads started later is set back after each test.

    A DataLoader's pin-memory thread calls ``torch.set_num_threads(1)``: this process's threads
    keep their count, but threads started afterwards (the emulated device's autograd thread, at
    the first backward pass there) took 1. A later test comparing CPU against the device then
    reduced in another order on each (a conv bias before a BatchNorm, whose gradient is rounding
    noise, then moved by Adam's whole step in opposite directions).
    """
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _shell_kept_apart():
    """A real IPython shell with neuron_workbench loaded; on teardown its namespace and the
    process's matmul precision go back to what they were."""
    from neuron_workbench.run.torch_settings import forget_chosen_precision
    from neuron_workbench.testing import testing_shell

    precision = torch.get_float32_matmul_precision()
    shell = testing_shell()
    yield shell
    shell.reset(new_session=False)
    # a matmul precision one test's notebook chose is not the next one's: a cell's "high" stayed
    # in this process (as in a kernel) and later tests' float32 matmuls ran at it
    torch.set_float32_matmul_precision(precision)
    forget_chosen_precision()


@pytest.fixture
def ip():
    """A real IPython shell with neuron_workbench loaded and a fresh namespace."""
    yield from _shell_kept_apart()


@pytest.fixture(scope="module")
def module_ip():
    """One such shell for a whole test module, whose tests share what its cells define."""
    yield from _shell_kept_apart()


@pytest.fixture
def fresh_dynamo(ip):
    """Dynamo reset around a test: the reference compiles in this process, and each test compiles
    afresh, as a new kernel would; compiled code goes before the shell's namespace (which holds
    Dynamo's globals) does."""
    import gc

    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()


@pytest.fixture
def fresh_tpu_worker(ip):
    """The matmul precision a tpu cell sets stays in its worker: later tests get a fresh one."""
    yield
    ip.magics_manager.registry["NeuronMagics"].session.workers.get("tpu").stop()


CHARTS_JS = Path(__file__).resolve().parents[1] / "extensions/neuron-workbench-lab/src/charts.js"
_CHARTS_PRELUDE = """
import * as charts from './charts.mjs';
import fs from 'fs';
const report = JSON.parse(fs.readFileSync(0, 'utf8'));
"""


@pytest.fixture
def run_charts_js(tmp_path):
    """Run the JupyterLab view's ``charts.js`` under Node.js on report data; return ``out``.

    ``run_charts_js(body, data)``: ``body`` is JavaScript that sees ``charts`` (the module) and
    ``report`` (``data``) and binds ``out``, which comes back parsed from JSON. Skips the test when
    Node.js is not installed.
    """
    node = shutil.which("node")

    def run(body: str, data: dict) -> Any:
        if node is None:
            pytest.skip("Node.js is not installed")
        shutil.copy(CHARTS_JS, tmp_path / "charts.mjs")
        script = _CHARTS_PRELUDE + body + "\nprocess.stdout.write(JSON.stringify(out));\n"
        (tmp_path / "harness.mjs").write_text(script)
        done = subprocess.run(
            [node, str(tmp_path / "harness.mjs")],
            input=json.dumps(data),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return run
