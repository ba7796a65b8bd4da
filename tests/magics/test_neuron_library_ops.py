"""%%neuron on the default path (target in its worker) with an op from a library, not ``aten``.

torchvision cannot be installed here: ``wbnb::nms`` stands in for ``torchvision::nms``, defined as
torchvision defines it (a schema and a CPU kernel only) in a module the cell imports, so the
reference (in the kernel) and the target (in its worker, which shares the kernel's ``sys.path``)
both have it. An op registered only in the notebook kernel (``torch.library.Library`` calls in an
earlier cell) does not exist in the worker; such a cell must define or import it itself (a
``torch.library.custom_op`` is defined in the worker too: tests/run/test_custom_ops.py).
"""

import textwrap

import pytest

from neuron_workbench.testing import run_cell

OPS = textwrap.dedent(
    """
    import torch

    _lib = torch.library.Library("wbnb", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


    def _nms_cpu(dets, scores, iou_threshold):
        order = scores.argsort(descending=True)
        x1, y1, x2, y2 = dets.unbind(1)
        areas = (x2 - x1) * (y2 - y1)
        keep, dropped = [], set()
        for i, a in enumerate(order.tolist()):
            if i in dropped:
                continue
            keep.append(a)
            for j in range(i + 1, len(order)):
                b = int(order[j])
                w = (min(x2[a], x2[b]) - max(x1[a], x1[b])).clamp(min=0)
                h = (min(y2[a], y2[b]) - max(y1[a], y1[b])).clamp(min=0)
                if w * h / (areas[a] + areas[b] - w * h) > iou_threshold:
                    dropped.add(j)
        return torch.tensor(keep, dtype=torch.int64)


    _lib.impl("nms", _nms_cpu, "CPU")
    """
)

CELL = (
    "import torch, wbnb_ops\n"
    "g = torch.Generator().manual_seed(0)\n"
    "xy = torch.rand(16, 2, generator=g) * 10\n"
    "boxes = torch.cat([xy, xy + 2], 1).cuda()\n"
    "scores = torch.rand(16, generator=g).cuda()\n"
    "keep = torch.ops.wbnb.nms(boxes, scores, 0.2)\n"
)


@pytest.fixture
def ops_module(tmp_path, monkeypatch):
    (tmp_path / "wbnb_ops.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_library_op_falls_back_on_neuron_with_its_cell_line(ip, ops_module):
    run_cell(ip, f"%%neuron --target neuron -o r\n{CELL}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {d.path: d.status for d in report.comparison.diffs}["keep"] == "match"
    events = [e for e in report.target.fallbacks if e["op"] == "wbnb::nms"]
    assert len(events) == 1 and events[0]["count"] == 1
    assert events[0]["site"]["line"] == 7  # the line that called it (the magic is line 1)


def test_a_library_op_raises_torchtpus_error_on_tpu_and_is_listed_with_list_fallbacks(
    ip, ops_module
):
    run_cell(ip, f"%%neuron --target tpu -o r\n{CELL}")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR", report.summary()
    assert report.target.error.message == (
        "operator 'wbnb::nms' is not implemented for TPU. Please file a feature request"
    )
    run_cell(ip, f"%%neuron --target tpu --list-fallbacks -o full\n{CELL}")
    full = ip.user_ns["full"]
    assert [(e["op"], e["site"]["line"]) for e in full.target.fallbacks] == [("wbnb::nms", 7)]
