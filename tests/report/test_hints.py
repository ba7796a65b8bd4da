"""Hints come from evidence: each one is backed by what the two runs recorded, or none is given."""

from pathlib import Path

import pytest

from neuron_workbench.report.hints import CAUSE_NOT_IDENTIFIED, hints_for
from neuron_workbench.testing import run_cell

# 1e-8 survives `1 + x - 1` in float64 but not in float32 (which emulated neuron computes float64
# as): the gradient differs by 1e-8, far inside float32's atol, yet AdamW's first step divides it
# by |grad| + eps = 2e-8, so the weight moves by lr/2 on the reference and not at all on the target.
AMPLIFIED_STEP = """
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(64, device="cuda"))
opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.0)
x = torch.randn(64, device="cuda")
tiny = (torch.full((64,), 1e-8, device="cuda").double() + 1.0 - 1.0).float()
loss = (w * tiny).sum() + (w * x).sum() * 0
loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
"""


def _failures(ip, cell, flags=""):
    ip.run_cell(f"%%neuron -o r {flags}\n{cell}")
    report = ip.user_ns["r"]
    return report, {d.path: d for d in report.comparison.failures}


def test_optimizer_amplification_is_named_with_its_evidence(ip):
    run_cell(ip, "import torch")
    report, failures = _failures(ip, AMPLIFIED_STEP)
    # the weight differs beyond its tolerance, by exactly what AdamW's first step makes of
    # gradients that matched: judged by the gradients, it passes, and the report says why
    assert report.verdict == "PASS", report.summary()
    assert "1 within tolerance by their gradients (optimizer amplification)" in report.summary()
    weight = failures["w"]
    assert weight.status == "differ"
    assert "judged by the gradients" in weight.explained and "first step, exact" in weight.explained
    assert weight.explained in report.notes
    assert "differ</span> (judged by its gradients)" in report._repr_html_()
    joined = " | ".join(weight.hints)
    assert "optimizer amplification" in joined
    assert "gradients matched within tolerance at AdamW.step()" in joined
    assert "eps 1e-08" in joined
    # the random inputs were the same numbers on both runs: no RNG hint
    assert not any("random numbers drawn" in h for h in weight.hints)
    assert CAUSE_NOT_IDENTIFIED not in weight.hints


def test_a_gradient_that_already_differed_is_blamed_on_the_pass_not_the_optimizer(ip):
    run_cell(ip, "import torch")
    # 0.3 survives `+ 1e8 - 1e8` in float64, not in float32: the gradients differ by 0.3
    cell = AMPLIFIED_STEP.replace("1e-8, device", "0.3, device").replace(
        ".double() + 1.0 - 1.0", ".double() + 1e8 - 1e8"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    hints = " | ".join(failures["w"].hints)
    assert "the gradient already differed at AdamW.step()" in hints
    assert "optimizer amplification" not in hints


def test_random_numbers_that_differ_get_the_rng_hint(ip):
    # Each run seeds by where it runs, standing in for two devices' generators. The fingerprints
    # differ, so the hint is supported.
    run_cell(ip, "import torch")
    cell = (
        "torch.manual_seed(1 if torch.ones(1, device='cuda').device.type == 'cpu' else 2)\n"
        "noise = torch.randn(16, device='cuda')\nout = noise * 2"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    assert any("random numbers drawn on the device differed" in h for h in failures["out"].hints)


def test_matching_random_numbers_give_no_rng_hint_and_unknown_causes_say_so(ip):
    run_cell(ip, "import torch")
    # the draws match (same seed); a difference the workbench cannot explain says so
    cell = (
        "noise = torch.randn(8, device='cuda')\n"
        "out = noise + (0.5 if noise.device.type != 'cpu' else 0.0)"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    assert failures["out"].hints == [CAUSE_NOT_IDENTIFIED]


def test_autocast_outputs_use_the_lowest_precision_tolerance(ip):
    run_cell(ip, "import torch")
    report, _ = _failures(
        ip,
        "x = torch.randn(8, 8, device='cuda')\n"
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = (x @ x).float()\n"
        "z = x * 2",
    )
    assert report.verdict == "PASS", report.summary()
    tolerances = {d.path: d.tolerance for d in report.comparison.diffs}
    assert tolerances["y"].rtol == 1.6e-2
    assert tolerances["z"].rtol == 1.6e-2  # the floor applies to every floating output
    assert any("autocast (bfloat16) was active" in note for note in report.notes)
    report, _ = _failures(
        ip,
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "    y = torch.ones(2, device='cuda') @ torch.ones(2, device='cuda')",
        flags="--preset strict",
    )
    assert all(d.tolerance.rtol == 0.0 for d in report.comparison.diffs)


def test_an_autocast_reading_the_device_type_from_a_tensor_is_named_as_cpu_autocast(ip):
    # torch.autocast(device_type=x.device.type, dtype=torch.float16), as library code writes it:
    # on the cpu reference x.device.type is "cpu", so its CPU autocast cast the softmax and the sum
    # that CUDA's lists (and the target's) keep in float32. The hint blamed the backends' own lists
    # ("the two backends cast different ops"), where a GPU casts as the target did.
    run_cell(ip, "import torch\ntorch.manual_seed(0)\nx = torch.randn(4, 8)\nw = torch.randn(8, 8)")
    cell = (
        "t = x.cuda()\n"
        "with torch.autocast(device_type=t.device.type, dtype=torch.float16):\n"
        "    probs = (t @ w.cuda()).softmax(-1)\n"
        "    total = (t @ w.cuda()).sum()"
    )
    report, failures = _failures(ip, cell)
    assert set(failures) == {"probs", "total"}, report.summary()
    for diff in failures.values():
        assert (diff.ref_dtype, diff.target_dtype) == ("float16", "float32"), diff
        assert not any(h.startswith("autocast op lists differ") for h in diff.hints), diff.hints
        assert any("the cell entered CPU autocast" in h for h in diff.hints), diff.hints
    assert report.ref.facts.cpu_autocast and not report.target.facts.cpu_autocast
    # an autocast the cell names for cuda is CUDA's on the reference: no such fact
    report, failures = _failures(
        ip, cell.replace("device_type=t.device.type", 'device_type="cuda"')
    )
    assert report.verdict == "PASS", report.summary()
    assert not report.ref.facts.cpu_autocast


# A difference born on the target only (a device check picks another constant), in an int64 output.
DEVICE_ONLY_INT = (
    "idx = torch.arange(8, device='cuda')\nout = idx * (3 if idx.device.type != 'cpu' else 2)"
)


def test_an_int64_value_beyond_int32_gets_the_wrap_hint_with_its_evidence(ip):
    # 70000**2 is beyond int32's range: on neuron the product wrapped around.
    run_cell(ip, "import torch")
    cell = "x = torch.full((4,), 70000, device='cuda')\nout = x * x"
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    hint = next(h for h in failures["out"].hints if "int64 arithmetic runs as int32" in h)
    assert "wrapped values around in this run: 1 of 1 int64 op had a value beyond ±2^31" in hint
    assert CAUSE_NOT_IDENTIFIED not in failures["out"].hints


def test_an_int64_wrap_is_named_first_where_an_unrelated_float64_op_ran(ip):
    # The sum wraps in int32 on neuron; an unrelated float64 op ran in the same cell. The int
    # output's own dtype names the int64 rule: it comes first, and the summary names it, not
    # "float64 computed as float32".
    run_cell(ip, "import torch")
    cell = (
        "w = torch.rand(4, device='cuda', dtype=torch.float64) * 2\n"
        "total = torch.arange(100000, device='cuda').sum().item()"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    hints = failures["total"].hints
    assert hints[0].startswith("int64 arithmetic runs as int32 on neuron"), hints
    assert any(h.startswith("float64 is computed as float32 on neuron") for h in hints[1:])
    assert "(int64 computed as int32)" in report.summary(), report.summary()
    assert "float64 computed as float32" not in report.summary()


def test_a_float_output_picked_by_a_wrapped_index_gets_the_wrap_hint(ip):
    # Hashed ids (int64) pick embedding rows: on neuron the hash wrapped around in int32, so the
    # float32 rows differ. Its dtype is not int64, yet the counted wrap is the evidence: it said
    # "cause not identified" (as did a flag or a label picked with the wrapped value).
    run_cell(ip, "import torch")
    cell = (
        "h = torch.tensor([3_000_000_019, 7], device='cuda')\n"
        "bucket = (h * 31) % 1000\n"
        "emb = torch.nn.Embedding(1000, 4).cuda()\n"
        "vec = emb(bucket)\n"
        "low = bool(bucket[0] < 100)"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    for path, dtype in (("vec", "float32"), ("low", "bool")):
        diff = failures[path]
        assert diff.ref_dtype == dtype and CAUSE_NOT_IDENTIFIED not in diff.hints, diff.hints
        hint = next(h for h in diff.hints if h.startswith("int64 arithmetic runs as int32"))
        assert "wrapped values around in this run" in hint and "picked or computed" in hint


def test_an_int64_difference_where_nothing_wrapped_gets_no_wrap_hint(ip):
    # int64 ops ran as int32 on the target, but every value fit in int32: the difference has
    # another cause (here a device check), and the int64 rule is no explanation for it.
    run_cell(ip, "import torch")
    report, failures = _failures(ip, DEVICE_ONLY_INT)
    assert report.verdict == "FAIL"
    assert failures["out"].hints == [CAUSE_NOT_IDENTIFIED]
    rule_ops = report.target.facts.rule_ops
    assert rule_ops["int64"] >= 1 and rule_ops["int64-wrapped"] == 0  # the op class did run


def test_a_run_that_did_not_count_wraps_has_the_int64_ops_as_its_evidence(ip):
    # A recording made before wraps were counted has only the count of int64 ops, as before.
    run_cell(ip, "import torch")
    report, failures = _failures(ip, DEVICE_ONLY_INT)
    del report.target.facts.rule_ops["int64-wrapped"]
    hints = hints_for(failures["out"], report.ref, report.target)
    assert any("int64 op ran in this run): values beyond ±2^31 wrap around" in h for h in hints)


#: A diffusion noise schedule built in float64, then cast to float32.
NOISE_SCHEDULE = (
    "steps = torch.arange(1001, dtype=torch.float64, device='cuda') / 1000\n"
    "f = torch.cos((steps + 0.008) / 1.008 * math.pi / 2) ** 2\n"
    "abar = torch.cumprod(1 - torch.clip(1 - f[1:] / f[:-1], 0, 0.999), dim=0)\n"
    "sqrt_recip = torch.sqrt(1.0 / abar).float()"
)


def test_a_float32_output_taken_from_float64_values_gets_the_float64_hint(ip):
    # A diffusion noise schedule built in float64, then cast to float32: neuron computed the
    # float64 ops as float32, and the float32 output keeps that rounding. Its dtype is float32,
    # yet the counted float64 ops are the evidence: not "cause not identified".
    run_cell(ip, "import torch, math")
    report, failures = _failures(ip, NOISE_SCHEDULE)
    assert report.verdict == "FAIL"
    diff = failures["sqrt_recip"]
    assert diff.ref_dtype == diff.target_dtype == "float32"
    assert CAUSE_NOT_IDENTIFIED not in diff.hints
    hint = next(h for h in diff.hints if h.startswith("float64 is computed as float32 on neuron"))
    assert "float64 ops rounded a value float32 cannot hold in this run): a float32 output " in hint


def test_a_run_that_did_not_count_rounding_has_the_float64_ops_as_its_evidence(ip):
    # A recording made before float64 roundings were counted has only the count of float64 ops,
    # as before; a run where none rounded a value has no float64 evidence for a float32 output.
    run_cell(ip, "import torch, math")
    report, failures = _failures(ip, NOISE_SCHEDULE)
    diff = failures["sqrt_recip"]
    assert any(h.startswith("float64 is computed as float32 on neuron") for h in diff.hints)
    rule_ops = report.target.facts.rule_ops
    rule_ops["fp64-rounded"] = 0
    hints = hints_for(diff, report.ref, report.target)
    assert not any("float64" in h for h in hints), hints
    del rule_ops["fp64-rounded"]
    hints = hints_for(diff, report.ref, report.target)
    assert any("float64 ops ran in this run): a float32 output taken from" in h for h in hints)


def test_a_metric_formatted_from_float64_values_gets_the_float64_hint_for_a_text(ip):
    # An evaluation's log line formatted from a float64 metric: neuron computed it as float32, so
    # its digits differ. The text got the hint for "an integer output taken from float64 values
    # (argmax, comparisons, rounding)", which it is not.
    run_cell(ip, "import torch\nphase = torch.linspace(0, 1, 8, dtype=torch.float64)")
    cell = (
        "score = (phase.cuda() * 1e6).sin().max().item()\n"
        'line = f"best score {score:.6f}"\n'
        "best = int((phase.cuda() * 1e6).sin().argmax())"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    diff = failures["line"]
    assert diff.kind == "text", diff
    hint = next(h for h in diff.hints if h.startswith("float64 is computed as float32 on neuron"))
    assert "in this run): a text written from float64 values" in hint, hint
    assert "integer output" not in hint, hint


def test_a_failing_int_output_on_tpu_gets_no_matmul_hint(ip):
    run_cell(ip, "import torch\nw = torch.randn(4, 4)")
    # a float32 matmul ran too (the TPU rule's op class), but it did not make an int64 output
    report, failures = _failures(ip, "y = w.cuda() @ w.cuda()\n" + DEVICE_ONLY_INT, "--target tpu")
    assert report.verdict == "FAIL"
    assert failures["out"].hints == [CAUSE_NOT_IDENTIFIED]


def test_the_tpu_matmul_hint_needs_a_float32_matmul_in_the_run(ip):
    run_cell(ip, "import torch")
    cell = (
        "x = torch.linspace(0, 1, 8, device='cuda')\n"
        "out = x * (1.001 if x.device.type != 'cpu' else 1.0)"
    )
    report, failures = _failures(ip, cell, "--target tpu")
    assert report.verdict == "FAIL"
    assert failures["out"].hints == [CAUSE_NOT_IDENTIFIED]


def test_the_tpu_matmul_hint_shows_its_evidence(ip):
    run_cell(ip, "import torch\ntorch.manual_seed(0)\nw = torch.randn(64, 64)")
    report, failures = _failures(ip, "y = w.cuda() @ w.cuda()", "--target tpu")
    assert report.verdict == "FAIL"
    hint = next(h for h in failures["y"].hints if "1-pass bfloat16" in h)
    assert "1 float32 matmul/conv op ran in 1-pass bfloat16 in this run" in hint


def test_emulated_scatters_get_no_nondeterminism_hint(ip):
    # Both runs execute the same CPU scatter kernel in the same order: no ordering to blame.
    run_cell(ip, "import torch")
    cell = (
        "acc = torch.zeros(4, device='cuda')\n"
        "acc.index_add_(0, torch.tensor([0, 0, 1], device='cuda'), torch.ones(3, device='cuda'))\n"
        "out = acc * (1.5 if acc.device.type != 'cpu' else 1.0)"
    )
    report, failures = _failures(ip, cell)
    assert report.verdict == "FAIL"
    assert not any("accumulating scatters" in h for h in failures["out"].hints)


def test_a_library_op_without_an_autocast_wrapper_for_the_device_is_named(ip):
    # torchvision registers nms's autocast wrapper for CPU, CUDA and XPU only: under autocast on
    # another device its kernel receives mixed dtypes and refuses them.
    fixtures = str(Path(__file__).parent / "fixtures")
    run_cell(ip, "import torch")
    ip.run_cell(
        "%%neuron --target neuron -o r\n"
        f"import sys; sys.path.insert(0, {fixtures!r}); import library_ops\n"
        'boxes = torch.randn(3, 4, device="cuda")\n'
        'scores = torch.rand(3, device="cuda")\n'
        'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        '    kept = torch.ops.wbtest.pair_score(boxes @ torch.eye(4, device="cuda"), scores)\n'
    )
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    assert "boxes should have the same type as scores" in report.target.error.message
    note = next(n for n in report.notes if "autocast wrappers" in n)
    assert "wbtest::pair_score has autocast wrappers for cpu, cuda only, none for neuron" in note


@pytest.mark.parametrize(
    "body",
    [
        "z = x + torch.randn(4)",  # a CPU tensor in arithmetic
        "z = x.index_select(0, torch.tensor([0, 2]))",  # a CPU index to an op that wants it there
        "z = torch.nn.Linear(4, 2)(x.view(1, 4))",  # a model left on the CPU
        "z = x.numpy()",  # NumPy of a device tensor
        # lengths on the device: CUDA's kernel wants them on the CPU too
        "z = torch.nn.utils.rnn.pack_padded_sequence(\n"
        "    x.view(1, 4, 1), torch.tensor([4], device='cuda'), batch_first=True)",
    ],
)
def test_what_cuda_refuses_too_is_named_as_the_cells_mistake(ip, body):
    # CUDA refuses these too; the cpu reference holds everything on the CPU and ran them, so the
    # target's ERROR read as a porting problem of the target.
    run_cell(ip, "import torch")
    run_cell(ip, f"%%neuron -o r\nx = torch.randn(4, device='cuda')\n{body}")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    note = next(n for n in report.notes if ", as CUDA does;" in n)
    what = (
        "NumPy of a tensor on the device"
        if "numpy" in body
        else "pack_padded_sequence's lengths on the device"
        if "pack_padded" in body
        else "a CPU tensor next to one on"
    )
    assert note.startswith(f"neuron (emulated) error: the target refused {what}")


def test_a_float16_fft_the_cpu_reference_cannot_compute_is_named_as_the_references_limit(ip):
    # cuFFT computes a float16 FFT of a power-of-two size; the CPU standing in for cuda has no
    # float16 FFT, so both runs raised and the ERROR read as if CUDA refused the line too.
    run_cell(ip, "import torch")
    cell = "x = torch.randn(4, 256, device='cuda')\nR = torch.fft.rfft(x.half())"
    run_cell(ip, f"%%neuron -o r\n{cell}")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is not None, report.summary()
    note = next(n for n in report.notes if "float16 FFT" in n)
    assert note.startswith("cpu (as cuda) error: the CPU has no float16 FFT"), note


def test_a_float16_error_outside_an_fft_gets_no_fft_note(ip):
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\nx = torch.randn(4, device='cuda')\nraise RuntimeError('Unsupported dtype Half')",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR"
    assert not any("float16 FFT" in n for n in report.notes)


_GRADCHECK_CELL = """\
class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g

x = torch.randn(3, dtype=torch.double, device='cuda', requires_grad=True)
ok = torch.autograd.gradcheck(Cube.apply, (x,))"""


def test_a_float64_gradcheck_neuron_alone_fails_is_named_as_float64_computed_in_float32(ip):
    # A correct backward passed gradcheck on the reference; neuron computes float64 as float32,
    # whose rounding swamps gradcheck's eps=1e-6, and the ERROR came with no note saying so.
    run_cell(ip, "import torch")
    run_cell(ip, f"%%neuron -o r\n{_GRADCHECK_CELL}")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    assert report.target.error.type == "GradcheckError", report.summary()
    note = next(n for n in report.notes if "gradcheck" in n)
    assert note.startswith("neuron (emulated) error: float64 is computed as float32 on neuron")


def test_a_gradcheck_both_runs_fail_gets_no_float64_note(ip):
    run_cell(ip, "import torch")
    cell = _GRADCHECK_CELL.replace("return 3 * x ** 2 * g", "return 2 * x * g")
    run_cell(ip, f"%%neuron -o r\n{cell}")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is not None, report.summary()
    assert not any("gradcheck" in n for n in report.notes)


def test_a_checkpoint_an_earlier_cell_saved_is_named_with_its_map_location(ip, tmp_path):
    # The notebook keeps the reference's file, whose tensors the CPU standing in for cuda tagged
    # "cpu": loaded without map_location, the target refused them next to its device's, and the
    # note's only advice (move it in the cell) did not fit code that runs on a GPU
    path = tmp_path / "batch.pt"
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\nmodel = torch.nn.Linear(3, 1).cuda()\n"
        f"torch.save(torch.randn(4, 3, device='cuda'), {str(path)!r})",
    )
    run_cell(ip, f"%%neuron -o r\nb = torch.load({str(path)!r})\nout = model(b)")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    note = next(n for n in report.notes if ", as CUDA does;" in n)
    assert "torch.load of a file a %%neuron cell saved" in note and 'map_location="cuda"' in note
    # what the note says to do works on both runs
    run_cell(
        ip, f"%%neuron -o r\nb = torch.load({str(path)!r}, map_location='cuda')\nout = model(b)"
    )
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()


def test_an_op_a_notebook_cell_registered_is_named_when_the_worker_lacks_it(ip):
    # Called through torch.ops, the worker's miss was a bare AttributeError with no pointer to the
    # documented limit (found by trying the default path as a user). A torch.library.custom_op is
    # defined in the worker too (tests/run/test_custom_ops.py); torch.library.Library's calls are not
    run_cell(
        ip,
        "import torch\n"
        '_lib = torch.library.Library("wbtest_kernel_only", "DEF")\n'
        '_lib.define("scale(Tensor x, float a) -> Tensor")\n'
        '_lib.impl("scale", lambda x, a: x * a, "CompositeExplicitAutograd")',
    )
    run_cell(
        ip,
        '%%neuron -o r\nx = torch.randn(4, device="cuda")\ny = torch.ops.wbtest_kernel_only.scale(x, 2.0)',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    note = next(n for n in report.notes if "torch.ops.wbtest_kernel_only.scale" in n)
    assert "--executor inprocess" in note and "torch.library.custom_op" in note


def test_an_op_a_module_only_the_kernel_imported_registered_is_named_with_its_module(ip, tmp_path):
    # (after review) the note blamed a notebook cell and advised defining the op in a module,
    # where the op already was in one: importing it in the cell is the fix
    (tmp_path / "wbtest_ops_module.py").write_text(
        "import torch\n"
        '@torch.library.custom_op("wbtest_module_op::scale", mutates_args=())\n'
        "def scale(x: torch.Tensor, a: float) -> torch.Tensor:\n"
        "    return x * a\n"
    )
    run_cell(
        ip, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport torch, wbtest_ops_module"
    )
    call = 'x = torch.randn(4, device="cuda")\ny = torch.ops.wbtest_module_op.scale(x, 2.0)'
    try:
        run_cell(ip, "%%neuron -o r\n" + call)
        report = ip.user_ns["r"]
        assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
        note = next(n for n in report.notes if "torch.ops.wbtest_module_op.scale" in n)
        assert "registered by module wbtest_ops_module" in note
        assert "import wbtest_ops_module in this cell" in note
        run_cell(ip, "%%neuron -o r\nimport wbtest_ops_module\n" + call)
        assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
    finally:
        run_cell(ip, f"sys.path.remove({str(tmp_path)!r})")


@pytest.mark.parametrize(
    "body",
    [
        "z = x * torch.tensor(2.0)",  # a 0-dim CPU tensor is a number to CUDA
        "z = x[torch.tensor([0, 2])]",  # indexing takes CPU indices on CUDA
        "z = x.cpu().numpy()",
    ],
)
def test_mixes_cuda_accepts_pass_without_the_note(ip, body):
    run_cell(ip, "import torch")
    run_cell(ip, f"%%neuron -o r\nx = torch.randn(4, device='cuda')\n{body}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert not any(", as CUDA does;" in n for n in report.notes)


def test_the_cuda_refuses_too_note_needs_a_reference_that_ran_on_the_host():
    from neuron_workbench.backends.base import BackendInfo
    from neuron_workbench.report.hints import cuda_refuses_too_hint
    from neuron_workbench.run.records import Run, RunError

    def refused(devices):
        message = f"Expected all tensors to be on the same device, but found {devices}!"
        return Run(backend=BackendInfo("neuron", "neuron:0", "emulated", True),
                   error=RunError("RuntimeError", message))  # fmt: skip

    target = refused("at least two devices, neuron:0 and cpu")
    host = BackendInfo("cpu", "cpu", "host", details={"stands_in_for": "cuda"})
    assert cuda_refuses_too_hint(Run(backend=host), target) is not None
    # a GPU reference would have refused it too; a failed reference has its own error to show
    gpu = BackendInfo("cuda", "cuda:0", "a GPU")
    assert cuda_refuses_too_hint(Run(backend=gpu), target) is None
    assert cuda_refuses_too_hint(Run(backend=host, error=target.error), target) is None
    # two accelerators, or another error: nothing the host could have refused
    assert cuda_refuses_too_hint(Run(backend=host), refused("neuron:0 and neuron:1")) is None
    other = Run(backend=target.backend, error=RunError("RuntimeError", "shape mismatch"))
    assert cuda_refuses_too_hint(Run(backend=host), other) is None


def _adam_first_step(w_before, grad, lr=1e-3, eps=1e-8):
    """AdamW's first step (weight decay 0) in float64: ``w - lr * g / (|g| + eps)``."""
    return w_before - lr * grad / (grad.abs() + eps)


def _run_with_step(name, weight, grad, lr=1e-3, eps=1e-8, step=0, second_moment=None):
    """A finished run whose output ``w`` went through a recorded AdamW step with ``grad``."""
    from neuron_workbench.backends.base import BackendInfo
    from neuron_workbench.run.records import Run
    from neuron_workbench.trace.optimizer import OptimizerSteps, ParamAtStep

    at = ParamAtStep("AdamW", 0, 0, grad, second_moment, step, lr, eps, 0.9, 0.999, 0.0)
    steps = OptimizerSteps(calls=1, params={id(weight): (weight, at)})
    return Run(BackendInfo(name, name, name), outputs={"w": weight}, extras={"optimizer": steps})


def test_a_weight_beyond_budget_after_adam_is_judged_by_its_gradients_against_the_oracle():
    import torch

    from neuron_workbench.compare import compare_outputs
    from neuron_workbench.compare.budget import against_oracle
    from neuron_workbench.report.hints import Evidence

    torch.manual_seed(0)
    # gradients of every scale, some near eps (where Adam's division magnifies their rounding)
    g_oracle = torch.randn(256, dtype=torch.float64) * 10.0 ** torch.randint(-9, -1, (256,))
    # weights a little over lr, of the gradient's sign, so that w - lr * update cancels
    w_before = (g_oracle.sign() * 1e-3 * (1.2 + 0.6 * torch.rand(256))).float().double()
    g_ref = g_oracle.float()
    g_target = g_ref.clone()  # every third element one rounding away from the reference's
    g_target[::3] = torch.nextafter(g_target[::3], torch.zeros_like(g_target[::3]))
    oracle = _adam_first_step(w_before, g_oracle)
    w_ref = oracle.float()  # the reference's step happens to round exactly (fused multiply-adds)
    # the target rounds at the scale of the weight before the step (its decay, then the update):
    # after the cancellation that is two or three ulps of the result
    before = w_before.float().abs()
    ulp_before = (torch.nextafter(before, torch.full_like(before, 1.0)) - before).double()
    signs = torch.where(torch.rand(256) < 0.5, -1.0, 1.0).double()
    w_target = (_adam_first_step(w_before, g_target.double()) + 1.25 * ulp_before * signs).float()
    runs = [
        _run_with_step(name, torch.nn.Parameter(w), g)
        for name, w, g in (
            ("cpu", w_ref, g_ref),
            ("neuron", w_target, g_target),
            ("oracle", oracle, g_oracle),
        )
    ]
    ref, target, oracle_run = runs
    # what --judge budget measures: the target 'less accurate' by rounding alone
    measured = against_oracle("w", w_ref, w_target, oracle)
    assert not measured.within, measured
    diff = compare_outputs(ref.outputs, target.outputs).diffs[0]
    why = Evidence(ref, target).amplification_within_budget(diff, oracle_run)
    assert why is not None and why.startswith(
        "AdamW amplification, judged by the gradients: w's gradients at AdamW.step() are within "
        "budget against the float64 oracle's"
    ), why
    # a weight off by more than rounding and the gradients can account for: still beyond budget
    target.outputs["w"].data[3] += 1e-5
    assert Evidence(ref, target).amplification_within_budget(diff, oracle_run) is None
    target.outputs["w"].data[3] -= 1e-5
    # gradients less accurate than the reference's: the pass, not the optimizer
    target.extras["optimizer"].at_step(target.outputs["w"]).grad = (g_oracle * 1.01).float()
    assert Evidence(ref, target).amplification_within_budget(diff, oracle_run) is None


def test_no_gradient_difference_accounts_for_more_than_an_adam_step_can_move():
    # A later step where v is about 0 (a unit no batch reached): the first-order bound,
    # sensitivity * |Δg|, grew without limit, so a weight 30 lr off passed as amplification.
    import torch

    from neuron_workbench.compare import compare_outputs
    from neuron_workbench.report.hints import Evidence

    torch.manual_seed(0)
    g_oracle = torch.randn(64, dtype=torch.float64) * 1e-3
    g_oracle[5] = 1e-12  # a unit that saw (almost) no gradient so far
    v = (g_oracle * g_oracle).float()
    v[5] = 0.0
    g_ref = g_oracle.float()
    g_target = g_ref.clone()
    g_target[5] = 2e-6
    w_oracle = torch.randn(64, dtype=torch.float64) * 0.02
    w_ref = w_oracle.float()
    w_target = w_ref.clone()
    w_target[5] += 0.03  # 30 lr: no Adam step moves a weight that far
    runs = [
        _run_with_step(name, torch.nn.Parameter(w), g, step=5, second_moment=v)
        for name, w, g in (
            ("cpu", w_ref, g_ref),
            ("neuron", w_target, g_target),
            ("oracle", w_oracle, g_oracle),
        )
    ]
    ref, target, oracle_run = runs
    diff = compare_outputs(ref.outputs, target.outputs).diffs[0]
    assert diff.status == "differ"
    evidence = Evidence(ref, target)
    assert evidence.amplification_within_budget(diff, oracle_run) is None
    assert evidence.amplification(diff) is None


#: A porting bug in one module: GELU's tanh approximation on the accelerator only (module call 1).
GELU_ON_THE_TARGET_ONLY = (
    "torch.manual_seed(0)\n"
    "approx = 'tanh' if torch.ones(1, device='cuda').device.type != 'cpu' else 'none'\n"
    "m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(approximate=approx),\n"
    "                        torch.nn.Linear(32, 4)).cuda()\n"
)


def test_with_layers_the_unexplained_hint_names_the_module_not_layers_again(ip):
    # A porting bug in one module (GELU's tanh approximation on the accelerator only): with
    # --layers the report found it born in module 1, yet the hint still said "run with --layers
    # to find the module where it is born", to a cell that had run with it.
    run_cell(ip, "import torch")
    cell = GELU_ON_THE_TARGET_ONLY + "y = m(torch.randn(16, 32, device='cuda'))"
    report, failures = _failures(ip, cell, "--layers")
    assert report.verdict == "FAIL" and report.first_divergence.module == "1"
    (hint,) = failures["y"].hints
    assert hint.startswith("cause not identified:")
    assert "run with --layers" not in hint
    assert "--layers found it is born in module call 1 (GELU)" in hint
    # without --layers the hint still advises it
    report, failures = _failures(ip, cell)
    assert failures["y"].hints == [CAUSE_NOT_IDENTIFIED]


def test_with_layers_a_parting_scalar_and_a_string_output_are_hinted_from_what_it_found(ip):
    # The printed loss.item() that parted was still hinted "run with --layers" under --layers,
    # and the string the device check made was said to be "born in module call 1 (GELU)".
    run_cell(ip, "import torch")
    cell = GELU_ON_THE_TARGET_ONLY + "print(m(torch.randn(16, 32, device='cuda')).sum().item())"
    report, failures = _failures(ip, cell, "--layers")
    assert report.verdict == "FAIL" and report.first_divergence.module == "1"
    (scalar_hint,) = report.scalars.first.hints
    assert "run with --layers" not in scalar_hint
    assert "--layers found it is born in module call 1 (GELU)" in scalar_hint
    (text_hint,) = failures["approx"].hints
    assert "GELU" not in text_hint and "run with --layers" not in text_hint
    assert "--layers compares the modules' tensor outputs, not how this value was made" in (
        text_hint
    )
