"""Run the real-model corpus through the real ``%%neuron`` magic on one emulated target.

Usage (one target per process, so the two targets run in parallel)::

    .venv/bin/python tests/corpus/corpus_runner.py --target neuron [--cases gpt2/bf16/train,lstm/fp32/fwd_bwd]

The runner's process holds no accelerator: each ``%%neuron`` cell runs its target in a worker
process, the default path users take.

Prints one JSON object per line, one per cell: model, precision, target, kind, verdict, the
one-line summary, each failing output with its hints, the fallback ops, and each run's error.
``tests/corpus/test_corpus.py`` and ``benchmarks/corpus.py`` both read these rows.

Every model is public, unmodified model code: ``transformers`` classes built from tiny configs (no
download, no network) and the PyTorch examples' classes in :mod:`pytorch_examples`. Each setup
cell seeds torch and builds the model and a batch on the CPU, as a data loader would; each
``%%neuron`` cell is CUDA-style code (device ``"cuda"``, AdamW, ``zero_grad(set_to_none=True)``,
``torch.autocast("cuda", dtype=torch.bfloat16)``).

Besides the models, the idiom rows (kind ``idiom``, :mod:`idioms`) are training idioms from public
code: activation checkpointing, a timed step, AMP with a ``GradScaler``, gradient accumulation,
clipping with a one-cycle schedule, a ``DataLoader`` with workers and pinned memory, half-precision
inference, ``generate()`` with a KV cache, a mixture-of-experts training step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from idioms import IDIOMS, idiom_cell, idiom_setup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

MODELS = ("gpt2", "bert", "llama", "resnet", "lstm", "dcgan")
PRECISIONS = ("fp32", "bf16")
KINDS = ("fwd_bwd", "train")
TARGETS = ("neuron", "tpu")
#: The kind of the idiom rows (their "model" is the idiom's name).
IDIOM = "idiom"
#: A training step whose models are compiled (``model = torch.compile(model)``), for these models.
COMPILED_KIND = "train_compiled"
COMPILED_MODELS = ("gpt2", "llama", "resnet")


@dataclass(frozen=True)
class ModelCase:
    """How to build one model on the CPU, and its forward pass and loss as CUDA-style code.

    ``setup`` runs as a plain cell; ``forward`` is the part of the ``%%neuron`` cell that runs
    under autocast in the bf16 variant (it binds ``loss``, and for the GAN ``lossD``/``lossG``);
    ``models`` and ``optimizers`` name what the cell moves to the device and steps.
    """

    setup: str
    forward: str
    models: tuple[str, ...] = ("model",)
    optimizer_args: str = "lr=1e-3"
    # Code after the forward pass, outside autocast (the GAN's losses); empty for most models.
    after: str = ""


_TRANSFORMERS_BATCH = """
torch.manual_seed(0)
input_ids = torch.randint(0, 128, (2, 16))
attention_mask = torch.ones(2, 16, dtype=torch.long)
"""

CASES: dict[str, ModelCase] = {
    "gpt2": ModelCase(
        setup="""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(
    vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
"""
        + _TRANSFORMERS_BATCH,
        forward="""
out = model(input_ids=input_ids.to(device), labels=input_ids.to(device))
loss = out.loss
""",
    ),
    "bert": ModelCase(
        setup="""
import torch
from transformers import BertConfig, BertForMaskedLM
torch.manual_seed(0)
model = BertForMaskedLM(BertConfig(
    vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=32))
"""
        + _TRANSFORMERS_BATCH
        + """
labels = input_ids.clone()
labels[:, ::3] = -100
""",
        forward="""
out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            labels=labels.to(device))
loss = out.loss
""",
    ),
    "llama": ModelCase(
        setup="""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
"""
        + _TRANSFORMERS_BATCH,
        forward="""
out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            labels=input_ids.to(device))
loss = out.loss
""",
    ),
    "resnet": ModelCase(
        setup="""
import torch
from transformers import ResNetConfig, ResNetForImageClassification
torch.manual_seed(0)
model = ResNetForImageClassification(ResNetConfig(
    embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=10))
pixel_values = torch.randn(4, 3, 32, 32)
targets = torch.randint(0, 10, (4,))
""",
        forward="""
out = model(pixel_values=pixel_values.to(device), labels=targets.to(device))
loss = out.loss
""",
    ),
    "lstm": ModelCase(
        setup="""
import torch
import torch.nn as nn
from pytorch_examples import RNNModel
torch.manual_seed(0)
model = RNNModel("LSTM", ntoken=128, ninp=32, nhid=32, nlayers=2, dropout=0.2)
criterion = nn.NLLLoss()
data = torch.randint(0, 128, (12, 4))  # (sequence length, batch), as batchify() lays it out
targets = torch.randint(0, 128, (12 * 4,))
""",
        forward="""
hidden = model.init_hidden(4)
output, hidden = model(data.to(device), hidden)
loss = criterion(output, targets.to(device))
""",
    ),
    "dcgan": ModelCase(
        setup="""
import torch
import torch.nn as nn
from pytorch_examples import Discriminator, Generator, nz, weights_init
torch.manual_seed(0)
netG = Generator(1)
netG.apply(weights_init)
netD = Discriminator(1)
netD.apply(weights_init)
criterion = nn.BCELoss()
real = torch.rand(4, 3, 64, 64) * 2 - 1
noise = torch.randn(4, nz, 1, 1)
""",
        # BCELoss is unsafe under CUDA autocast (it raises there), so the probabilities leave
        # autocast as float32 and the losses are computed outside, as an AMP port of DCGAN does.
        forward="""
real_out = netD(real.to(device))
fake = netG(noise.to(device))
fake_out_d = netD(fake.detach())
fake_out_g = netD(fake)
""",
        after="""
ones = torch.full((4,), 1.0, device=device)
zeros = torch.full((4,), 0.0, device=device)
lossD = criterion(real_out.float(), ones) + criterion(fake_out_d.float(), zeros)
lossG = criterion(fake_out_g.float(), ones)
loss = lossD + lossG
""",
        models=("netD", "netG"),
        optimizer_args="lr=2e-4, betas=(0.5, 0.999)",
    ),
}


def cell_source(model: str, precision: str, kind: str) -> str:
    """The CUDA-style ``%%neuron`` cell body for one corpus row."""
    if kind == IDIOM:
        return idiom_cell(model)
    case = CASES[model]
    lines = ['device = "cuda"']
    lines += [f"{name} = {name}.to(device)" for name in case.models]
    if kind == COMPILED_KIND:
        lines += [f"{name} = torch.compile({name})" for name in case.models]
    if kind in ("train", COMPILED_KIND):
        for name in case.models:
            lines.append(
                f"optimizer_{name} = torch.optim.AdamW({name}.parameters(), {case.optimizer_args})"
            )
            lines.append(f"optimizer_{name}.zero_grad(set_to_none=True)")
    forward = case.forward.strip().splitlines()
    if precision == "bf16":
        lines.append('with torch.autocast("cuda", dtype=torch.bfloat16):')
        lines += ["    " + line for line in forward]
    else:
        lines += forward
    lines += case.after.strip().splitlines()
    lines.append("loss.backward()")
    if kind in ("train", COMPILED_KIND):
        lines += [f"optimizer_{name}.step()" for name in case.models]
    return "\n".join(lines) + "\n"


#: Hint families by the words that name their cause (short tags for the table and the tests).
HINT_FAMILIES: dict[str, re.Pattern[str]] = {
    "fp64": re.compile(r"float64 is computed as float32"),
    "int64": re.compile(r"int64 arithmetic runs as int32"),
    "tpu-matmul": re.compile(r"1-pass bfloat16|Precision\.DEFAULT"),
    "what-if": re.compile(r"bf16 what-if"),
    "optimizer": re.compile(r"(?i)optimi[sz]er.*\beps\b|\beps\b.*optimi[sz]er"),
    "grad-differed": re.compile(r"(?i)gradient already differed"),
    # Not bare "attention": module paths in a hint's --tol suggestion contain it (BERT).
    "attention": re.compile(r"(?i)attention kernel|scaled_dot_product_attention|flash attention"),
    "rnn-kernel": re.compile(r"(?i)recurrent layers ran|cuDNN kernel"),
    "autocast-lists": re.compile(r"(?i)autocast.*\blists?\b"),
    "autocast": re.compile(r"(?i)autocast"),
    "random": re.compile(r"(?i)random numbers|draws its own|dropout masks|\bmasks\b"),
    "tf32": re.compile(r"\bTF32\b"),
    "fallback": re.compile(r"(?i)ran on the CPU instead of"),
    "not-identified": re.compile(r"(?i)^cause not identified"),
}


def hint_tags(hints: list[str]) -> list[str]:
    """The families of ``hints``, in :data:`HINT_FAMILIES` order; ``other`` for the rest.

    ``autocast`` is only given to an autocast hint that names no op lists.
    """
    tags = []
    for hint in hints:
        found = [name for name, pattern in HINT_FAMILIES.items() if pattern.search(hint)]
        if "autocast-lists" in found:
            found.remove("autocast")
        tags += found or ["other"]
    return [name for name in [*HINT_FAMILIES, "other"] if name in tags]


def case_id(target: str, model: str, precision: str, kind: str) -> str:
    """``tpu-gpt2-bf16-train``: one corpus row's name (also the test id)."""
    return f"{target}-{model}-{precision}-{kind}"


def all_cases(
    targets: tuple[str, ...] = TARGETS,
    models: tuple[str, ...] = MODELS,
    precisions: tuple[str, ...] = PRECISIONS,
    kinds: tuple[str, ...] = KINDS,
    idioms: tuple[str, ...] | None = None,
) -> list[tuple[str, str, str, str]]:
    """Every (target, model, precision, kind), in the order the table prints them.

    The idiom rows (``idioms``, default: all of :data:`idioms.IDIOMS`) follow each target's models.
    """
    names = tuple(IDIOMS) if idioms is None else idioms
    return [
        case
        for target in targets
        for case in [
            *(
                (target, model, precision, kind)
                for model in models
                for precision in precisions
                for kind in kinds
            ),
            *((target, name, precision, IDIOM) for name in names for precision in precisions),
        ]
    ]


def setup_source(model: str, precision: str, kind: str) -> str:
    """The plain setup cell for one corpus row."""
    return idiom_setup(model, precision) if kind == IDIOM else CASES[model].setup


def compiled_cases(targets: tuple[str, ...] = TARGETS) -> list[tuple[str, str, str, str]]:
    """The compiled rows: each of :data:`COMPILED_MODELS` in float32, compiled, per target."""
    return [
        (target, model, "fp32", COMPILED_KIND) for target in targets for model in COMPILED_MODELS
    ]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


_RNG_CHECK = """
import torch
def draws(device):
    torch.manual_seed(0)
    x = torch.randn(256, device=device)
    return [
        x,
        torch.rand(256, device=device),
        torch.randint(0, 128, (256,), device=device),
        torch.nn.functional.dropout(torch.ones(256, device=device), 0.3, training=True),
    ]
print(all(torch.equal(a, b.cpu()) for a, b in zip(draws("cpu"), draws("{target}"))))
"""


def device_rng_matches_cpu(target: str) -> bool:
    """Whether ``target`` draws the same random numbers as the CPU from the same seed.

    Checked on the draws the corpus makes (normal, uniform, integers, dropout masks); when they
    match, a hint blaming device random numbers for a difference is wrong. The device is emulated
    in a process of its own (the runner's process holds none).
    """
    env = {**os.environ, "NEURON_WORKBENCH_EMULATE": target}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "workbench"), env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [sys.executable, "-c", _RNG_CHECK.format(target=target)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] == "True"


def row_of(report: Any, *, model: str, precision: str, target: str, kind: str) -> dict[str, Any]:
    """The JSON row for one cell's report."""
    comparison = report.comparison
    failures = comparison.failures if comparison is not None else []
    errors = {}
    for role, run in (("ref", report.ref), ("target", report.target)):
        if run.error is not None:
            errors[role] = {
                "summary": run.error.summary,
                "message": run.error.message,
                "line": run.error.line,
            }
    return {
        "id": case_id(target, model, precision, kind),
        "model": model,
        "precision": precision,
        "target": target,
        "kind": kind,
        "verdict": report.verdict,
        "summary": report.summary(),
        "outputs": len(comparison.diffs) if comparison is not None else 0,
        "failures": [
            {
                "path": d.path,
                "status": d.status,
                "headline": d.headline(),
                "ref_dtype": d.ref_dtype,
                "target_dtype": d.target_dtype,
                "max_abs": d.max_abs,
                "max_rel": d.max_rel,
                "rtol": d.tolerance.rtol,
                "atol": d.tolerance.atol,
                "mismatched": d.mismatched,
                "numel": d.numel,
                "hints": list(d.hints),
            }
            for d in failures
        ],
        "hints": _unique([h for d in failures for h in d.hints]),
        "fallbacks": report.target.fallback_ops(),
        "errors": errors,
        "facts": {"ref": report.ref.facts.to_dict(), "target": report.target.facts.to_dict()},
        "first_divergence": _first_divergence(report),
        "compile": {
            role: _compiled(run) for role, run in (("ref", report.ref), ("target", report.target))
        },
        "budget": _worst_ratio(report),
    }


def _compiled(run: Any) -> dict[str, Any]:
    """What torch.compile did in one run: its graphs' backends, breaks, recompiles."""
    record = run.extras.get("compile")
    if record is None:
        return {"backends": [], "graphs": 0, "graph_breaks": 0, "recompiles": 0}
    return {
        "backends": record.backends(),
        "graphs": len(record.graphs),
        "graph_breaks": len(record.graph_breaks),
        "recompiles": len(record.recompiles),
    }


def _worst_ratio(report: Any) -> dict[str, Any] | None:
    """The output with the largest error ratio R (precision budget), or None when none was measured."""
    worst = report.budget.worst if getattr(report, "budget", None) is not None else None
    if worst is None:
        return None
    return {"path": worst.path, "ratio": worst.factor, "label": worst.label, "within": worst.within}


def _first_divergence(report: Any) -> str | None:
    """Where ``--layers`` says the difference was born: forward first, else backward."""
    if report.first_divergence is not None:
        return report.first_divergence.label
    backward = getattr(report.layers, "first_backward", None)
    return f"{backward.label} (backward)" if backward is not None else None


def run_cases(
    target: str, cases: list[tuple[str, str, str]], options: str = ""
) -> Iterator[dict[str, Any]]:
    """Run each (model, precision, kind) cell on ``target`` in this process; yield one row each.

    Each cell's target runs in its worker process, as in a user's kernel.
    """
    from IPython.utils.capture import capture_output

    from neuron_workbench.testing import run_cell, testing_shell

    shell = testing_shell()
    run_cell(shell, f'%config NeuronMagics.target = "{target}"')
    rng_matches = device_rng_matches_cpu(target)
    for model, precision, kind in cases:
        # A fresh namespace per cell: the setup builds the same seeded model each time.
        shell.reset(new_session=False)
        run_cell(shell, f"import sys; sys.path.insert(0, {str(HERE)!r})")
        started = time.perf_counter()
        with capture_output():
            run_cell(shell, setup_source(model, precision, kind))
            run_cell(
                shell,
                f"%%neuron --no-scan {options} -o corpus_report\n"
                + cell_source(model, precision, kind),
            )
        row = row_of(
            shell.user_ns["corpus_report"],
            model=model,
            precision=precision,
            target=target,
            kind=kind,
        )
        row["rng_matches_cpu"] = rng_matches
        row["seconds"] = round(time.perf_counter() - started, 2)
        yield row


def main(argv: list[str] | None = None) -> int:
    """Run one target's cases and print their rows as JSON lines, each as soon as it is done."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, required=True)
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated MODEL/PRECISION/KIND (default: every case), e.g. gpt2/bf16/train",
    )
    parser.add_argument("--options", default="", help="extra %%neuron options, e.g. --layers")
    args = parser.parse_args(argv)
    if os.environ.get("NEURON_WORKBENCH_EMULATE"):
        raise SystemExit("unset NEURON_WORKBENCH_EMULATE: the corpus runs targets in workers")
    cases = [tuple(c[1:]) for c in all_cases((args.target,))]
    if args.cases:
        cases = [tuple(text.split("/")) for text in args.cases.split(",")]
        known = {tuple(c[1:]) for c in all_cases() + compiled_cases()}
        for case in cases:
            if len(case) != 3 or case not in known:
                raise SystemExit(f"unknown case {'/'.join(case)}: use MODEL/PRECISION/KIND")
    for row in run_cases(args.target, cases, args.options):
        print(json.dumps(row), flush=True)
    return 0


def start(target: str, cases: list[tuple[str, str, str]], options: str = "") -> Any:
    """Start this runner for ``target`` in a subprocess (``subprocess.Popen``, stdout piped)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "workbench"), env.get("PYTHONPATH", "")) if p
    )
    env.pop("NEURON_WORKBENCH_EMULATE", None)
    env.pop("NEURON_WORKBENCH_TARGET", None)
    command = [sys.executable, str(Path(__file__)), "--target", target]
    command += ["--cases", ",".join("/".join(case) for case in cases)]
    if options:
        command.append(f"--options={options}")
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
    )


def crash_row(target: str, case: tuple[str, str, str], stderr: str) -> dict[str, Any]:
    """The row for a case whose process died (an abort, not a Python exception)."""
    model, precision, kind = case
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
    return {
        "id": case_id(target, model, precision, kind),
        "model": model,
        "precision": precision,
        "target": target,
        "kind": kind,
        "verdict": "CRASH",
        "summary": "the process died: " + " | ".join(tail),
        "outputs": 0,
        "failures": [],
        "hints": [],
        "fallbacks": [],
        "errors": {"process": {"summary": " | ".join(tail), "message": stderr[-4000:]}},
        "facts": {},
        "compile": {},
        "first_divergence": None,
        "budget": None,
        "rng_matches_cpu": None,
        "seconds": None,
    }


def corpus_rows(
    cases: list[tuple[str, str, str, str]] | None = None, *, options: str = "", timeout: float = 900
) -> list[dict[str, Any]]:
    """Run ``cases`` (default: all), one process per target, the targets in parallel.

    A case that kills its process (an abort in C++) becomes a ``CRASH`` row and the target's
    remaining cases go on in a fresh process.
    """
    cases = cases if cases is not None else all_cases()
    pending = {
        target: [tuple(c[1:]) for c in cases if c[0] == target]
        for target in dict.fromkeys(c[0] for c in cases)
    }
    rows: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while any(pending.values()):
        processes = {t: start(t, todo, options) for t, todo in pending.items() if todo}
        for target, process in processes.items():
            try:
                stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                raise
            done = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            for row in done:
                rows[row["id"]] = row
            todo = pending[target][len(done) :]
            if todo and process.returncode == 0:
                raise RuntimeError(f"corpus runner for {target} stopped early:\n{stderr[-4000:]}")
            if todo:
                rows[case_id(target, *todo[0])] = crash_row(target, todo[0], stderr)
                todo = todo[1:]
            pending[target] = todo
    return [rows[case_id(*case)] for case in cases]


if __name__ == "__main__":
    raise SystemExit(main())
