"""``neuron-workbench doctor``: what is real here (emulated in this process; a fake SDK in a child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from neuron_workbench.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def test_doctor_text_fits_one_screen(capsys):
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("neuron-workbench ") and lines[0].endswith(" doctor")
    assert len(lines) <= 30 and max(map(len, lines)) <= 160
    text = "\n".join(lines)
    # The test process emulates neuron (tests/conftest.py), so tpu cannot be emulated next to it.
    assert "PrivateUse1 is 'neuron'" in text
    assert "neuron   emulated on the host CPU" in text
    assert "coverage: neuron-2026-04 (195 native ops)" in text
    assert (
        "tpu      unavailable: emulated tpu is not available: this process already emulates" in text
    )
    assert "sdk torch_neuronx: not installed" in text


def test_doctor_json(capsys):
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in data["backends"]}
    assert list(rows) == ["cpu", "cuda", "neuron", "tpu"]
    assert rows["neuron"]["kind"] == "emulated" and rows["neuron"]["available"] is True
    assert rows["neuron"]["capabilities"]["fallback tracking"] == "emulator events (counts, sites)"
    assert rows["tpu"]["kind"] == "unavailable" and rows["tpu"]["reason"]
    assert data["emulator_installed"] == "neuron"
    assert data["host"]["cpu_cores"] == os.cpu_count()


def test_doctor_with_a_fake_sdk_says_fake():
    env = dict(os.environ)
    env.pop("NEURON_WORKBENCH_EMULATE", None)
    fakes = ROOT / "tests" / "fakes"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(fakes / "neuron"), str(fakes / "common"), str(ROOT / "workbench")]
    )
    code = (
        "from neuron_workbench.cli.main import main\n"
        "main(['doctor']); print('---'); main(['doctor', '--json'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    text, _, js = proc.stdout.partition("---\n")
    assert (
        "neuron   fake: fake Trainium (neuron_workbench emulator); logical NeuronCores: 1" in text
    )
    assert "sdk torch_neuronx 2.14.3.0+fake (loaded)" in text
    assert "FAKE: fake torch_neuronx" in text
    neuron = {row["name"]: row for row in json.loads(js)["backends"]}["neuron"]
    assert neuron["kind"] == "fake" and neuron["devices"] == "1"
    assert neuron["sdk"] == {
        "module": "torch_neuronx",
        "installed": "2.14.3.0+fake",
        "loaded": True,
    }
    caps = neuron["capabilities"]
    assert caps["synchronize"] == "torch.neuron.synchronize"
    assert caps["memory"] == "torch.neuron.memory_allocated"
    assert caps["fallback tracking"].startswith("torch_neuronx.get_fallback_ops")
