"""``neuron-workbench run SCRIPT.py [options] -- ARGS``: a training script as users run it.

The script gets its own arguments, folder and ``__main__`` on both runs (the target's in its
worker), an argument error is the script's own usage message and exit 2, and every scalar it logs
(``loss.item()``) is compared step by step: the loss curves of a small nanoGPT-style ``train.py``
(``gpt/train.py``) match on neuron and part on tpu, where the report names the first step and why.
"""

import ast
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from test_run import validator

from neuron_workbench.testing import write_notebook

GPT = Path(__file__).resolve().parents[3] / "notebooks" / "gpt" / "train.py"


def _site(text):
    """``train.py:N`` of the line of ``GPT`` that holds ``text``."""
    lines = GPT.read_text().splitlines()
    return f"train.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


EVAL_SITE = _site("losses[k] = loss.item()")  # estimate_loss()
TRAIN_SITE = _site("lossf = loss.item()")  # once per iteration
PRINT_SITE = _site("train loss {losses['train']:.4f}")  # f"{loss:.4f}" of both splits' losses

CONTEXT_SCRIPT = """\
import argparse, os, sys
import torch
parser = argparse.ArgumentParser(prog="ctx.py")
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()

def note_where():  # each run appends a line (the device differs: it is not a global)
    seen = {"argv": list(sys.argv), "cwd": os.getcwd(), "name": __name__,
            "device": torch.ones(1, device="cuda").device.type}
    print("where", repr(seen))
    open("where.txt", "a").write(repr(seen) + "\\n")  # closed at once (CPython)

note_where()

def train():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = torch.randn(16, 4).cuda(), torch.randn(16, 1).cuda()
    for step in range(args.steps):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step {step}: {loss.item():.4f}")
        correct = int((model(x) > 0).eq(y > 0).sum())

if __name__ == "__main__":
    train()
"""


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


@pytest.fixture
def context_script(tmp_path):
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "ctx.py").write_text(CONTEXT_SCRIPT)
    return folder / "ctx.py"


def test_the_script_gets_its_arguments_folder_and_main_on_both_runs(context_script, tmp_path):
    done = cli(
        "run", str(context_script), "--target", "neuron", "--json", "r.json",
        "--", "--steps=3", "--lr", "0.05",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["options"]["args"] == ["--steps=3", "--lr", "0.05"]
    report = document["reports"][0]
    # each run printed what it saw: the reference here, the target in its worker
    seen = {side: _where(report[side]["stdout"]) for side in ("ref", "target")}
    assert {side: s.pop("device") for side, s in seen.items()} == {"ref": "cpu", "target": "neuron"}
    context = {
        "argv": [str(context_script), "--steps=3", "--lr", "0.05"],
        "cwd": str(context_script.parent),
        "name": "__main__",
    }
    assert seen == {"ref": context, "target": context}
    # the file both appended to holds the kept run's line; the target's was kept apart
    lines = (context_script.parent / "where.txt").read_text().splitlines()
    assert [ast.literal_eval(line)["device"] for line in lines] == ["cpu"]
    assert any(
        "its writes to 1 file were kept apart" in n and "where.txt" in n for n in report["notes"]
    )
    sites = {s["site"]: s for s in report["scalars"]["sites"]}
    # loss.item() in the loop and int(tensor) after it, three times each, on both runs
    assert sorted(sites) == ["ctx.py:24", "ctx.py:25"]
    assert sites["ctx.py:24"]["how"] == "Tensor.item" and sites["ctx.py:24"]["dtype"] == "float32"
    assert sites["ctx.py:25"]["how"] == "int" and sites["ctx.py:25"]["dtype"] == "int64"
    assert all(s["ref_count"] == s["target_count"] == 3 and s["matched"] for s in sites.values())
    assert report["scalars"]["first"] is None


def _where(stdout):
    """The context a run of the script printed (its ``where {...}`` line)."""
    line = next(line for line in stdout.splitlines() if line.startswith("where "))
    return ast.literal_eval(line.removeprefix("where "))


def test_cwd_sets_the_working_folder(context_script, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli(
        "run", str(context_script), "--cwd", str(elsewhere), "--", "--steps=1", cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the kept (reference) run's line, written in the folder --cwd named
    assert len((elsewhere / "where.txt").read_text().splitlines()) == 1
    assert not (context_script.parent / "where.txt").exists()
    bad = cli("run", str(context_script), "--cwd", str(tmp_path / "nope"), cwd=tmp_path)
    assert bad.returncode == 2
    assert (
        bad.stderr.strip() == f"neuron-workbench: error: --cwd {tmp_path / 'nope'}: no such folder"
    )


def test_an_argument_error_is_the_scripts_own_usage_and_exit_2(context_script, tmp_path):
    done = cli("run", str(context_script), "--", "--steps=2", "--bogus=1", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "usage: ctx.py [-h] --steps STEPS [--lr LR]",
        "ctx.py: error: unrecognized arguments: --bogus=1",
    ]
    assert "Traceback" not in done.stdout + done.stderr
    missing = cli("run", str(context_script), cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[-1] == (
        "ctx.py: error: the following arguments are required: --steps"
    )


def test_script_arguments_are_for_scripts_only(tmp_path):
    (tmp_path / "n.ipynb").write_text("{}")
    done = cli("run", "n.ipynb", "--", "--x=1", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "neuron-workbench: error: `-- ARGS` and --cwd apply to a script (.py)"
    )


def test_a_scripts_arguments_without_the_dashes_say_where_they_go(context_script, tmp_path):
    # `run train.py --lr 0.5` (the `--` forgotten) said only "unrecognized arguments: --lr 0.5"
    done = cli("run", str(context_script), "--lr", "0.5", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "neuron-workbench: error: unrecognized arguments: --lr 0.5 (a script's own arguments "
        "follow --, after the command's options: neuron-workbench run "
        f"{context_script} [options] -- --lr 0.5)"
    )
    # an unknown option before `--` is the command's (a typo), as before
    typo = cli("run", str(context_script), "--bogus", "--", "--steps=2", cwd=tmp_path)
    assert typo.returncode == 2
    assert typo.stderr.strip() == "neuron-workbench: error: unrecognized arguments: --bogus"


def test_max_steps_stops_both_runs(context_script, tmp_path):
    done = cli(
        "run", str(context_script), "--max-steps", "2", "--json", "r.json", "--", "--steps=50",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    first = report["scalars"]["sites"][0]
    assert (first["site"], first["ref_count"], first["target_count"]) == ("ctx.py:24", 2, 2)
    assert report["scalars"]["max_steps"] == 2
    for role in ("ref", "target"):  # the third step's loss was never logged
        assert report[role]["stdout"].count("step ") == 2, report[role]["stdout"]
    assert cli("run", str(context_script), "--max-steps", "0", cwd=tmp_path).returncode == 2


def test_a_gpt_training_script_on_neuron_has_matching_loss_curves(tmp_path):
    done = cli(
        "run", str(GPT), "--target", "neuron", "--json", "n.json", "--html", "n.html",
        "--junit", "n.xml", "--", "--max_iters=20",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the training log the script printed (the reference run's), then the report line
    assert done.stdout.startswith("step 0: train loss ")
    assert "\ntrain.py: PASS neuron (emulated) vs cpu (as cuda)" in done.stdout
    report = json.loads((tmp_path / "n.json").read_text())["reports"][0]
    sites = {s["site"]: s for s in report["scalars"]["sites"]}
    # estimate_loss's loss.item() (2 splits x 2 batches at iterations 0, 10, 20), the
    # training loop's, once per iteration, and the f-string printing both splits' mean losses
    assert {k: (s["ref_count"], s["target_count"]) for k, s in sites.items()} == {
        EVAL_SITE: (12, 12),
        TRAIN_SITE: (20, 20),
        PRINT_SITE: (6, 6),
    }
    assert all(s["matched"] for s in sites.values())
    assert sites[TRAIN_SITE]["ref"][-1] < sites[TRAIN_SITE]["ref"][0]  # it learns
    html = (tmp_path / "n.html").read_text()
    assert "Observed scalars (by call site and occurrence)" in html
    cases = ET.parse(tmp_path / "n.xml").getroot().findall("testsuite/testcase")
    assert len(cases) == 1  # one testcase per script


def test_a_gpt_training_script_on_tpu_names_where_the_curves_part(tmp_path):
    done = cli(
        "run", str(GPT), "--target", "tpu", "--json", "t.json", "--junit", "t.xml",
        "--", "--max_iters=20", "--dtype=float32",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("train.py: "))
    assert line.startswith("train.py: FAIL tpu (emulated) vs cpu (as cuda)")
    assert f"; scalars part at {EVAL_SITE} #" in line and line.endswith("(TPU 1-pass bf16 matmuls)")
    report = json.loads((tmp_path / "t.json").read_text())["reports"][0]
    first = report["scalars"]["first"]
    assert first["site"] == EVAL_SITE
    assert first["ref"] != first["target"]
    assert any(h.startswith("TPU fp32 matmuls default to 1-pass bfloat16") for h in first["hints"])
    training = next(s for s in report["scalars"]["sites"] if s["site"] == TRAIN_SITE)
    assert training["parts_at"] is not None and training["max_abs"] > 0
    failure = ET.parse(tmp_path / "t.xml").getroot().find("testsuite/testcase/failure")
    assert f"observed scalars part first at {EVAL_SITE} #" in failure.text


def test_record_takes_the_same_form_and_run_compares_the_recorded_curve(context_script, tmp_path):
    done = cli(
        "record", str(context_script), "-o", "ref.nwrun.zip", "--", "--steps=3", cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((context_script.parent / "where.txt").read_text().splitlines()) == 1
    done = cli(
        "run", str(context_script), "--against", "ref.nwrun.zip", "--target", "tpu",
        "--json", "r.json", "--", "--steps=3",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "scalars part at ctx.py:24 #1: " in done.stdout  # the recorded curve, the live one
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    assert report["scalars"]["sites"][0]["ref_count"] == 3
    bad = cli(
        "record",
        str(context_script),
        "-o",
        "x.nwrun.zip",
        "--",
        "--steps=1",
        "--nope",
        cwd=tmp_path,
    )
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == "ctx.py: error: unrecognized arguments: --nope"
    assert not (tmp_path / "x.nwrun.zip").exists()


def test_sys_exit_0_at_the_end_is_the_scripts_normal_end(tmp_path):
    (tmp_path / "main.py").write_text(
        "import sys\nimport torch\n\n"
        "def main():\n"
        "    global total\n"
        "    total = torch.ones(3, device='cuda').sum()\n"
        "    print(total.item())\n\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main())\n"
    )
    done = cli("run", "main.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # what the script printed, then its report
    assert done.stdout.startswith(
        "3.0\nmain.py: PASS neuron (emulated) vs cpu (as cuda) — 1 output"
    )
    (tmp_path / "fails.py").write_text("import sys\nsys.exit(3)\n")
    assert cli("run", "fails.py", cwd=tmp_path).returncode == 3


def test_a_script_resuming_from_its_own_checkpoint_finds_it_as_the_run_did(tmp_path):
    # The target's run found the checkpoint the reference had just saved and resumed from it:
    # FAIL, ones against twos. Under python on a GPU, the first run leaves ones, the next twos.
    (tmp_path / "resume.py").write_text(
        "import os, torch\n"
        'w = torch.zeros(3, device="cuda")\n'
        'if os.path.exists("state.pt"):\n'
        '    w = torch.load("state.pt", map_location="cuda")\n'
        "w = w + 1\n"
        'torch.save(w, "state.pt")\n'
    )
    for step in (1.0, 2.0):
        done = cli("run", "resume.py", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("resume.py: PASS"), done.stdout
        saved = torch.load(tmp_path / "state.pt", map_location="cpu")
        assert saved.tolist() == [step] * 3


def test_a_script_with_a_bom_or_a_coding_line_runs_as_under_python(tmp_path):
    # python reads a UTF-8 byte order mark (Windows editors save one) and a PEP 263 coding line;
    # run read the bytes as plain UTF-8: "syntax error line 1: invalid non-printable character
    # U+FEFF", and "not a readable UTF-8 script" for latin-1, both exit 2 with nothing run
    body = "import torch\nx = torch.ones(3, device='cuda')\nprint('name', 'caf\u00e9', x.sum().item())\n"
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    (tmp_path / "latin.py").write_bytes(("# -*- coding: latin-1 -*-\n" + body).encode("latin-1"))
    for name in ("bom.py", "latin.py"):
        assert subprocess.run([sys.executable, name], cwd=tmp_path).returncode == 1  # (no cuda)
        done = cli("run", name, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"name caf\u00e9 3.0\n{name}: PASS neuron (emulated)")
    done = cli("record", "latin.py", "-q", "-o", "latin.nwrun.zip", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # a file python itself refuses stays a one-line error
    (tmp_path / "bad.py").write_bytes(b"x = '\xff'\n")
    done = cli("run", "bad.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(
        "neuron-workbench: error: bad.py is not a readable Python script: "
    )
    assert done.stderr.count("\n") == 1


def test_os_exit_at_the_end_is_reported_not_a_silent_exit_0(tmp_path):
    # os._exit ended the command itself (the reference runs in its process): exit 0, nothing
    # printed, no report file, so a CI job read a pass. A forked child's os._exit is its own.
    (tmp_path / "hard_exit.py").write_text(
        "import multiprocessing as mp, os, sys\n"
        "import torch\n"
        "def child(q):\n"
        "    q.put(2)\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('fork')\n"
        "    q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()\n"
        "    scale = q.get(); p.join()\n"
        "    print('child exit', p.exitcode)\n"
        "    print('loss', (torch.ones(3, device='cuda') * scale).sum().item(), flush=True)\n"
        "    os._exit(int(sys.argv[1]))\n"
    )
    done = cli("run", "hard_exit.py", "--json", "r.json", "--", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "child exit 0\nloss 6.0\nhard_exit.py: PASS neuron (emulated) vs cpu (as cuda)"
    )
    assert json.loads((tmp_path / "r.json").read_text())["reports"][0]["verdict"] == "PASS"
    # a non-zero code is the script's failure, as sys.exit(3) after its work is
    done = cli("run", "hard_exit.py", "--", "3", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "hard_exit.py: ERROR " in done.stdout and "raised SystemExit: 3" in done.stdout


def test_a_script_using_its_standard_streams_as_files_runs_on_both_sides(tmp_path):
    # the runs' captures were StringIOs: faulthandler.enable() raised UnsupportedOperation: fileno
    # and sys.stdout.reconfigure(...) AttributeError, on the reference and in the worker alike
    (tmp_path / "streams.py").write_text(
        "import faulthandler, sys\n"
        "import torch\n"
        "from tqdm import tqdm\n"
        "faulthandler.enable()\n"
        "sys.stdout.reconfigure(line_buffering=True)\n"
        "x = torch.zeros(2, device='cuda')\n"
        "for _ in tqdm(range(3)):\n"
        "    x += 1\n"
        "sys.stdout.buffer.write(b'bytes\\n')\n"
        "print('loss', x.sum().item(), sys.stdout.encoding)\n"
    )
    done = cli("run", "streams.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("bytes\nloss 6.0 utf-8\nstreams.py: PASS neuron (emulated)")
    outputs = json.loads((tmp_path / "r.json").read_text())["reports"][0]["outputs"]
    assert all(o["status"] == "match" for o in outputs), outputs


def test_a_script_without_a_docstring_has_pythons_module_globals(tmp_path):
    # __doc__, __spec__ and __package__ were unset in the script's globals and fell through to the
    # builtins module's: ArgumentParser(description=__doc__) printed its docstring in --help
    (tmp_path / "nodoc.py").write_text(
        "import argparse\nimport torch\n"
        "parser = argparse.ArgumentParser(description=__doc__)\n"
        "parser.add_argument('--lr', type=float, default=0.1)\n"
        "args = parser.parse_args()\n"
        "print('globals', __doc__, __spec__, __package__)\n"
        "print('loss', (torch.ones(2, device='cuda') * args.lr).sum().item())\n"
    )
    plain = subprocess.run(
        [sys.executable, "nodoc.py", "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    done = cli("run", "nodoc.py", "--", "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == plain.stdout, done.stdout + done.stderr
    done = cli("run", "nodoc.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("globals None None None\nloss 0.2")


NEXT_TO_IT_SCRIPT = """\
import os
import torch
print("file", __file__)
scale = float(open(os.path.join(os.path.dirname(__file__), "scale.txt")).read())
x = torch.ones(3, device="cuda") * scale
"""


def test_a_script_named_by_a_relative_path_with_a_folder_runs_as_under_python(tmp_path):
    # `run sub/hello.py` from the project root, the usual CI form: the runs change to sub/, and
    # __file__, the script's folder and --record DIR still mean what they mean where it was typed
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "hello.py").write_text(NEXT_TO_IT_SCRIPT)
    (sub / "scale.txt").write_text("2\n")
    done = cli(
        "run", "sub/hello.py", "--record", "recs", "--json", "r.json", cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        f"file {sub / 'hello.py'}\nhello.py: PASS neuron (emulated) vs cpu (as cuda) — "
    )
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    for side in ("ref", "target"):  # absolute, as `python sub/hello.py` gives it
        assert f"file {sub / 'hello.py'}\n" in report[side]["stdout"]
    assert (tmp_path / "recs" / "hello.nwrun.zip").is_file()
    assert not (sub / "recs").exists()
    again = cli("run", "sub/hello.py", "--against", "recs", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr


ARGV0_SCRIPT = """\
import os, sys
import torch
print("argv0", sys.argv[0])
here = os.path.dirname(os.path.abspath(sys.argv[0]))
scale = float(open(os.path.join(here, "scale.txt")).read())
x = torch.ones(3, device="cuda") * scale
"""


def test_argv0_names_the_script_from_the_folder_the_runs_work_in(tmp_path):
    # `run sub/train.py`: the runs work in sub/, where "sub/train.py" names nothing; a script
    # finding its files by os.path.abspath(sys.argv[0]) read sub/sub/scale.txt on both runs
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "train.py").write_text(ARGV0_SCRIPT)
    (sub / "scale.txt").write_text("2\n")
    done = cli("run", "sub/train.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    for side in ("ref", "target"):  # as `cd sub && python train.py` gives it
        assert report[side]["stdout"] == "argv0 train.py\n"
        assert report[side]["script"]["argv"] == ["train.py"]
    # run from the command's folder (--cwd .), the script is named as it was typed
    here = cli("run", "sub/train.py", "--cwd", ".", "--json", "r.json", cwd=tmp_path)
    assert here.returncode == 0, here.stdout + here.stderr
    assert here.stdout.startswith("argv0 sub/train.py\n")


def test_a_module_next_to_the_script_named_like_a_standard_one_is_not_the_workbenchs(tmp_path):
    # a project's secrets.py (another script's API keys) next to train.py, which imports only
    # torch: the workbench's own import of NumPy's generators (to seed them) took it for the
    # standard library's and raised, in this process (a traceback) and in the target's worker
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "secrets.py").write_text('API_KEY = "not-a-key"\n')
    (sub / "train.py").write_text(
        "import torch\nw = torch.ones(3, device='cuda') * 2\nprint(w.sum().item())\n"
    )
    done = cli("run", "sub/train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "train.py: PASS neuron (emulated) vs cpu (as cuda)" in done.stdout
    assert done.stderr == ""
    recorded = cli("record", "sub/train.py", "--backend", "neuron", "-o", "r.zip", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "recorded neuron (emulated) run: 1 outputs" in recorded.stdout


def test_a_class_from_a_module_next_to_the_script_comes_back_from_the_target(tmp_path):
    # with --against no reference run imports model.py here: the target's answer, which holds
    # its class by reference, must still load (not "could not be loaded from the worker")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "model.py").write_text(
        "import torch\nclass Net(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n"
    )
    (sub / "train.py").write_text(
        "import torch\nfrom model import Net\ntorch.manual_seed(0)\n"
        'net = Net().cuda()\nprint(f"{net.fc.weight.sum().item():.4f}")\n'
    )
    recorded = cli("record", "sub/train.py", "--backend", "neuron", "-o", "r.zip", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "recorded neuron (emulated) run: 2 outputs," in recorded.stdout  # net.fc's parameters
    again = cli("run", "sub/train.py", "--record", "recs", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    against = cli("run", "sub/train.py", "--against", "recs", "--json", "a.json", cwd=tmp_path)
    assert against.returncode == 0, against.stdout + against.stderr
    assert against.stderr == ""
    report = json.loads((tmp_path / "a.json").read_text())["reports"][0]
    assert report["verdict"] == "PASS"
    assert report["counts"] == {"match": 2}  # net.fc's weight and bias, nothing left out


def test_a_script_whose_class_the_command_cannot_load_leaves_its_modules_alone(tmp_path):
    # the script puts src/ on sys.path itself: with --against no reference run did so here, and
    # the target's model cannot be loaded (not compared); the modules the script imported were
    # listed with it ("could not be loaded", no reason), after a walk through torch's modules that
    # printed FutureWarnings of deprecated torch.distributed names
    (tmp_path / "src" / "mylib").mkdir(parents=True)
    (tmp_path / "src" / "mylib" / "__init__.py").write_text(
        "import torch\nclass Net(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n"
    )
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(
        "import os, sys\n"
        "sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'src'))\n"
        "import torch\nfrom mylib import Net\ntorch.manual_seed(0)\n"
        'net = Net().cuda()\nprint(f"{net.fc.weight.sum().item():.4f}")\n'
    )
    recorded = cli("run", "scripts/train.py", "--record", "recs", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    done = cli("run", "scripts/train.py", "--against", "recs", "--json", "a.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stderr
    report = json.loads((tmp_path / "a.json").read_text())["reports"][0]
    left_out = {o["path"] for o in report["outputs"] if o["status"] == "not-compared"}
    assert not left_out & {"os", "sys", "torch"}


MATMUL_SCRIPT = """\
import torch
torch.manual_seed(0)
a = torch.randn(64, 64).cuda()
print(f"{(a @ a).sum().item()}")
"""


def test_several_targets_give_a_script_one_report_each(tmp_path):
    (tmp_path / "mm.py").write_text(MATMUL_SCRIPT)
    done = cli(
        "run", "mm.py", "--target", "neuron,tpu", "--json", "r.json", "--junit", "r.xml",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # tpu's 1-pass bf16 matmul parts
    printed, *lines = done.stdout.splitlines()  # the sum the script printed, once, first
    float(printed)
    assert lines[0].startswith("mm.py: PASS neuron (emulated) vs cpu (as cuda)")
    assert lines[1].startswith("mm.py: FAIL tpu (emulated) vs cpu (as cuda)")
    assert lines[2].startswith("2 reports: 1 PASS, 1 FAIL, 0 ERROR;")
    document = json.loads((tmp_path / "r.json").read_text())
    targets = [r["target"]["backend"]["name"] for r in document["reports"]]
    assert targets == ["neuron", "tpu"]
    assert document["summary"]["exit_code"] == 1
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")


HELP_SCRIPT = """\
import argparse
import torch
parser = argparse.ArgumentParser(prog="ap.py", description="trains a thing")
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()
x = torch.ones(2, device="cuda") * args.epochs
"""


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_scripts_own_help_is_printed_and_exits_0(tmp_path, flag):
    (tmp_path / "ap.py").write_text(HELP_SCRIPT)
    done = cli("run", "ap.py", "--", flag, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage: ap.py [-h] --epochs EPOCHS\n\ntrains a thing\n")
    assert "UNCOMPARED" not in done.stdout + done.stderr


SPAWN_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, Dataset

class Rows(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i))

def main():
    loader = DataLoader(Rows(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    global total
    total = sum(batch.to("cuda").sum() for batch in loader)

if __name__ == "__main__":
    main()
"""


def test_a_dataloader_spawning_its_workers_finds_the_scripts_dataset(tmp_path):
    # The reference ran in the command line's process, whose __main__ is not the script: pickle
    # could not find the script's Dataset class for a spawned worker ("Can't pickle <class
    # '__main__.Rows'>"), where `python SCRIPT` runs (found by trying the command line as a user)
    (tmp_path / "spawn.py").write_text(SPAWN_SCRIPT)
    done = cli("run", "spawn.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("spawn.py: PASS neuron (emulated) vs cpu (as cuda) — 1 output")


def test_a_script_that_exits_non_zero_after_its_work_is_reported(tmp_path):
    # Its exit was taken for a usage error: its progress went to stderr as a usage message, no
    # --json or --junit file was written, and its own code (3) read as the --strict one
    (tmp_path / "late.py").write_text(
        "import sys\nimport torch\n"
        "x = torch.ones(2, device='cuda')\n"
        "for i in range(3):\n"
        "    print('epoch', i, (x * i).sum().item())\n"
        "sys.exit(3)\n"
    )
    done = cli("run", "late.py", "--json", "r.json", "--junit", "r.xml", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(
        "epoch 0 0.0\nepoch 1 2.0\nepoch 2 4.0\n"
        "late.py: ERROR neuron (emulated) vs cpu (as cuda) — cpu raised"
    )
    assert "SystemExit: 3" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["reports"][0]["verdict"] == "ERROR"
    assert (tmp_path / "r.xml").is_file()


def test_a_script_judged_by_its_scalars_says_what_was_not_compared(tmp_path):
    # its loss is compared; the lock at its top cannot come back from the target's worker: the
    # line said "PASS ... 1 scalar site match", as if nothing had been left out
    (tmp_path / "train.py").write_text(
        "import threading\nimport torch\nlock = threading.Lock()\n"
        "def main():\n    w = torch.ones(3, device='cuda')\n"
        '    print(f"{(w * 2).sum().item():.3f}")\n'
        "if __name__ == '__main__':\n    main()\n"
    )
    done = cli("run", "train.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "train.py: PASS neuron (emulated) vs cpu (as cuda) — 1 scalar site match; 1 not compared\n"
        in done.stdout
    )
    report = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    assert [(o["path"], o["status"]) for o in report["outputs"]] == [("lock", "not-compared")]


def test_a_script_that_compared_nothing_and_exited_0_is_uncompared_not_help(tmp_path):
    # (after review) any sys.exit(0) of a run that compared nothing was taken for the script's
    # --help: `sys.exit(main())` of a script keeping its work in locals printed nothing, exited 0
    # and wrote no report file, so a CI gate passed with nothing checked
    (tmp_path / "quiet.py").write_text(
        "import sys\nimport torch\n\n"
        "def main():\n"
        "    x = torch.ones(2, device='cuda') * 2\n"
        "    return 0\n\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main())\n"
    )
    done = cli("run", "quiet.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("quiet.py: UNCOMPARED")
    assert (tmp_path / "r.json").is_file()


PRINTING_SCRIPT = """\
import sys
import torch
x = torch.ones(3, device="cuda")
print("loss", float(x.sum()), "on", x.device.type)
print("warming up on", x.device.type, file=sys.stderr)
y = x * 2
"""


def test_the_scripts_own_output_is_shown_once_before_its_report(tmp_path):
    # A training script's loss lines were never shown, only the report line: the runs' output was
    # captured for the comparison and kept in the report files alone
    (tmp_path / "train.py").write_text(PRINTING_SCRIPT)
    done = cli("run", "train.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # the kept (reference) run's output, once, each stream on its own, then the report
    lines = done.stdout.splitlines()
    assert lines[0] == "loss 3.0 on cpu"
    assert lines[1].startswith("train.py: PASS neuron (emulated) vs cpu (as cuda) — ")
    assert done.stdout.count("loss 3.0") == 1
    assert done.stderr.splitlines().count("warming up on cpu") == 1
    assert "on neuron" not in done.stdout + done.stderr
    # the report file is as it was: each run's output in its own report, nothing more
    document = json.loads((tmp_path / "r.json").read_text())
    validator("run").validate(document)
    assert set(document) == {
        "schema_version", "kind", "workbench_version", "input", "options", "summary", "reports",
        "cell_errors",
    }  # fmt: skip
    report = document["reports"][0]
    assert report["ref"]["stdout"] == "loss 3.0 on cpu\n"
    assert report["target"]["stdout"] == "loss 3.0 on neuron\n"
    # --keep target keeps the target's results, and shows what it printed
    kept = cli("run", "train.py", "--keep", "target", cwd=tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert kept.stdout.splitlines()[:1] == ["loss 3.0 on neuron"]
    assert kept.stderr.splitlines().count("warming up on neuron") == 1
    assert "on cpu" not in kept.stdout + kept.stderr


def test_quiet_leaves_the_scripts_output_out(tmp_path):
    # CI logs and checked notebook outputs want the verdicts only: a training log's digits vary
    # from host to host
    (tmp_path / "train.py").write_text(PRINTING_SCRIPT)
    done = cli("run", "train.py", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("train.py: PASS neuron (emulated)")
    assert "loss 3.0" not in done.stdout and "warming up" not in done.stderr
    recorded = cli("record", "train.py", "-q", "-o", "ref.nwrun.zip", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "loss 3.0" not in recorded.stdout and "warming up" not in recorded.stderr


FAILING_SCRIPT = """\
import torch
print("starting training")
x = torch.ones(3, device="cuda")
print("loss", float(x.sum()))
raise ValueError("boom at step 3")
"""


def test_a_script_that_raised_shows_its_output_and_names_its_own_line(tmp_path):
    # The error read "(cell line 5)" of a script that has no cell, and its output was not shown
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    done = cli("run", "fail.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[:3] == [
        "starting training",
        "loss 3.0",
        "fail.py: ERROR neuron (emulated) vs cpu (as cuda) — "
        "cpu raised ValueError: boom at step 3 (fail.py, line 5); "
        "neuron raised ValueError: boom at step 3 (fail.py, line 5)",
    ]
    assert done.stdout.count("starting training") == 1
    summary = json.loads((tmp_path / "r.json").read_text())["reports"][0]["summary"]
    assert summary.endswith("neuron raised ValueError: boom at step 3 (fail.py, line 5)")
    # the same code as a notebook cell keeps a cell's wording (line 1 is the %%neuron line)
    notebook = write_notebook(tmp_path / "fail.ipynb", "%%neuron\n" + FAILING_SCRIPT)
    cell = cli("run", str(notebook), cwd=tmp_path)
    assert cell.returncode == 1, cell.stdout + cell.stderr
    assert cell.stdout.splitlines()[0] == (
        "cell 1: ERROR neuron (emulated) vs cpu (as cuda) — "
        "cpu raised ValueError: boom at step 3 (cell line 6); "
        "neuron raised ValueError: boom at step 3 (cell line 6)"
    )


ABORTING_SCRIPT = """\
import ctypes
import os
import torch

x = torch.ones(2, device="cuda") + 1
if os.environ.get("NEURON_WORKBENCH_WORKER"):
    ctypes.CDLL(None).abort()
"""


def test_a_target_process_that_died_in_a_script_names_the_scripts_line(tmp_path):
    # The worker's message read "at cell line 7" of a script that has no cell
    (tmp_path / "abort.py").write_text(ABORTING_SCRIPT)
    done = cli("run", "abort.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    message = json.loads((tmp_path / "r.json").read_text())["reports"][0]["target"]["error"]
    assert message["message"] == (
        "target process died (SIGABRT) at abort.py, line 7, after running aten::add.Tensor"
    )
    assert "TargetProcessDied: target process died (SIGABRT) at abort.py, line 7," in done.stdout


def test_a_file_missed_from_the_scripts_folder_but_found_here_hints_at_cwd(tmp_path):
    # `python scripts/train.py --config configs/a.json` from a repository's root finds the config;
    # the runs start in scripts/, and the ERROR line gave no word of --cwd
    (tmp_path / "scripts").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.json").write_text('{"scale": 2}')
    (tmp_path / "scripts" / "train.py").write_text(
        "import argparse, json\nimport torch\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--config')\n"
        "cfg = json.load(open(parser.parse_args().config))\n"
        "print('loss', (torch.ones(2, device='cuda') * cfg['scale']).sum().item())\n"
    )
    done = cli("run", "scripts/train.py", "--", "--config", "configs/a.json", cwd=tmp_path)
    assert done.returncode == 1 and "raised FileNotFoundError" in done.stdout
    assert done.stderr.splitlines()[-1] == (
        f"hint: train.py runs from its own folder ({tmp_path / 'scripts'}), which has no "
        "configs/a.json; this folder has it: add --cwd . to run the script from here, as python "
        "would"
    )
    done = cli("run", "scripts/train.py", "--cwd", ".", "--", "--config", "configs/a.json",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hint:" not in done.stderr
    # a file missing everywhere is the script's own error, with no hint
    done = cli("run", "scripts/train.py", "--", "--config", "configs/b.json", cwd=tmp_path)
    assert done.returncode == 1 and "hint:" not in done.stderr


WAITING_SCRIPT = """\
import os, time
import torch
x = torch.ones(3, device="cuda")
print("step 0", flush=True)


def wait_for_the_test():  # until it has read step 0 (20 s at most)
    for _ in range(200):
        if os.path.exists("go"):
            return
        time.sleep(0.1)
    print("step 0 was not shown while the script ran")


wait_for_the_test()
print("step 1", float(x.sum()))
"""


def _after_first_line(tmp_path, script, first, then):
    """Exit code, output and errors of ``run train.py`` (``script``), ``then`` done once its
    first line (``first``) was read while it ran."""
    (tmp_path / "train.py").write_text(script)
    process = subprocess.Popen(
        [sys.executable, "-m", "neuron_workbench.cli.main", "run", "train.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == first
        then(process)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    return process.returncode, out, err


def test_the_scripts_output_shows_as_it_prints_it(tmp_path):
    # A training script's progress came only once both runs had ended (and a Ctrl-C lost all of
    # it): the kept run's output now reaches the terminal as the script prints it
    code, out, err = _after_first_line(
        tmp_path, WAITING_SCRIPT, "step 0\n", lambda process: (tmp_path / "go").touch()
    )
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "step 1 3.0"  # once: the output shown as it came is not shown again
    assert lines[1].startswith("train.py: PASS neuron (emulated) vs cpu (as cuda) — ")
    assert "was not shown" not in out and "step 0" not in out


SLEEPING_SCRIPT = """\
import time
import torch
x = torch.ones(3, device="cuda")
print("started", flush=True)
time.sleep(120)
"""


def test_sigterm_ends_a_script_run_with_one_line_and_exit_143(tmp_path):
    # A CI job's timeout or `kill` ended `run SCRIPT` with no word (the process killed by the
    # signal); it now ends as Ctrl-C does: its runs stopped, what the script printed shown
    import signal

    code, out, err = _after_first_line(
        tmp_path, SLEEPING_SCRIPT, "started\n", lambda process: process.send_signal(signal.SIGTERM)
    )
    assert code == 143, out + err
    assert err.splitlines()[-1] == "neuron-workbench: terminated (SIGTERM)", err
    assert "Traceback" not in err


def test_a_reader_that_went_away_ends_the_command_quietly_with_exit_141(tmp_path):
    # `run train.py | head -1` in a CI step: the lines after the first raised BrokenPipeError,
    # a traceback from the command and another as Python flushed its closed output at exit
    (tmp_path / "train.py").write_text(WAITING_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, "-m", "neuron_workbench.cli.main", "run", "train.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "step 0\n"
        process.stdout.close()  # as `head -1` does once it has its line
        (tmp_path / "go").touch()
        err = process.stderr.read()
        code = process.wait(timeout=300)
    finally:
        process.kill()
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


BELOW_PYTHON_SCRIPT = """\
import ctypes, os, subprocess, sys
import torch
print("before", flush=True)
os.system("echo hi from os.system")
subprocess.run(["echo", "hi from a subprocess"])
subprocess.run(["echo", "hi through sys.stdout"], stdout=sys.stdout)
os.write(1, b"hi from fd 1\\n")
sys.stdout.flush()
ctypes.CDLL(None).dprintf(2, b"hi from C on fd 2\\n")
print("after")
x = torch.ones(3, device="cuda") * 2
"""


def test_output_written_below_python_is_shown_once_and_recorded_with_the_target(tmp_path):
    # os.system's output showed twice: the target's worker shares the terminal's fds 1 and 2, so
    # what it wrote below Python reached the terminal next to the reference's
    (tmp_path / "below.py").write_text(BELOW_PYTHON_SCRIPT)
    done = cli("run", "below.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = ("hi from os.system", "hi from a subprocess", "hi through sys.stdout", "hi from fd 1")
    for text in shown:
        assert done.stdout.count(text) == 1, done.stdout
    assert done.stderr.count("hi from C on fd 2") == 1, done.stderr
    # the target's is its run's record, where it came among what the run printed
    target = json.loads((tmp_path / "r.json").read_text())["reports"][0]["target"]
    assert target["stdout"] == (
        "before\nhi from os.system\nhi from a subprocess\nhi through sys.stdout\nhi from fd 1\n"
        "after\n"
    )
    assert target["stderr"] == "hi from C on fd 2\n"


def test_json_to_stdout_leaves_stdout_to_the_report_alone(tmp_path):
    # `run train.py --json - | jq` in a CI step: "-" was a file named "-"; now the report is the
    # standard output, and the command's lines and the script's output (below Python too) go to
    # stderr, each once
    (tmp_path / "below.py").write_text(BELOW_PYTHON_SCRIPT)
    done = cli("run", "below.py", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["summary"]["verdicts"]["PASS"] == 1 and not (tmp_path / "-").exists()
    shown = ("hi from os.system", "hi from a subprocess", "hi through sys.stdout", "hi from fd 1")
    for text in (*shown, "below.py: PASS", "1 reports: 1 PASS"):
        assert done.stderr.count(text) == 1, done.stderr
    both = cli("run", "below.py", "--json", "-", "--html", "-", cwd=tmp_path)
    assert both.returncode == 2 and both.stdout == ""
    assert both.stderr == (
        "neuron-workbench: error: --json and --html both name - (standard output): one report "
        "can go there\n"
    )


DYING_SCRIPT = """\
import ctypes, faulthandler, os
import torch
faulthandler.enable()
x = torch.ones(2, device="cuda") + 1
if os.environ.get("NEURON_WORKBENCH_WORKER"):
    os.write(2, b"the device said why\\n")
    ctypes.CDLL(None).abort()
"""


def test_a_target_that_died_keeps_what_it_wrote_below_python_and_its_line(tmp_path):
    # what the dying worker wrote to its fd 2 (a C++ abort's message) is its run's record; the
    # stack a script's own faulthandler.enable() dumps there still names the script's line
    (tmp_path / "dies.py").write_text(DYING_SCRIPT)
    done = cli("run", "dies.py", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    target = json.loads((tmp_path / "r.json").read_text())["reports"][0]["target"]
    assert target["error"]["message"] == (
        "target process died (SIGABRT) at dies.py, line 7, after running aten::add.Tensor"
    )
    assert target["stderr"].startswith("the device said why\n")
    assert "Fatal Python error: Aborted" in target["stderr"]
    assert "the device said why" not in done.stderr
