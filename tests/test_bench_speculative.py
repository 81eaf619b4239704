"""The co-located benchmark's code, run at tiny sizes (the real run is in the README)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

_path = pathlib.Path(__file__).parents[1] / "tools" / "bench_speculative.py"
_spec = importlib.util.spec_from_file_location("bench_speculative", _path)
bench_speculative = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_speculative)


def test_tiny_benchmark_reports_ratios_and_alpha(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert (
        bench_speculative.main(
            ["--tiny", "--gammas", "2", "--temperatures", "0", "--json", str(out)]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["gamma"], r["mode"]) for r in rows] == [(2, "sync"), (2, "pipelined")]
    for r in rows:
        assert r["speedup"] > 0 and 0 <= r["alpha"] <= 1 and r["tokens_per_round"] >= 1
        assert r["speedup"] == r["spec_tok_s"] / r["plain_tok_s"]
    assert "speedup" in capsys.readouterr().out
