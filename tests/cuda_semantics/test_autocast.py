"""CUDA's autocast lists applied on the CPU's autocast key, for as long as the context lasts."""

import pytest
import torch

from neuron_workbench.cuda_semantics.autocast import BCE_BANNED_MESSAGE, cuda_autocast_lists


def _dtypes():
    a = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = a @ a
        return {
            "matmul": h.dtype,
            "softmax": torch.softmax(h, -1).dtype,
            "layer_norm": torch.nn.functional.layer_norm(h, (4,)).dtype,
            "exp": torch.exp(h).dtype,
            "mse": torch.nn.functional.mse_loss(h, h.detach()).dtype,
        }


def test_cpu_lists_outside_and_cuda_lists_inside():
    before = _dtypes()
    assert before["softmax"] == torch.bfloat16  # CPU's own lists leave softmax in bf16
    with cuda_autocast_lists():
        inside = _dtypes()
    assert inside == {
        "matmul": torch.bfloat16,
        "softmax": torch.float32,
        "layer_norm": torch.float32,
        "exp": torch.float32,
        "mse": torch.float32,
    }
    assert _dtypes() == before  # unregistered on exit


def test_ops_only_cpu_lists_name_are_not_cast():
    # CPU autocast runs `stack` and `prod` with its own policies; CUDA's lists leave them alone
    # (prod gets float32 only through CUDA's set_opt_dtype rule).
    x = torch.randn(3, dtype=torch.float64)
    with cuda_autocast_lists(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.stack([x, x]).dtype == torch.float64
        assert torch.prod(torch.randn(3).bfloat16()).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4)
    with cuda_autocast_lists(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError) as info:
            torch.nn.functional.binary_cross_entropy(p, p)
    assert str(info.value) == BCE_BANNED_MESSAGE


def test_taking_cudas_lists_leaves_the_once_per_line_warnings_as_they_were():
    # catch_warnings around the registration told every module the filters changed, emptying
    # their registries: a deprecation a loop had shown once showed again the next time round
    import warnings

    code = compile(
        "for i in range(3):\n    warnings.warn('once here', FutureWarning)\n"
        "    if i == 0:\n        with cuda_autocast_lists():\n            pass\n",
        "<loop>",
        "exec",
    )
    namespace = {"warnings": warnings, "cuda_autocast_lists": cuda_autocast_lists}
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        exec(code, namespace)
    assert [str(w.message) for w in shown] == ["once here"]
