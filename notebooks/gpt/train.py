"""A small GPT trained on generated text, in the style of nanoGPT's ``train.py``.

Written for neuron-workbench (notebook 07, the tests) (no code taken from nanoGPT; see README.md): module-level
config, overridden from the command line as ``--key=value`` (``--max_iters=20``), a CUDA device,
AdamW with weight decay groups, gradient clipping, a cosine learning-rate schedule, a periodic
``estimate_loss()`` and one ``loss.item()`` logged per iteration. The data is generated on the fly:
token sequences that follow a fixed random bigram table, so the loss has something to learn.
"""

import argparse
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values: a tiny model, quick on any device
device = "cuda"
dtype = "float32"  # 'float32', 'bfloat16' (autocast)
seed = 1337
batch_size = 8
block_size = 16
vocab_size = 32
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
bias = False
learning_rate = 6e-3
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
max_iters = 50
warmup_iters = 5
min_lr = 6e-4
eval_interval = 10
eval_iters = 2
log_interval = 1
# -----------------------------------------------------------------------------
config_keys = [
    k for k, v in list(globals().items())
    if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]  # fmt: skip


def _parse_overrides() -> None:
    """``--key=value`` overrides of the config above; an unknown key is a usage error (exit 2)."""
    parser = argparse.ArgumentParser(description="train a small GPT on generated tokens")
    for key in config_keys:
        value = globals()[key]
        kind = (
            (lambda s: s.lower() in ("1", "true", "yes"))
            if isinstance(value, bool)
            else type(value)
        )
        parser.add_argument(f"--{key}", type=kind, default=value, metavar=type(value).__name__)
    globals().update(vars(parser.parse_args()))


_parse_overrides()
config = {k: globals()[k] for k in config_keys}


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2))


# the data: sequences that follow a fixed random bigram table (generated on the CPU, then moved)
_data_gen = torch.Generator().manual_seed(seed)
_bigram = torch.softmax(3 * torch.randn(vocab_size, vocab_size, generator=_data_gen), dim=-1)


def get_batch(split):
    gen = torch.Generator().manual_seed(seed + get_batch.calls[split])
    get_batch.calls[split] += 1
    seq = torch.empty(batch_size, block_size + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab_size, (batch_size,), generator=gen)
    for t in range(block_size):
        seq[:, t + 1] = torch.multinomial(_bigram[seq[:, t]], 1, generator=gen).squeeze(1)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    return x.to(device), y.to(device)


get_batch.calls = {"train": 0, "val": 10_000}


@torch.no_grad()
def estimate_loss(model):
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (learning_rate - min_lr)


def main():
    torch.manual_seed(seed)
    model = GPT().to(device)
    optimizer = model.configure_optimizers()
    ctx = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        if dtype == "bfloat16"
        else torch.autocast(device_type="cuda", enabled=False)
    )
    X, Y = get_batch("train")
    for iter_num in range(max_iters + 1):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(iter_num)
        if iter_num % eval_interval == 0:
            losses = estimate_loss(model)
            print(
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
            )
        if iter_num == max_iters:
            break
        with ctx:
            _, loss = model(X, Y)
        X, Y = get_batch("train")
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % log_interval == 0:
            lossf = loss.item()
            print(f"iter {iter_num}: loss {lossf:.4f}")


if __name__ == "__main__":
    main()
