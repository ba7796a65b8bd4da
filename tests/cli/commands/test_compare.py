"""``neuron-workbench compare A B``: a recorded reference against a recorded target."""

import json
import xml.etree.ElementTree as ET
import zipfile
from importlib import resources

import jsonschema
import pytest

from neuron_workbench.artifacts import load
from neuron_workbench.cli.main import main

SCRIPT = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(3, 2).to(device)
x = torch.randn(4, 3, device=device)
loss = model(x).square().mean()
loss.backward()
"""
SORTS = SCRIPT + "values, order = torch.sort(x[:, 0])\n"
DRIFTS = SCRIPT + "flag = loss.detach().cpu() + (1.0 if x.device.type != 'cpu' else 0.0)\n"
INTS = "n = 3\n"


def edited(artifact, out, edit):
    """A copy of ``artifact`` with ``edit`` applied to its manifest, as by hand: unzip, edit, zip."""
    with zipfile.ZipFile(artifact) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(out, "w") as target:
        for info, data in entries:
            if info.filename == "manifest.json":
                manifest = json.loads(data)
                edit(manifest)
                data = json.dumps(manifest, indent=1).encode()
            target.writestr(info, data)
    return out


def report_errors(path):
    """What report.schema.json finds wrong in the report ``compare --json`` wrote to ``path``."""
    text = resources.files("neuron_workbench.report").joinpath("report.schema.json").read_text()
    validator = jsonschema.Draft202012Validator(json.loads(text))
    return [error.message for error in validator.iter_errors(json.loads(path.read_text()))]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Artifacts recorded on the 'GPU host' (cpu here) and on the 'Trainium host' (emulated)."""
    folder = tmp_path_factory.mktemp("rec")
    made = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        scripts = {"plain": SCRIPT, "sorts": SORTS, "drifts": DRIFTS, "ints": INTS}
        for name, source in scripts.items():
            (folder / f"{name}.py").write_text(source)
            for backend in ("cpu", "neuron"):
                out = folder / f"{name}-{backend}.nwrun.zip"
                assert main(["record", f"{name}.py", "--backend", backend, "-o", str(out)]) == 0
                made[name, backend] = out
    return made


def test_pass_prints_the_verdict_and_writes_reports(recorded, tmp_path, capsys):
    a, b = recorded["plain", "cpu"], recorded["plain", "neuron"]
    j, h, x = tmp_path / "c.json", tmp_path / "c.html", tmp_path / "c.xml"
    code = main(["compare", str(a), str(b), "--json", str(j), "--html", str(h), "--junit", str(x)])
    out = capsys.readouterr()
    assert code == 0 and out.err == ""
    assert out.out.startswith("PASS neuron (emulated) vs cpu (as cuda) — 7 outputs, 7 match")
    data = json.loads(j.read_text())
    assert data["summary"] == out.out.strip() and data["verdict"] == "PASS"
    assert data["artifacts"] == {"ref": str(a), "target": str(b)} and data["warnings"] == []
    assert data["ref"]["backend"]["emulated"] is False and data["target"]["backend"]["emulated"]
    assert 'class="nw-report"' in h.read_text()
    case = ET.parse(x).getroot().find("testsuite/testcase")
    assert case.get("name") == "cell 1" and case.find("failure") is None


def test_a_report_named_dash_is_the_standard_output(recorded, tmp_path, capsys, monkeypatch):
    a, b = recorded["plain", "cpu"], recorded["plain", "neuron"]
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(a), str(b), "--json", "-"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)  # the report alone: the verdict line went to stderr
    assert out.err.startswith(data["summary"]) and data["verdict"] == "PASS"
    assert not (tmp_path / "-").exists()
    assert main(["compare", str(a), str(b), "--junit", "-"]) == 0
    case = ET.fromstring(capsys.readouterr().out).find("testsuite/testcase")
    assert case.get("name") == "cell 1" and case.find("failure") is None


def test_fallbacks_and_strict(recorded, capsys):
    a, b = recorded["sorts", "cpu"], recorded["sorts", "neuron"]
    assert main(["compare", str(a), str(b)]) == 0
    assert "fell back to CPU" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--strict"]) == 3
    # which ops, as `run --strict` says (the exit code alone left a CI log reading PASS)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"{a.name} vs {b.name}: --strict: on neuron these ops fell back to CPU: "
    )
    ops = line.split("fell back to CPU: ")[1].split(" (")[0].split(", ")
    assert main(["compare", str(a), str(b), "--strict", "--allow-fallback", ",".join(ops)]) == 0


def test_a_one_run_artifact_compared_with_itself_is_refused(recorded, capsys):
    # its one run stood for both sides: `compare ref.zip ref.zip` PASSed, a green CI job that
    # checked nothing
    a = recorded["plain", "cpu"]
    assert main(["compare", str(a), str(a)]) == 2
    assert capsys.readouterr().err == (
        f"neuron-workbench: error: {a} holds one run: comparing it with itself checks nothing; "
        "give the artifact of the other side as B\n"
    )


def test_numeric_failure_exits_1(recorded, capsys):
    assert main(["compare", str(recorded["drifts", "cpu"]), str(recorded["drifts", "neuron"])]) == 1
    assert capsys.readouterr().out.startswith("FAIL neuron (emulated) vs cpu (as cuda)")


def test_a_different_cell_source_is_a_warning_in_the_report(recorded, tmp_path, capsys):
    j = tmp_path / "w.json"
    code = main(
        [
            "compare",
            str(recorded["plain", "cpu"]),
            str(recorded["sorts", "neuron"]),
            "--json",
            str(j),
        ]
    )
    out = capsys.readouterr()
    assert code == 1  # the extra outputs are missing on the reference
    assert out.err.startswith(
        "warning: the recording plain-cpu.nwrun.zip ran a different cell source"
    )
    assert json.loads(j.read_text())["warnings"][0] == out.err.removeprefix("warning: ").strip()


def test_compare_matches_the_live_verdict_of_run_record(recorded, tmp_path, monkeypatch, capsys):
    # `run --record` keeps both runs; comparing that artifact with itself (A's ref vs B's target)
    # reproduces the live report exactly.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drifts.py").write_text(DRIFTS)
    assert main(["run", "drifts.py", "--ref", "cpu", "--record", "rec", "--json", "live.json"]) == 1
    both = tmp_path / "rec" / "drifts.nwrun.zip"
    assert main(["compare", str(both), str(both), "--json", "again.json"]) == 1
    live = json.loads((tmp_path / "live.json").read_text())["reports"][0]
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["summary"] == live["summary"]
    assert again["outputs"] == live["outputs"]
    capsys.readouterr()


MATMUL = """\
import torch
x = torch.randn(64, 64, device="cuda")
y = x @ x
"""


def test_each_target_of_a_recording_of_several_is_compared_by_its_role(
    tmp_path, monkeypatch, capsys
):
    # `run --target neuron,tpu --record` keeps the tpu run as target_tpu: the first target is
    # compared unless --target-run names another, and the report says the others are there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matmul.py").write_text(MATMUL)
    args = ["run", "matmul.py", "--target", "neuron,tpu", "--record", "rec", "--json", "live.json"]
    assert main(args) == 1  # the TPU's one-pass bfloat16 matmul
    live = json.loads((tmp_path / "live.json").read_text())["reports"]
    assert [report["verdict"] for report in live] == ["PASS", "FAIL"]
    both = str(tmp_path / "rec" / "matmul.nwrun.zip")
    capsys.readouterr()

    assert main(["compare", both, both, "--json", "neuron.json"]) == 0
    err = capsys.readouterr().err
    note = "matmul.nwrun.zip also holds the target run(s) target_tpu: --target-run target_tpu"
    assert note in err
    neuron = json.loads((tmp_path / "neuron.json").read_text())
    assert neuron["summary"] == live[0]["summary"]
    assert any(note in each for each in neuron["notes"])

    assert main(["compare", both, both, "--target-run", "target_tpu", "--json", "tpu.json"]) == 1
    assert "also holds the target run(s) target:" in capsys.readouterr().err
    tpu = json.loads((tmp_path / "tpu.json").read_text())
    assert tpu["summary"] == live[1]["summary"]
    assert tpu["outputs"] == live[1]["outputs"]

    assert main(["compare", both, both, "--target-run", "target_xla"]) == 2
    assert "holds runs ref, target, target_tpu and none is 'target_xla'" in capsys.readouterr().err
    assert main(["compare", both, both, "--ref-run", "target", "--target-run", "target"]) == 2
    assert "both name 'target'" in capsys.readouterr().err
    # the neuron run as the reference of the tpu run: the two targets against each other
    assert main(["compare", both, both, "--ref-run", "target", "--target-run", "target_tpu"]) == 1
    assert "FAIL tpu (emulated) vs neuron (emulated)" in capsys.readouterr().out


def test_role_choice_and_bad_input(recorded, tmp_path, capsys):
    a = recorded["plain", "cpu"]
    assert main(["compare", str(a), str(a), "--rtol", "1e-3"]) == 2
    assert "give --rtol and --atol together" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "none.zip")]) == 2
    assert (
        capsys.readouterr().err
        == f"neuron-workbench: error: no such artifact: {tmp_path / 'none.zip'}\n"
    )
    # An artifact with roles other than ref/target and more than one run is ambiguous.
    from neuron_workbench.artifacts import save

    runs = load(a).runs
    odd = save(
        tmp_path / "odd.nwrun.zip", runs={"x": runs["ref"], "y": runs["ref"]}, cell_source=""
    )
    assert main(["compare", str(odd), str(a)]) == 2
    assert "holds runs x, y and none is 'ref'" in capsys.readouterr().err


def test_a_role_named_on_the_command_line_must_be_in_the_artifact(recorded, capsys):
    # A one-run artifact's run stands in for the default roles only: `--target-run target_tpu`
    # against a neuron-only recording compared its neuron run and exited 0 as if it were tpu's.
    a, b = str(recorded["plain", "cpu"]), str(recorded["plain", "neuron"])
    assert main(["compare", a, b, "--target-run", "target_tpu"]) == 2
    assert "holds runs ref and none is 'target_tpu'" in capsys.readouterr().err
    assert main(["compare", a, b, "--ref-run", "nope"]) == 2
    assert "holds runs ref and none is 'nope'" in capsys.readouterr().err
    assert main(["compare", a, b]) == 0  # left out, each artifact's only run is still taken
    assert main(["compare", a, b, "--ref-run", "ref"]) == 0


def test_a_report_over_an_input_artifact_is_refused(recorded, tmp_path, capsys):
    # `compare A B --json B` replaced the artifact B with the JSON report (exit 0)
    a = tmp_path / "a.nwrun.zip"
    a.write_bytes(recorded["plain", "cpu"].read_bytes())
    b = str(recorded["plain", "neuron"])
    assert main(["compare", str(a), b, "--json", str(a)]) == 2
    assert f"--json {a} is also the input {a}" in capsys.readouterr().err
    assert load(a).runs  # still the artifact


def _set_output(value):
    def edit(manifest):
        (run,) = manifest["runs"].values()
        (leaf,) = [leaf for leaf in run["outputs"] if leaf["path"] == "n"]
        leaf["value"] = value

    return edit


def test_python_ints_too_large_for_a_float_compare_exactly(recorded, tmp_path, capsys):
    # An int output edited to 10**400 (a JSON literal of 401 digits) read "n ValueError: Overflow
    # when unpacking long long": Python ints of any size are outputs a cell can have (a live
    # %%neuron cell compares them the same way), compared exactly
    a, b = recorded["ints", "cpu"], recorded["ints", "neuron"]
    big_a = edited(a, tmp_path / "big-a.nwrun.zip", _set_output(10**400))
    big_b = edited(b, tmp_path / "big-b.nwrun.zip", _set_output(10**400))
    next_b = edited(b, tmp_path / "next-b.nwrun.zip", _set_output(10**400 + 1))
    with zipfile.ZipFile(big_a) as archive:
        assert '"value": 1' + "0" * 400 + "\n" in archive.read("manifest.json").decode()
    report = tmp_path / "r.json"

    assert main(["compare", str(big_a), str(big_b), "--json", str(report)]) == 0
    out = capsys.readouterr()
    assert out.out == "PASS neuron (emulated) vs cpu (as cuda) — 1 output, 1 match\n"
    assert out.err == "" and report_errors(report) == []

    assert main(["compare", str(big_a), str(next_b), "--json", str(report)]) == 1
    assert capsys.readouterr().out.endswith("1 differs: n max|Δ| 1.0e+00 > 0.0e+00\n")
    (n,) = json.loads(report.read_text())["outputs"]
    assert (n["status"], n["max_abs"], n["worst_ref"], n["worst_target"]) == (
        "differ", 1.0, "inf", "inf"
    )  # fmt: skip
    assert report_errors(report) == []

    # against the recorded 3: a difference too large for a float, inf in the report's numbers
    html = tmp_path / "r.html"
    assert main(["compare", str(big_a), str(b), "--json", str(report), "--html", str(html)]) == 1
    out = capsys.readouterr()
    assert out.out.endswith("1 differs: n max|Δ| 1.0e+400 > 0.0e+00\n") and out.err == ""
    (n,) = json.loads(report.read_text())["outputs"]
    assert (n["status"], n["max_abs"], n["worst_target"]) == ("differ", "inf", 3.0)
    assert report_errors(report) == [] and "Overflow" not in report.read_text()


@pytest.mark.parametrize(
    ("site", "kind"), [(5, "a number"), (["sorts.py", 6], "a list"), ("sorts.py:6", "a string")]
)
def test_a_fallback_site_of_the_wrong_type_is_a_damaged_artifact(
    recorded, tmp_path, site, kind, capsys
):
    # it loaded, and `compare --json` wrote a report that failed report.schema.json (a site is an
    # object or null)
    a, b = recorded["sorts", "cpu"], recorded["sorts", "neuron"]
    report = tmp_path / "r.json"
    assert main(["compare", str(a), str(b), "--json", str(report)]) == 0
    assert report_errors(report) == []
    capsys.readouterr()
    report.unlink()

    def edit(manifest):
        manifest["runs"]["ref"]["fallbacks"][0]["site"] = site

    bad = edited(b, tmp_path / "site.nwrun.zip", edit)
    assert main(["compare", str(a), str(bad), "--json", str(report)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and not report.exists()
    assert out.err == (
        f"neuron-workbench: error: {bad}: runs.ref.fallbacks[0].site must be an object or null, "
        f"not {kind}\n"
    )


def test_a_recorded_extra_named_facts_does_not_replace_the_runs_facts(recorded, tmp_path, capsys):
    # the report's run took every extra over its own facts: an artifact's extras hold whatever
    # its file says, and `compare --json` wrote "facts": [1], which report.schema.json refuses
    a, b = recorded["sorts", "cpu"], recorded["sorts", "neuron"]

    def edit(manifest):
        manifest["runs"]["ref"]["extras"]["facts"] = [1]

    odd = edited(b, tmp_path / "facts.nwrun.zip", edit)
    report = tmp_path / "r.json"
    assert main(["compare", str(a), str(odd), "--json", str(report)]) == 0
    capsys.readouterr()
    assert report_errors(report) == []
    facts = json.loads(report.read_text())["target"]["facts"]
    assert facts == json.loads(json.dumps(load(b).runs["ref"].facts.to_dict()))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A comparison `run --record` saved (its report holds the options), and its profile's."""
    folder = tmp_path_factory.mktemp("run-rec")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        (folder / "sorts.py").write_text(SORTS)
        args = ["run", "sorts.py", "--ref", "cpu", "--target", "neuron", "--profile"]
        assert main([*args, "--record", str(folder / "rec")]) == 0
    return folder / "rec" / "sorts.nwrun.zip"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(options=5), "report.options must be an object or null, not a number"),
        (lambda r: r.update(options=[1]), "report.options must be an object or null, not a list"),
        (
            lambda r: r["options"].update(tolerance=5),
            "report.options.tolerance must be an object or null, not a number",
        ),
        (
            lambda r: r["options"].update(tolerance={"rtol": "x", "atol": 0}),
            "report.options.tolerance.rtol must be a non-negative number or null, not a string",
        ),
        (
            lambda r: r["options"]["tolerance"].update(per_output={"loss": 5}),
            "report.options.tolerance.per_output['loss'] must be a list of two numbers, not a "
            "number",
        ),
    ],
)
def test_damaged_recorded_options_are_a_damaged_artifact(compared, tmp_path, edit, message, capsys):
    # compare judges the runs with the recording's options: these were tracebacks (TypeError:
    # '>=' not supported between instances of 'str' and 'int', 'int' object is not iterable)
    assert main(["compare", str(compared), str(compared)]) == 0
    capsys.readouterr()
    bad = edited(compared, tmp_path / "options.nwrun.zip", lambda m: edit(m["report"]))
    assert main(["compare", str(compared), str(bad)]) == 2
    assert capsys.readouterr() == ("", f"neuron-workbench: error: {bad}: {message}\n")


def test_a_damaged_profile_table_is_a_damaged_artifact(compared, tmp_path, capsys):
    # compare --html crashed on rows of 5 (the profile's tables are untyped in the schema)
    html = tmp_path / "r.html"
    assert main(["compare", str(compared), str(compared), "--html", str(html)]) == 0
    assert "Op profile" in html.read_text()
    capsys.readouterr()
    html.unlink()

    def edit(manifest):
        manifest["runs"]["target"]["extras"]["profile"]["rows"] = 5

    bad = edited(compared, tmp_path / "profile.nwrun.zip", edit)
    assert main(["compare", str(compared), str(bad), "--html", str(html)]) == 2
    assert capsys.readouterr() == (
        "",
        f"neuron-workbench: error: {bad}: runs.target.extras.profile.rows must be a list of "
        "objects or null, not a number\n",
    )
    assert not html.exists()


def test_an_int_too_large_to_record_is_reported_not_compared(tmp_path, monkeypatch, capsys):
    # recording n = 10**5000 crashed in json.dumps; now it is written with the reason and
    # compare names the output as not compared
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.py").write_text("n = 10**5000\nm = 2\n")
    for backend in ("cpu", "neuron"):
        assert main(["record", "big.py", "--backend", backend, "-o", f"{backend}.nwrun.zip"]) == 0
    capsys.readouterr()
    args = ["compare", "cpu.nwrun.zip", "neuron.nwrun.zip", "--json", "r.json", "--html", "r.html"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out == (
        "PASS neuron (emulated) vs cpu (as cuda) — 1 output, 1 match; 1 not compared\n"
    )
    outputs = {
        each["path"]: each for each in json.loads((tmp_path / "r.json").read_text())["outputs"]
    }
    assert outputs["n"]["status"] == "not-compared"
    assert outputs["n"]["detail"] == "both runs: an int of more than 4300 digits is not recorded"
    assert report_errors(tmp_path / "r.json") == []
