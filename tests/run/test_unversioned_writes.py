"""UnversionedWrites: the writes a run's version counters miss, counted per tensor."""

import torch

from neuron_workbench.run.unversioned_writes import UnversionedWrites


def test_a_fused_step_is_counted_for_the_tensors_it_wrote():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    model(torch.randn(3, 4)).sum().backward()
    writes = UnversionedWrites()
    with writes.recording():
        opt.step()
    assert writes.count(model.weight) == 1
    assert writes.count(opt.state[model.weight]["exp_avg"]) == 1
    assert writes.count(torch.ones(1)) == 0
    assert torch._fused_adamw_.__module__ == "torch"  # put back (the C function's)


def test_writes_through_a_data_alias_count_for_the_tensor():
    p = torch.nn.Parameter(torch.ones(3))
    writes = UnversionedWrites()
    writes.watch([p])
    alias = p.data
    writes.aliased(p, alias)
    assert writes.count(p) == 0
    alias.mul_(2)
    alias.add_(1)
    assert writes.count(p) == 2
    inner = alias.data  # p.data.data: still p's
    writes.aliased(alias, inner)
    inner.zero_()
    assert writes.count(p) == 3


def test_aliases_no_one_holds_are_let_go():
    p = torch.ones(3)
    writes = UnversionedWrites()
    writes.watch([p])
    for _ in range(1000):
        alias = p.data
        writes.aliased(p, alias)
        alias.add_(1)
    del alias
    assert writes.count(p) == 1000
    assert not writes._aliases


def test_only_the_state_a_run_started_with_is_followed():
    # `torch.max(outputs.data, 1)` in an evaluation loop: the run's own tensors are outputs by
    # their names, and their aliases are not kept (they would keep each batch's outputs alive)
    outputs = torch.ones(3)
    writes = UnversionedWrites()
    writes.aliased(outputs, outputs.data)
    assert not writes._aliases


def test_replacing_data_counts_once_and_lets_its_aliases_go():
    p = torch.nn.Parameter(torch.ones(3))
    writes = UnversionedWrites()
    writes.watch([p])
    old = p.data
    writes.aliased(p, old)
    old.add_(1)
    p.data = torch.zeros(3)
    writes.replaced(p)
    assert writes.count(p) == 2
    assert not writes._aliases
