"""The corpus runner's process handling: a case that aborts its process does not hide the others."""

from __future__ import annotations

import json
import subprocess
import sys

import corpus_runner


def _fake_start(calls: list, abort_on: tuple[str, str, str]):
    """A ``start`` whose process prints a PASS row per case and aborts (C++-style) on one case."""

    def start(target, cases, options=""):
        calls.append(list(cases))
        lines = []
        for case in cases:
            if case == abort_on:
                lines.append("sys.stderr.write('terminate called without an active exception\\n')")
                lines.append("sys.stderr.flush(); os.abort()")
                break
            row = corpus_runner.crash_row(target, case, "")
            row["verdict"] = "PASS"
            lines.append(f"print({json.dumps(json.dumps(row))}, flush=True)")
        script = "import os, sys\n" + "\n".join(lines)
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return start


def test_a_case_that_kills_its_process_becomes_a_crash_row_and_the_rest_still_run(monkeypatch):
    cases = corpus_runner.all_cases(
        ("neuron",), ("gpt2", "bert"), ("fp32",), ("fwd_bwd", "train"), idioms=()
    )
    aborting = cases[1][1:]
    calls: list = []
    monkeypatch.setattr(corpus_runner, "start", _fake_start(calls, aborting))
    rows = corpus_runner.corpus_rows(cases, timeout=60)
    assert [row["id"] for row in rows] == [corpus_runner.case_id(*case) for case in cases]
    assert [row["verdict"] for row in rows] == ["PASS", "CRASH", "PASS", "PASS"]
    assert "terminate called without an active exception" in rows[1]["summary"]
    # The fresh process starts after the crashed case, not from the beginning.
    assert calls == [[c[1:] for c in cases], [c[1:] for c in cases[2:]]]
