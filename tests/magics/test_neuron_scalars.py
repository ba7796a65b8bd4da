"""%%neuron records every scalar a cell's training loop logs, on both runs, and compares the curves.

Through the default path (the target in its worker): ``loss.item()`` per step is the loss curve;
an optimizer's own ``.item()`` calls and the workbench's ``--steps`` reads are not the user's and
stay out; the curves match on neuron and part on tpu, where the report names the first step and
why; the JupyterLab view (the extension's chart builder, run by Node.js) draws the pair.
"""

import pytest
from IPython.core.error import UsageError

from neuron_workbench.testing import run_cell
from neuron_workbench.views import scalar_figures

SETUP = (
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
    "x, y = torch.randn(64, 8), torch.randn(64, 1)\n"
    "def accuracy(out, y):\n"
    "    return float(((out > 0) == (y > 0)).float().mean())"
)
LOOP = (
    "model.cuda()\n"
    "opt = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
    "losses = []\n"
    "for step in range(10):\n"
    "    out = model(x.cuda())\n"
    "    loss = torch.nn.functional.mse_loss(out, y.cuda())\n"
    "    opt.zero_grad(); loss.backward(); opt.step()\n"
    "    losses.append(loss.item())\n"
    "    acc = accuracy(out, y.cuda())"
)


def _sites(report):
    return {s.site: s for s in report.scalars.sites}


def test_a_training_loop_cell_has_its_loss_curve_pair(ip, run_charts_js):
    run_cell(ip, SETUP)
    run_cell(ip, "%%neuron --target neuron -o r\n" + LOOP)
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    sites = _sites(report)
    # the cell's loss.item() (cell line 8 under the %%neuron line) and float() in the notebook's
    # own function; Adam's step.item() calls are torch's, not the user's
    assert len(sites) == 2, list(sites)
    loss_site, acc_site = list(sites.values())
    assert (loss_site.how, loss_site.dtype) == ("Tensor.item", "float32")
    assert (acc_site.how, acc_site.dtype) == ("float", "float32")
    assert len(loss_site.ref) == len(loss_site.target) == 10
    assert loss_site.ref == pytest.approx(ip.user_ns["losses"])
    assert loss_site.matched and report.scalars.first is None
    data = report.to_dict()
    assert data["scalars"]["sites"][0]["ref"] == loss_site.ref
    specs = scalar_figures.scalar_curves_specs(data)
    assert [len(trace["y"]) for trace in specs[0]["data"][:2]] == [10, 10]
    assert specs[0]["layout"]["title"]["text"].endswith(": match")

    figure = run_charts_js("const out = charts.CHARTS.scalars(report);", data)
    ref, target, diff = figure["data"][:3]
    assert ref["y"] == loss_site.ref and target["y"] == loss_site.target
    assert ref["name"] == "cpu (as cuda)" and target["name"].startswith("neuron")
    assert diff["y"] == [0] * 10
    assert figure["layout"]["title"]["text"].startswith(f"Observed scalars at {loss_site.site}")


def test_on_tpu_the_curves_part_and_the_report_names_the_first_step(ip):
    run_cell(ip, SETUP)
    run_cell(ip, "%%neuron --target tpu -o r\n" + LOOP)
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL"
    first = report.scalars.first
    loss_site = list(_sites(report).values())[0]
    assert (first.site, first.occurrence) == (loss_site.site, 1)
    assert first.ref == loss_site.ref[0] and first.target == loss_site.target[0]
    assert first.ref != first.target
    assert any(h.startswith("TPU fp32 matmuls default to 1-pass bfloat16") for h in first.hints)
    assert f"scalars part at {loss_site.site} #1: " in report.summary()
    html = report._repr_html_()
    assert "First divergence" in html and "part at #1" in html


def test_steps_reads_and_torch_internal_conversions_are_not_recorded(ip):
    run_cell(ip, SETUP)
    # --steps reads the bound loss with float() after each repetition: the workbench's, not the
    # cell's; clip_grad_norm_ and Adam's internals are torch's
    run_cell(
        ip,
        "%%neuron --steps 3 -o r\n"
        "model.cuda()\n"
        "out = model(x.cuda())\n"
        "loss = torch.nn.functional.mse_loss(out, y.cuda())\n"
        "loss.backward()\n"
        "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    )
    report = ip.user_ns["r"]
    assert report.scalars is None or not report.scalars.sites, report.scalars
    assert report.verdict == "PASS", report.summary()


def test_max_steps_compares_the_first_steps_of_a_long_loop(ip):
    run_cell(ip, SETUP)
    run_cell(ip, "%%neuron --target neuron --max-steps 4 -o r\n" + LOOP.replace("10", "1000"))
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    loss_site = list(_sites(report).values())[0]
    assert len(loss_site.ref) == len(loss_site.target) == 4
    assert len(ip.user_ns["losses"]) == 4  # the kept run stopped there too
    assert report.to_dict()["options"]["max_steps"] == 4
    with pytest.raises(UsageError, match="--max-steps must be at least 1"):
        ip.run_cell_magic("neuron", "--max-steps 0", "y = 1")


@pytest.mark.parametrize(
    ("logged", "why"),
    [
        ("", "the cell made no scalar from a tensor"),
        ("    print(loss.item())\n", "its first scalar's call site (cell:9) made 3, fewer than 5"),
    ],
    ids=["nothing-logged", "shorter-loop"],
)
def test_max_steps_that_stopped_nothing_says_so(ip, logged, why):
    # A DataLoader loop that logged no loss ran to its end under --max-steps 2 with no word in the
    # report, and one shorter than its limit read "Both runs stopped after 5 steps" in the HTML.
    run_cell(ip, "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import *")
    run_cell(
        ip,
        "%%neuron --max-steps " + ("2" if not logged else "5") + " -o r\n"
        'device = torch.device("cuda")\n'
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "ds = TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))\n"
        "for xb, yb in DataLoader(ds, batch_size=4):\n"
        "    loss = F.cross_entropy(model(xb.to(device)), yb.to(device))\n"
        + logged
        + "    opt.zero_grad(); loss.backward(); opt.step()\n",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    limit = 2 if not logged else 5
    assert f"--max-steps {limit} did not stop the runs: {why}" in "\n".join(report.notes)
    assert "Both runs stopped" not in report._repr_html_()


def test_under_the_budget_judge_the_first_divergence_gets_its_error_ratio(ip):
    run_cell(ip, SETUP)
    run_cell(ip, "%%neuron --target tpu --judge budget -o r\n" + LOOP)
    report = ip.user_ns["r"]
    first = report.scalars.first
    # the float64 oracle's run recorded the same sites: the target is further from it than the
    # reference, by its 1-pass bfloat16 matmuls
    assert first.oracle is not None and abs(first.oracle - first.ref) < abs(
        first.oracle - first.target
    )
    assert first.ratio > 2 and first.budget_label == "less accurate"
    assert report.summary().endswith(
        f"(TPU 1-pass bf16 matmuls; R {first.ratio:.3g}, less accurate)"
    )
    assert "Precision budget there: R " in report._repr_html_()


@pytest.fixture
def train_loggers():
    """The ``wbtest.*`` loggers a test sets up in this process (the kernel), at defaults after it."""
    import logging

    yield
    for name in ("wbtest.train", "wbtest.cell"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def test_a_value_logged_through_logging_set_up_in_the_notebook_is_recorded_on_both_runs(
    ip, train_loggers, capsys
):
    # logging set up in a plain cell is the kernel's: the worker, at Python's defaults (WARNING),
    # never formatted the message, and the cell FAILed with "scalars part at cell:3 #1: 0.5 vs none"
    run_cell(
        ip,
        "import logging, sys, torch\n"
        "log = logging.getLogger('wbtest.train')\n"
        "log.setLevel(logging.INFO)\n"
        "log.addHandler(logging.StreamHandler(sys.stderr))\n"
        "log.propagate = False",
    )
    run_cell(
        ip,
        "%%neuron -o r\n"
        "loss = torch.tensor(0.25, device='cuda') * 2\n"
        "log.info('loss %.4f', loss)\n"
        "log.debug('below the level %.4f', loss * 5)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    (site,) = report.scalars.sites
    assert (site.site, site.ref, site.target, site.matched) == ("cell:3", [0.5], [0.5], True)
    assert report.target.stderr == "loss 0.5000\n"  # written by the run, where its prints go
    # a handler a %%neuron cell adds stays in the kernel (the kept run's): the worker's own,
    # added by its run, goes, or every later message was formatted (and recorded) twice there;
    # the kernel's wrote every later message into the run's capture of stdout, unseen
    cell = (
        "%%neuron -o r\n"
        "cell_log = logging.getLogger('wbtest.cell')\n"
        "cell_log.setLevel(logging.INFO)\n"
        "cell_log.addHandler(logging.StreamHandler(sys.stdout))\n"
        "cell_log.propagate = False\n"
        "cell_log.info('step %.1f', torch.ones((), device='cuda'))"
    )
    run_cell(ip, cell)
    # and the kernel's handler writes where plain cells write, not into the run's capture
    capsys.readouterr()
    run_cell(ip, "cell_log.info('in a plain cell')")
    assert capsys.readouterr().out == "in a plain cell\n"
    run_cell(ip, "%%neuron -o r\ncell_log.info('step %.1f', torch.ones((), device='cuda') * 2)")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    (site,) = report.scalars.sites
    assert (site.ref, site.target) == ([2.0], [2.0])
    assert report.target.stdout == "step 2.0\n"


def test_a_line_logged_through_the_notebooks_handler_shows_once_with_the_kept_target(
    ip, train_loggers, capsys
):
    # the kernel's handler holds the notebook's stream, not the reference run's capture: with
    # --keep target the reference's line went straight to the notebook, then the target's was
    # shown with its prints, and every line of the cell's training log came twice
    run_cell(
        ip,
        "import logging, sys, torch\n"
        "log = logging.getLogger('wbtest.train')\n"
        "log.setLevel(logging.INFO)\n"
        "log.addHandler(logging.StreamHandler(sys.stdout))\n"
        "log.propagate = False",
    )
    capsys.readouterr()
    run_cell(
        ip,
        "%%neuron -o r --keep target\n"
        "loss = torch.tensor(0.25, device='cuda') * 2\n"
        "print('before')\n"
        "log.info('loss %.4f on %s', loss, loss.device.type)\n"
        "print('after')",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    # the target's output alone, in the order it came; the reference's line is its run's record
    shown = capsys.readouterr().out
    assert shown.startswith("before\nloss 0.5000 on neuron\nafter\nPASS"), shown
    assert report.ref.stdout == "before\nloss 0.5000 on cpu\nafter\n"
    # between cells the handler writes where plain cells write again
    run_cell(ip, "log.info('in a plain cell')")
    assert capsys.readouterr().out == "in a plain cell\n"
