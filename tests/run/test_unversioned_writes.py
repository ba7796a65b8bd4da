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
    for _ in range(1000):
        alias = p.data
        writes.aliased(p, alias)
        alias.add_(1)
    del alias
    assert writes.count(p) == 1000
    assert not writes._aliases
