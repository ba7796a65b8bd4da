"""Mechanical migration: what is rewritten, what is left alone, idempotence, and running the result."""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.scan import migrate_path, migrate_source, scan_source

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((Path(__file__).parent / "fixtures" / "scripts").glob("*.py"))

REWRITES = [
    ('x = torch.zeros(2, device="cuda")', 'x = torch.zeros(2, device="neuron")'),
    ("d = torch.device('cuda:1')", "d = torch.device('neuron:1')"),
    ('d = torch.device(f"cuda:{rank}")', 'd = torch.device(f"neuron:{rank}")'),
    (
        'device = "cuda" if torch.cuda.is_available() else "cpu"',
        'device = "neuron" if torch.neuron.is_available() else "cpu"',
    ),
    ("m = Net().cuda()", 'm = Net().to("neuron")'),
    ("x = x.cuda(0, non_blocking=True)", 'x = x.to("neuron:0", non_blocking=True)'),
    ("x = x.cuda(device=1)", 'x = x.to("neuron:1")'),
    ("torch.cuda.synchronize()", "torch.neuron.synchronize()"),
    (
        "n = torch.cuda.max_memory_allocated() / 2**20",
        "n = torch.neuron.max_memory_allocated() / 2**20",
    ),
    ("e = torch.cuda.Event(enable_timing=True)", "e = torch.neuron.Event(enable_timing=True)"),
    ("ok = t.is_cuda", "ok = t.is_neuron"),
    (
        'with torch.autocast("cuda", dtype=torch.float16):\n    pass',
        'with torch.autocast("neuron", dtype=torch.float16):\n    pass',
    ),
    ("with torch.cuda.amp.autocast():\n    pass", 'with torch.autocast("neuron"):\n    pass'),
    (
        "with torch.cuda.amp.autocast(True, torch.bfloat16):\n    pass",
        'with torch.autocast("neuron", enabled=True, dtype=torch.bfloat16):\n    pass',
    ),
    (
        "s = torch.cuda.amp.GradScaler(enabled=use_amp)",
        's = torch.amp.GradScaler("neuron", enabled=use_amp)',
    ),
    ("s = torch.amp.GradScaler()", 's = torch.amp.GradScaler("neuron")'),
    (
        's = torch.amp.GradScaler("cuda", init_scale=8.0)',
        's = torch.amp.GradScaler("neuron", init_scale=8.0)',
    ),
]


@pytest.mark.parametrize(("before", "after"), REWRITES)
def test_rewrites(before, after):
    migration = migrate_source("import torch\n" + before + "\n", path="x.py")
    assert migration.new_source == "import torch\n" + after + "\n"
    assert migration.applied and all(f.fixable for f in migration.applied)
    assert migration.diff.startswith("--- a/x.py\n+++ b/x.py\n")


def test_aliases_are_kept():
    src = (
        "import torch as T\nfrom torch.cuda.amp import autocast, GradScaler\n"
        "T.cuda.empty_cache()\nwith autocast():\n    s = GradScaler()\n"
    )
    new = migrate_source(src, path="a.py").new_source
    assert "T.neuron.empty_cache()" in new
    assert 'with T.autocast("neuron"):' in new and 's = T.amp.GradScaler("neuron")' in new


def test_name_from_torch_cuda_amp_without_torch_import_is_left_alone():
    src = "from torch.cuda.amp import autocast\nwith autocast():\n    pass\n"
    migration = migrate_source(src, path="a.py")
    assert not migration.changed
    assert {f.rule_id for f in migration.remaining} >= {"NW107", "NW110"}


UNTOUCHED = [
    "import torch\nmajor, minor = torch.cuda.get_device_capability()",
    "from torch.cuda import synchronize\nsynchronize()",
    "import torch\nx = x.cuda(local_rank)",
    'import torch.distributed as dist\ndist.init_process_group("nccl")',
    'import torch\ng = torch.Generator(device="cuda")',
    'import torch\nm = torch.compile(m, mode="max-autotune", dynamic=True)',
    "import torch\ntorch.backends.cudnn.benchmark = True",
    'import os\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"',
    "import torch\nx = torch.zeros(2, dtype=torch.float64)",
    'print("cuda")  # cuda\ncuda = 1',
]


@pytest.mark.parametrize("src", UNTOUCHED)
def test_unsafe_findings_are_not_rewritten(src):
    migration = migrate_source(src + "\n", path="u.py")
    assert not migration.changed and migration.diff == ""
    assert migration.to_text().startswith("u.py: no changes")


def test_comments_and_formatting_are_preserved():
    src = (
        "import torch  # the framework\n\n\n"
        "def f( x ):\n"
        "    # move to the gpu\n"
        "    y = x.cuda( )   # trailing comment about cuda\n"
        "    z = torch.zeros(\n"
        "        3,\n"
        "        device = 'cuda:0' ,  # keep this comment\n"
        "    )\n"
        "    return y,z\n"
    )
    new = migrate_source(src, path="f.py").new_source
    assert new == (src.replace("x.cuda( )", 'x.to("neuron")').replace("'cuda:0'", "'neuron:0'"))


def test_tpu_target():
    src = (
        "import torch\ntorch.cuda.set_device(0)\nx = t.cuda()\n"
        "torch.cuda.manual_seed(0)\nwith torch.autocast('cuda'):\n    pass\n"
    )
    new = migrate_source(src, "tpu", path="t.py").new_source
    assert "torch.accelerator.set_device_index(0)" in new
    assert 'x = t.to("tpu")' in new and "torch.autocast('tpu')" in new
    assert "torch.cuda.manual_seed(0)" in new  # no mechanical tpu equivalent


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_fixture_migration_is_idempotent_and_complete(script):
    first = migrate_source(script.read_text(), path=str(script))
    ast.parse(first.new_source)
    assert not [f for f in first.remaining if f.fixable], "a fixable finding survived"
    second = migrate_source(first.new_source, path=str(script))
    assert not second.changed and second.applied == []
    # Unfixable findings are untouched: the same rules remain, on the same lines.
    before = [
        (f.line, f.rule_id) for f in scan_source(script.read_text(), str(script)) if not f.fixable
    ]
    assert before == [(f.line, f.rule_id) for f in first.remaining]


def test_migrate_path_writes_only_with_write(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\nx = torch.ones(1).cuda()\n")
    preview = migrate_path(path)
    assert preview.changed and path.read_text().endswith(".cuda()\n")
    migrate_path(path, write=True)
    assert path.read_text() == 'import torch\nx = torch.ones(1).to("neuron")\n'
    assert not migrate_path(path, write=True).changed


def test_migrate_path_errors(tmp_path):
    with pytest.raises(WorkbenchUsageError, match="no such file"):
        migrate_path(tmp_path / "missing.py")
    with pytest.raises(WorkbenchUsageError):
        migrate_path(tmp_path / "x.py", target="cuda")


# -- property: migration never breaks parseable code and is idempotent --------------------------
FRAGMENTS = [
    "x = t.cuda()",
    'y = t.to("cuda:0")',
    "torch.cuda.synchronize()",
    "n = torch.cuda.device_count()",
    'device = "cuda" if torch.cuda.is_available() else "cpu"',
    "ok = t.is_cuda",
    "with torch.cuda.amp.autocast(True):\n    pass",
    "s = torch.cuda.amp.GradScaler(2.0**16)",
    "s = torch.amp.GradScaler()",
    'a = torch.autocast(device_type="cuda")',
    "print('cuda')  # cuda",
    "cuda = True",
    "def cuda():\n    return 0",
    "z = torch.zeros(2,\n    device='cuda')",
    "r = x.cuda(rank)",
    "c = torch.cuda.get_device_capability()",
    'e = f"cuda:{i}"',
    'd = torch.device(f"cuda:{i}")',
    "m = (t\n     .cuda())",
    "import torch as T\nT.cuda.empty_cache()",
    "from torch.cuda.amp import autocast\nq = autocast()",
    "if x.device.type == 'cuda':\n    pass",
    "g = torch.Generator(device='cuda')",
    'p = t.to(("cuda"))',
    "q = (t.cuda())",
    "w = (torch.cuda).synchronize()",
    'c2 = torch.device("cu" "da")',
    "s2 = (torch.amp.GradScaler)()",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8),
    st.sampled_from(["neuron", "tpu"]),
    st.sampled_from(["", "    "]),
)
def test_migration_property(fragments, target, indent):
    body = "\n".join(fragments)
    if indent:  # the same code inside a function body
        body = "def main():\n" + "\n".join(indent + line for line in body.split("\n"))
    source = "import torch\n" + body + "\n"
    ast.parse(source)
    first = migrate_source(source, target, path="p.py")
    ast.parse(first.new_source)
    assert not migrate_source(first.new_source, target, path="p.py").changed
    assert not [f for f in first.remaining if f.fixable]  # every fixable finding was applied


# -- the migrated training scripts run on the emulated neuron device -----------------------------
def _emulated_python():
    """argv prefix that runs a script on emulated neuron, preferring the public CLI."""
    env_root = str(REPO / "workbench")
    if importlib.util.find_spec("neuron_workbench.cli.commands.emulate") is not None:
        return [sys.executable, "-m", "neuron_workbench.cli.main", "emulate", "--", sys.executable]
    if importlib.util.find_spec("neuron_workbench.emulator.runner") is not None:
        return [sys.executable, "-m", "neuron_workbench.emulator.runner", "neuron"]
    pytest.skip(f"no emulator on {env_root}")


RUNNABLE = [p for p in SCRIPTS if "# run-after-migrate: yes" in p.read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("script", RUNNABLE, ids=lambda p: p.stem)
def test_migrated_script_runs_on_emulated_neuron(script, tmp_path):
    prefix = _emulated_python()
    target = tmp_path / script.name
    target.write_text(script.read_text())
    migrate_path(target, write=True)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workbench")}
    proc = subprocess.run(
        [*prefix, str(target)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " ok" in proc.stdout


def test_runnable_scripts_exist():
    assert {p.stem for p in RUNNABLE} >= {
        "cnn_classifier",
        "lstm_language_model",
        "transformer_amp",
    }
