"""neuron numerics: float64 computed as float32, int64 arithmetic as int32, bf16 what-if policy."""

from __future__ import annotations

import torch

from neuron_workbench.emulator import configure, status


def test_float64_is_computed_as_float32():
    a = torch.tensor([1.0, 3.0], dtype=torch.float64)
    b = torch.tensor([1e-10, 1.0 / 3.0], dtype=torch.float64)
    got = (a.to("neuron") + b.to("neuron")).cpu()
    assert got.dtype == torch.float64  # stored as float64
    expected = (a.float() + b.float()).double()  # with float32 precision
    assert torch.equal(got, expected)
    assert not torch.equal(got, a + b)
    # copies are exact: storage keeps float64 bits
    x = torch.tensor([1 + 2**-40], dtype=torch.float64)
    assert torch.equal(x.to("neuron").cpu(), x)
    # inputs are rounded too: x - 1 is 0 in float32 arithmetic
    assert (x.to("neuron") - 1).item() == 0.0
    assert ((x - 1).item()) != 0.0


def test_float64_reductions_and_matmul_round_through_float32():
    torch.manual_seed(0)
    m = torch.randn(16, 16, dtype=torch.float64)
    got = (m.to("neuron") @ m.to("neuron")).cpu()
    torch.testing.assert_close(got, m @ m, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, got.float().double())  # every value is a float32 value
    s = m.to("neuron").sum().cpu()
    assert s.item() == float(torch.tensor(s.item()).float())


def test_float64_batch_norm_updates_its_running_statistics():
    # native_batch_norm writes running_mean/var though its schema does not mark them written: the
    # float64 rule handed the kernel float32-rounded copies, so the statistics never moved
    torch.manual_seed(0)
    x = torch.randn(8, 4, dtype=torch.float64)
    bn = torch.nn.BatchNorm1d(4).double().to("neuron")
    bn(x.to("neuron"))
    expected = torch.nn.BatchNorm1d(4).double()
    expected(x.float().double())  # the inputs rounded through float32, as the device rounds them
    assert bn.running_mean.abs().sum() > 0
    torch.testing.assert_close(bn.running_mean.cpu(), expected.running_mean, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(bn.running_var.cpu(), expected.running_var, rtol=1e-6, atol=1e-7)
    assert int(bn.num_batches_tracked) == 1
    # in eval the statistics are read, not written: they keep every float64 bit
    stats = torch.tensor([1 + 2**-40, 3.0], dtype=torch.float64)
    frozen = torch.nn.BatchNorm1d(2).double().to("neuron").eval()
    frozen.running_mean.copy_(stats.to("neuron"))
    frozen(torch.randn(4, 2, dtype=torch.float64).to("neuron"))
    assert torch.equal(frozen.running_mean.cpu(), stats)


def test_int64_arithmetic_wraps_like_int32():
    big = torch.tensor([2**31 - 1, 5])
    assert (big.to("neuron") + 1).tolist() == [-(2**31), 6]
    assert (big + 1).tolist() == [2**31, 6]  # CPU int64 does not wrap
    assert big.to("neuron").sum().item() == -(2**31) + 4
    wrapped = ((70000 * 70000 + 2**31) % 2**32) - 2**31
    assert wrapped != 70000 * 70000
    assert (torch.tensor([70000]).to("neuron") * 70000).item() == wrapped
    assert (torch.tensor([-70000]).to("neuron") * 70000).item() == -wrapped
    # indexing and storage keep int64
    idx = torch.tensor([2**33])
    assert idx.to("neuron").cpu().item() == 2**33
    t = torch.arange(10.0, device="neuron")
    assert t[torch.tensor([9], device="neuron")].item() == 9.0


def test_64bit_policy_can_be_switched_off():
    configure(narrow_64bit=False)
    assert status().numerics["float64"] == "float64"
    a = torch.tensor([1.0], dtype=torch.float64, device="neuron")
    assert (a + 1e-10).item() == 1.0 + 1e-10
    assert (torch.tensor([2**31 - 1], device="neuron") + 1).item() == 2**31


def test_bf16_matmul_what_if_policy():
    torch.manual_seed(0)
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    exact = (a.to("neuron") @ b.to("neuron")).cpu()
    assert torch.equal(exact, a @ b)  # off by default: TorchNeuron does not auto-cast
    configure(bf16_matmul=True)
    assert status().numerics["bf16_matmul"] is True
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    ref = a.bfloat16().float() @ b.bfloat16().float()  # bf16 inputs, fp32 accumulate
    assert torch.equal(got, ref) and not torch.equal(got, a @ b)
    # convolutions and their backward follow the policy too
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    cn = torch.nn.Conv2d(3, 4, 3).to("neuron")
    cn.load_state_dict(conv.state_dict())
    xn = x.detach().to("neuron").requires_grad_()
    out = cn(xn)
    ref_out = torch.nn.functional.conv2d(
        x.detach().bfloat16().float(), conv.weight.detach().bfloat16().float(), conv.bias.detach()
    )
    torch.testing.assert_close(out.detach().cpu(), ref_out)
    out.sum().backward()
    conv(x).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), x.grad, rtol=2e-2, atol=2e-2)
    assert not torch.equal(xn.grad.cpu(), x.grad)


def test_python_scalars_are_narrowed_and_keep_their_promotion():
    # A Python number is a wrapped scalar: narrowed like a 64-bit input, yet promoted as on CPU.
    x = torch.tensor(3, dtype=torch.int32)
    assert (x.to("neuron") + 5).dtype == (x + 5).dtype == torch.int32
    h = torch.tensor(1.5, dtype=torch.float16)
    assert (h.to("neuron") * 0.1).dtype == (h * 0.1).dtype == torch.float16
    # its value is what int32 / float32 arithmetic sees
    big = torch.tensor([1, 2])
    assert (big.to("neuron") + 2**33).tolist() == [1, 2]  # 2**33 wraps to 0 in int32
    assert (big + 2**33).tolist() == [2**33 + 1, 2**33 + 2]
    f = torch.tensor([1.0, 2.0], dtype=torch.float64)
    got = (f.to("neuron") * 0.1).cpu()
    assert torch.equal(got, (f.float() * torch.tensor(0.1).float()).double())
    assert (f.to("neuron") + 1e300).isinf().all()  # beyond float32's range
    assert (f.to("neuron") + float("nan")).isnan().all()
    # float32 tensors see the same scalar as on CPU (it is rounded to float32 there too)
    g = torch.tensor([1.0, 3.0])
    assert torch.equal((g.to("neuron") * 0.1).cpu(), g * 0.1)
    # a Python int with a floating tensor is converted, not wrapped as int32 arithmetic would
    for big in (2**32, 2**31, 2**33):
        assert torch.equal((g.to("neuron") / big).cpu(), g / big)
        assert torch.equal((g.to("neuron") + big).cpu(), g + big)
    # and the float64 result is still rounded as float32 arithmetic (the tensor decides)
    one = torch.tensor([0.1], dtype=torch.float64)
    for got, expected in (
        (one.to("neuron") + 1, one.float() + 1),
        (one.to("neuron") * 3, one.float() * 3),
    ):
        assert got.dtype == torch.float64
        assert torch.equal(got.cpu(), expected.double())
