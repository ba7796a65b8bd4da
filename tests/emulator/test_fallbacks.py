"""Fallback events: exactly the ops outside the neuron coverage, attributed to line and module."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.nn as nn

from neuron_workbench.emulator import FallbackEvent, SourceSite, process_log, record_fallbacks

HERE = str(Path(__file__).resolve())


def _line(marker: str) -> int:
    for n, text in enumerate(Path(HERE).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# @{marker}"):
            return n
    raise AssertionError(marker)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Identity(), nn.MaxPool2d(2)
        )
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = nn.Linear(256, 4)

    def forward(self, x):
        x = self.features(x)  # @features
        x = self.up(x)  # @up
        v, _ = torch.sort(x.flatten(1), dim=1)  # @sort
        return self.head(v)


def _run(steps=3):
    model = Net().to("neuron")
    x = torch.ones(2, 3, 8, 8).to("neuron")  # ones + copy: native, no event
    with record_fallbacks() as log:
        for _ in range(steps):
            model(x).sum().backward()
    return log


def test_exactly_the_uncovered_ops_are_reported():
    log = _run()
    assert log.ops() == [
        "aten::max_pool2d_with_indices",
        "aten::max_pool2d_with_indices_backward",
        "aten::sort",
        "aten::upsample_nearest2d",
        "aten::upsample_nearest2d_backward",
    ]


def test_events_carry_site_module_phase_and_counts():
    log = _run(steps=3)
    by_op = {e.op: e for e in log.events}
    expect = {
        "aten::max_pool2d_with_indices": ("features", "features.3", "MaxPool2d"),
        "aten::upsample_nearest2d": ("up", "up", "Upsample"),
        "aten::sort": ("sort", "", "Net"),
    }
    for op, (marker, module, module_type) in expect.items():
        ev = by_op[op]
        assert ev.phase == "forward" and ev.count == 3  # deduplicated per site
        assert ev.site == SourceSite(HERE, _line(marker), "forward")
        assert (ev.module, ev.module_type) == (module, module_type)
        assert ev.cpu_time_s > 0 and ev.autograd_node == ""
    pool = by_op["aten::max_pool2d_with_indices"]
    assert pool.shapes == [[2, 4, 8, 8]] and pool.dtypes == ["torch.float32"]
    # structured: the out= form is what reaches the device's fallback, as on the real backends
    assert pool.overload == "aten::max_pool2d_with_indices.out"
    bwd = by_op["aten::max_pool2d_with_indices_backward"]
    assert bwd.phase == "backward" and bwd.autograd_node == "MaxPool2DWithIndicesBackward0"
    # the backward op of a forward fallback points back at the forward line and module
    assert bwd.site == pool.site and bwd.module == "features.3"
    up_bwd = by_op["aten::upsample_nearest2d_backward"]
    assert up_bwd.site.line == _line("up") and up_bwd.module == "up"
    d = pool.to_dict()
    assert d["site"] == {"file": HERE, "line": _line("features"), "function": "forward"}
    assert isinstance(pool, FallbackEvent)


def test_view_and_native_ops_are_never_reported():
    x = torch.randn(4, 6, device="neuron")
    with record_fallbacks() as log:
        y = x.view(2, 12).t().transpose(0, 1).reshape(24)[3:].unsqueeze(0).expand(2, 21)
        z = (y.detach() * 2 + 1).relu().sum()
        z.item()
        repr(y)  # printing creates no events
    assert log.events == []


def test_nested_parallel_and_process_logs_all_see_events():
    x = torch.randn(8, device="neuron")
    before = sum(e.count for e in process_log().events if e.op == "aten::sort")
    seen = []

    def worker():
        with record_fallbacks() as inner:
            torch.sort(x)
        seen.append(inner.ops())

    with record_fallbacks() as outer:
        with record_fallbacks() as nested:
            torch.sort(x)
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert nested.ops() == ["aten::sort"] and seen == [["aten::sort"]]
    assert sum(e.count for e in outer.events) == 2
    after = sum(e.count for e in process_log().events if e.op == "aten::sort")
    assert after - before == 2


def test_factories_decompose_like_the_real_dispatcher():
    # randn has no TorchNeuron kernel: its composite runs on the device, and normal_ falls back.
    with record_fallbacks() as log:
        torch.randn(3, device="neuron")
        torch.zeros(3, device="neuron")
    assert log.ops() == ["aten::normal_"]


def test_summary_and_json_shapes():
    log = _run(steps=2)
    lines = log.summary_lines()
    assert any(line.startswith("aten::sort  x2  first at " + HERE) for line in lines)
    entries = {e["op"]: e for e in log.to_list()}
    assert entries["aten::sort"]["sites"] == [{"file": HERE, "line": _line("sort"), "module": ""}]
    assert entries["aten::max_pool2d_with_indices_backward"]["phases"] == ["backward"]
