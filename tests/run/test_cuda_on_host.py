"""The cpu reference behaves like CUDA for the CUDA parts of a cell (issue: CUDA-faithful reference).

Each test runs the real ``%%neuron`` magic with the default reference (the host CPU standing in for
cuda) against the emulated neuron target, on cells written as a CUDA user writes them.
"""

import pytest
import torch

from neuron_workbench.run.cuda_on_host import CudaOnHost, round_to_tf32, tf32_enabled
from neuron_workbench.testing import run_cell


def _report(ip, cell):
    ip.run_cell("%%neuron -o r\n" + cell)
    return ip.user_ns["r"]


def test_cuda_copy_does_not_alias_the_notebook_tensor(ip):
    run_cell(ip, "import torch\nbase = torch.arange(5.0)")
    report = _report(ip, "y = base.cuda().mul_(2)\nz = base.to('cuda').add_(1)")
    assert report.verdict == "PASS", report.summary()
    assert torch.equal(ip.user_ns["base"], torch.arange(5.0))
    assert torch.equal(ip.user_ns["y"], torch.arange(5.0) * 2)
    assert report.summary().startswith("PASS neuron (emulated) vs cpu (as cuda)")


def test_requires_grad_on_a_moved_copy_leaves_the_input_alone(ip):
    run_cell(ip, "import torch\nbase = torch.arange(4.0)")
    report = _report(
        ip,
        "device = torch.device('cuda')\nw = base.to(device).requires_grad_()\n"
        "loss = (w * w).sum()\nloss.backward()",
    )
    assert report.verdict == "PASS", report.summary()
    assert not ip.user_ns["base"].requires_grad
    assert "base" not in [d.path for d in report.comparison.diffs]


def test_a_tensor_already_on_cuda_is_not_copied_again(ip):
    # On CUDA, .to("cuda") of a CUDA tensor returns the tensor itself: in-place ops reach it.
    run_cell(ip, "import torch")
    report = _report(
        ip,
        "x = torch.zeros(3, device='cuda')\ny = x.to('cuda')\ny.add_(1)\n"
        "a = torch.ones(2).cuda()\nb = a.cuda()\nb.mul_(3)",
    )
    assert report.verdict == "PASS", report.summary()
    assert torch.equal(ip.user_ns["x"], torch.ones(3))
    assert torch.equal(ip.user_ns["a"], torch.full((2,), 3.0))


def test_a_device_object_built_as_cuda_keeps_meaning_cuda_in_later_cells(ip):
    run_cell(ip, "import torch\nbase = torch.arange(3.0)")
    report = _report(ip, "device = torch.device('cuda')\nw = base.to(device)\nw.add_(1)")
    assert report.verdict == "PASS", report.summary()
    report = _report(ip, "v = base.to(device)\nv.mul_(5)\nu = w.to(device)\nu.add_(1)")
    assert report.verdict == "PASS", report.summary()
    assert torch.equal(ip.user_ns["base"], torch.arange(3.0))
    # w was on "cuda" already: moving it again returns it, so the in-place add reached it
    assert torch.equal(ip.user_ns["w"], torch.arange(3.0) + 2)


def test_as_tensor_on_cuda_copies_numpy_memory(ip):
    run_cell(ip, "import numpy as np\nimport torch\narr = np.arange(3.0)")
    report = _report(ip, "t = torch.as_tensor(arr, device='cuda')\nt.add_(10)")
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["arr"].tolist() == [0.0, 1.0, 2.0]


def test_module_to_cuda_copies_parameters_but_keeps_them(ip):
    run_cell(ip, "import torch\nnet = torch.nn.Linear(3, 2)\nw0 = net.weight")
    report = _report(ip, "net.to('cuda')\nout = net(torch.ones(1, 3, device='cuda'))")
    assert report.verdict == "PASS", report.summary()
    # the parameter object is the same, as Module.to keeps it on CUDA
    assert ip.user_ns["net"].weight is not None


def test_cuda_autocast_uses_cuda_op_lists(ip):
    run_cell(ip, "import torch")
    report = _report(
        ip,
        "x = torch.randn(4, 8).cuda()\nw = torch.randn(8, 8).cuda()\n"
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "    h = x @ w\n    y = torch.softmax(h, -1)\n    n = torch.nn.functional.layer_norm(h, (8,))",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["h"].dtype == torch.bfloat16
    assert ip.user_ns["y"].dtype == torch.float32  # CPU autocast would give bfloat16
    assert ip.user_ns["n"].dtype == torch.float32
    assert any("CUDA's op lists" in note for note in report.notes)
    # the override ends with the run: plain CPU autocast keeps CPU's lists
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = torch.randn(2, 2)
        assert torch.softmax(a @ a, -1).dtype == torch.bfloat16


def test_cpu_autocast_in_a_cell_keeps_cpu_lists(ip):
    run_cell(ip, "import torch")
    report = _report(
        ip,
        "x = torch.randn(4, 8)\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    y = torch.softmax(x @ x.T, -1)",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["y"].dtype == torch.bfloat16


def test_pin_memory_copies_and_reports_pinned(ip):
    run_cell(ip, "import torch\nt = torch.arange(4.0)")
    report = _report(
        ip,
        "p = t.pin_memory()\npinned = p.is_pinned()\nbefore = t.is_pinned()\n"
        "u = p.to('cuda', non_blocking=True)\np.add_(1)",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["pinned"] is True
    assert ip.user_ns["before"] is False
    assert torch.equal(ip.user_ns["t"], torch.arange(4.0))


def test_dataloader_with_pinned_memory_and_shuffle_passes(ip):
    run_cell(
        ip,
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))\n"
        "loader = DataLoader(ds, batch_size=8, shuffle=True, pin_memory=True)\n"
        "model = torch.nn.Linear(4, 3)",
    )
    report = _report(
        ip,
        "model.cuda()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "for xb, yb in loader:\n"
        "    xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)\n"
        "    loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
        "    opt.zero_grad(set_to_none=True)\n    loss.backward()\n    opt.step()",
    )
    assert report.verdict == "PASS", report.summary()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_with_pinned_memory_yields_pinned_batches_as_on_a_gpu(ip, recwarn, num_workers):
    # The reference's loader warned "'pin_memory' argument is set as true but no accelerator is
    # found" and yielded unpinned batches, the target's pinned ones: `xb.is_pinned()` differed
    # (FAIL, "cause not identified") where a GPU pins every batch and warns nothing.
    run_cell(
        ip,
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(torch.randn(32, 4), torch.arange(32))\n"
        f"loader = DataLoader(ds, batch_size=8, pin_memory=True, num_workers={num_workers})",
    )
    report = _report(
        ip,
        "pinned = [xb.is_pinned() and yb.is_pinned() for xb, yb in loader]\n"
        "total = sum(xb.cuda(non_blocking=True).sum() for xb, _ in loader)",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["pinned"] == [True] * 4
    assert not [w for w in recwarn if "pin_memory" in str(w.message)]
    # a plain cell's loader is the kernel's own again: no pinning without an accelerator
    run_cell(ip, "plain = [xb.is_pinned() for xb, _ in loader]")
    assert ip.user_ns["plain"] == [False] * 4


def test_optimizers_default_to_foreach_as_on_cuda(ip):
    run_cell(ip, "import torch\nimport torch.optim.optimizer as oo")
    report = _report(
        ip,
        "w = torch.nn.Parameter(torch.ones(3, device='cuda'))\n"
        "fused, foreach = oo._default_to_fused_or_foreach([w], False)\n"
        "opt = torch.optim.AdamW([w])\nw.sum().backward()\nopt.step()",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["foreach"] is True
    assert any("foreach" in note for note in report.notes)
    import torch.optim.optimizer as oo

    assert oo._default_to_fused_or_foreach([torch.ones(1)], False) == (False, False)


def test_the_foreach_note_names_what_took_foreach(ip):
    # nanoGPT's step: a fused AdamW and clip_grad_norm_. Only the clipping took the foreach path,
    # and the note said the optimizers had
    run_cell(ip, "import torch\nlin = torch.nn.Linear(4, 2)")
    step = (
        "m = lin.cuda()\nopt = torch.optim.AdamW(m.parameters(), {kind}=True)\n"
        "m(torch.ones(3, 4, device='cuda')).sum().backward()\n"
        "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\nopt.step()"
    )
    report = _report(ip, step.format(kind="fused"))
    assert report.verdict == "PASS", report.summary()
    notes = [note for note in report.notes if "foreach" in note]
    assert notes == [
        "cpu (as cuda): gradient clipping (torch's foreach helpers) used the foreach "
        "implementation CUDA tensors default to"
    ], report.notes
    report = _report(ip, step.format(kind="foreach").replace("foreach=True", "foreach=None"))
    assert any(
        note.startswith("cpu (as cuda): optimizers and gradient clipping") for note in report.notes
    ), report.notes


def test_tf32_rounding_when_the_cell_enables_it(ip):
    run_cell(ip, "import torch")
    cell = (
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "a = torch.full((1, 1), 1.0 + 2**-12, device='cuda')\n"
        "b = torch.full((1, 1), 1000.0, device='cuda')\n"
        "c = a @ b\ntorch.backends.cuda.matmul.allow_tf32 = False"
    )
    report = _report(ip, cell)
    # the reference rounded to TF32 (10 mantissa bits), the emulated target computed in float32
    assert ip.user_ns["c"].item() == 1000.0
    assert report.verdict == "FAIL"
    failure = report.comparison.failures[0]
    assert failure.path == "c"
    assert any(h.startswith("TF32: cpu (as cuda)") for h in failure.hints)
    ip.run_cell("%%neuron -o r --ref-precision fp32\n" + cell)
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
    assert ip.user_ns["c"].item() > 1000.2
    assert not tf32_enabled()


def test_tf32_leaves_a_linears_bias_in_float32_as_cublas_does(ip):
    # TF32 rounds the two matrices a GPU multiplies; the bias addmm adds is read in float32. The
    # reference rounded the bias too: 1000.3 became 1000.5, a FAIL of 0.2 blamed on TF32 where a
    # GPU's result is within 1e-5 of the target's
    run_cell(
        ip,
        "import torch\nlin = torch.nn.Linear(4, 4)\nx = torch.ones(2, 4)\n"
        "with torch.no_grad():\n    lin.weight.fill_(0.001)\n    lin.bias.fill_(1000.3)",
    )
    report = _report(
        ip,
        "torch.backends.cuda.matmul.allow_tf32 = True\ny = lin.cuda()(x.cuda())\n"
        "torch.backends.cuda.matmul.allow_tf32 = False",
    )
    assert report.verdict == "PASS", report.summary()
    assert report.ref.facts.tf32_matmuls  # the weights were rounded
    expected = torch.tensor(1000.3) + 4 * round_to_tf32(torch.tensor(0.001))
    assert torch.allclose(ip.user_ns["y"], expected.expand(2, 4), rtol=0, atol=1e-4)


def test_tf32_set_by_torchs_newer_switch_rounds_on_the_reference(ip):
    # torch.backends.cuda.matmul.fp32_precision = "tf32" (PyTorch 2.9's API; cuBLAS reads it): the
    # reference read the legacy allow_tf32, which torch then refuses to read, and raised "mix of
    # the legacy and new APIs" at the cell's first matmul, and in every later cell (ERROR)
    run_cell(ip, "import torch\nlin = torch.nn.Linear(64, 64)\nx = torch.randn(32, 64)")
    try:
        report = _report(
            ip, 'torch.backends.cuda.matmul.fp32_precision = "tf32"\ny = lin.cuda()(x.cuda())'
        )
        assert report.ref.error is None, report.summary()
        failed = {d.path: d for d in report.comparison.failures}
        assert any(h.startswith("TF32: cpu (as cuda)") for h in failed["y"].hints), report.summary()
        # and the cells after it, with TF32 still on in the notebook
        report = _report(ip, "y = lin(x.cuda())")
        assert report.ref.error is None and report.ref.facts.tf32_matmuls, report.summary()
    finally:
        torch.backends.cuda.matmul.fp32_precision = "none"
    assert not tf32_enabled()


def test_tf32_on_with_no_float32_matmul_is_no_tf32_evidence(ip):
    # TF32 on (nanoGPT's first lines), then bfloat16 and float64 matmuls only: the reference noted
    # "float32 matmuls rounded their inputs to TF32" and hinted TF32 for a float64 output, which
    # TF32 never touches (found by trying precision idioms as a user)
    run_cell(ip, "import torch\nlin = torch.nn.Linear(64, 64)\nx = torch.randn(32, 64)")
    report = _report(
        ip,
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "y = lin.cuda().to(torch.bfloat16)(x.cuda().bfloat16())\n"
        "xd = x.cuda().double()\n"
        "w = (xd + 1e-9) @ xd.T - xd @ xd.T\n"
        "torch.backends.cuda.matmul.allow_tf32 = False",
    )
    assert report.verdict == "FAIL", report.summary()
    failed = {d.path: d for d in report.comparison.failures}
    assert any(h.startswith("float64 is computed as float32") for h in failed["w"].hints)
    assert not any("TF32" in h for h in failed["w"].hints), failed["w"].hints
    assert not report.ref.facts.tf32_matmuls
    assert not any("TF32" in note for note in report.notes), report.notes


_CONV_TF32_NOTE = "compute float32 convolutions with TF32"


def test_the_tf32_convolution_note_is_for_the_convolutions_a_gpu_computes_in_tf32(ip):
    # The note that a GPU convolves float32 in TF32 where this reference does not was added for
    # any convolution: also with cuDNN's TF32 turned off by the cell, and under bf16 autocast,
    # where a GPU convolves as the reference does (found by trying precision idioms as a user)
    run_cell(ip, "import torch\nconv = torch.nn.Conv2d(3, 4, 3)\nx = torch.randn(1, 3, 8, 8)")
    report = _report(ip, "y = conv.cuda()(x.cuda())")
    assert any(_CONV_TF32_NOTE in note for note in report.notes), report.notes
    for cell in (
        "torch.backends.cudnn.allow_tf32 = False\ny = conv(x.cuda())\n"
        "torch.backends.cudnn.allow_tf32 = True",
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = conv(x.cuda())",
        "y = conv.to(torch.bfloat16)(x.cuda().bfloat16())",
    ):
        report = _report(ip, cell)
        assert report.verdict == "PASS", report.summary()
        assert not any(_CONV_TF32_NOTE in note for note in report.notes), (cell, report.notes)
    assert torch.backends.cudnn.allow_tf32


def test_the_attention_kernel_note_is_left_out_where_a_gpu_takes_the_math_path_too(ip):
    # with sdpa_kernel(SDPBackend.MATH) a GPU computes attention as this reference does; the note
    # that a GPU would pick a fused kernel was added all the same
    run_cell(
        ip,
        "import torch\nimport torch.nn.functional as F\n"
        "from torch.nn.attention import sdpa_kernel, SDPBackend\nq = torch.randn(1, 2, 4, 8)",
    )
    note = "CUDA picks flash, memory-efficient or cuDNN attention kernels"
    report = _report(ip, "a = F.scaled_dot_product_attention(q.cuda(), q.cuda(), q.cuda())")
    assert any(note in each for each in report.notes), report.notes
    report = _report(
        ip,
        "with sdpa_kernel(SDPBackend.MATH):\n"
        "    a = F.scaled_dot_product_attention(q.cuda(), q.cuda(), q.cuda())",
    )
    assert report.verdict == "PASS", report.summary()
    assert not any(note in each for each in report.notes), report.notes


def test_round_to_tf32_keeps_ten_mantissa_bits():
    x = torch.tensor([1.0 + 2**-10, 1.0 + 2**-11, 1.0 + 2**-12, float("inf"), float("nan"), -3.0])
    out = round_to_tf32(x)
    assert out[0] == 1.0 + 2**-10  # representable
    assert out[1] == 1.0 + 2**-10  # tie rounds away from zero
    assert out[2] == 1.0
    assert torch.isinf(out[3]) and torch.isnan(out[4]) and out[5] == -3.0


def test_residency_and_pinning_bookkeeping():
    resident = torch.ones(2)
    host = CudaOnHost([resident])
    assert host.on_device(resident)
    moved = host.moved(resident, resident)
    assert moved is resident
    fresh = torch.zeros(2)
    copy = host.moved(fresh, fresh)
    assert copy is not fresh and host.on_device(copy) and torch.equal(copy, fresh)
    pinned = host.pin(fresh)
    assert pinned is not fresh and host.is_pinned(pinned) and not host.is_pinned(fresh)
    assert host.pin(pinned) is pinned


def test_lstm_under_cuda_autocast_runs_in_lower_precision_on_both(ip):
    # CPU autocast leaves oneDNN's LSTM in float32; CUDA (and the emulated device) give bfloat16.
    run_cell(ip, "import torch\ntorch.manual_seed(0)\nrnn = torch.nn.LSTM(8, 16, num_layers=2)")
    report = _report(
        ip,
        "rnn.cuda()\nx = torch.randn(5, 3, 8, device='cuda')\n"
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    out, (h, c) = rnn(x)\n"
        "out.float().sum().backward()",
    )
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["out"].dtype == torch.bfloat16


def test_sparse_tensor_on_the_target_is_a_one_line_error(ip):
    run_cell(ip, "import torch")
    report = _report(
        ip,
        "i = torch.tensor([[0, 1], [1, 0]])\n"
        "s = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (2, 2)).cuda()\n"
        "y = s.to_dense() * 2",
    )
    assert report.verdict == "ERROR"
    assert report.ref.ok  # the reference (as CUDA) takes sparse tensors
    error = report.target.error
    assert error.type == "NotImplementedError" and error.lineno == 3  # %%neuron is line 1
    assert "\n" not in error.message
    assert "torch.sparse_coo" in error.message and "aten::" in error.message
    assert "coverage has no op for sparse tensors" in error.message


def test_data_parallel_runs_on_the_reference_as_on_one_gpu_and_says_why_not_on_the_target(ip):
    # Unguarded nn.DataParallel: the reference raised AttributeError (no multi_processor_count in
    # the device properties), then could not scatter (no torch._C._scatter without CUDA); the
    # target raised ZeroDivisionError (the emulated capacity, 0).
    run_cell(
        ip,
        "import torch\nimport torch.nn as nn\ntorch.manual_seed(0)\n"
        "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\nx = torch.randn(5, 4)",
    )
    report = _report(
        ip,
        "model = nn.DataParallel(net).cuda()\n"
        "xin = x.cuda().requires_grad_()\n"
        "loss = model(xin).pow(2).sum()\n"
        "loss.backward()\n"
        "same_device = torch.device('cuda', 0) == next(model.parameters()).device\n"
        "cores = torch.cuda.get_device_properties(0).multi_processor_count",
    )
    ref, target = report.ref, report.target
    assert ref.ok, ref.error
    net, x = ip.user_ns["net"], ip.user_ns["x"]
    plain_x = x.clone().requires_grad_()
    plain_loss = net(plain_x).pow(2).sum()
    plain_loss.backward()
    assert torch.equal(ref.outputs["loss"], plain_loss)
    assert torch.equal(ref.outputs["xin"].grad, plain_x.grad)  # scattered back through backward
    assert ref.outputs["same_device"] is True and ref.outputs["cores"] >= 1
    assert target.error.type == "RuntimeError"
    assert target.error.message.startswith(
        "nn.DataParallel cannot run on neuron: it scatters inputs and gathers outputs with CUDA "
        "kernels (torch._C._scatter)"
    )
    assert target.error.lineno == 2
    # the scanner says it before anything runs
    assert "NW141" in {f["rule_id"] for f in report.migration["findings"]}
    # a host input is copied to the "GPU" as CUDA copies it: the module's in-place ReLU leaves the
    # notebook's tensor alone; more devices than one are refused as on a one-GPU machine; the
    # functional form says on the target what the class says
    report = _report(
        ip,
        "relu_first = nn.DataParallel(nn.Sequential(nn.ReLU(inplace=True), net)).cuda()\n"
        "kept = x.clone()\n"
        "out = relu_first(kept)\n"
        "untouched = torch.equal(kept, x)",
    )
    assert report.ref.ok and report.ref.outputs["untouched"] is True, report.ref.error
    report = _report(ip, "two = nn.DataParallel(net, device_ids=[0, 1])")
    assert report.ref.error.message == "Invalid device id"
    report = _report(ip, "y = nn.parallel.data_parallel(net.cuda(), x.cuda())")
    assert report.ref.ok and report.target.error.message.startswith(
        "nn.DataParallel cannot run on neuron"
    )
