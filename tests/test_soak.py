"""tools/soak.py briefly, on the tiny pair: `jaxspec serve` under the whole mix (streams,
whole answers, clients leaving mid-answer, bursts past the session limit, 10 MB bodies, a
slow reader) answers every request with what is expected, holds no session once the last
client left, and exits on SIGTERM. The hour on the real pair, and the bounds on growth and
the neighbour's latency, are the tool's to report (docs/service.md), not a test's."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests.grpc_helpers import server_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_short_soak_of_jaxspec_serve(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "tools/soak.py", "--stack", "colocated", "--pair", "tiny",
         "--minutes", "3", "--minute-s", "5", "--quiet-s", "2", "--json", str(out)],
        cwd=ROOT, env=dict(os.environ, **server_env(tmp_path / "jax-cache")),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    soak = json.loads(out.read_text())
    assert soak["unexpected"] == {} and soak["live_after"] == 0, soak
    seen = {kind for row in soak["rows"] for kind in row["statuses"]}
    assert {"10MB:413", "leave:left", "neighbour:200", "whole:200"} <= seen, seen
    assert {k for k in seen if k.startswith("slow:")} <= {"slow:200"}, seen  # (or still reading)
    assert seen & {"burst:429"}, seen  # the bursts went past the limit, refused cleanly
    assert all(row["serve_rss_mb"] > 0 and row["serve_maps"] > 0 for row in soak["rows"])
    assert set(soak["sigterm_exit_s"]) == {"serve"}
