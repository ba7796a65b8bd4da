"""The real adapters against FAKE SDKs (tests/fakes) give what the emulator gives for the same cell.

Each side runs in its own interpreter: ``emulated`` (``NEURON_WORKBENCH_EMULATE``) or ``fake`` (the
fake ``torch_neuronx`` / ``torch_tpu`` autoloaded at ``import torch``, which the workbench treats as
the real SDK). The fakes implement only what shared/notes/ documents, so these tests also show that
the adapters call nothing else.
"""

from __future__ import annotations

import pytest

NEURON_CELL = """%%neuron --target neuron -o r
x = torch.randn(8, 16, device="cuda")
y = x.sort(dim=1).values
for _ in range(3):
    m = x.argmax(dim=1)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2)).cuda()
out = net(torch.randn(2, 3, 10, 10, device="cuda", requires_grad=True))
out.sum().backward()
keep = torch.zeros(256, 1024, device="cuda")
"""

TPU_CELL = """%%neuron --target tpu -o r
x = torch.randn(8, 16, device="cuda")
a = torch.special.i0(x)
b = x.kthvalue(2).values
c = torch.diag(x[:, :8])
for _ in range(2):
    e = torch.special.i0(x + 1)
"""

TPU_SMALL_CELL = """%%neuron --target tpu -o r
x = torch.randn(4, 4, device="cuda")
a = torch.special.i0(x)
"""

TPU_CELL_SWITCHING = """%%neuron --target tpu -o r
import torch_tpu
torch_tpu._internal.execution_mode.enable_cpu_fallback = True
x = torch.randn(4, 4, device="cuda")
a = torch.special.i0(x)
torch_tpu._internal.execution_mode.enable_cpu_fallback = False
"""

COMMON = r"""
import json, os, sys, tempfile
import torch
from neuron_workbench.backends import get_backend
from neuron_workbench.testing import testing_shell

shell = testing_shell()
shell.run_cell("import torch")


def report(source):
    result = shell.run_cell(source)
    assert result.error_in_exec is None, result.error_in_exec
    r = shell.user_ns["r"]
    target = r.to_dict()["target"]
    return {
        "verdict": r.verdict,
        "summary": r.summary(),
        "backend": target["backend"],
        "memory": target.get("memory"),
        "fallbacks": target["fallbacks"],
        "error": (target.get("error") or {}).get("message"),
        "html": r._repr_html_(),
    }
"""

NEURON_SCRIPT = (
    COMMON
    + f"NEURON_CELL = {NEURON_CELL!r}\n"
    + r"""
from neuron_workbench.backends.registry import BackendStatusTable

out = {"cell": report(NEURON_CELL), "kind": get_backend("neuron").kind()}
out["status_line"] = [line for line in BackendStatusTable().lines() if line.startswith("neuron")]
if "torch_neuronx" in sys.modules:
    import torch_neuronx

    shell.run_cell("del r\nimport gc\ngc.collect()")  # the first report holds its device tensors
    os.environ["NEURON_WORKBENCH_NEURON_TRACK_PER_OP"] = "1"
    out["cell_per_op"] = report(NEURON_CELL)
    del os.environ["NEURON_WORKBENCH_NEURON_TRACK_PER_OP"]
    shell.run_cell("del r\nimport gc\ngc.collect()")
    out["cell_per_op_flag"] = report(NEURON_CELL.replace(" -o r", " --track-per-op -o r"))

    torch_neuronx.clear_op_tracking()
    x = torch.arange(6.0, device="neuron")
    y = x.argmax()
    z = x + 1
    torch.neuron.synchronize()
    out["fallback_ops"] = torch_neuronx.get_fallback_ops()
    out["executed_ops"] = torch_neuronx.get_executed_ops()
    torch_neuronx.clear_op_tracking()
    out["after_clear"] = [torch_neuronx.get_fallback_ops(), torch_neuronx.get_executed_ops()]
    out["props"] = [torch.neuron.get_device_properties(0).name, torch.neuron.get_device_name(0)]
print(json.dumps(out, default=str))
"""
)

TPU_SCRIPT = (
    COMMON
    + f"TPU_CELL = {TPU_CELL!r}\nTPU_SMALL_CELL = {TPU_SMALL_CELL!r}\n"
    + f"TPU_CELL_SWITCHING = {TPU_CELL_SWITCHING!r}\n"
    + r"""
out = {"default": report(TPU_CELL), "kind": get_backend("tpu").kind()}
os.environ["NEURON_WORKBENCH_TPU_LIST_FALLBACKS"] = "1"
out["full"] = report(TPU_CELL)
del os.environ["NEURON_WORKBENCH_TPU_LIST_FALLBACKS"]
out["full_flag"] = report(TPU_CELL.replace(" -o r", " --list-fallbacks -o r"))
# The switch where TorchTPU keeps it: real (fake) and emulated alike.
import torch_tpu
switch = torch_tpu._internal.execution_mode
out["switch_after_full_list"] = switch.enable_cpu_fallback
shell.run_cell("import torch_tpu\ntorch_tpu._internal.execution_mode.enable_cpu_fallback = True")
out["user_switch"] = report(TPU_SMALL_CELL)
shell.run_cell("torch_tpu._internal.execution_mode.enable_cpu_fallback = False")
out["cell_switching"] = report(TPU_CELL_SWITCHING)
# The per-call warning, straight from the device (file descriptor 2).
x = torch.randn(4, device="tpu")
switch.enable_cpu_fallback = True
sys.stderr.flush()
saved, tmp = os.dup(2), tempfile.TemporaryFile()
os.dup2(tmp.fileno(), 2)
torch.special.i0(x)
torch.special.i0(x)
sys.stderr.flush()
os.dup2(saved, 2)
tmp.seek(0)
out["direct_warnings"] = tmp.read().decode().count(
    "operator 'aten::i0.out' is not implemented for TPU. Falling back to CPU"
)
switch.enable_cpu_fallback = False
try:
    torch.special.i0(x)
    out["direct_error"] = None
except RuntimeError as exc:
    out["direct_error"] = str(exc)
out["surface"] = sorted(n for n in dir(torch.tpu) if not n.startswith("__"))
out["not_available"] = get_backend("tpu").info().details.get("not_available")
print(json.dumps(out, default=str))
"""
)


def _by_op(events):
    """Op → (total count, sorted (file, line, phase) sites) over the events that carry counts."""
    ops = {}
    for event in events:
        if event["count"] is None:
            continue
        count, sites = ops.get(event["op"], (0, set()))
        site = event["site"]
        where = (site["file"], site["line"]) if site else None
        ops[event["op"]] = (count + event["count"], sites | {(where, event["phase"])})
    return {op: (count, sorted(map(str, sites))) for op, (count, sites) in ops.items()}


@pytest.fixture(scope="module")
def neuron_runs(run_device_json):
    return {
        kind: run_device_json("neuron", kind, NEURON_SCRIPT)[0] for kind in ("emulated", "fake")
    }


@pytest.fixture(scope="module")
def tpu_runs(run_device_json):
    return {kind: run_device_json("tpu", kind, TPU_SCRIPT) for kind in ("emulated", "fake")}


# ---- neuron -------------------------------------------------------------------------------------


def test_neuron_fake_gives_the_emulators_verdict_and_memory(neuron_runs):
    emu, fake = neuron_runs["emulated"]["cell"], neuron_runs["fake"]["cell"]
    assert emu["verdict"] == fake["verdict"] == "PASS"
    assert fake["memory"] == emu["memory"]
    assert fake["memory"]["peak_bytes"] >= 256 * 1024 * 4


def test_neuron_fake_gives_the_emulators_fallback_counts_and_sites(neuron_runs):
    emu, fake = neuron_runs["emulated"]["cell"], neuron_runs["fake"]["cell"]
    emu_ops, fake_ops = _by_op(emu["fallbacks"]), _by_op(fake["fallbacks"])
    # Every op the emulator lists is named by torch_neuronx.get_fallback_ops() on the fake...
    assert {e["op"] for e in fake["fallbacks"]} == {e["op"] for e in emu["fallbacks"]}
    # ...and wherever the op reached the device as a call of its own, count and lines agree.
    assert set(fake_ops) == {
        "aten::sort",
        "aten::argmax",
        "aten::max_pool2d_with_indices",
        "aten::max_pool2d_with_indices_backward",
    }
    for op, counted in fake_ops.items():
        assert counted == emu_ops[op], op
    assert fake_ops["aten::argmax"][0] == 3
    # normal_ runs inside randn's kernel: the SDK names it, a dispatch recorder cannot count it.
    (inner,) = [e for e in fake["fallbacks"] if e["count"] is None]
    assert inner["op"] == "aten::normal_" and "not seen at dispatch" in inner["source"]


def test_neuron_per_op_tracking_counts_fallbacks_inside_other_ops(neuron_runs):
    emu, fake = neuron_runs["emulated"]["cell"], neuron_runs["fake"]["cell_per_op"]
    assert fake["verdict"] == "PASS" and fake["memory"] == emu["memory"]
    assert all(event["count"] is not None for event in fake["fallbacks"])
    assert _by_op(fake["fallbacks"]) == _by_op(emu["fallbacks"])
    assert _by_op(fake["fallbacks"])["aten::normal_"][0] == 2  # randn on lines 2 and 7
    assert "per op" in fake["backend"]["details"]["fallback_tracking"]


def test_neuron_per_op_tracking_flag_does_what_the_variable_does(neuron_runs):
    by_env, by_flag = neuron_runs["fake"]["cell_per_op"], neuron_runs["fake"]["cell_per_op_flag"]
    assert by_flag["verdict"] == by_env["verdict"] == "PASS"
    assert _by_op(by_flag["fallbacks"]) == _by_op(by_env["fallbacks"])
    tracking = {r["backend"]["details"]["fallback_tracking"] for r in (by_env, by_flag)}
    assert len(tracking) == 1 and "per op" in tracking.pop()


def test_neuron_reports_say_fake(neuron_runs):
    emu, fake = neuron_runs["emulated"], neuron_runs["fake"]
    backend = fake["cell"]["backend"]
    assert fake["kind"] == "fake" and emu["kind"] == "emulated"
    assert backend["emulated"] is False and backend["details"]["kind"] == "fake"
    assert "fake torch_neuronx 2.14.3.0+fake" in backend["device_name"]
    assert backend["details"]["torch_neuronx"] == "2.14.3.0+fake"
    assert "fake torch_neuronx" in fake["cell"]["html"]
    assert "fake torch_neuronx" not in emu["cell"]["html"]
    assert fake["cell"]["summary"].startswith("PASS neuron (fake) vs ")
    assert fake["status_line"][0].startswith("neuron  available (FAKE: fake torch_neuronx")
    assert emu["status_line"][0] == "neuron  available (emulated on the host CPU)"


def test_fake_torch_neuronx_op_tracking(neuron_runs):
    fake = neuron_runs["fake"]
    # argmax is structured: the out= form reaches the device's fallback, as on TorchNeuron
    assert fake["fallback_ops"] == ["aten::argmax.out"]
    assert {"aten::argmax.out", "aten::add.Tensor"} <= set(fake["executed_ops"])
    assert fake["after_clear"] == [[], []]
    assert fake["props"][1] == "neuron:0"


# ---- tpu ----------------------------------------------------------------------------------------

TPU_MISSING = "operator 'aten::i0.out' is not implemented for TPU. Please file a feature request"


def test_tpu_missing_op_error_is_torchtpus_text(tpu_runs):
    for kind in ("emulated", "fake"):
        out, _ = tpu_runs[kind]
        assert out["default"]["verdict"] == "ERROR", kind
        assert out["default"]["error"] == TPU_MISSING, kind
        assert out["default"]["fallbacks"] == [], kind
        assert out["direct_error"] == TPU_MISSING, kind


def test_tpu_full_list_names_every_missing_op_in_one_run(tpu_runs):
    emu, fake = tpu_runs["emulated"][0]["full"], tpu_runs["fake"][0]["full"]
    assert emu["verdict"] == fake["verdict"] == "PASS"
    # torch.diag's diagonal_copy is a view-copy op: its composite kernel (a diagonal view and a
    # clone, both covered) runs on the device, as it would for TorchTPU; no fallback
    expected = {"aten::i0", "aten::kthvalue"}
    assert {e["op"] for e in emu["fallbacks"]} == expected
    assert _by_op(fake["fallbacks"]) == _by_op(emu["fallbacks"])
    assert _by_op(fake["fallbacks"])["aten::i0"][0] == 3  # line 3 once, line 7 twice
    assert fake["memory"] == emu["memory"]
    assert "full list" in fake["backend"]["details"]["fallback_mode"]


def test_tpu_full_list_flag_does_what_the_variable_does(tpu_runs):
    for kind in ("emulated", "fake"):
        by_env, by_flag = tpu_runs[kind][0]["full"], tpu_runs[kind][0]["full_flag"]
        assert by_flag["verdict"] == by_env["verdict"] == "PASS", kind
        assert _by_op(by_flag["fallbacks"]) == _by_op(by_env["fallbacks"]), kind
        assert "full list" in by_flag["backend"]["details"]["fallback_mode"], kind


def test_tpu_fallback_warnings_are_captured_and_deduplicated(tpu_runs):
    fake, stderr = tpu_runs["fake"]
    i0 = [e for e in fake["full"]["fallbacks"] if e["op"] == "aten::i0"]
    assert {e["warnings"] for e in i0} == {3}
    assert all("is not implemented for TPU. Falling back to CPU" in e["warning"] for e in i0)
    # The device printed them on descriptor 2 (as TorchTPU does): none reached the process's stderr.
    assert fake["direct_warnings"] == 2
    assert "Falling back to CPU" not in stderr


def test_tpu_switch_at_torchtpus_location(tpu_runs):
    for kind in ("emulated", "fake"):
        out, _ = tpu_runs[kind]
        assert out["switch_after_full_list"] is False, kind  # the full list restores it
        user = out["user_switch"]
        assert user["verdict"] == "PASS", kind
        assert {e["op"] for e in user["fallbacks"]} == {"aten::i0"}, kind
        assert out["direct_warnings"] == 2, kind


def test_tpu_fallback_switched_on_inside_the_cell_is_still_reported(tpu_runs):
    emu, fake = tpu_runs["emulated"][0]["cell_switching"], tpu_runs["fake"][0]["cell_switching"]
    assert emu["verdict"] == fake["verdict"] == "PASS"
    assert [(e["op"], e["count"]) for e in emu["fallbacks"]] == [("aten::i0", 1)]
    # The fake's warnings name the op; the recorder was off (the fallback was off at the start).
    (event,) = fake["fallbacks"]
    assert (event["op"], event["count"], event["warnings"]) == ("aten::i0", None, 1)


def test_tpu_reports_say_fake_and_undocumented_calls_are_not_assumed(tpu_runs):
    fake, emu = tpu_runs["fake"][0], tpu_runs["emulated"][0]
    backend = fake["full"]["backend"]
    assert fake["kind"] == "fake" and emu["kind"] == "emulated"
    assert backend["details"]["kind"] == "fake" and "fake torch_tpu" in backend["device_name"]
    assert fake["full"]["summary"].startswith("PASS tpu (fake) vs ")
    # The fake has only the documented torch.tpu surface; the adapter still runs and says what
    # it could not do.
    assert fake["surface"] == ["Precision", "precision"]
    assert "seed" in fake["not_available"]
