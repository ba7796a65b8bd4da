"""``neuron-workbench run`` on compiled scripts: ``--strict-graph-breaks`` and ``--compile-check``."""

import json

from test_run import cli, validator

BREAKING = """import torch


def f(t):
    t = t.sin()
    print("inside")
    return t.cos()


y = torch.compile(f)(torch.ones(3).cuda())
"""


def test_strict_graph_breaks_exits_4_with_the_break_on_one_line(tmp_path):
    (tmp_path / "breaks.py").write_text(BREAKING)
    done = cli(
        "run", "breaks.py", "--strict-graph-breaks", "--compile-check", "--json", "r.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    # the verdict line says both verdicts: as written and with torch.compile off on both sides
    # the script's print (the kept run's, not the --compile-check runs'), then the verdict line
    assert done.stdout.startswith("inside\nbreaks.py: PASS neuron (emulated) vs cpu (as cuda)")
    assert "; with torch.compile off: PASS" in done.stdout.splitlines()[1]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "breaks.py: --strict-graph-breaks: torch.compile on neuron had 1 graph break, the first "
    ), done.stderr
    assert "the first at breaks.py:6: " in lines[-1] and "print" in lines[-1]
    document = json.loads((tmp_path / "r.json").read_text())
    validator("run").validate(document)
    assert document["summary"]["exit_code"] == 4 and document["summary"]["strict_graph_breaks"]
    check = document["reports"][0]["compile_check"]
    assert (check["compiled"], check["eager"]) == ("PASS", "PASS")


def test_strict_graph_breaks_is_silent_without_a_break(tmp_path):
    (tmp_path / "whole.py").write_text(BREAKING.replace('    print("inside")\n', ""))
    done = cli("run", "whole.py", "--strict-graph-breaks", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("whole.py: PASS neuron (emulated) vs cpu (as cuda)")


def test_a_scripts_graph_break_names_its_file_and_line_not_a_cell_line(tmp_path):
    # A script's own lines read "cell line 6" in the --strict-graph-breaks line and compile tables
    (tmp_path / "breaks.py").write_text(BREAKING)
    done = cli(
        "run", "breaks.py", "--strict-graph-breaks", "--json", "r.json", "--html", "r.html",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "had 1 graph break, the first at breaks.py:6: " in done.stderr.splitlines()[-1]
    target = json.loads((tmp_path / "r.json").read_text())["reports"][0]["target"]
    assert [(b["file"], b["line"]) for b in target["compile"]["graph_breaks"]] == [("breaks.py", 6)]
    html = (tmp_path / "r.html").read_text()
    assert "breaks.py:6" in html and "cell line" not in html
