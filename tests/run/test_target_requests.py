"""run/target_requests.py: a target process answers every request, failing ones with one line."""

import gc
import sys

import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run.cell import compile_cell
from neuron_workbench.run.target_requests import (
    _last_op_recorded,
    answer_request,
    pack_request,
    read_last_op,
    refuse_input,
    release_answered,
    where_it_was,
)
from neuron_workbench.run.transport import dumps, loads
from neuron_workbench.worker_launch import LAST_OP_BYTES


def _unloadable():
    raise ImportError("No module named 'nb_helpers'")


class _Unloadable:
    """Pickles here, fails to load in the target process (a module only the kernel has)."""

    def __reduce__(self):
        return (_unloadable, ())


def _request(program):
    """A run request for ``program`` as the kernel sends one, with every option at its default."""
    return {
        "program": program,
        "seed": 0,
        "hidden": frozenset(),
        "force": [],
        "instruments": {},
        "rng_on_cpu": False,
        "steps": 1,
        "what_if": None,
        "ref_precision": "cuda",
        "backend_options": {},
        "lines": None,
    }


def test_a_request_the_target_cannot_load_or_run_is_a_one_line_usage_error():
    cpu = get_backend("cpu")
    unloadable = dumps({"value": _Unloadable()})
    answer = loads(
        answer_request(unloadable, cpu, bytearray(256), host="actor", load_hint="L", hint="H")
    )
    assert answer == {
        "usage_error": "the cpu actor could not load what the cell reads "
        "(ImportError: No module named 'nb_helpers'); L"
    }
    broken = dumps({"no": "program"})  # the workbench fails around the cell: the process serves on
    answer = loads(
        answer_request(broken, cpu, bytearray(256), host="worker", load_hint="L", hint="H")
    )
    assert answer == {"usage_error": "the cpu worker failed: KeyError: 'program'; H"}


@pytest.mark.parametrize("module", ["nwtest_release", "__main__"])
def test_the_cells_state_outlives_the_answer_until_it_is_released(module):
    # A worker frees the cell's state after it has sent the answer (release_answered), not before:
    # freeing a model's worth of objects would otherwise delay every answer. A notebook's
    # (__main__) values live in the notebook globals the worker keeps between requests: they go
    # then too, not at the start of the next request.
    program = compile_cell(
        "import sys, weakref\n"
        "x = torch.ones(3) * 2\n"
        "weakref.finalize(x, sys.modules[__name__ + '_freed'].append, 'x')\n"
        "weakref.finalize(v, sys.modules[__name__ + '_freed'].append, 'v')\n"
    )
    freed: list[str] = []
    request = _request(program)
    namespace = {"torch": torch, "__name__": module}
    sys.modules[f"{module}_freed"] = freed  # type: ignore[assignment]
    try:
        packed = pack_request(request, {"torch": torch, "v": torch.zeros(2)}, namespace, "cpu")
        answer = loads(
            answer_request(
                packed, get_backend("cpu"), bytearray(256), host="worker", load_hint="L", hint="H"
            )  # fmt: skip
        )
        assert torch.equal(answer["run"].outputs["x"], torch.full((3,), 2.0))
        gc.collect()
        assert freed == []  # the run's x, and the v it read, are still held
        release_answered()
        gc.collect()
        assert sorted(freed) == ["v", "x"]
    finally:
        del sys.modules[f"{module}_freed"]


def test_a_thread_the_cell_started_reads_what_the_cell_bound_after_the_answer():
    # it failed in the worker with "NameError: name 'seen' is not defined", printed into the
    # notebook: the run put the namespace back, and the answer emptied the notebook's globals
    import threading
    import time
    import types

    program = compile_cell(
        "import sys, threading\n"
        "seen = []\n"
        "def bg(box=sys.modules['nwtest_thread_box']):\n"
        "    box.go.wait(10)\n"
        "    try:\n"
        "        seen.append(1)\n"
        "        box.done.append(len(seen))\n"
        "    except NameError as exc:\n"
        "        box.done.append(str(exc))\n"
        "threading.Thread(target=bg, daemon=True).start()\n"
    )
    request = _request(program)
    box = types.ModuleType("nwtest_thread_box")
    box.go, box.done = threading.Event(), []  # type: ignore[attr-defined]
    sys.modules[box.__name__] = box
    try:
        packed = pack_request(request, {}, {"__name__": "__main__"}, "cpu")
        answer = loads(
            answer_request(
                packed, get_backend("cpu"), bytearray(256), host="worker", load_hint="L", hint="H"
            )  # fmt: skip
        )
        assert answer["run"].ok, answer["run"].error
        release_answered()  # as the worker does once the answer is sent
        box.go.set()
        deadline = time.monotonic() + 10
        while not box.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert box.done == [1]
    finally:
        box.go.set()
        del sys.modules[box.__name__]
        release_answered()


def test_input_in_a_target_process_says_it_has_no_standard_input(monkeypatch):
    # a worker's stdin is /dev/null: input() raised a bare "EOF when reading a line", which the
    # report gave as the device's failure
    import builtins

    monkeypatch.setattr(builtins, "input", builtins.input)  # put back after the test
    refuse_input("worker", "run the cell with --executor inprocess")
    with pytest.raises(EOFError) as error:  # still an EOFError: what a cell catching it expects
        input("n? ")
    assert str(error.value) == (
        "input() cannot ask: the worker process has no standard input; "
        "run the cell with --executor inprocess"
    )


@torch.library.custom_op("nwtest_requests::reads_slot", mutates_args=())
def _reads_slot(x: torch.Tensor) -> torch.Tensor:
    _SEEN.append(read_last_op(_SLOT))
    return x * 2


_SLOT = bytearray(LAST_OP_BYTES)
_SEEN: list = []


def test_the_dispatch_mode_names_each_op_and_marks_it_ended_when_it_returns():
    # (no emulated device in this process: the Python dispatch mode records, as in a Ray actor)
    _SLOT[:] = b"\xff" * LAST_OP_BYTES
    _SEEN.clear()
    with _last_op_recorded(_SLOT):
        torch.ones(2) + 1
        assert read_last_op(_SLOT) == ("aten::add.Tensor", True)
        _reads_slot(torch.ones(2))
    assert _SEEN == [("nwtest_requests::reads_slot", False)]  # inside it: still running
    assert read_last_op(_SLOT) == ("nwtest_requests::reads_slot", True)


def test_where_a_process_was_says_whether_its_last_op_had_ended():
    assert (
        where_it_was("aten::mul.Tensor", False, 4)
        == " while running aten::mul.Tensor at cell line 4"
    )
    assert (
        where_it_was("aten::mul.Tensor", True, 4)
        == " at cell line 4, after running aten::mul.Tensor"
    )
    assert where_it_was("aten::mul.Tensor", True, None) == " after running aten::mul.Tensor"
    assert where_it_was("", False, 2) == " at cell line 2"
    assert where_it_was("", True, None) == ""
    # a record from before the state byte, or a short one, reads as running
    assert read_last_op(b"aten::cos".ljust(LAST_OP_BYTES, b"\0")) == ("aten::cos", False)
    assert read_last_op(b"aten::cos\0\1") == ("aten::cos", False)


def test_where_a_process_was_names_a_scripts_line_as_the_scripts():
    # a script's program is compiled under its own path; a cell's under a pseudo-file
    assert where_it_was("", False, 2, "sub/train.py") == " at train.py, line 2"
    assert (
        where_it_was("aten::mul.Tensor", True, 4, "/home/me/train.py")
        == " at train.py, line 4, after running aten::mul.Tensor"
    )
    assert where_it_was("", False, 2, "<neuron-cell-3>") == " at cell line 2"
    assert where_it_was("aten::cos", False, None, "train.py") == " while running aten::cos"
