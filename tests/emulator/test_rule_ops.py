"""Evidence counters: the ops each numeric rule touched (``read_rule_ops``), in both cores."""

from __future__ import annotations

import json

import torch

from neuron_workbench import emulator


def _counted(fn):
    emulator.reset_rule_ops()
    fn()
    return emulator.read_rule_ops()


def test_float64_and_int64_ops_on_neuron_are_counted_once_per_op():
    a = torch.ones(4, dtype=torch.float64, device="neuron")
    i = torch.arange(4, device="neuron")
    assert _counted(lambda: a + a) == {
        "tpu-matmul": 0,
        "tpu-matmul-1pass": 0,
        "fp64": 1,
        "int64": 0,
        "int64-wrapped": 0,
        "fp64-rounded": 0,
    }
    assert _counted(lambda: (i * 3).sum()) == {
        "tpu-matmul": 0,
        "tpu-matmul-1pass": 0,
        "fp64": 0,
        "int64": 2,
        "int64-wrapped": 0,  # 0..3 times 3, summed: int32 holds every value
        "fp64-rounded": 0,
    }
    # float32 work and data movement touch no rule; a float32 matmul is exact on neuron by default
    x = torch.randn(3, 3, device="neuron")
    assert _counted(lambda: (x @ x * 2.5 + 1).cpu()) == {
        "tpu-matmul": 0,
        "tpu-matmul-1pass": 0,
        "fp64": 0,
        "int64": 0,
        "int64-wrapped": 0,
        "fp64-rounded": 0,
    }


def test_int64_ops_that_wrap_a_value_are_counted_apart():
    # The int64 rule changes a value only beyond int32's range: an op that ran as int32 is no
    # evidence that anything wrapped around, and the hint needs that evidence.
    i = torch.arange(4, device="neuron")
    big = torch.full((4,), 70000, device="neuron")
    counted = _counted(lambda: (i * 3 + 1, big // 7, big - i))
    assert (counted["int64"], counted["int64-wrapped"]) == (4, 0)
    # a result beyond int32 (70000**2), a Python int beyond it, an input beyond it (in place too)
    assert _counted(lambda: big * big)["int64-wrapped"] == 1
    assert _counted(lambda: i + 2**40)["int64-wrapped"] == 1
    assert _counted(lambda: (i + 2**31).cpu())["int64-wrapped"] == 1
    wide = torch.full((2,), 2**33)  # made on the host: the device narrows it when it computes
    assert _counted(lambda: wide.to("neuron").add_(1))["int64-wrapped"] == 1
    # int32 arithmetic wraps on the CPU as well: no int64 op, nothing counted
    n = torch.full((2,), 70000, dtype=torch.int32, device="neuron")
    assert _counted(lambda: n * n) == dict.fromkeys(emulator.RULES, 0)


FP64_ROUNDED = r"""
import json, torch
from neuron_workbench import emulator as E
E.emulate("neuron")
def counted(fn):
    E.reset_rule_ops(); fn(); return [E.read_rule_ops()[k] for k in ("fp64", "fp64-rounded")]
scale = torch.full((), 65536.0, device="neuron")
x = torch.randn(8, device="neuron")
wide = torch.tensor([0.1, 1e8 + 1, 1e8], dtype=torch.float64).to("neuron")
out = {
    "core": E.status().core,
    # GradScaler's unscale_: float32 holds a power-of-two scale and its reciprocal
    "scale": counted(lambda: scale.double().reciprocal().float()),
    "exact": counted(lambda: torch.ones(4, dtype=torch.float64, device="neuron") * 2),
    # float32 values in float64 arithmetic, a result float32 rounds (in place too)
    "result": counted(lambda: x.double() * 1.1),
    "in_place": counted(lambda: x.double().mul_(1.1)),
    # float64 inputs float32 cannot hold: into a float64 result or an index they change it, into
    # a float32 result (which CUDA rounds as well) they do not
    "input": counted(lambda: wide * 2),
    "index": counted(lambda: wide.argmax()),
    "to_float32": counted(lambda: torch.zeros(3, device="neuron").add_(wide)),
}
# a sparse float64 tensor has no elementwise comparison: the device still refuses it as before
try:
    torch.eye(2, dtype=torch.float64).to_sparse().to("neuron")
except NotImplementedError as exc:
    out["sparse"] = "cannot be created on neuron" in str(exc)
print(json.dumps(out))
"""


def test_float64_ops_that_round_a_value_are_counted_apart_in_both_cores(run_py):
    # A float64 op on values float32 holds computes what float64 would: it is no evidence that
    # float32 rounded anything (a GradScaler step counted float64 ops, and every difference in
    # its cell was put down to float64).
    for core in ("auto", "python"):
        r = run_py(FP64_ROUNDED, env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out.pop("core") == ("python" if core == "python" else "native")
        assert out == {
            "scale": [1, 0],
            "exact": [1, 0],
            "result": [1, 1],
            "in_place": [1, 1],
            "input": [1, 1],
            "index": [1, 1],
            "to_float32": [1, 0],
            "sparse": True,
        }, (core, out)


def test_bf16_what_if_counts_float32_matmuls_only():
    emulator.configure(bf16_matmul=True)
    x = torch.randn(3, 3, device="neuron")
    n = torch.ones(3, 3, dtype=torch.int32, device="neuron")
    conv = torch.nn.Conv2d(1, 2, 3).to("neuron")
    assert _counted(lambda: x @ x)["tpu-matmul"] == 1
    assert _counted(lambda: conv(torch.randn(1, 1, 5, 5, device="neuron")))["tpu-matmul"] == 1
    assert _counted(lambda: n @ n)["tpu-matmul"] == 0


def test_nothing_is_counted_when_nothing_is_emulated(run_py):
    r = run_py(
        "import json; from neuron_workbench import emulator as E\n"
        "E.reset_rule_ops(); print(json.dumps(E.read_rule_ops()))"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == dict.fromkeys(emulator.RULES, 0)


TPU = r"""
import json, torch
from neuron_workbench import emulator as E
E.emulate("tpu")
def counted(fn):
    E.reset_rule_ops(); fn(); return E.read_rule_ops()
x = torch.randn(4, 4, device="tpu")
n = torch.ones(4, 4, dtype=torch.int64, device="tpu")
out = {
    "matmul": counted(lambda: torch.nn.functional.linear(x, x)),
    "int": counted(lambda: (n @ n).sum()),
    "core": E.status().core,
}
print(json.dumps(out))
"""


def test_tpu_counts_float32_matmuls_and_not_int_ones_in_both_cores(run_py):
    for core in ("auto", "python"):
        r = run_py(TPU, env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["core"] == ("python" if core == "python" else "native")
        nothing = dict.fromkeys(emulator.RULES, 0)
        assert out["matmul"] == {**nothing, "tpu-matmul": 1, "tpu-matmul-1pass": 1}, out
        assert out["int"] == nothing, out


NEURON_PY = r"""
import json, torch
from neuron_workbench import emulator as E
E.emulate("neuron")
E.reset_rule_ops()
a = torch.ones(4, dtype=torch.float64, device="neuron")
(a + a).cpu()
(torch.ones(2, device="neuron") * 2.5 + 1).cpu()  # Python scalars are no 64-bit op
fp64 = E.read_rule_ops()
i = torch.arange(4, device="neuron")
big = torch.full((4,), 70000, device="neuron")
E.reset_rule_ops()
(i * 3 + 1).cpu(), (big - i).cpu()
fits = E.read_rule_ops()
E.reset_rule_ops()
(big * big).cpu(), (i + 2**40).cpu(), torch.full((2,), 2**33).to("neuron").add_(1).cpu()
wraps = E.read_rule_ops()
print(json.dumps([E.status().core, fp64, fits, wraps]))
"""


def test_python_core_counts_float64_and_int64_wraps_on_neuron(run_py):
    r = run_py(NEURON_PY, env={"NEURON_WORKBENCH_EMULATOR_CORE": "python"})
    assert r.returncode == 0, r.stderr[-2000:]
    core, counts, fits, wraps = json.loads(r.stdout.strip().splitlines()[-1])
    assert (fits["int64"], fits["int64-wrapped"]) == (3, 0)
    assert (wraps["int64"], wraps["int64-wrapped"]) == (3, 3)
    assert core == "python" and counts == {
        "tpu-matmul": 0,
        "tpu-matmul-1pass": 0,
        "fp64": 1,
        "int64": 0,
        "int64-wrapped": 0,
        "fp64-rounded": 0,
    }
