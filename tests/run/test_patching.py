"""Names and attributes set for the length of a run, and put back (run/patching.py)."""

from neuron_workbench.run.patching import names_rebound


def test_names_rebound_for_the_body_get_their_own_back_unless_rebound():
    own, other = object(), object()
    namespace = {"a": own, "b": own, "c": other}
    during = object()
    with names_rebound(namespace, lambda name, value: during if value is own else value):
        assert namespace == {"a": during, "b": during, "c": other}
        namespace["b"] = "the body's"  # the body bound it: it keeps that
        namespace["d"] = during  # a name the body made is not the notebook's to give back
    assert namespace == {"a": own, "b": "the body's", "c": other, "d": during}


def test_names_are_given_back_when_the_body_raises():
    own = object()
    namespace = {"a": own}
    try:
        with names_rebound(namespace, lambda name, value: "run's"):
            raise KeyError("the cell's error")
    except KeyError:
        pass
    assert namespace == {"a": own}
