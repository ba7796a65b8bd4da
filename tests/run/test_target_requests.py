"""run/target_requests.py: a target process answers every request, failing ones with one line."""

from neuron_workbench.backends import get_backend
from neuron_workbench.run.target_requests import answer_request
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
