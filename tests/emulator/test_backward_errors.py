"""Errors raised during backward on the emulated device are Python errors, never process aborts.

Root cause under test: a Python exception raised on the autograd device thread left the Python
error indicator set while C++ unwound; the engine's stream guard then called the Python device
guard from a ``noexcept`` destructor and the process died with "terminate called without an
active exception". Every repro runs in a subprocess, so an abort fails the test instead of
killing pytest.
"""

from __future__ import annotations

import json
import signal

import pytest

PRELUDE = r"""
import json, sys, torch
import neuron_workbench
neuron_workbench.emulate(sys.argv[1])
dev = sys.argv[1]

def grads(fn, *xs):
    # the gradients of sum(fn(*xs)) on CPU and on the emulated device
    out = {}
    for where in ("cpu", dev):
        leaves = [x.detach().to(where).requires_grad_(x.requires_grad) for x in xs]
        y = fn(*leaves)
        (y.abs() if y.is_complex() else y).sum().backward()
        out[where] = [None if l.grad is None else l.grad.cpu() for l in leaves]
    return out

def same(a, b):
    return all((x is None and y is None) or torch.allclose(x, y, atol=1e-5, rtol=1e-5)
               for x, y in zip(a, b))

def error_of(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e).splitlines()[0]]
    return None
"""

CASES = {
    # torch.fft.hfft / hfftn of real float32 input: ConjBackward hands a lazily conjugated
    # gradient to view_as_real; the device tensor must carry the payload's conj bit.
    "hfft": r"""
torch.manual_seed(0)
x = torch.randn(5, 6, 7).requires_grad_()
g = grads(lambda t: torch.fft.hfft(t, n=10, dim=1, norm="ortho"), x)
h = grads(lambda t: torch.fft.hfftn(t, s=(4, 6), dim=(0, 2)), x)
c = grads(lambda t: torch.fft.hfft(t), torch.randn(3, 8, dtype=torch.complex64).requires_grad_())
print(json.dumps({"hfft": same(g["cpu"], g[dev]), "hfftn": same(h["cpu"], h[dev]),
                  "hfft_complex": same(c["cpu"], c[dev])}))
""",
    # group_norm without weight, bias requiring grad: CPU's native_group_norm_backward raises
    # "tensor does not have a device"; the emulated device must raise it too, not abort.
    "group_norm_bias_only": r"""
import torch.nn.functional as F
torch.manual_seed(0)
res = {}
for where in ("cpu", dev):
    x = torch.randn(2, 6, 5).to(where)
    b = torch.randn(6).to(where).requires_grad_()
    res[where] = error_of(lambda: F.group_norm(x, 3, None, b).sum().backward())
w = torch.randn(6)
ok = grads(lambda x, w, b: F.group_norm(x, 3, w, b), torch.randn(2, 6, 5), w,
           torch.randn(6).requires_grad_())
ok2 = grads(lambda x, w, b: F.group_norm(x, 3, w, b), torch.randn(2, 6, 5).requires_grad_(), w,
            torch.randn(6).requires_grad_())
res["weight_without_grad_matches"] = same(ok["cpu"], ok[dev]) and same(ok2["cpu"], ok2[dev])
print(json.dumps(res))
""",
    # Any Python error raised on the device thread: a tensor hook, and an op the profile
    # refuses in backward (CPU fallback off).
    "python_errors_in_backward": r"""
import neuron_workbench.emulator as E
res = {}
x = torch.randn(4, device=dev, requires_grad=True)
y = x * 3
def hook(g):
    raise ValueError("hook says no")
y.register_hook(hook)
res["hook"] = error_of(lambda: y.sum().backward())
E.configure(cpu_fallback=True)  # tpu's default is off
a = torch.randn(3, 4, device=dev, requires_grad=True)
b = torch.special.i0(a)  # forward with CPU fallback on
E.configure(cpu_fallback=False)  # the backward needs special_i1, outside both coverages
res["refused_op"] = error_of(lambda: b.sum().backward())
E.configure(cpu_fallback=True)
z = torch.randn(4, device=dev, requires_grad=True)
(z * 2).sum().backward()
res["later_backward_ok"] = z.grad.cpu().tolist() == [2.0] * 4
print(json.dumps(res))
""",
}


def _run(run_py, case: str, device: str = "neuron") -> dict:
    r = run_py(PRELUDE + CASES[case], args=[device], timeout=180)
    assert r.returncode != -signal.SIGABRT, f"process aborted:\n{r.stderr[-2000:]}"
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_hfft_backward_matches_cpu(run_py):
    assert _run(run_py, "hfft") == {"hfft": True, "hfftn": True, "hfft_complex": True}


def test_group_norm_bias_only_gradient_raises_like_cpu(run_py):
    res = _run(run_py, "group_norm_bias_only")
    assert res["cpu"] == ["RuntimeError", "tensor does not have a device"]
    assert res["neuron"] == res["cpu"]
    assert res["weight_without_grad_matches"] is True


@pytest.mark.parametrize("device", ["neuron", "tpu"])
def test_python_errors_on_the_device_thread_reach_the_caller(run_py, device):
    res = _run(run_py, "python_errors_in_backward", device)
    assert res["hook"] == ["ValueError", "hook says no"]
    kind, msg = res["refused_op"]
    assert kind == "RuntimeError"
    if device == "tpu":
        assert msg.endswith("is not implemented for TPU. Please file a feature request"), msg
    else:
        assert "is not implemented for emulated neuron" in msg, msg
    assert res["later_backward_ok"] is True
