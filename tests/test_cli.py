"""The `jaxspec` command as a user runs it (a real subprocess of the installed script)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest


def _jaxspec(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("jaxspec")
    cmd = [exe] if exe else [sys.executable, "-m", "jaxspec_apps.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "tiny"
    r = _jaxspec("init-random", str(d))
    assert r.returncode == 0, r.stderr
    return d


def test_generate_prints_prompt_and_completion(tiny_dir):
    r = _jaxspec(
        "generate", "--checkpoint", str(tiny_dir), "--prompt", "def f(x):",
        "--max-new-tokens", "8", "--temperature", "0",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def f(x):")
    # Compilation and generation are reported apart; tok/s is the generation's alone.
    m = re.search(
        r"\[compiled in ([\d.]+) s; (\d+) tokens in ([\d.]+) s, ([\d.]+|inf) tok/s\]", r.stderr
    )
    assert m, r.stderr
    compile_s, tokens, gen_s, rate = float(m[1]), int(m[2]), float(m[3]), float(m[4])
    assert compile_s > 0  # a fresh process compiles its decoder
    assert tokens == 8
    if gen_s >= 0.1:  # printed to 2 decimals: the rate must be the tokens over that time
        assert abs(rate - tokens / gen_s) <= 0.1 * rate
    assert "compilation included" not in r.stderr


def test_generate_is_reproducible_with_a_seed(tiny_dir):
    args = ["generate", "--checkpoint", str(tiny_dir), "--prompt", "import os",
            "--max-new-tokens", "6", "--seed", "3"]  # fmt: skip
    assert _jaxspec(*args).stdout == _jaxspec(*args).stdout


def test_missing_checkpoint_is_a_clean_error(tmp_path):
    r = _jaxspec("generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "x")
    assert r.returncode == 2
    assert "no checkpoint directory" in r.stderr
    assert "Traceback" not in r.stderr


def test_generate_with_a_draft_reports_acceptance(tiny_dir):
    r = _jaxspec(
        "generate", "--checkpoint", str(tiny_dir), "--draft", str(tiny_dir), "--prompt", "x = ",
        "--max-new-tokens", "8", "--temperature", "0", "--gamma", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "acceptance rate 1.00" in r.stderr  # the target as its own draft


def test_bad_draft_options_are_a_clean_error(tiny_dir):
    """The shared draft flags reach `DraftSpec`'s one validator; the CLI prints its message."""
    r = _jaxspec(
        "generate", "--checkpoint", str(tiny_dir), "--draft", str(tiny_dir), "--prompt", "x",
        "--encoding", "sparse", "--sparse-k", "0",
    )  # fmt: skip
    assert r.returncode == 2
    assert "sparse_k must be >= 1" in r.stderr and "Traceback" not in r.stderr


def test_doctor_says_which_path_each_weight_format_runs(capsys):
    from jaxspec import kernels
    from jaxspec_apps import cli

    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert kernels.status() in out and "backend cpu" in out
    assert "int4 weights (W4A16): " in out and "int8 weights" in out
    assert "smollm2-w4a16:" in out
