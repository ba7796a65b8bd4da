import ast
import types
import warnings

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


def _reads(source):
    return set(compile_cell(source).read_names)


AUTOGRAD_CELL = """
class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2

y = Fn.apply(inp)
"""


def test_parameters_and_locals_of_functions_the_cell_defines_are_not_reads():
    assert _reads(AUTOGRAD_CELL) == {"torch", "staticmethod", "inp"}
    # the notebook's unrelated generator ``g`` is not something the cell reads, so it is not sent
    ns = {"__name__": "__main__", "g": (i for i in range(3)), "ctx": 1, "x": 2, "inp": 3}
    names = referenced_names(compile_cell(AUTOGRAD_CELL), ns)
    assert "inp" in names and not {"g", "ctx", "x"} & names


def test_lambda_parameters_and_comprehension_variables_are_not_reads():
    assert _reads("f = lambda a, *rest, b=1: a + b + len(rest) + q") == {"len", "q"}
    cell = (
        "ys = [i * k for i in xs]\n"
        "zs = {key: v for key, v in pairs}\n"
        "ss = {s for s in xs if s > lo}\n"
        "gs = sum(j for j in xs)\n"
        "nested = [[a * b for b in row] for a, row in rows]\n"
    )
    assert _reads(cell) == {"k", "xs", "pairs", "lo", "sum", "rows"}


def test_comprehensions_still_run_as_written():
    # the read analysis relabels comprehensions while it unparses them: the compiled cell must not see that
    program = compile_cell(
        "d = {k: v for k, v in [(1, 2)]}\nl = [i for i in range(3)]\ns = {i for i in range(2)}\n(d, l, s)"
    )
    ns = {}
    exec(program.body, ns)
    assert eval(program.last_expr, ns) == ({1: 2}, [0, 1, 2], {0, 1})


def test_decorators_defaults_and_function_globals_are_read_at_the_definition():
    assert _reads("def f():\n    return model(x)") == {"model", "x"}
    source = "@register(name)\ndef f(x=default, *, k: float = factor):\n    return model(x) * k"
    assert _reads(source) == {"register", "name", "default", "float", "factor", "model"}


def test_global_declarations_in_place_updates_and_deletions_are_reads():
    assert _reads("def bump():\n    global counter\n    counter += 1") == {"counter"}
    assert _reads("def reset():\n    global state\n    state = None") == {"state"}
    # a function's own ``+=`` and ``del`` work on its locals
    assert _reads("def f():\n    acc = 0\n    acc += 1\n    del acc") == set()
    loop = "for i in range(3):\n    total += f(i)\n    del old"
    assert _reads(loop) == {"range", "total", "f", "old"}  # the body's i is the loop's


def test_names_bound_in_an_enclosing_function_are_not_reads():
    cell = (
        "def outer():\n"
        "    y, n = 1, 0\n"
        "    def inner():\n"
        "        nonlocal n\n"
        "        n += 1\n"
        "        return y + z\n"
        "    class Local:\n"
        "        attr = y\n"
        "    return inner, Local\n"
    )
    assert _reads(cell) == {"z"}


def test_class_bodies_read_module_names():
    cell = (
        "class Config:\n"
        "    lr = lr\n"  # the class namespace has no ``lr`` yet: this reads the notebook's
        "    size = width * 2\n"
        "    def scaled(self, factor):\n"
        "        return size * factor\n"  # a method does not see the class's ``size``
    )
    assert _reads(cell) == {"lr", "width", "size"}


def test_names_bound_earlier_are_not_reads_inside_functions():
    ns = {"__name__": "__main__", "model": object(), "x": 1}
    program = compile_cell("model = Net()\ndef f():\n    return model(x)\ny = f()")
    assert set(program.read_names) == {"Net", "x"}
    assert "model" not in referenced_names(program, ns)
    late = compile_cell("def f():\n    return model(x)\nmodel = Net()")
    assert "model" in referenced_names(late, ns)


def test_a_statement_symtable_rejects_counts_every_name():
    import ast

    from neuron_workbench.run.cell import _names_read_before_bound

    # parses, but has no binding for the nonlocal: the compile fails later; no name is dropped meanwhile
    tree = ast.parse("def f(a):\n    nonlocal q\n    return a + q + r")
    assert set(_names_read_before_bound(tree)) == {"a", "q", "r"}


def test_a_modules_and_an_optimizers_hooks_read_notebook_globals_as_the_cell_does():
    import torch

    namespace = {"__name__": "__main__", "torch": torch}
    exec(
        "log = []\nseen = []\n"
        "def hook(mod, inp, out):\n    log.append(out.shape)\n"
        "def stepped(opt, args, kwargs):\n    seen.append(1)\n"
        "class KFAC(torch.optim.SGD):\n"
        "    def __init__(self, params, modules):\n"
        "        super().__init__(params, lr=0.1)\n"
        "        self.modules = modules  # a list of its own, not Module.modules\n"
        "model = torch.nn.Sequential(torch.nn.Linear(2, 2))\n"
        "model[0].register_forward_hook(hook)\n"
        "opt = KFAC(model.parameters(), [model[0]])\n"
        "opt.register_step_post_hook(stepped)\n",
        namespace,
    )
    names = referenced_names(compile_cell("y = model(torch.ones(2))\nopt.step()"), namespace)
    assert {"model", "opt", "log", "seen"} <= names


def test_hooks_deep_in_a_model_are_found_past_empty_and_shared_submodules():
    import torch

    namespace = {"__name__": "__main__", "torch": torch}
    exec(
        "grads, calls, outs = [], [], []\n"
        "def on_grad(g):\n    grads.append(g)\n"
        "def before(mod, inp):\n    calls.append(1)\n"
        "def after(mod, inp, out):\n    outs.append(1)\n"
        "shared = torch.nn.Linear(2, 2)\n"
        "empty = torch.nn.Sequential()  # no submodules: len() 0, false\n"
        "empty.register_forward_hook(after)\n"
        "deep = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)))\n"
        "model = torch.nn.Sequential(empty, deep, shared, shared)\n"
        "deep[0][0].weight.register_hook(on_grad)\n"
        "shared.register_forward_pre_hook(before)\n",
        namespace,
    )
    names = referenced_names(compile_cell("model(torch.ones(2)).sum().backward()"), namespace)
    assert {"grads", "calls", "outs"} <= names


def test_with_and_for_targets_are_bound_in_their_bodies():
    from neuron_workbench.run.cell import _names_read_before_bound

    def reads(source):
        return set(_names_read_before_bound(ast.parse(source)))

    # the body reads what the statement bound, not the notebook's name of that name
    assert reads("with open(p) as f:\n    f.read()") == {"open", "p"}
    assert reads("with a as (x, y), b(x) as z:\n    q = x + y + z") == {"a", "b"}
    assert reads("for batch in loader:\n    model(batch)") == {"loader", "model"}
    # ... but what binds a target is read, and a loop's target may stay unbound
    assert reads("with ctx as obj.attr:\n    pass") == {"ctx", "obj"}
    assert "i" in reads("for i in range(n):\n    pass\nelse:\n    print(i)")
    assert "i" in reads("for i in range(n):\n    pass\nprint(i)")
    # a context manager may suppress the rest of its body: what the body binds may stay unbound
    assert "out" in reads("with suppress(E):\n    out = f()\nprint(out)")


def test_a_cell_compiled_again_gets_new_code_under_its_own_file_name():
    # a training step run cell after cell is parsed once; each run's code must still be its own
    # (Dynamo keys its caches on code objects) and name its own file (tracebacks, sites)
    source = "def step(x):\n    return [v * 2 for v in x]\ny = step([1])\ny"
    first = compile_cell(source, filename="<cell-a>", first_line=2)
    again = compile_cell(source, filename="<cell-b>", first_line=2)
    assert (first.read_names, first.stored_names, first.last_expr_name) == (
        again.read_names,
        again.stored_names,
        again.last_expr_name,
    )
    assert first.read_names is not again.read_names
    functions = [c for c in again.body.co_consts if isinstance(c, types.CodeType)]
    comprehension = [c for c in functions[0].co_consts if isinstance(c, types.CodeType)]
    assert {again.body.co_filename, again.last_expr.co_filename, functions[0].co_filename} == {
        "<cell-b>"
    }
    assert comprehension and comprehension[0].co_filename == "<cell-b>"
    assert again.body is not first.body and first.body.co_filename == "<cell-a>"
    namespace = {}
    exec(again.body, namespace)
    assert eval(again.last_expr, namespace) == [2]


def test_a_cell_whose_compile_warns_warns_each_time_under_its_own_name():
    source = "x = 1\nif x is 1:\n    pass"
    for name in ("<warn-a>", "<warn-b>"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile_cell(source, filename=name)
        assert [(w.category, w.filename) for w in caught] == [(SyntaxWarning, name)]


def test_a_cell_that_unpickles_reads_the_notebooks_classes():
    # torch.load of a whole model finds its class on __main__ by name, unnamed by the cell
    ns = {"__name__": "__main__"}
    exec("class Net:\n    pass\nclass Other:\n    pass\nAlias = Net\nimport pickle", ns)
    assert ns["Net"].__module__ == "__main__"
    loads = referenced_names(compile_cell("m = pickle.load(f)"), ns)
    assert {"Net", "Other"} <= loads
    assert "Alias" not in loads  # pickle looks a class up by its own name
    assert "Net" not in referenced_names(compile_cell("m = pickle"), ns)


def test_a_cell_that_unpickles_names_the_notebooks_classes_without_what_they_read():
    # pickle finds a notebook class on __main__ by name: the class travels, and what its methods
    # read travels with it by value; following those names copied (and sent) every dataset or
    # model a method mentions with each cell that loads a checkpoint
    ns = {"__name__": "__main__"}
    exec(
        "dataset = list(range(10))\nclass Net:\n    def batches(self):\n        return dataset\n",
        ns,
    )
    program = compile_cell("state = torch.load(path, weights_only=False)")
    names = referenced_names(program, ns)
    assert "Net" in names and "dataset" not in names
