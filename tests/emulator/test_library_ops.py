"""Ops outside ``aten`` (torchvision's, a user's ``torch.library`` op) as the real backends treat them.

An op with no kernel for the device (a CPU-only kernel, a Meta/fake kernel) falls back on neuron
(TorchNeuron's global boxed CPU fallback: an event with its site) and raises TorchTPU's missing-op
error on tpu; an op with a PrivateUse1, CompositeExplicitAutograd or CompositeImplicitAutograd
kernel runs on the device. Checked in this process (neuron, native core) and in subprocesses (tpu;
the pure-Python core). torchvision cannot be installed here, so ``wbtest::nms`` stands in for
``torchvision::nms``: defined the same way (a schema and a CPU kernel only).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

HERE = str(Path(__file__).resolve())

# Defines the test ops in the process that runs it (each process defines them once).
OPS = r"""
import torch

_lib = torch.library.Library("wbtest", "DEF")
# torchvision's shape: a schema and a CPU kernel, nothing for any other device
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _nms_cpu(dets, scores, iou_threshold):
    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    keep = []
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    for i, idx in enumerate(order.tolist()):
        if suppressed[i]:
            continue
        keep.append(idx)
        rest = order[i + 1 :]
        w = (torch.minimum(x2[idx], x2[rest]) - torch.maximum(x1[idx], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[idx], y2[rest]) - torch.maximum(y1[idx], y1[rest])).clamp(min=0)
        inter = w * h
        iou = inter / (areas[idx] + areas[rest] - inter)
        suppressed[i + 1 :] |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


_lib.impl("nms", _nms_cpu, "CPU")


# A CPU kernel plus a fake (Meta) kernel, as torch.compile-ready libraries register them.
@torch.library.custom_op("wbtest::roi_scale", mutates_args=(), device_types="cpu")
def roi_scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@roi_scale.register_fake
def _(x, s):
    return torch.empty_like(x)


# No device_types: a CompositeExplicitAutograd kernel, which runs on any device as its parts.
@torch.library.custom_op("wbtest::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# A kernel registered for the device itself (a library that supports the backend).
_lib.define("devop(Tensor x) -> Tensor")
_lib.impl("devop", lambda x: x + 1, "PrivateUse1")
_lib.impl("devop", lambda x: x + 1, "CPU")
# A CompositeImplicitAutograd kernel: decomposed above the device.
_lib.define("cia(Tensor x) -> Tensor")
_lib.impl("cia", lambda x: x * 3, "CompositeImplicitAutograd")
"""

# Runs every op on the device; prints what happened as JSON (the last line).
PROBE = r"""
import json
import torch
from neuron_workbench import emulator as E

def probe(device):
    out = {}
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(12, 2, generator=g) * 10
    dets = torch.cat([xy, xy + 1 + torch.rand(12, 2, generator=g) * 4], 1)
    scores = torch.rand(12, generator=g)
    ref = torch.ops.wbtest.nms(dets, scores, 0.3)
    x = torch.randn(5, generator=g)
    d = x.to(device)
    with E.record_fallbacks() as log:
        try:
            keep = torch.ops.wbtest.nms(dets.to(device), scores.to(device), 0.3)  # @nms
            out["nms"] = {"device": keep.device.type, "same": torch.equal(keep.cpu(), ref)}
        except RuntimeError as exc:
            out["nms"] = str(exc)
        try:
            out["roi_scale"] = torch.equal(torch.ops.wbtest.roi_scale(d, 2.5).cpu(), x * 2.5)
        except RuntimeError as exc:
            out["roi_scale"] = str(exc)
        out["twice"] = torch.equal(torch.ops.wbtest.twice(d).cpu(), x * 2)
        out["devop"] = torch.equal(torch.ops.wbtest.devop(d).cpu(), x + 1)
        out["cia"] = torch.equal(torch.ops.wbtest.cia(d).cpu(), x * 3)
    out["ops"] = log.ops()
    out["sites"] = {e.op: e.site.line if e.site else None for e in log.events}
    out["overloads"] = sorted({e.overload for e in log.events})
    return out
"""


def _line(marker: str) -> int:
    for n, text in enumerate(PROBE.splitlines(), 1):
        if text.rstrip().endswith(f"# @{marker}"):
            return n
    raise AssertionError(marker)


_ns: dict = {}


@pytest.fixture(scope="module")
def probe():
    if not _ns:
        exec(compile(OPS, "<wbtest ops>", "exec"), {})
        exec(compile(PROBE, "<wbtest probe>", "exec"), _ns)
    return _ns["probe"]


FALLEN = ["wbtest::nms", "wbtest::roi_scale"]


def test_ops_without_a_device_kernel_fall_back_on_neuron_with_their_site(probe):
    out = probe("neuron")
    assert out["nms"] == {"device": "neuron", "same": True}
    assert out["roi_scale"] is True
    assert out["twice"] is out["devop"] is out["cia"] is True
    # exactly the ops without a kernel for the device; their parts (aten ops) are not events
    assert out["ops"] == FALLEN
    assert out["overloads"] == FALLEN  # default overloads: no suffix
    assert out["sites"]["wbtest::nms"] == _line("nms")


def test_library_fallback_is_a_process_log_event_with_phase_and_inputs(probe):
    from neuron_workbench.emulator import process_log

    probe("neuron")
    events = [e for e in process_log().events if e.op == "wbtest::nms"]
    assert events and events[0].phase == "forward"
    assert events[0].shapes == [[12, 4], [12]] and events[0].dtypes[0] == "torch.float32"


SUBPROCESS = (
    OPS
    + PROBE
    + r"""
import sys
E.emulate(sys.argv[1])
res = {"core": E.status().core, "default": probe(sys.argv[1])}
if sys.argv[1] == "tpu":
    torch.tpu.execution_mode.enable_cpu_fallback = True  # TorchTPU's switch (--list-fallbacks)
    E.configure(fallback_warnings=False)
    res["fallback_on"] = probe("tpu")
print(json.dumps(res))
"""
)

TPU_TEXT = "operator 'wbtest::{}' is not implemented for TPU. Please file a feature request"


@pytest.mark.parametrize(
    ("device", "core"), [("tpu", "auto"), ("tpu", "python"), ("neuron", "python")]
)
def test_library_ops_in_the_other_cores_and_on_tpu(run_py, device, core):
    r = run_py(SUBPROCESS, args=[device], env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["core"] == ("python" if core == "python" else "native")
    out = res["default"]
    nms_line = OPS.count("\n") + _line("nms")  # the probe follows the ops in the script
    assert out["twice"] is out["devop"] is out["cia"] is True
    if device == "neuron":
        assert out["nms"] == {"device": "neuron", "same": True} and out["roi_scale"] is True
        assert out["ops"] == FALLEN and out["sites"]["wbtest::nms"] == nms_line
        return
    # tpu: TorchTPU's missing-op text, word for word; nothing ran on CPU
    assert out["nms"] == TPU_TEXT.format("nms")
    assert out["roi_scale"] == TPU_TEXT.format("roi_scale")
    assert out["ops"] == []
    # with TorchTPU's CPU fallback on (as --list-fallbacks runs), they are listed with their site
    on = res["fallback_on"]
    assert on["nms"] == {"device": "tpu", "same": True} and on["roi_scale"] is True
    assert on["ops"] == FALLEN and on["sites"]["wbtest::nms"] == nms_line


def test_a_cpu_tensor_stays_off_the_fallback(probe):
    # Host tensors never reach the device's fallback: the CPU kernel runs, nothing is recorded.
    from neuron_workbench.emulator import record_fallbacks

    probe("neuron")
    with record_fallbacks() as log:
        torch.ops.wbtest.roi_scale(torch.ones(2), 2.0)
    assert log.events == []


REFUSES = r"""
import torch
from neuron_workbench import emulator as E

_refusing = torch.library.Library("wbrefuse", "DEF")
_refusing.define("pair(Tensor a, Tensor b) -> Tensor")


def _pair(a, b):
    if a.dtype != b.dtype:
        raise RuntimeError("a should have the same type as b")
    return a + b


_refusing.impl("pair", _pair, "CPU")


def refused(device):
    with E.record_fallbacks() as log:
        try:
            torch.ops.wbrefuse.pair(torch.ones(2, device=device), torch.ones(2, device=device).half())
        except RuntimeError as exc:
            return str(exc), log.ops()
    return None, log.ops()
"""


@pytest.mark.parametrize("core", ["auto", "python"])
def test_a_fallback_whose_cpu_kernel_refuses_is_still_an_event(run_py, core):
    # The event (the op, its line) is what explains the error the CPU kernel raised.
    script = REFUSES + "E.emulate('neuron')\nimport json\nprint(json.dumps(refused('neuron')))\n"
    r = run_py(script, env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
    assert r.returncode == 0, r.stderr[-3000:]
    error, ops = json.loads(r.stdout.strip().splitlines()[-1])
    assert error == "a should have the same type as b"
    assert ops == ["wbrefuse::pair"]
