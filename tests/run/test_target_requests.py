"""run/target_requests.py: a target process answers every request, failing ones with one line."""

import gc
import sys

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run.cell import compile_cell
from neuron_workbench.run.target_requests import answer_request, pack_request, release_answered
from neuron_workbench.run.transport import dumps, loads


def _unloadable():
    raise ImportError("No module named 'nb_helpers'")


class _Unloadable:
    """Pickles here, fails to load in the target process (a module only the kernel has)."""

    def __reduce__(self):
        return (_unloadable, ())


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


def test_the_cells_state_outlives_the_answer_until_it_is_released():
    # A worker frees the cell's state after it has sent the answer (release_answered), not before:
    # freeing a model's worth of objects would otherwise delay every answer.
    program = compile_cell(
        "import sys, weakref\n"
        "x = torch.ones(3) * 2\n"
        "weakref.finalize(x, sys.modules[__name__ + '_freed'].append, 'x')\n"
    )
    freed: list[str] = []
    request = {
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
    namespace = {"torch": torch, "__name__": "nwtest_release"}
    sys.modules["nwtest_release_freed"] = freed  # type: ignore[assignment]
    try:
        packed = pack_request(request, {"torch": torch}, namespace, "cpu")
        answer = loads(
            answer_request(
                packed, get_backend("cpu"), bytearray(256), host="worker", load_hint="L", hint="H"
            )  # fmt: skip
        )
        assert torch.equal(answer["run"].outputs["x"], torch.full((3,), 2.0))
        gc.collect()
        assert freed == []  # the run's x is still held
        release_answered()
        gc.collect()
        assert freed == ["x"]
    finally:
        del sys.modules["nwtest_release_freed"]
