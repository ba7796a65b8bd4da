"""Training idioms from public training code, as CUDA-style cells: the corpus's idiom rows.

Each idiom is a setup cell (a seeded model and data on the CPU) and a ``%%neuron`` cell written as
the public code writes it: ``device = "cuda"``, ``torch.autocast("cuda", ...)`` switched on by an
``amp`` flag the way training scripts switch it (``enabled=amp``), the idiom itself, then the values
a training script keeps (losses, parameters, gradients). ``amp`` is False for the fp32 rows and True
for the bf16 rows (float16 with a ``GradScaler`` for the scaler idiom, as that idiom is written).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Idiom:
    """One idiom: ``setup`` runs as a plain cell, ``cell`` as the ``%%neuron`` cell body.

    Both see ``amp`` (bool) and ``amp_dtype`` (``torch.bfloat16``, or ``torch.float16`` when
    ``fp16`` is set), bound before the setup runs.
    """

    setup: str
    cell: str
    fp16: bool = False


_MLP = """
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
inputs = torch.randn(16, 32)
targets = torch.randint(0, 8, (16,))
"""

IDIOMS: dict[str, Idiom] = {
    # torch.utils.checkpoint around blocks with dropout (transformers' gradient_checkpointing).
    "checkpoint": Idiom(
        setup=_MLP,
        cell="""
from torch.utils.checkpoint import checkpoint
device = "cuda"
model = model.to(device)
x = inputs.to(device)
with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    h = checkpoint(model[:3], x, use_reentrant=False)
    logits = checkpoint(model[3:], h, use_reentrant=False)
    loss = nn.functional.cross_entropy(logits, targets.to(device))
loss.backward()
""",
    ),
    "checkpoint_reentrant": Idiom(
        setup=_MLP,
        cell="""
from torch.utils.checkpoint import checkpoint
device = "cuda"
model = model.to(device)
x = inputs.to(device).requires_grad_()
with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    h = checkpoint(model[:3], x, use_reentrant=True)
    logits = model[3:](h)
    loss = nn.functional.cross_entropy(logits, targets.to(device))
loss.backward()
""",
    ),
    # A step timed the way benchmarks and training logs time it.
    "timing": Idiom(
        setup=_MLP + "import time\n",
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.cuda.reset_peak_memory_stats()
start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
t0 = time.perf_counter()
start.record()
with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
loss.backward()
optimizer.step()
end.record()
torch.cuda.synchronize()
step_ms = start.elapsed_time(end)
wall_ms = (time.perf_counter() - t0) * 1000
peak_mib = torch.cuda.max_memory_allocated() / 2**20
loss_value = loss.item()
""",
    ),
    # AMP with loss scaling: the torch.amp recipe.
    "grad_scaler": Idiom(
        setup=_MLP,
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=amp)
for step in range(2):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
        loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
scale = scaler.get_scale()
""",
        fp16=True,
    ),
    # Several micro-batches per optimizer step, the loss divided by their number.
    "grad_accumulation": Idiom(
        setup=_MLP,
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
accumulation_steps = 4
optimizer.zero_grad(set_to_none=True)
for micro_x, micro_y in zip(inputs.chunk(accumulation_steps), targets.chunk(accumulation_steps)):
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
        loss = nn.functional.cross_entropy(model(micro_x.to(device)), micro_y.to(device))
    (loss / accumulation_steps).backward()
optimizer.step()
""",
    ),
    # Gradient clipping and a one-cycle schedule stepped per batch.
    "clip_one_cycle": Idiom(
        setup=_MLP,
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
for step in range(3):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
        loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    scheduler.step()
lr = scheduler.get_last_lr()[0]
""",
    ),
    # A DataLoader with worker processes and pinned memory, batches moved non_blocking.
    "dataloader": Idiom(
        setup=_MLP
        + """
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.randn(64, 32), torch.randint(0, 8, (64,)))
""",
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=16, shuffle=False, num_workers=2, pin_memory=True)
losses = []
for batch_x, batch_y in loader:
    batch_x = batch_x.to(device, non_blocking=True)
    batch_y = batch_y.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
        loss = nn.functional.cross_entropy(model(batch_x), batch_y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
""",
    ),
    # Half-precision inference: model.half() and half inputs, no autograd.
    "half_inference": Idiom(
        setup=_MLP,
        cell="""
device = "cuda"
model = model.to(device).half().eval()
with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    logits = model(inputs.to(device).half())
probs = logits.float().softmax(-1)
""",
    ),
    # Greedy decoding with a KV cache under inference_mode (transformers' generate()).
    "generate": Idiom(
        setup="""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(
    vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
prompt = torch.randint(0, 128, (2, 6))
""",
        cell="""
device = "cuda"
model = model.to(device)
with torch.inference_mode(), torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    tokens = model.generate(
        prompt.to(device), attention_mask=torch.ones_like(prompt).to(device),
        max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
""",
    ),
    # A sparse mixture-of-experts decoder's training step (router, top-k experts, aux loss).
    "moe": Idiom(
        setup="""
import torch
from transformers import MixtralConfig, MixtralForCausalLM
torch.manual_seed(0)
model = MixtralForCausalLM(MixtralConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    num_local_experts=4, num_experts_per_tok=2, output_router_logits=True))
input_ids = torch.randint(0, 128, (2, 16))
""",
        cell="""
device = "cuda"
model = model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
optimizer.zero_grad(set_to_none=True)
with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
    out = model(input_ids=input_ids.to(device), labels=input_ids.to(device))
loss = out.loss
aux_loss = out.aux_loss
loss.backward()
optimizer.step()
""",
    ),
}


def idiom_setup(name: str, precision: str) -> str:
    """The setup cell of idiom ``name`` for ``precision`` (``fp32`` or ``bf16``)."""
    idiom = IDIOMS[name]
    dtype = "torch.float16" if idiom.fp16 else "torch.bfloat16"
    return f"import torch\namp = {precision != 'fp32'}\namp_dtype = {dtype}\n" + idiom.setup


def idiom_cell(name: str) -> str:
    """The ``%%neuron`` cell body of idiom ``name``."""
    return IDIOMS[name].cell.lstrip("\n")
