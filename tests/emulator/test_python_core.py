"""The pure-Python core: chosen on purpose, or used where the native core cannot be built."""

from __future__ import annotations

import json

PROBE = """
import json, warnings
import torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from neuron_workbench.emulator import emulate
    from neuron_workbench.emulator._core import GrowthError
    st = emulate("neuron")
out = {"core": st.core, "note": st.core_note,
       "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
twin.load_state_dict(model.state_dict())
twin.to("neuron")
x = torch.randn(4, 8)
model(x).sum().backward()
twin(x.to("neuron")).sum().backward()
out["grads_match"] = all(
    torch.equal(a.grad, b.grad.cpu()) for a, b in zip(model.parameters(), twin.parameters())
)
try:
    torch.ones(2, device="neuron").resize_(5)
    out["grow"] = "grew"
except GrowthError as e:
    out["grow"] = str(e).splitlines()[0]
print(json.dumps(out))
"""


def test_python_core_when_chosen(run_py):
    r = run_py(PROBE, env={"NEURON_WORKBENCH_EMULATOR_CORE": "python"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["core"] == "python" and out["note"] == "NEURON_WORKBENCH_EMULATOR_CORE=python"
    assert out["warnings"] == []  # chosen on purpose: nothing to warn about
    assert out["grads_match"] is True
    assert "cannot grow a tensor in place" in out["grow"]


def test_no_compiler_falls_back_to_the_python_core_with_one_line(run_py, tmp_path):
    env = {
        "PATH": str(tmp_path),  # no c++, g++, clang++ or ninja
        "NEURON_WORKBENCH_CACHE": str(tmp_path / "cache"),  # nothing built there
        "CXX": "",
    }
    r = run_py(PROBE, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["core"] == "python"
    assert (
        out["note"]
        == "cannot build the emulator's native core: no C++ compiler found (install g++ or clang++)"
    )
    assert len(out["warnings"]) == 1 and "\n" not in out["warnings"][0]
    assert "uses the pure-Python core" in out["warnings"][0]
    assert out["grads_match"] is True
