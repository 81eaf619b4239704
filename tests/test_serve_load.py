"""tools/serve_load.py briefly, on the tiny pair: `jaxspec serve` started by the tool, ready
by its `/health`, a cell of streamed requests with `ignore_eos` (so every answer is exactly
the tokens asked for), its figures written, the server stopped after. The real pair's cells,
beside llama-server, are the tool's to report (docs/service.md), not a test's."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests.grpc_helpers import server_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_cell_against_jaxspec_serve(tmp_path):
    out = tmp_path / "cells.json"
    run = subprocess.run(
        [sys.executable, "tools/serve_load.py", "--concurrency", "2", "--requests", "3",
         "--tokens", "9", "--completions", "--json", str(out), "--",
         "jaxspec", "serve", "--pair", "tiny", "--max-len", "512", "--max-sessions", "4"],
        cwd=ROOT, env=dict(os.environ, **server_env(tmp_path / "jax-cache")),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["concurrency"] == 2 and row["requests"] == 3 and row["errors"] == [], row
    assert row["tokens_per_s"] > 0 and row["ttft_max_ms"] >= row["ttft_median_ms"] > 0, row
    assert row["output_tokens"] == 27, row  # 3 answers of 9 tokens
    assert row["ready_s"] > 0 and row["rss_mb"] > 0, row
