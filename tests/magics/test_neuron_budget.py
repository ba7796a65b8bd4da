"""%%neuron --judge: the precision budget as users meet it, on the default (worker) path."""

import json

import pytest
from IPython.core.error import UsageError

from neuron_workbench.report import read_report
from neuron_workbench.testing import run_cell

SETUP = (
    "import torch\ntorch.manual_seed(0)\nx = torch.randn(64, 256)\nw = torch.randn(256, 128) / 16"
)
MATMUL = "h = x.cuda() @ w.cuda()\np = torch.softmax(h, dim=-1)\nloss = p.pow(2).sum()"
#: A target-only bug, chosen by a device check: the accelerator path normalises over the batch.
SOFTMAX_BUG = (
    "h = x.cuda() @ w.cuda()\n"
    "p = torch.softmax(h, dim=0 if h.device.type != 'cpu' else -1)\n"
    "loss = p.pow(2).sum()"
)
LAYER_NORM_BUG = (
    "h = x.cuda() @ w.cuda()\n"
    "p = torch.nn.functional.layer_norm(h, (128,), eps=1e-2 if h.device.type != 'cpu' else 1e-5)\n"
    "loss = p.pow(2).sum()"
)


@pytest.fixture
def fresh_tpu(ip):
    """A tpu worker at its default matmul precision.

    A cell's ``torch.set_float32_matmul_precision`` lasts in its worker, as in a kernel. A worker
    that ran no cell since it started (the one the last test's teardown started) is kept.
    """
    workers = ip.magics_manager.registry["NeuronMagics"].session.workers
    tpu = workers.get("tpu")
    if not (tpu.alive and tpu.cells_run == 0):
        workers.restart("tpu")
    yield
    workers.restart("tpu")


def _run(ip, flags, body):
    run_cell(ip, SETUP)
    run_cell(ip, f"%%neuron {flags} -o r\n{body}")
    return ip.user_ns["r"]


@pytest.mark.parametrize("judge", ["tolerance", "budget"])
@pytest.mark.parametrize("bug", [SOFTMAX_BUG, LAYER_NORM_BUG], ids=["softmax-dim", "ln-eps"])
def test_a_target_only_bug_fails_under_both_judges_with_a_large_r(ip, judge, bug):
    report = _run(ip, f"--target neuron --judge {judge}", bug)
    assert report.verdict == "FAIL", report.summary()
    p = report.budget.get("p")
    assert p.ratio > 10 and not p.within
    if judge == "budget":
        assert "p: target " in report.summary() and "x less accurate than the reference" in (
            report.summary()
        )
    else:  # the line is the tolerance's; R is in the data and the HTML
        assert "less accurate" not in report.summary()
        assert report.to_dict()["budget"]["outputs"][0]["path"] in ("p", "h")
        assert f'<td class="num">{p.ratio:.3g}</td>' in report._repr_html_()


def test_emulated_neuron_float32_is_as_accurate_as_the_reference(ip):
    report = _run(ip, "--target neuron --judge budget", MATMUL)
    assert report.verdict == "PASS", report.summary()
    assert {o.path for o in report.budget.outputs} == {"h", "p", "loss"}
    assert all(o.ratio <= 1.2 for o in report.budget.outputs)
    assert report.summary().startswith(
        "PASS neuron (emulated) vs cpu (as cuda) — within precision budget (worst R 1.0 at "
    )


def test_an_amp_training_step_with_a_grad_scaler_is_measured_against_the_oracle(ip):
    # The oracle raised "inv_scale must be a float tensor" at scaler.step: the budget of every AMP
    # cell fell back to random rounding (worst R 0.0), with the oracle's error as its note.
    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(16, 4)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.randn(8, 16)",
    )
    run_cell(
        ip,
        "%%neuron --judge budget -o r\nmodel.cuda()\nscaler = torch.amp.GradScaler('cuda')\n"
        "with torch.autocast('cuda', dtype=torch.float16):\n"
        "    loss = model(x.cuda()).square().mean()\n"
        "scaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert report.budget.oracle_error == ""
    assert {o.source for o in report.budget.outputs} == {"float64 oracle"}
    assert "within precision budget (worst R 1.0 at" in report.summary()


def test_tpu_float32_fails_by_its_factor_and_passes_at_highest_precision(ip, fresh_tpu):
    report = _run(ip, "--target tpu --judge budget", MATMUL)
    assert report.verdict == "FAIL", report.summary()
    assert "x less accurate than the reference (TPU 1-pass bf16 matmuls)" in report.summary()
    assert report.budget.get("h").ratio > 10
    highest = "torch.set_float32_matmul_precision('highest')\n" + MATMUL
    report = _run(ip, "--target tpu --judge budget", highest)
    assert report.verdict == "PASS", report.summary()
    assert "within precision budget" in report.summary()


def test_under_tolerance_the_oracle_runs_only_when_an_output_failed(ip, fresh_tpu):
    report = _run(ip, "--target neuron", MATMUL)
    assert report.verdict == "PASS" and report.budget is None
    report = _run(ip, "--target tpu", MATMUL)
    assert report.verdict == "FAIL"
    assert {o.path for o in report.budget.outputs} == {d.path for d in report.comparison.failures}
    data = report.to_dict()
    assert data["schema_version"] == 3 and read_report(json.loads(json.dumps(data))) == data
    assert data["budget"]["tolerances"][0].startswith("# --tol 'h=")  # beyond budget: a comment
    assert "Precision budget" in report._repr_html_()


def test_judge_is_a_config_setting_and_bad_values_are_one_line(ip, fresh_tpu):
    run_cell(ip, "%config NeuronMagics.judge = 'budget'")
    report = _run(ip, "--target tpu", MATMUL)
    assert report.options["judge"] == "budget" and report.verdict == "FAIL"
    run_cell(ip, "%config NeuronMagics.judge = 'tolerance'")
    with pytest.raises(UsageError, match="judge"):
        ip.run_cell_magic("neuron", "--judge strict", "y = 1")


def test_several_targets_share_one_oracle_run(ip, fresh_tpu, monkeypatch):
    from neuron_workbench.compare import budget as budget_module

    reruns = []
    original = budget_module.rerun

    def counted(spec, backend, instrument):
        reruns.append(backend.name)
        return original(spec, backend, instrument)

    monkeypatch.setattr(budget_module, "rerun", counted)
    run_cell(ip, SETUP)
    run_cell(ip, f"%%neuron --target neuron,tpu --judge budget -o both\n{MATMUL}")
    neuron, tpu = ip.user_ns["both"]
    assert (neuron.verdict, tpu.verdict) == ("PASS", "FAIL")
    assert reruns == ["cpu"]  # one float64 oracle run for both targets
    assert neuron.budget.get("h").floor == tpu.budget.get("h").floor


def test_a_bug_bf16_autocast_tolerances_hide_fails_within_the_budget(ip):
    # a 0.4% scaling only the device path applies: inside bfloat16's tolerance, not its budget
    body = (
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "    h = x.cuda() @ w.cuda()\n"
        "loss = (h.float() * (1.004 if h.device.type != 'cpu' else 1.0)).softmax(-1).pow(2).sum()"
    )
    assert _run(ip, "--target neuron", body).verdict == "PASS"
    report = _run(ip, "--target neuron --judge budget", body)
    assert report.verdict == "FAIL", report.summary()
    assert report.budget.get("h").within and report.budget.get("loss").ratio > 5
    assert "loss: target " in report.summary()


def test_loose_tolerances_do_not_hide_the_tpu_factor_or_its_cause(ip, fresh_tpu):
    report = _run(ip, "--target tpu --judge budget --rtol 0.1 --atol 0.1", MATMUL)
    assert report.comparison.passed  # every output is within the loose tolerances
    assert report.verdict == "FAIL"
    assert "x less accurate than the reference (TPU 1-pass bf16 matmuls)" in report.summary()


def test_outputs_beyond_budget_are_shown_as_failing_not_as_matching(ip, fresh_tpu):
    # Under --judge budget an output within its tolerance but beyond budget fails the verdict,
    # and the summary says "0 match, 3 differ"; yet the report data said status "match" for
    # each, and the HTML listed them under "3 matching outputs" below a FAIL badge.
    from importlib import resources

    import jsonschema

    from neuron_workbench.views.tables import numerics_html, summary_html

    report = _run(ip, "--target tpu --judge budget --rtol 0.1 --atol 0.1", MATMUL)
    assert report.verdict == "FAIL" and report.comparison.passed, report.summary()
    assert ", 0 match, 3 differ: " in report.summary()
    data = report.to_dict()
    judged = {o["path"]: (o["status"], o.get("budget_judged")) for o in data["outputs"]}
    assert judged == {p: ("match", "beyond") for p in ("h", "p", "loss")}, judged
    schema = resources.files("neuron_workbench.report").joinpath("report.schema.json")
    jsonschema.Draft202012Validator(json.loads(schema.read_text())).validate(data)
    html = report._repr_html_()
    assert "matching output" not in html
    assert '<span class="bad">beyond budget (tolerance: match)</span>' in html
    assert '<span class="bad">beyond budget (tolerance: match)</span>' in numerics_html(data)
    assert "precision budget: 3 beyond, 0 within" in summary_html(data)
    # under the tolerance judge nothing changes: the outputs match, and show so
    report = _run(ip, "--target neuron", MATMUL)
    assert report.verdict == "PASS"
    assert not any("budget_judged" in o for o in report.to_dict()["outputs"])


def test_a_cell_that_sets_high_precision_gets_no_one_pass_hint(ip, fresh_tpu):
    """The worker starts the cell at DEFAULT; the cell's own 'high' is what its matmul ran at."""
    high = "torch.set_float32_matmul_precision('high')\n" + MATMUL
    report = _run(ip, "--target tpu --judge budget", high)
    assert report.budget.get("h").ratio < 1, report.summary()
    hints = [h for d in report.comparison.failures for h in d.hints]
    assert not any("1-pass" in h for h in hints), hints
    assert "1-pass" not in report.summary()


def test_a_target_more_accurate_than_a_tf32_reference_shows_its_small_r(ip, fresh_tpu):
    """3-pass bf16 beats the reference's TF32 by far: its R is written, not rounded to 0.0."""
    report = _run(
        ip, "--target tpu --judge budget", "torch.set_float32_matmul_precision('high')\n" + MATMUL
    )
    ratio = report.budget.get("h").ratio
    assert 0 < ratio < 0.1 and report.verdict == "PASS", report.summary()
    assert f"within precision budget (worst R {ratio:.2g} at h)" in report.summary()
    assert not report.summary().count("worst R 0.0 ") and "R 0.0 at" not in report.summary()


def test_a_float64_output_on_neuron_names_its_cause_in_the_summary(ip):
    """float64 computed as float32 is a documented rule: the summary says so beside its R."""
    cell = "s = torch.logsumexp(x.double().cuda() @ w.double().cuda(), -1)"
    report = _run(ip, "--target neuron --judge budget", cell)
    assert report.verdict == "FAIL" and report.budget.get("s").ratio > 1e6, report.summary()
    assert report.summary().endswith(
        "x less accurate than the reference (float64 computed as float32)"
    ), report.summary()


def test_a_failing_cell_logs_each_message_once(ip, tmp_path):
    # The oracle reruns a failing cell in the kernel: its prints were discarded, but the
    # notebook's log handlers wrote each message a second time (in the log file, and under the
    # cell: a handler holds the stream it was made on, not the run's capture)
    import logging

    path = tmp_path / "train.log"
    run_cell(
        ip,
        "import io, logging, torch\n"
        "log = logging.getLogger('wbtest.oracle')\n"
        "log.setLevel(logging.INFO)\n"
        "log.propagate = False\n"
        "shown = io.StringIO()\n"
        "log.addHandler(logging.StreamHandler(shown))\n"
        f"log.addHandler(logging.FileHandler({str(path)!r}))",
    )
    try:
        run_cell(
            ip,
            "%%neuron -o r\n"
            "x = torch.randn(1000, dtype=torch.float64, device='cuda').mul(1e3).cumsum(0)\n"
            "log.info('sum %.4f', x.sum())",
        )
        report = ip.user_ns["r"]
        assert report.verdict == "FAIL", report.summary()
        assert report.budget.oracle_error == ""  # the oracle ran
        (line,) = ip.user_ns["shown"].getvalue().splitlines()
        assert path.read_text().splitlines() == [line]
    finally:
        logger = logging.getLogger("wbtest.oracle")
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()


def test_a_rounding_level_failure_is_hinted_as_rounding_not_an_unknown_cause(ip):
    # A tolerance tighter than the computation's own rounding (bitwise here; Wav2Vec2's CTC loss
    # summed over frames did it at assert_close's float32 rtol) failed gradients that differ in
    # the last bits, each hinted "cause not identified ... run with --layers", though the oracle
    # measured the target as accurate as the reference: a user went looking for a bug.
    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\nsignal = torch.randn(4, 8, 200)\n"
        "conv = torch.nn.Conv1d(8, 16, 9)\nnorm = torch.nn.GroupNorm(4, 16)",
    )
    run_cell(
        ip,
        "%%neuron --preset strict -o r\n"
        "y = norm.cuda()(conv.cuda()(signal.cuda()))\ny.sum().backward()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()  # the tolerance judge still judges
    failures = report.comparison.failures
    assert failures and all(report.budget.get(d.path).within for d in failures)
    for diff in failures:
        assert diff.hints == [
            f"rounding: against a float64 oracle the target is as accurate as the reference "
            f"(R {report.budget.get(diff.path).factor}); the tolerance is tighter than this "
            "computation's own rounding (--judge budget judges float outputs by R)"
        ], diff.hints
    # --judge budget passes them, and the HTML's "Likely causes" said "cause not identified ...
    # run with --layers" for each all the same
    run_cell(
        ip,
        "%%neuron --preset strict --judge budget -o r\n"
        "y = norm.cuda()(conv.cuda()(signal.cuda()))\ny.sum().backward()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    failures = report.comparison.failures
    assert failures and all(report.budget.get(d.path).within for d in failures)
    for diff in failures:
        assert len(diff.hints) == 1 and diff.hints[0].startswith("rounding: "), diff.hints
    assert "cause not identified" not in report._repr_html_()


def test_a_suggested_tol_line_pasted_into_the_magic_passes_the_output(ip):
    # The report's "Tolerances that would pass" lines are quoted for a shell (--tol 'y=...'),
    # and the magic's line keeps quotes: pasted as shown, each stopped the cell with
    # "--tol expects numbers in PATH=RTOL,ATOL, got "'y=1.3e-06,...'"". A path holding quotes
    # (out['z']) was single-quoted too, which a shell splits.
    import shlex

    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\nsignal = torch.randn(4, 8, 200)\n"
        "conv = torch.nn.Conv1d(8, 16, 9)\nnorm = torch.nn.GroupNorm(4, 16)",
    )
    body = "y = norm.cuda()(conv.cuda()(signal.cuda()))\nout = {'z': y.exp()}"
    run_cell(ip, f"%%neuron --preset strict -o r\n{body}")
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    lines = sorted(report.budget.tolerances)
    assert [line.split("=")[0] for line in lines] == ["--tol \"out['z']", "--tol 'y"], lines
    for line in lines:  # a shell reads each path whole
        flag, value = shlex.split(line)
        assert value.split("=")[0] in ("y", "out['z']")
    run_cell(ip, f"%%neuron --preset strict {' '.join(lines)} -o r\n{body}")
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
    double_quoted = lines[1].replace("'", '"')
    run_cell(ip, f"%%neuron --preset strict {lines[0]} {double_quoted} -o r\n{body}")
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()


def test_integer_outputs_that_changed_get_no_tolerance_that_would_pass_them(ip):
    # ids wrapped around on neuron (int64 computed as int32; the hint says so), yet the report
    # listed "--tol 'ids=2.9e+00,0.0e+00'" among the "Tolerances that would pass": an integer
    # has no rounding, a tolerance only hides the changed values.
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron --target neuron -o r\n"
        "ids = torch.arange(10, device='cuda') * 1_000_000_000\n"
        "bucket = ids % 1000\n"
        "share = bucket.float() / 1000",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    lines = {line.split("'")[1].split("=")[0]: line for line in report.budget.tolerances}
    for name in ("ids", "bucket"):
        assert lines[name].startswith(f"# --tol '{name}="), lines
        assert "integer values that changed, not rounding" in lines[name]
    assert "beyond budget" in lines["share"]  # a float taken from them: measured by its R
    html = report._repr_html_()  # the precision budget's section lists every line
    assert "integer values that changed, not rounding" in html


#: An evaluation loop that only prints its loss: the cell binds no floating output.
PRINTED_LOSS = (
    "with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):\n"
    "    for _ in range(3):\n"
    "        h = x.cuda() @ w.cuda()\n"
    "        val = (h.float() * SCALE).softmax(-1).pow(2).sum()\n"
    "        print(f'val loss {val.item():.6f}')\n"
    "del h, val, _"
)


def test_a_printed_loss_within_tolerance_but_beyond_budget_fails_the_budget_judge(ip):
    # A 0.4% scaling only the device path applies, on a loss the loop only prints: within the
    # bfloat16 tolerance its scalars were compared with, and with no floating output bound the
    # oracle never ran, so --judge budget said "PASS ... 1 scalar site match"
    bug = PRINTED_LOSS.replace("SCALE", "(1.004 if h.device.type != 'cpu' else 1.0)")
    report = _run(ip, "--target neuron --judge budget", bug)
    assert report.verdict == "FAIL", report.summary()
    first = report.scalars.first
    assert first is not None and first.ratio > 5 and first.budget_label == "less accurate"
    assert report.summary().endswith(f"(R {first.ratio:.3g}, less accurate)"), report.summary()
    # the tolerance judge keeps its own verdict, and the same loop without the bug passes
    assert _run(ip, "--target neuron", bug).verdict == "PASS"
    report = _run(ip, "--target neuron --judge budget", PRINTED_LOSS.replace("SCALE", "1.0"))
    assert report.verdict == "PASS", report.summary()


def test_a_printed_loss_that_differs_by_rounding_passes_the_budget_judge(ip):
    # a bitwise tolerance, and a convolution whose last bits differ: with no floating output
    # bound the oracle never ran, so the printed value failed its tolerance under either judge
    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\nsignal = torch.randn(4, 8, 200)\n"
        "conv = torch.nn.Conv1d(8, 16, 9)\nnorm = torch.nn.GroupNorm(4, 16)",
    )
    body = "y = norm.cuda()(conv.cuda()(signal.cuda()))\nprint(f'{y.max().item():.9f}')\ndel y"
    run_cell(ip, f"%%neuron --preset strict -o r\n{body}")
    assert ip.user_ns["r"].verdict == "FAIL", ip.user_ns["r"].summary()
    run_cell(ip, f"%%neuron --preset strict --judge budget -o r\n{body}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert report.scalars.sites[0].within_budget == 1


def test_a_numpy_output_is_judged_by_its_budget_as_a_tensor_is(ip):
    # NumPy arrays had no budget: judged by their tolerance alone under --judge budget, a
    # target-only layer_norm eps within float32's tolerance passed, and a difference in the last
    # bits failed a bitwise tolerance that the same values as a tensor passed
    bug = (
        "h = x.cuda() @ w.cuda()\n"
        "z = torch.nn.functional.layer_norm(h, (128,), eps=1e-5 if h.device.type == 'cpu' "
        "else 1.3e-5)\n"
        "emb = z.cpu().numpy()\n"
        "del h, z"
    )
    assert _run(ip, "--target neuron", bug).verdict == "PASS"  # within float32's tolerance
    report = _run(ip, "--target neuron --judge budget", bug)
    assert report.verdict == "FAIL", report.summary()
    emb = report.budget.get("emb")
    assert emb is not None and emb.ratio > 3 and not emb.within
    assert "emb: target " in report.summary()
    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\nsignal = torch.randn(4, 8, 200)\n"
        "conv = torch.nn.Conv1d(8, 16, 9)\nnorm = torch.nn.GroupNorm(4, 16)",
    )
    run_cell(
        ip,
        "%%neuron --preset strict --judge budget -o r\n"
        "y = norm.cuda()(conv.cuda()(signal.cuda())).detach()\n"
        "out = y.cpu().numpy()\n"
        "del y",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert report.budget.get("out").within and not report.comparison.passed


@pytest.mark.parametrize("fill", ["float('inf')", "float('nan')"])
def test_a_mask_filled_with_another_non_finite_value_on_the_target_is_beyond_budget(ip, fill):
    # The budget compared where each run was finite, not what it held there: a target filling an
    # attention mask with +inf (or NaN) where the reference fills -inf passed --judge budget
    # "within precision budget (worst R 1.0 at s)", and the tolerance judge's report said R 1.0
    run_cell(ip, "import torch\ntorch.manual_seed(0)\nq = torch.randn(4, 16, 16)")
    body = (
        "s = q.cuda().masked_fill(q.cuda() > 0.5, "
        f"float('-inf') if q.cuda().device.type == 'cpu' else {fill})"
    )
    for judge in ("budget", "tolerance"):
        run_cell(ip, f"%%neuron --target neuron --judge {judge} -o r\n{body}")
        report = ip.user_ns["r"]
        assert report.verdict == "FAIL", report.summary()
        assert not report.budget.get("s").within
        assert not any(h.startswith("rounding: ") for h in report.comparison.failures[0].hints)
    assert (
        report.budget.get("s").describe()
        == "s: target's NaN or Inf differ from the reference's (R inf)"
    )
    # the same -inf on both runs is no difference
    run_cell(
        ip,
        "%%neuron --target neuron --judge budget -o r\ns = q.cuda().masked_fill(q.cuda() > 0.5, float('-inf'))",
    )
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()


def test_printed_tolist_values_beyond_budget_fail_the_budget_judge(ip):
    # A .tolist() of a few numbers was judged by its tolerance alone, even under --judge budget:
    # the same 0.4% target-only scaling as a printed loss passed "1 scalar site match"
    body = (
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "    h = x.cuda() @ w.cuda()\n"
        "p = (h.float() * SCALE).softmax(-1).pow(2).sum(-1)\n"
        "print(p[:4].tolist())\n"
        "del h, p"
    )
    bug = body.replace("SCALE", "(1.004 if h.device.type != 'cpu' else 1.0)")
    assert _run(ip, "--target neuron", bug).verdict == "PASS"  # within bfloat16's tolerance
    report = _run(ip, "--target neuron --judge budget", bug)
    assert report.verdict == "FAIL", report.summary()
    assert report.scalars.sites[0].how == "Tensor.tolist" and report.scalars.parted
    report = _run(ip, "--target neuron --judge budget", body.replace("SCALE", "1.0"))
    assert report.verdict == "PASS", report.summary()
    # a .tolist() whose last bits differ (a convolution's) is within budget
    run_cell(
        ip,
        "torch.manual_seed(0)\nsignal = torch.randn(4, 8, 200)\n"
        "conv = torch.nn.Conv1d(8, 16, 9)\nnorm = torch.nn.GroupNorm(4, 16)",
    )
    run_cell(
        ip,
        "%%neuron --preset strict --judge budget -o r\n"
        "y = norm.cuda()(conv.cuda()(signal.cuda()))\n"
        "print(y.amax(-1)[0, :8].tolist())\n"
        "del y",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert report.scalars.sites[0].within_budget == 1, report.scalars.to_dict()
