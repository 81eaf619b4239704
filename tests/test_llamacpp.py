"""The `llamacpp` bench section's own logic: reading llama-bench's and llama-speculative's
output (samples recorded from llama.cpp as built from llama-cpp-python 0.3.36), and skipping in
one line where llama.cpp cannot be built. Building and timing llama.cpp is the bench's job
(`jaxspec bench --pairs real`), not the suite's."""

from __future__ import annotations

import json

import pytest

from jaxspec_apps.bench import llamacpp

BENCH = "build: 0c1e570 (1)\n" + json.dumps(
    [
        {"n_prompt": 5, "n_gen": 0, "n_threads": 2, "avg_ts": 285.1, "model_type": "Q4_1"},
        {"n_prompt": 0, "n_gen": 64, "n_threads": 2, "avg_ts": 169.4, "model_type": "Q4_1"},
        {"n_prompt": 5, "n_gen": 0, "n_threads": 1, "avg_ts": 179.0, "model_type": "Q4_1"},
        {"n_prompt": 0, "n_gen": 64, "n_threads": 1, "avg_ts": 144.2, "model_type": "Q4_1"},
    ]
)

SPECULATIVE = """
0.26.496.906 I encoded   17 tokens in    1.207 seconds, speed:   14.088 t/s
0.26.496.950 I decoded   68 tokens in   22.630 seconds, speed:    3.005 t/s
0.26.496.985 I
0.26.497.022 I n_draft   = 4
0.26.497.058 I n_predict = 68
0.26.497.093 I n_drafted = 56
0.26.497.130 I n_accept  = 53
0.26.497.167 I accept    = 94.643%
"""


def test_llama_bench_json_is_read_per_test_and_thread_count():
    got = llamacpp.parse_bench(BENCH)
    assert got == {"pp5/t2": 285.1, "tg64/t2": 169.4, "pp5/t1": 179.0, "tg64/t1": 144.2}


def test_llama_speculative_summary_is_read():
    got = llamacpp.parse_speculative(SPECULATIVE)
    assert got == {"tokens": 68, "seconds": 22.63, "drafted": 56, "accepted": 53}
    with pytest.raises(llamacpp.Unavailable, match="no summary"):
        llamacpp.parse_speculative("error: failed to load model")


def test_without_cmake_the_section_is_skipped_in_one_line(tmp_path, monkeypatch):
    """No cmake (or compiler, or network): a `skipped` reason, not a failure, and nothing
    half-built left as if it were done."""
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(llamacpp.shutil, "which", lambda tool: None)
    res = llamacpp.run_section(_Ctx())
    assert set(res) == {"skipped"} and "\n" not in res["skipped"]
    assert "no cmake on PATH" in res["skipped"]
    assert not (llamacpp.home() / "build.json").exists()


def test_a_failing_tool_says_which_and_why():
    with pytest.raises(llamacpp.Unavailable, match=r"false exited 1"):
        llamacpp._run(["false"])
    with pytest.raises(llamacpp.Unavailable, match="no-such-tool"):
        llamacpp._run(["no-such-tool-for-jaxspec"])


class _Ctx:
    """What `run_section` reads before it needs llama.cpp: only its log."""

    @staticmethod
    def log(line: str) -> None:
        pass
