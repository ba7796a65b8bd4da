"""Objects of classes the notebook defines are compared through their attributes; outputs that
could not come back from the target (``NotCompared`` markers) are ``not-compared``, never failures."""

import copy

import pytest
import torch

from neuron_workbench.compare import NOT_COMPARED, STATUSES, compare_outputs
from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.report.display import NOT_COMPARED_STATUS
from neuron_workbench.run.records import NotCompared

NOTEBOOK = """
import torch

class Trainer:
    def __init__(self, model):
        self.model = model
        self.loss = torch.tensor(0.5)
        self._step = 3
        self.log = print          # a function: nothing to compare
        self.device = torch.device("cpu")

    def train(self):
        return self.loss

class Node:
    def __init__(self, value):
        self.value = value
        self.next = None

class Slotted:
    __slots__ = ("x", "unset")

    def __init__(self, x):
        self.x = x

def helper():
    return 1
"""

REASON = (
    "could not be sent back from the neuron worker process "
    "(ModuleNotFoundError: No module named 'torch.neuron')"
)


@pytest.fixture
def nb():
    """A notebook's namespace: its classes have ``__module__ == "__main__"``, as in a kernel."""
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK, "<cell>", "exec"), namespace)
    return namespace


def trainer_pair(nb):
    torch.manual_seed(0)
    ref = nb["Trainer"](torch.nn.Linear(3, 2))
    return ref, copy.deepcopy(ref)


def test_a_notebook_object_is_compared_through_its_attributes(nb):
    ref, target = trainer_pair(nb)
    comparison = compare_outputs({"trainer": ref}, {"trainer": target})
    paths = [d.path for d in comparison.diffs]
    assert paths == ["trainer.model.weight", "trainer.model.bias", "trainer.loss", "trainer._step"]
    assert comparison.passed and all(d.status == "match" for d in comparison.diffs)


def test_a_differing_tensor_inside_a_notebook_object_fails_naming_its_path(nb):
    ref, target = trainer_pair(nb)
    with torch.no_grad():
        target.model.bias[1] += 1.0
    comparison = compare_outputs({"trainer": ref}, {"trainer": target})
    assert not comparison.passed
    assert [d.path for d in comparison.failures] == ["trainer.model.bias"]
    assert comparison.failures[0].headline().startswith("trainer.model.bias ")


def test_a_value_attribute_that_differs_fails_too(nb):
    ref, target = trainer_pair(nb)
    target._step = 4
    [failure] = compare_outputs({"t": ref}, {"t": target}).failures
    assert (failure.path, failure.status) == ("t._step", "differ")


def test_functions_classes_modules_methods_and_devices_are_skipped_silently(nb):
    ref, _ = trainer_pair(nb)
    outputs = {
        "helper": nb["helper"],
        "Trainer": nb["Trainer"],
        "torch_module": torch,
        "method": ref.train,
        "device": torch.device("cpu"),
        "loader": torch.utils.data.DataLoader([1, 2]),
        "empty": nb["Node"].__new__(nb["Node"]),  # a notebook object with nothing in it
    }
    assert list(iter_leaves(outputs)) == []
    comparison = compare_outputs(outputs, dict(outputs))
    assert comparison.diffs == [] and comparison.compared == []


def test_only_classes_of_the_notebook_module_are_walked_whole():
    class Local:  # defined in this test module, not in __main__: a library object
        def __init__(self):
            self.x = torch.ones(1)
            self.n = 3

    # a library's object by its tensors only (a TensorDataset's): its settings are the library's
    assert [path for path, _ in iter_leaves({"obj": Local()})] == ["obj.x"]
    leaves = list(iter_leaves({"obj": Local()}, user_modules=(__name__,)))
    assert [path for path, _ in leaves] == ["obj.x", "obj.n"]


def test_cycles_and_long_chains_terminate(nb):
    a, b = nb["Node"](torch.ones(2)), nb["Node"](torch.zeros(2))
    a.next, b.next = b, a
    a.me = a
    assert [p for p, _ in iter_leaves({"a": a})] == ["a.value", "a.next.value"]
    head = node = nb["Node"](0)
    for i in range(1, 100):
        node.next = nb["Node"](i)
        node = node.next
    paths = [p for p, _ in iter_leaves({"chain": head})]
    assert 1 < len(paths) < 100  # bounded by the depth limit, not by the chain
    comparison = compare_outputs({"a": a, "chain": head}, {"a": a, "chain": head})
    assert comparison.passed and len(comparison.diffs) == 2 + len(paths)


def test_slots_are_attributes_too(nb):
    ref, target = nb["Slotted"](torch.ones(2)), nb["Slotted"](torch.full((2,), 2.0))
    [diff] = compare_outputs({"s": ref}, {"s": target}).diffs
    assert (diff.path, diff.status) == ("s.x", "differ")


def test_a_not_compared_marker_is_reported_with_its_reason_and_does_not_fail():
    ref = {"mod": torch.cuda, "x": torch.ones(2)}  # the module is skipped on the reference
    target = {"mod": NotCompared(REASON), "x": torch.ones(2)}
    comparison = compare_outputs(ref, target)
    statuses = {d.path: d.status for d in comparison.diffs}
    assert statuses == {"x": "match", "mod": NOT_COMPARED}
    [skipped] = comparison.not_compared
    assert skipped.detail == f"target: {REASON}" and skipped.kind == "none"
    assert not skipped.passed and not skipped.failed and not skipped.compared
    assert comparison.passed and comparison.failures == []
    assert [d.path for d in comparison.compared] == ["x"]
    assert comparison.counts() == {"match": 1, NOT_COMPARED: 1}
    assert skipped.headline() == f"mod (target: {REASON})"


def test_a_marker_stands_for_everything_the_other_side_has_under_it(nb):
    ref, _ = trainer_pair(nb)
    comparison = compare_outputs({"trainer": ref, "y": 1}, {"trainer": NotCompared("gone"), "y": 2})
    assert [(d.path, d.status) for d in comparison.diffs] == [
        ("trainer", NOT_COMPARED),
        ("y", "differ"),
    ]
    assert not comparison.passed and [d.path for d in comparison.failures] == ["y"]


def test_markers_on_the_reference_side_and_on_both_sides_say_so():
    [one] = compare_outputs({"g": NotCompared("r")}, {"g": 1}).diffs
    assert (one.status, one.detail) == (NOT_COMPARED, "reference: r")
    [both] = compare_outputs({"g": NotCompared("r")}, {"g": NotCompared("r")}).diffs
    assert both.detail == "both runs: r"
    [nested] = compare_outputs({"xs": [1, 2]}, {"xs": [NotCompared("r"), 2]}).not_compared
    assert nested.path == "xs[0]"


def test_a_long_reason_is_cut_in_the_headline_only():
    reason = "x" * 300
    [diff] = compare_outputs({"m": 1}, {"m": NotCompared(reason)}).diffs
    assert diff.detail == f"target: {reason}"
    assert len(diff.headline()) < 180 and diff.headline().endswith("…)")


def test_the_status_is_spelled_once_for_renderers():
    assert NOT_COMPARED in STATUSES and NOT_COMPARED_STATUS == NOT_COMPARED == "not-compared"
