"""The standalone HTML report (``run --html``, ``compare --html``) of a script's runs."""

import html

from neuron_workbench.cli.main import main

SCRIPT = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1.0)
parser.add_argument("--out", default="model.pt")
args = parser.parse_args()
w = torch.ones(2, device="cuda")
print(f"loss {(w * args.lr).sum().item():.4f}")
"""


def test_a_scripts_page_names_the_command_line_it_ran(tmp_path, monkeypatch, capsys):
    # the page of `run train.py -- --lr 0.5` read the same as one of `run train.py`: the arguments
    # that decide what the script computed were only in the --json file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    argv = [
        "run",
        "train.py",
        "-q",
        "--html",
        "r.html",
        "--",
        "--lr",
        "0.5",
        "--out",
        "my model.pt",
    ]
    assert main(argv) == 0, capsys.readouterr()
    page = html.unescape((tmp_path / "r.html").read_text())
    assert f"ran: <code>python train.py --lr 0.5 --out 'my model.pt'</code> in {tmp_path}" in page
    assert page.count("ran: <code>") == 1  # both runs ran it: one line
