import pytest

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.cell import compile_cell, referenced_names


def test_last_expression_is_split_off():
    program = compile_cell("a = 1\na + 1")
    assert program.last_expr is not None and program.last_expr_name is None
    ns = {}
    exec(program.body, ns)
    assert eval(program.last_expr, ns) == 2


def test_last_expression_name_is_recorded():
    assert compile_cell("a = 1\na").last_expr_name == "a"
    assert compile_cell("a = 1").last_expr is None


def test_syntax_error_is_a_usage_error_with_the_line():
    with pytest.raises(WorkbenchUsageError, match="line 2"):
        compile_cell("a = 1\nb = (\n")


def test_referenced_names_follow_notebook_functions_and_classes():
    ns = {"__name__": "__main__"}
    exec(
        "model = object()\n"
        "def helper():\n    return model\n"
        "def step():\n    return helper()\n"
        "class Trainer:\n    def run(self):\n        return opt\n"
        "trainer = Trainer()\nopt = 1\nunused = 2\n",
        ns,
    )
    program = compile_cell("step()\ntrainer.run()")
    names = referenced_names(program, ns)
    assert {"step", "helper", "model", "trainer", "opt"} <= names
    assert "unused" not in names


def test_names_bound_before_use_are_not_inputs():
    ns = {"__name__": "__main__", "model": object(), "x": 1, "f": None}
    exec("def uses_model():\n    return model\n", ns)
    program = compile_cell("model = 3\nmodel + 1\nx = x + 1\nuses_model()")
    names = referenced_names(program, ns)
    assert "x" in names  # read before its own assignment
    assert "model" not in names  # bound by the cell first, also for the function called later
    assert "uses_model" in names
    late = compile_cell("uses_model()\nmodel = 3")
    assert "model" in referenced_names(late, ns)


def test_calls_backward_sees_the_cell_and_the_functions_it_reaches():
    from neuron_workbench.run.cell import calls_backward

    ns = {"__name__": "__main__"}
    exec("def step(loss):\n    loss.backward()\n\ndef predict(x):\n    return x\n", ns)
    assert calls_backward(compile_cell("loss.backward()"), ns)
    assert calls_backward(compile_cell("step(loss)"), ns)
    assert not calls_backward(compile_cell("y = predict(x)"), ns)
