"""`jaxspec bench`: the whole suite at tiny sizes (report, results.json, plots), the greedy
equality check against transformers with a mutant it must catch, the analytic model held
equal to `proofs.latency`, and single sections with their sizes set on the command line
(`--sections X --set NAME=VALUE`), the kept-apart ones (target, adaptive) with their blocks
of BENCHMARKS.md and mutants they must catch. No speed is asserted: speeds are ratios of one
run."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import pathlib
import shutil
import tempfile
from fractions import Fraction

import jax
import pytest

import jaxspec
from jaxspec.ckpts.tiny import byte_tokenizer, tiny_config
from jaxspec.decoding import analytic
from jaxspec_apps import bench, cli
from jaxspec_apps.bench import adaptive, peer, target
from jaxspec_apps.bench.capacity import bisect_capacity, capacity_at
from jaxspec_apps.bench.common import GreedyMismatch, check_same_tokens
from jaxspec_apps.bench.profile import PROFILES, with_settings
from jaxspec_apps.bench.suite import _command, merge_real
from proofs import latency as proofs_latency

REPO = pathlib.Path(__file__).resolve().parents[1]

REQUIRED = (
    "colocated_speedup",
    "peer_plain_ratio",
    "peer_spec_ratio",
    "batch32_over_batch1",
    "batch_scaling_vs_roofline",
    "capacity_factor_measured",
    "capacity_factor_predicted",
    "pipelined_over_sync_at_50ms",
    "w4a16_bytes_ratio",
    "w4a16_ppl_ratio",
    "w4a16_alpha_ratio",
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny checkpoints with the byte tokenizer: a target, a draft close to it (the target's
    weights x 1.05) and an unrelated model (another seed). Weights x 3 keep the logits spread,
    so greedy decisions are far from ties and torch and JAX agree."""
    tok = byte_tokenizer()
    cfg = tiny_config(
        vocab_size=len(tok),
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=(tok.eos_token_id,),
    )
    root = tmp_path_factory.mktemp("bench_ckpt")

    def write(name, params):
        jaxspec.save(jaxspec.Model(config=cfg, params=params, tokenizer=tok), root / name)
        return str(root / name)

    base = jax.tree.map(lambda a: 3 * a, jaxspec.init_params(cfg, 0))
    return {
        "target": write("target", base),
        "draft": write("draft", jax.tree.map(lambda a: 1.05 * a, base)),
        "other": write("other", jax.tree.map(lambda a: 3 * a, jaxspec.init_params(cfg, 5))),
    }


def _bench(argv: list[str]) -> int:
    """`jaxspec bench ARGV` through the module's own hooks (what the CLI calls)."""
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.main(parser.parse_args(argv))


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _committed_report() -> dict[str, str]:
    """Digests of the repository's committed report files (BENCHMARKS.md, bench/*)."""
    files = [REPO / "BENCHMARKS.md", *sorted((REPO / "bench").glob("*"))]
    return {
        str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in files
        if f.is_file()
    }


def test_the_committed_report_renders_from_its_json_alone(tmp_path):
    """`jaxspec bench --render` over a copy of the committed JSON only (bench/results.json,
    each kept block's bench/<name>.json; quant.md is tools/quant_table.py's own) writes the
    committed BENCHMARKS.md and bench/*.md byte for byte, measuring nothing."""
    from jaxspec_apps.bench.render.templates import KEPT_ORDER

    (tmp_path / "bench").mkdir()
    for f in (REPO / "bench").glob("*.json"):
        shutil.copyfile(f, tmp_path / "bench" / f.name)
    shutil.copyfile(REPO / "bench" / "quant.md", tmp_path / "bench" / "quant.md")
    assert _bench(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "BENCHMARKS.md").read_text() == (REPO / "BENCHMARKS.md").read_text()
    blocks = [f"{n}.md" for n in KEPT_ORDER if (REPO / "bench" / f"{n}.md").is_file()]
    assert len(blocks) >= len(KEPT_ORDER) - 1  # every kept block but int4 is committed
    assert sorted(f.name for f in (tmp_path / "bench").glob("*.md")) == sorted(blocks)
    for name in blocks:
        assert (tmp_path / "bench" / name).read_bytes() == (REPO / "bench" / name).read_bytes()


def test_the_templates_follow_the_passes_order():
    """The renderer prints each pair's sections in the order its pass runs them."""
    from jaxspec_apps.bench import real, tiny
    from jaxspec_apps.bench.render import templates

    assert tuple(templates.TINY) == tuple(s.name for s in tiny.SECTIONS)
    for _, _, sections in real.REAL_PASSES.values():
        names = [s.name for s in sections]
        assert [n for n in templates.REAL if n in names] == names
    kept = {s.name: "tiny" for s in tiny.KEPT} | {s.name: "real" for s in real.KEPT}
    assert kept == {name: pair for name, (pair, _) in templates.KEPT.items()}


@pytest.fixture(scope="module")
def tiny_run(checkpoints, tmp_path_factory):
    """One `jaxspec bench --profile tiny` run without --out, shared by the tests that read a
    whole tiny pass (its compilations are paid once): the report directory it made under a
    temporary directory standing in for the system's, and what it left elsewhere."""
    tmp = tmp_path_factory.mktemp("tiny_run")
    before = _committed_report()
    cwd = tmp / "cwd"  # stands for the repository a user runs it in: the old default
    cwd.mkdir()  # (--out .) wrote there
    argv = ["--profile", "tiny", "--target", checkpoints["target"], "--draft", checkpoints["draft"]]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        mp.setattr(tempfile, "tempdir", str(tmp))
        rc = _bench(argv)
    return {
        "rc": rc,
        "committed_before": before,
        "committed_after": _committed_report(),
        "left_in_cwd": list(cwd.iterdir()),
        "outs": list(tmp.glob("jaxspec-bench-*")),
    }


def test_the_tiny_suite_writes_the_report_results_and_plots(tiny_run):
    """Without --out, the report goes to a new temporary directory (here under tmp_path):
    the repository's committed BENCHMARKS.md, bench/results.json and plots stay as they are."""
    before = tiny_run["committed_before"]
    assert "BENCHMARKS.md" in before and "bench/results.json" in before
    assert tiny_run["rc"] == 0
    assert tiny_run["left_in_cwd"] == [] and tiny_run["committed_after"] == before
    (out,) = tiny_run["outs"]
    res = json.loads((out / "bench" / "results.json").read_text())
    assert "--out" not in res["command"]
    assert res["failures"] == {} and res["skipped"] == {}
    for key in REQUIRED:
        assert _number(res[key]) and res[key] > 0, key
    assert set(res["roofline_fraction"]) == {"batch1", "batch32"}
    assert all(0 < v for v in res["roofline_fraction"].values())
    assert set(res["wire_bytes_per_token"]) == {
        "full", "sparse4", "sparse16", "full-f16", "sparse4-f16", "sparse16-f16", "onehot"
    }  # fmt: skip
    m = res["machine"]
    assert m["cores"] >= 1 and m["memory_bytes"] > 0 and m["jax"] == jax.__version__

    s = res["sections"]
    # The headline numbers are the sections' own measurements.
    (row,) = [r for r in s["colocated"]["default_pair"] if r["temperature"] == 0]
    assert res["colocated_speedup"] == row["speedup"] == row["spec_tok_s"] / row["plain_tok_s"]
    assert 0 <= row["alpha"] <= 1 and row["tokens_per_round"] >= 1
    cap = s["capacity"]["capacity"]
    assert res["capacity_factor_measured"] == (
        cap["edge_cloud"]["clients"] / cap["colocated"]["clients"]
    )
    c = s["capacity"]
    assert res["capacity_factor_predicted"] == 1 + 4 * c["t_d"] / c["t_v"]
    per = c["verify_per_client_s"]  # the term the factor leaves out: the verify batching
    ns = sorted(per, key=int)
    assert ns[0] == "1" and c["verify_batching_gain"] == per["1"] / per[ns[-1]]
    at50 = next(r for r in s["latency"]["rows"] if r["rtt_ms"] == 50)["measured"]
    assert res["pipelined_over_sync_at_50ms"] == at50["sync"] / at50["pipelined"]
    # One co-located row per (gamma, mode), its speedup the ratio of the tokens/s measured.
    rows = s["colocated"]["default_pair"]
    assert [(r["gamma"], r["mode"]) for r in rows] == [(4, "sync")]
    for r in rows:
        assert r["speedup"] > 0 and 0 <= r["alpha"] <= 1 and r["tokens_per_round"] >= 1
        assert r["speedup"] == r["spec_tok_s"] / r["plain_tok_s"]
    # The verifier's batch sweep against its roofline.
    roof, rows = s["verifier"]["roofline"], s["verifier"]["rows"]
    assert roof["bandwidth_Bps"] > 0 and roof["flops_per_s"] > 0
    assert [r["batch"] for r in rows] == [1, 32] and rows[0]["ratio_to_batch1"] == 1.0
    for r in rows:
        assert r["step_s"] > 0 and r["roofline_s"] == max(r["memory_floor_s"], r["compute_floor_s"])
    # The latency model: every mode measured and predicted at each RTT; its sync prediction
    # grows by exactly the RTT difference divided by E[A].
    lat = s["latency"]
    assert [r["rtt_ms"] for r in lat["rows"]] == [0, 50]
    for r in lat["rows"]:
        for mode in ("cloud_ar", "colocated", "sync", "pipelined"):
            assert r["measured"][mode] > 0 and r["predicted"][mode] > 0
    p0, p50 = (r["predicted"]["sync"] for r in lat["rows"])
    e_a = proofs_latency.expected_tokens(lat["components"]["alpha"], 4)
    assert abs((p50 - p0) - 0.050 / e_a) < 1e-9
    # Bytes per block follow the encodings' payloads: vocab floats > 16 pairs > 4 > ids only.
    up = {r["encoding"]: r["bytes_per_block_up"] for r in s["wirecost"]["rows"]}
    assert up["full"] > up["sparse16"] > up["sparse4"] > up["onehot"] > 0
    # float16 q: about half the bytes of full q per block, and less for sparse.
    assert up["full-f16"] < 0.6 * up["full"] and up["sparse16-f16"] < up["sparse16"]
    assert all(0 <= r["alpha"] <= 1 for r in s["wirecost"]["rows"])
    # int4 tiles are 64 output columns wide: this tiny model's 32-wide layers pad to twice
    assert res["w4a16_bytes_ratio"] < 0.5
    assert s["peer"]["new_tokens"] > 0

    md = (out / "BENCHMARKS.md").read_text()
    assert res["command"] in md and f"{m['cores']} CPU cores" in md
    for heading in (
        "## Headline numbers",
        "## 1. Co-located",
        "## 2. Peer",
        "## 3. Multi-tenant capacity",
        "### RTT sweep",
        "### Batch sweep",
        "## 5. Wire cost",
        "## W4A16 draft quality",
    ):
        assert heading in md, heading
    assert "identical tokens on every prompt (asserted)" in md
    assert "| speedup |" in md and "of roofline" in md and "| RTT ms |" in md
    for name in ("colocated", "peer", "capacity", "rtt", "batch", "wire"):
        png = out / "bench" / f"{name}.png"
        assert png.stat().st_size > 1000 and f"(bench/{name}.png)" in md


REAL_REQUIRED = (
    "plain_roofline_fraction",
    "peer_plain_ratio",
    "colocated_speedup",
    "colocated_vs_analytic",
    "peer_spec_ratio",
    "alpha_t0",
    "alpha_t07",
    "draft_cost_ratio",
    "capacity_factor_measured",
    "capacity_factor_predicted",
    "capacity_vs_cloud_ar",
    "verify_over_decode",
)


def test_the_real_pass_adds_its_object_and_keeps_the_tiny_keys(checkpoints, tiny_run, tmp_path):
    """`--pairs real` on a report already there (a copy of `tiny_run`'s): `results["real"]`
    gets every key the issue lists (here with tiny stand-ins: a W4A16 draft, which the peer
    gets dequantized), the tiny pair's keys and sections stay, and the report puts the real
    pair first."""
    assert tiny_run["rc"] == 0
    shutil.copytree(tiny_run["outs"][0], tmp_path, dirs_exist_ok=True)
    before = json.loads((tmp_path / "bench" / "results.json").read_text())
    q = jaxspec.quantize(jaxspec.load(checkpoints["draft"]), "w4a16", 16, method="asym")
    jaxspec.save(q, tmp_path / "draft-w4a16")
    argv = ["--profile", "tiny", "--out", str(tmp_path), "--pairs", "real", "--sections"]
    argv += ["specbench,cost,colocated,peer,verifier,capacity"]  # wirecost, quality: the suite's
    argv += ["--real-target", checkpoints["target"], "--real-draft", str(tmp_path / "draft-w4a16")]
    assert _bench(argv) == 0
    res = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert res["peer_plain_ratio"] == before["peer_plain_ratio"]
    assert res["sections"] == before["sections"]
    real = res["real"]
    assert "--pairs real" in real["command"] and res["failures"] == {}
    for key in REAL_REQUIRED:
        assert _number(real[key]) and real[key] > 0, key
    assert 0 <= real["alpha_t0"] <= 1 and real["tokens_per_round_t0"] >= 1
    assert set(real["verify_roofline_fraction"]) == {"1", "32"}
    assert "wire_bytes_per_token" not in real and "quality" not in real["sections"]
    s = real["sections"]
    assert [r["category"] for r in s["specbench"]["rows"]] == [
        "coding", "explanation", "summarization", "math", "rewriting"
    ]  # fmt: skip
    assert real["colocated_speedup"] == s["specbench"]["auto"]["overall"]["speedup"]
    assert real["colocated_speedup_gamma4"] == s["specbench"]["overall"]["speedup"]
    assert all(0 <= g <= 8 for g in s["specbench"]["auto"]["overall"]["gammas"])
    parts = s["specbench"]["parts"]  # what a round of exactly its forwards allows
    assert parts["round_s"] > parts["verify_s"] > 0 and parts["draft2_s"] > 0
    assert real["colocated_vs_parts"] == s["specbench"]["overall"]["speedup"] / parts["speedup"]
    assert real["draft_cost_ratio"] == (
        s["cost"]["draft"]["s_per_token"] / s["cost"]["target"]["s_per_token"]
    )
    assert s["verifier"]["rows"][0]["kv_bytes"] > 0
    assert real["models"]["draft_quantization"] and "w4a16" in real["models"]["draft_quantization"]
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert md.index("## The real pair") < md.index("## The tiny pair") < md.index("### 2. Peer")
    assert "### Spec-Bench" in md and "| **overall** |" in md


def test_check_same_tokens_names_the_first_difference():
    check_same_tokens("same", [1, 2, 3], (1, 2, 3))
    with pytest.raises(GreedyMismatch, match="at new token 2"):
        check_same_tokens("x", [1, 2, 3, 4], [1, 2, 9, 4])
    with pytest.raises(GreedyMismatch, match=r"at new token 2 \(lengths 2 vs 3\)"):
        check_same_tokens("x", [1, 2], [1, 2, 3])


def test_the_peer_comparison_catches_a_model_that_decodes_differently(checkpoints):
    """Mutant: transformers is given another checkpoint than ours. The comparison must refuse
    to report ratios."""
    target, draft = jaxspec.load(checkpoints["target"]), jaxspec.load(checkpoints["draft"])
    prompts = [[5, 6, 7, 8, 9]]
    kw = dict(new_tokens=8, gamma=4, repeats=1)
    ok = peer.run(target, draft, checkpoints["target"], checkpoints["draft"], prompts, **kw)
    assert ok["new_tokens"] == 8
    with pytest.raises(GreedyMismatch, match="vs hf_plain"):
        peer.run(target, draft, checkpoints["other"], checkpoints["draft"], prompts, **kw)


def test_a_mismatch_fails_the_command_but_still_writes_the_report(
    checkpoints, tmp_path, monkeypatch
):
    load_hf = peer.load_hf

    def wrong_target(path):  # the mutant: transformers decodes an unrelated model
        return load_hf(checkpoints["other"] if str(path) == checkpoints["target"] else path)

    monkeypatch.setattr(peer, "load_hf", wrong_target)
    argv = ["--profile", "tiny", "--out", str(tmp_path), "--sections", "peer"]
    argv += ["--target", checkpoints["target"], "--draft", checkpoints["draft"]]
    assert _bench(argv) == 1
    res = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert "greedy tokens differ" in res["failures"]["peer"]
    assert "peer_plain_ratio" not in res
    assert "## FAILED" in (tmp_path / "BENCHMARKS.md").read_text()


def test_the_analytic_model_equals_the_proofs_exactly():
    """`jaxspec.decoding.analytic` is the installed copy of `proofs/latency.py`'s formulas."""
    fracs = [Fraction(0), Fraction(1, 3), Fraction(9, 10), Fraction(1)]
    times = [Fraction(1, 7), Fraction(2), Fraction(5)]
    for g, a, td, tv, rtt, depth in itertools.product(
        range(1, 5), fracs, times, times, [Fraction(0), Fraction(3)], range(1, 4)
    ):
        assert analytic.expected_tokens(a, g) == proofs_latency.expected_tokens(a, g)
        assert analytic.sync_token_time(g, a, td, rtt, tv) == proofs_latency.sync_token_time(
            g, a, td, rtt, tv
        )
        assert analytic.colocated_token_time(g, a, td, tv) == (
            proofs_latency.colocated_token_time(g, a, td, tv)
        )
        assert analytic.pipelined_token_time(g, a, td, rtt, tv, depth) == (
            proofs_latency.pipelined_expected_token_time(g, a, td, rtt, tv, depth)
        )
        assert analytic.capacity_factor(g, td, tv) == proofs_latency.capacity_gain(g, td, tv)


def test_capacity_is_found_by_bisection_to_the_stated_precision():
    """A server whose per-client rate is 100 * c / N sustains exactly c clients at 100: the
    bisection brackets c within 12.5% (capped and fractional capacities too), probing each N
    once, and a mutant that stops at the doubling (no bisection) is off by far more."""
    for c in (0.3, 1, 3.5, 7, 20.2, 50, 127):
        probes = []

        def rate_at(n, c=c, probes=probes):
            probes.append(n)
            return 100 * c / n

        got = bisect_capacity(rate_at, 100, start=4, max_clients=128)
        assert not got["censored"] and len(probes) == len(set(probes)) <= 10
        lo, hi = got["bracket"]
        assert (lo <= c <= hi and hi - lo <= max(1, 0.125 * lo)) or (c < 1 and lo == hi == 1)
        assert got["clients"] == pytest.approx(c, rel=0.13)
    capped = bisect_capacity(lambda n: 100 * 500 / n, 100, start=4, max_clients=64)
    assert capped["censored"] and capped["clients"] == 64
    coarse = bisect_capacity(lambda n: 100 * 20.2 / n, 100, start=4, max_clients=128, precision=8)
    assert coarse["bracket"] == [16, 32]  # the doubling's bracket alone: 40% off at worst


def test_a_partial_real_pass_replaces_its_sections_and_names_the_earlier_run():
    old = {
        "command": "bench A",
        "wall_time_s": 60.0,
        "machine": {},
        "alpha_t0": 0.8,
        "draft_cost_ratio": 0.5,
        "sections": {"specbench": 1, "cost": 2, "capacity": 3},
    }
    new = {"command": "bench B", "wall_time_s": 30.0, "machine": {}, "draft_cost_ratio": 0.4,
           "sections": {"cost": 20, "capacity": 30}}  # fmt: skip
    m = merge_real(old, new)
    assert m["sections"] == {"specbench": 1, "cost": 20, "capacity": 30}
    assert (m["command"], m["alpha_t0"], m["draft_cost_ratio"]) == ("bench B", 0.8, 0.4)
    assert m["earlier_runs"] == [
        {"command": "bench A", "wall_time_s": 60.0, "machine": {}, "sections": ["specbench"]}
    ]
    again = merge_real(m, new | {"command": "bench C", "sections": {"specbench": 10}})
    assert again["sections"] == {"specbench": 10, "cost": 20, "capacity": 30}
    assert [e["command"] for e in again["earlier_runs"]] == ["bench B"]


def test_capacity_interpolates_between_measured_client_counts():
    assert capacity_at([1, 2, 4], [300, 200, 100], 150) == {"clients": 3.0, "censored": False}
    assert capacity_at([1, 2, 4], [300, 200, 180], 150) == {"clients": 4.0, "censored": True}
    assert capacity_at([1, 2], [50, 20], 100) == {"clients": 0.5, "censored": False}


def test_the_cli_parses_bench_options():
    """`jaxspec bench` is registered on the CLI with the defaults the report relies on: no
    --out (a temporary directory), so only an explicit `--out .` rewrites the committed
    report, and the report's command line says so."""
    args = cli.build_parser().parse_args(["bench", "--quick"])
    assert args.quick and args.out is None and args.target == "default"
    assert _command(args) == "jaxspec bench --quick"
    args = cli.build_parser().parse_args(["bench", "--out", "."])
    assert _command(args) == "jaxspec bench --out ."


def test_the_kernels_section_times_both_paths_in_one_run(monkeypatch):
    """`kernels` (real pair): every format x layout x row count and every model shape, the
    float kernel and XLA's ops each timed; its table names them all."""
    from jaxspec import kernels as cpu_kernels
    from jaxspec_apps.bench import kernels
    from jaxspec_apps.bench.render import kernels as kernels_md

    # two row counts and two model shapes (each is a compilation of both paths)
    monkeypatch.setattr(kernels, "ROWS", (1, 16))
    monkeypatch.setattr(kernels, "SHAPES", ((1, 1), (16, 5)))
    res = kernels.run(jaxspec.load("default"), repeats=1, chain=2)
    if not cpu_kernels.available():
        assert res == {"skipped": cpu_kernels.status()}
        return
    assert len(res["matmul"]) == 2 * 2 * len(kernels.ROWS)
    assert [(r["rows"], r["positions"]) for r in res["model"]] == list(kernels.SHAPES)
    for r in res["matmul"] + res["model"]:
        assert r["kernel_ms"] > 0 and r["xla_ms"] > 0
    md = "\n".join(kernels_md.table_md(res))
    assert "| bfloat16 | NT (table) | 16 |" in md and "| 16 x 5 |" in md


def _pair(checkpoints) -> list[str]:
    return ["--target", checkpoints["target"], "--draft", checkpoints["draft"]]


def test_the_target_section_compares_with_transformers_and_splices_its_block(tmp_path, monkeypatch):
    """`--pairs real --sections target` (here on the shipped tiny target, at the tiny
    profile's sizes) writes bench/target.json and its block of the report in place, and a
    greedy mismatch with transformers fails the command."""
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\nsuite text\n\n## Reproduce\n\njaxspec bench\n")
    argv = ["--profile", "tiny", "--pairs", "real", "--sections", "target"]
    argv += ["--real-target", "default", "--out", str(tmp_path)]
    assert _bench(argv) == 0
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
    assert "<!-- begin: written by jaxspec bench --pairs real --sections target," in text
    # A rerun replaces the section (one copy), and a greedy mismatch fails the command.
    monkeypatch.setattr(target, "_theirs", lambda hf, ids, n: [0] * n)
    assert _bench(argv) == 1
    text = report.read_text()
    assert text.count("## Real target: default") == 1 and "**DIFFER**" in text


def test_the_adaptive_section_checks_tokens_and_writes_its_block(checkpoints, tmp_path):
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\n## Reproduce\n")
    argv = ["--profile", "tiny", "--sections", "adaptive", *_pair(checkpoints)]
    sizes = ["--set", "adaptive_rtts_ms=0,20", "--set", "adaptive_longest=2"]
    sizes += ["--set", "adaptive_new_tokens=8", "--set", "adaptive_prompts=1"]
    assert _bench([*argv, *sizes, "--out", str(tmp_path)]) == 0
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
    assert (tmp_path / "bench" / "adaptive.png").stat().st_size > 1000
    # A run whose tokens differ from the others' is a failure (exit status 1), not a number.
    real = adaptive._session

    async def wrong(*a, **kw):
        toks, s, used, figures = await real(*a, **kw)
        return ([*toks[:-1], toks[-1] + 1] if a[3] == "auto" else toks), s, used, figures

    adaptive._session = wrong
    try:
        sizes = ["--set", "adaptive_rtts_ms=0", "--set", "adaptive_longest=2"]
        sizes += ["--set", "adaptive_new_tokens=4"]
        assert _bench([*argv, *sizes, "--out", str(tmp_path / "mutant")]) == 1
    finally:
        adaptive._session = real


def test_sections_and_settings_are_checked_before_anything_runs(tmp_path):
    """An unknown section, a kept section of the other pair, or a --set that names no field
    or cannot be read, is an error; a --set value reads as its field's type."""
    for argv, match in (
        (["--sections", "nope"], "unknown sections"),
        (["--pairs", "tiny", "--sections", "target"], "unknown sections"),
        (["--pairs", "real", "--sections", "adaptive"], "unknown sections"),
        (["--set", "gammas"], "NAME=VALUE"),
        (["--set", "nope=1"], "NAME=VALUE"),
        (["--set", "int4_offset=maybe"], "true or false"),
    ):
        with pytest.raises(ValueError, match=match):
            _bench(["--profile", "tiny", "--out", str(tmp_path), *argv])
    assert not (tmp_path / "bench").exists()
    p = with_settings(
        PROFILES["full"],
        ["gammas=2,4", "rtts_ms=0,20", "fleet_seconds=20", "int4_offset=true",
         "real_prompt_tokens=none", "modes=sync"],
    )  # fmt: skip
    assert (p.colocated.gammas, p.latency.rtts_ms, p.fleet.seconds) == ((2, 4), (0, 20), 20.0)
    assert (p.int4.offset, p.real_prompt_tokens, p.colocated.modes) == (True, None, ("sync",))


def test_the_two_process_section_pins_both_sides_and_predicts(checkpoints, tmp_path):
    """`--pairs real --sections two_process` on the tiny pair: a verifier process and an edge
    process (pinned where 2 cores are free), every mode timed at each RTT with its model's
    prediction, the same greedy tokens in every session, its block and plot written."""
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\n## Reproduce\n")
    argv = ["--profile", "tiny", "--pairs", "real", "--sections", "two_process"]
    argv += ["--real-target", checkpoints["target"], "--real-draft", checkpoints["draft"]]
    assert _bench([*argv, "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "bench" / "two_process.json").read_text())
    assert [row["rtt_ms"] for row in r["rows"]] == [0, 50] and not r["tokens_differ"]
    assert r["t_d"] > 0 and r["t_v"] > 0 and r["cloud_streamed"] > 0
    for row in r["rows"]:
        for mode in ("pipelined", "sync"):
            assert row[mode] > 0 and row[f"predicted_{mode}"] > 0
            assert row[f"{mode}_vs_model"] == row[mode] / row[f"predicted_{mode}"]
        # Two cloud baselines: the streamed plain loop (the same at every RTT), gamma 0.
        assert row["cloud_streamed"] == r["cloud_streamed"]
        assert row["edge_over_cloud_ar"] == row["cloud_streamed"] / row["pipelined"]
        assert row["edge_over_cloud_gamma0"] == row["cloud_gamma0"] / row["pipelined"]
        assert row["session_depth"] == min(8, row["depth"] + 1)
        for kind in ("pipelined", "sync", "cloud_gamma0", "cloud_gamma0_sync"):
            assert row[kind] > 0 and sum(row[f"{kind}_stalls"].values()) == pytest.approx(1.0)
    # The model's sync time grows by exactly the RTT difference over E[A] (same alpha).
    r0, r50 = r["rows"]
    if r0["sync_alpha"] == r50["sync_alpha"]:
        e_a = proofs_latency.expected_tokens(r0["sync_alpha"], 4)
        assert abs((r50["predicted_sync"] - r0["predicted_sync"]) - 0.050 / e_a) < 1e-9
    assert r["pipelined_vs_model"] == max(r0["pipelined_vs_model"], r50["pipelined_vs_model"])
    assert r["edge_over_cloud_ar"] == r50["edge_over_cloud_ar"]
    assert r["gamma0_over_decode"] == r0["cloud_gamma0"] / r["cloud_streamed"]
    assert r50["cloud_gamma0_sync_stalls"]["wait_wire"] > 0  # a round trip per token
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Two processes" in text and "**cloud streamed**" in text
    assert (tmp_path / "bench" / "two_process.png").stat().st_size > 1000


def test_the_round_profile_section_buckets_each_modes_time(checkpoints, tmp_path):
    """`--pairs real --sections round_profile` on the tiny pair: every mode's time per token
    and its profiled time in buckets that add up to at most the whole run."""
    argv = ["--profile", "tiny", "--pairs", "real", "--sections", "round_profile"]
    argv += ["--real-target", checkpoints["target"], "--real-draft", checkpoints["draft"]]
    assert _bench([*argv, "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "bench" / "round_profile.json").read_text())
    edges = {"edge sync", "edge pipelined", "edge pipelined, 50 ms"}
    assert set(r["modes"]) == {"plain", "colocated", *edges}
    for name, m in r["modes"].items():
        assert m["s_per_token"] > 0 and m["top"]
        assert 0.5 < sum(m["shares"].values()) <= 1.0 + 1e-9
        assert m["shares"]["device"] > 0  # the model's compute is waited for somewhere
        if name in edges:  # the session's own split of its wall time
            assert sum(m["stalls"].values()) == pytest.approx(1.0)
            assert min(m["stalls"].values()) >= 0 and m["stalls"]["draft_kept"] > 0
    assert r["modes"]["edge pipelined, 50 ms"]["stalls"]["wait_wire"] > 0
    # Each jitted program against its forwards timed alone.
    rows = {x["program"]: x for x in r["program_vs_parts"]["rows"]}
    assert set(rows) == {"plain decode token", "co-located round", "drafter round",
                         "gamma-0 step", "verify step 1x5", "verify step 2x5"}  # fmt: skip
    for x in rows.values():
        assert x["parts_s"] > 0 and x["ratio"] == x["measured_s"] / x["parts_s"]
    assert rows["gamma-0 step"]["host_s"] >= 0 and rows["drafter round"]["host_s"] is None
    # The co-located round's device account: every part of a round found in the trace.
    acc = r["device_account"]
    assert acc["rounds"] > 0 and acc["device_wall_s"] > 0 and acc["host_s"] >= 0
    for part in ("draft forwards", "draft sampling (q)", "verify forward", "rule and commit"):
        assert acc["parts_s"][part] > 0, part
    assert acc["parts_s"]["prefill: draft (per call)"] > 0
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Where a round's time goes" in text and "`program_vs_parts`" in text
    assert "device account (`jax.profiler`)" in text
    assert "### Where the edge sessions stall" in text


def test_the_device_account_puts_each_op_under_its_part_and_leaves_the_host_out():
    """`device_account.account` on a made-up trace: ops under the part their op_name says,
    control-flow spans and the executor's own spans not counted (their ops are), the host's
    thread (named after the process, not "python") kept out of the parts, and the device's
    wall read off the runtime's wait."""
    from jaxspec_apps.bench import device_account
    from jaxspec_apps.bench.roundprofile import colocated_part

    def ev(name, dur_us, tid, thread):
        return {"name": name, "dur": dur_us, "pid": 1, "tid": tid, "thread": thread, "ph": "X"}

    host, xla = (0, "jaxspec"), (1, "tf_XLAEigen/1")
    events = [
        ev("$bench.py:1 run", 1000, *host), ev("PjitFunction(f)", 900, *host),
        ev(device_account.WAIT, 800, 2, "tf_XLAPjRtCpuClient/1"),
        ev("ThunkExecutor::Execute", 700, *xla), ev("while.3", 600, *xla),
        ev("ffi_call.1", 300, *xla), ev("end: ffi_call.1", 1, *xla),
        ev("ffi_call.2", 200, *xla), ev("add_fusion.4", 50, *xla), ev("copy.5", 10, *xla),
    ]  # fmt: skip
    scopes = {"ffi_call.1": "round_draft/Llama/layers_0/x", "ffi_call.2": "round_target/Llama/x",
              "add_fusion.4": "round_rule/add", "copy.5": "copy"}  # fmt: skip
    text = "\n".join(
        f'  %{k} = f32[1] op(), metadata={{op_name="jit(f)/while/body/{v}"}}'
        for k, v in scopes.items()
    )
    acc = device_account.account(events, device_account.op_names(text), colocated_part)
    assert acc["parts_s"] == pytest.approx({"draft forwards": 3e-4, "verify forward": 2e-4,
                                            "rule and commit": 5e-5, "copies": 1e-5})  # fmt: skip
    assert acc["device_wall_s"] == pytest.approx(8e-4) and set(acc) == {"parts_s", "device_wall_s"}
