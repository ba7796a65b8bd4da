"""The real-model corpus as a table: model x precision x target x cell kind -> verdict, R, hints.

The kinds are fwd_bwd, train and train_compiled (GPT-2, Llama and ResNet, models compiled).

Usage: .venv/bin/python benchmarks/corpus.py [--json PATH] [--options=--layers] [ID_PREFIX ...]

Runs ``tests/corpus/corpus_runner.py`` (unmodified ``transformers`` and PyTorch-examples models as
CUDA-style cells through ``%%neuron``), one process per emulated target, both in parallel, and
prints one line per cell: the verdict, the worst error ratio R of the precision budget (every float
output with ``--options=--judge=budget``, else the failing ones), the hint families of its failing
outputs, the ops that fell back to CPU, and an error or the first failing output. The last line is
the wall time of the whole corpus (host CPU time; emulated devices, never accelerator performance).
``ID_PREFIX`` picks rows, e.g. ``tpu-gpt2`` or ``neuron-lstm-bf16``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "corpus"))

import corpus_runner  # noqa: E402  (lives with the tests it serves)


def table(rows: list[dict]) -> str:
    """One aligned line per row, in corpus order."""
    header = (
        "target", "model", "precision", "kind", "verdict", "R", "hints", "fallbacks", "detail",
    )  # fmt: skip
    lines = [header]
    for row in rows:
        if row["errors"]:
            detail = "; ".join(f"{role}: {e['summary']}" for role, e in row["errors"].items())
        elif row["failures"]:
            more = len(row["failures"]) - 1
            detail = row["failures"][0]["headline"] + (f" (+{more} more)" if more else "")
        else:
            detail = f"{row['outputs']} outputs match"
        if row.get("first_divergence"):
            detail = f"born at {row['first_divergence']}; {detail}"
        lines.append(
            (
                row["target"],
                row["model"],
                row["precision"],
                row["kind"],
                row["verdict"],
                _ratio(row.get("budget")),
                ",".join(corpus_runner.hint_tags(row["hints"])) or "-",
                str(len(row["fallbacks"])),
                detail[:110],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
        for line in lines
    )


def _ratio(budget: dict | None) -> str:
    """The worst error ratio R and its class (``-`` when not measured: nothing failed tolerance)."""
    if not budget:
        return "-"
    short = {"as accurate as the reference": "ok", "marginal": "marginal"}
    return f"{budget['ratio']} {short.get(budget['label'], 'less accurate')} at {budget['path']}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="row ids starting with these (default: all)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument(
        "--options",
        default="",
        help="extra %%neuron options for every cell, e.g. --options=--layers",
    )
    args = parser.parse_args(argv)
    cases = [
        case
        for case in corpus_runner.all_cases() + corpus_runner.compiled_cases()
        if not args.prefixes
        or any(corpus_runner.case_id(*case).startswith(p) for p in args.prefixes)
    ]
    started = time.perf_counter()
    rows = corpus_runner.corpus_rows(cases, options=args.options)
    elapsed = time.perf_counter() - started
    print(table(rows))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("PASS", "FAIL", "ERROR", "CRASH")}
    print(
        f"{len(rows)} cells: "
        + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        + f"; corpus wall time {elapsed:.1f} s (host CPU, both targets in parallel)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
