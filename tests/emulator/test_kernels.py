"""The emulator's Python kernels (``neuron_workbench.emulator.kernels``) against CPU's results."""

import torch
import torch.nn.functional as F


def _masked_sdpa_with_dropout(device, mask, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=dtype) for _ in range(3))
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    # the same seed before each run: the emulator draws dropout's mask with the CPU generator
    torch.manual_seed(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(device), dropout_p=0.5)
    weights = torch.arange(out.numel(), dtype=dtype).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


def test_sdpa_with_a_boolean_mask_and_dropout_matches_cpu():
    # Dropout sends SDPA to its math kernel, which adds its mask to the scores: public SDPA turns a
    # boolean mask into 0 / -inf first, and the emulator added the booleans themselves (found by a
    # user: HF BERT in train mode with a padded attention_mask failed every step).
    torch.manual_seed(2)
    for shape in [(6, 6), (2, 1, 6, 6), (2, 3, 6, 6)]:
        mask = torch.rand(shape) > 0.4
        mask[..., 1, :] = False  # a row that attends to nothing: zeros, as on CPU
        for dtype in (torch.float32, torch.bfloat16):
            cpu = _masked_sdpa_with_dropout("cpu", mask, dtype)
            neuron = _masked_sdpa_with_dropout("neuron", mask, dtype)
            for name, a, b in zip(("out", "q.grad", "k.grad", "v.grad"), cpu, neuron):
                assert torch.equal(a, b), (shape, dtype, name)
            assert not cpu[0].isnan().any()
