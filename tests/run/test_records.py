import json

import torch

from neuron_workbench.run.random_draws import fingerprint
from neuron_workbench.run.records import COMPILED_DRAW, RunFacts, same_random_numbers


def _facts(*draws):
    facts = RunFacts()
    for name, value in draws:
        facts.random_ops[name] = facts.random_ops.get(name, 0) + 1
        facts.note_draw(name, fingerprint(value))
    return facts


def test_one_stream_at_float32_precision_is_the_same_draws():
    # TorchNeuron computes float64 as float32: the target's float64 randn is the reference's
    # numbers rounded to float32, which read as "random numbers differed" (a false hint).
    torch.manual_seed(0)
    exact = torch.randn(16, 16, dtype=torch.float64)
    rounded = exact.float().double()
    assert not torch.equal(exact, rounded)
    assert same_random_numbers(_facts(("torch.randn", exact)), _facts(("torch.randn", rounded)))
    # a recorded run's fingerprints come back from JSON as lists
    recorded = RunFacts(**json.loads(json.dumps(_facts(("torch.randn", rounded)).to_dict())))
    assert same_random_numbers(_facts(("torch.randn", exact)), recorded)


def test_draws_inside_a_compiled_graph_leave_the_runs_draws_unknown():
    # The compiler draws a compiled dropout's mask itself, unfingerprinted: the same fingerprints of
    # the runs' other draws read as "the same random numbers", and the mask difference as rounding.
    torch.manual_seed(0)
    x = torch.randn(4)
    ref, target = _facts(("torch.randn", x)), _facts(("torch.randn", x))
    assert same_random_numbers(ref, target)
    ref.random_ops[f"torch.nn.functional.dropout{COMPILED_DRAW}"] = 1
    assert same_random_numbers(ref, target) is None
    assert same_random_numbers(target, ref) is None


def test_other_numbers_are_other_draws():
    torch.manual_seed(0)
    first = torch.randn(16)
    second = torch.randn(16)
    assert not same_random_numbers(_facts(("torch.randn", first)), _facts(("torch.randn", second)))
    assert not same_random_numbers(  # one draw more
        _facts(("torch.randn", first)), _facts(("torch.randn", first), ("torch.randn", second))
    )
    assert not same_random_numbers(_facts(("torch.randn", first)), _facts(("torch.rand", first)))
    tiny = [
        torch.empty(16).normal_(0, 1e-7, generator=torch.Generator().manual_seed(s)) for s in (1, 2)
    ]
    assert not same_random_numbers(
        _facts(("Tensor.normal_", tiny[0])), _facts(("Tensor.normal_", tiny[1]))
    )
    ints = torch.randint(0, 10, (16,))
    assert not same_random_numbers(
        _facts(("torch.randint", ints)), _facts(("torch.randint", ints + 1))
    )
    mask = torch.rand(16) > 0.5
    dropout = "torch.nn.functional.dropout"
    facts = RunFacts()
    facts.random_ops[dropout] = 1
    facts.note_draw(dropout, fingerprint(mask.float(), zeros_only=True))
    other = RunFacts()
    other.random_ops[dropout] = 1
    other.note_draw(dropout, fingerprint((~mask).float(), zeros_only=True))
    assert not same_random_numbers(facts, other) and same_random_numbers(facts, facts)


def test_an_error_raised_below_the_cell_names_the_users_frame_not_torchs():
    # a shape error inside a notebook class's forward read "(cell line 2)" alone: the line calling
    # the model, not the line in the class that raised
    from neuron_workbench.run.records import Run, RunError
    from neuron_workbench.sites import relabel_site

    earlier = compile(
        "import torch\ndef forward(x):\n    return x @ torch.ones(5, 2)\n",
        "<ipython-input-3-abc>",
        "exec",
    )
    namespace: dict = {}
    exec(earlier, namespace)
    cell = compile("y = forward(torch.ones(3, 4))", "<neuron-cell-9>", "exec")
    try:
        exec(cell, {**namespace})
    except RuntimeError as exc:
        error = RunError.from_exception(exc, "<neuron-cell-9>")
    assert error.lineno == 1
    # the innermost user frame, not torch's functions below it
    assert error.site == {"file": "<ipython-input-3-abc>", "line": 3, "function": "forward"}
    run = Run(None, error=error)
    run.relabel_sites({"<ipython-input-3-abc>": 3})
    assert run.error.raised_in == "in forward at cell [3], line 3"
    assert RunError.from_dict(json.loads(json.dumps(run.error.to_dict()))) == run.error
    assert relabel_site(run.error.site, {}) == run.error.site
    # raised on the cell's own line: nothing more to say
    try:
        exec(
            compile("y = torch.ones(3, 4) @ torch.ones(5, 2)", "<neuron-cell-9>", "exec"), namespace
        )
    except RuntimeError as exc:
        assert RunError.from_exception(exc, "<neuron-cell-9>").site is None


SPAWNING_SCRIPT = """\
import torch
import torch.multiprocessing as mp


def worker(rank):
    raise ValueError(f"no shard for rank {rank}")


if __name__ == "__main__":
    print("loss", torch.ones(2, device="cuda").sum().item())
    mp.spawn(worker, nprocs=1)
"""


def test_an_error_of_a_spawned_process_names_its_cause(tmp_path, monkeypatch, capsys):
    # `mp.spawn` (a DDP script's entry point) re-raises a process's error with its traceback as
    # the message: the report line read "ProcessRaisedException: -- Process 0 terminated with the
    # following error:", the cause nowhere but the JSON's message
    from neuron_workbench.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp.py").write_text(SPAWNING_SCRIPT)
    assert main(["run", "ddp.py", "-q", "--junit", "r.xml"]) == 1
    cause = (
        "raised ProcessRaisedException: ValueError: no shard for rank 0 (in spawned process 0) "
        "(ddp.py, line 11)"
    )
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("ddp.py: ERROR ") and line.count(cause) == 2, line
    assert (
        "ValueError: no shard for rank 0 (in spawned process 0)" in (tmp_path / "r.xml").read_text()
    )
