"""The benchmarks' code, run at tiny sizes (the real runs: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

from proofs import latency


def _tool(name: str):
    path = pathlib.Path(__file__).parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_speculative = _tool("bench_speculative")
bench_verifier = _tool("bench_verifier")


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


def test_tiny_verifier_benchmark_reports_batch_ratios_and_roofline(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert bench_verifier.main(["--tiny", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    roof, rows = res[0]["roofline"], res[1:]
    assert roof["bandwidth_Bps"] > 0 and roof["flops_per_s"] > 0
    assert [r["batch"] for r in rows] == [1, 2, 4]
    assert rows[0]["ratio_to_batch1"] == 1.0
    for r in rows:
        assert r["step_s"] > 0 and r["roofline_s"] == max(r["memory_floor_s"], r["compute_floor_s"])
    assert "of roofline" in capsys.readouterr().out


def test_tiny_latency_benchmark_writes_table_json_and_plot(tmp_path):
    bench_latency = _tool("bench_latency")
    out = tmp_path / "lat"
    assert bench_latency.main(["--tiny", "--out", str(out)]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["rtt_ms"] for r in res["rows"]] == [0, 20]
    for r in res["rows"]:
        for mode in ("cloud_ar", "colocated", "sync", "pipelined"):
            assert r["measured"][mode] > 0 and r["predicted"][mode] > 0
    # The model's sync prediction grows by exactly the RTT difference divided by E[A].
    p0, p20 = (r["predicted"]["sync"] for r in res["rows"])
    e_a = latency.expected_tokens(res["components"]["alpha"], 4)
    assert abs((p20 - p0) - 0.020 / e_a) < 1e-9
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "| RTT ms |" in out.with_suffix(".md").read_text()


def test_target_benchmark_compares_with_transformers_and_splices_its_section(tmp_path, monkeypatch):
    bench_target = _tool("bench_target")
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\nsuite text\n\n## Reproduce\n\njaxspec bench\n")
    argv = ["--checkpoint", "default", "--new-tokens", "10", "--repeats", "1", "--prompts", "1"]
    argv += ["--roofline-mib", "8", "--out", str(tmp_path)]
    assert bench_target.main(argv) == 0
    r = json.loads((tmp_path / "bench" / "target.json").read_text())
    (row,) = r["rows"]
    assert row["identical_greedy_tokens"] and not r["mismatches"] and not r["chat"]
    # At tiny sizes t(N) - t(8) is noise (it came out negative once on a loaded machine):
    # the numbers must exist and be finite, their size means nothing here.
    for key in ("jaxspec_f32_tok_per_s", "jaxspec_bf16_tok_per_s", "transformers_f32_tok_per_s"):
        assert math.isfinite(r[key])
    text = report.read_text()
    assert (
        text.index("suite text")
        < text.index("## Real target: default")
        < text.index("## Reproduce")
    )
    # A rerun replaces the section (one copy), and a greedy mismatch fails the tool.
    monkeypatch.setattr(bench_target, "_theirs", lambda hf, ids, n: [0] * n)
    assert bench_target.main(argv) == 1
    text = report.read_text()
    assert text.count("## Real target: default") == 1 and "**DIFFER**" in text


def test_adaptive_gamma_sweep_checks_tokens_and_writes_its_section(tmp_path):
    bench_adaptive = _tool("bench_adaptive")
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\n## Reproduce\n")
    argv = ["--tiny", "--rtts-ms", "0,20", "--max-gamma", "2", "--new-tokens", "8"]
    assert bench_adaptive.main([*argv, "--prompts", "1", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "bench" / "adaptive.json").read_text())
    assert not r["failures"] and [row["rtt_ms"] for row in r["rows"]] == [0, 20]
    for row in r["rows"]:
        assert set(row["token_s"]) == {"1", "2", "auto"}
        assert row["auto_over_best"] == row["token_s"]["auto"] / min(
            row["token_s"][g] for g in ("1", "2")
        )
        assert sum(row["auto_gammas"].values()) > 0
    assert r["summary"]["worst_point_ratio"] == max(x["auto_over_best"] for x in r["rows"])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text.index("## Adaptive gamma") < text.index("## Reproduce")
    # A run whose tokens differ from the others' is a failure (exit status 1), not a number.
    real = bench_adaptive.adaptive._session

    async def wrong(*a, **kw):
        toks, s, used = await real(*a, **kw)
        return ([*toks[:-1], toks[-1] + 1] if a[3] == "auto" else toks), s, used

    bench_adaptive.adaptive._session = wrong
    try:
        argv = ["--tiny", "--rtts-ms", "0", "--max-gamma", "2", "--new-tokens", "4"]
        assert bench_adaptive.main(argv) == 1
    finally:
        bench_adaptive.adaptive._session = real
