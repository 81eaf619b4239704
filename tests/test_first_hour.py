"""A new user's first hour: bad flags and an unusable verifier are reported at once (before
any model loads), a wrong address says it is retrying and until when, and transformers'
"PyTorch was not found" notice is not printed by commands that need no torch.

"Before any model loads" is checked without timing: every command gets a checkpoint (or
draft) path that does not exist, so loading it first would report that instead.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import socket
import subprocess
import sys

import pytest

from edge.client import (
    at_most_every,
    check_verifier,
    retry_notice,
    short_reason,
    warming_words,
)
from edge.session import run_session
from jaxspec.protocol import DraftSpec, SessionConfig, Unauthenticated, Unavailable
from jaxspec_host.flags import add_draft_flags, add_sampling_flags, check_args

MISSING = "/nonexistent/jaxspec-checkpoint"
NOT_LOADED = "no checkpoint directory"  # what loading MISSING would have said


def _jaxspec() -> list[str]:
    exe = shutil.which("jaxspec")
    return [exe] if exe else [sys.executable, "-m", "jaxspec_apps.cli"]


EDGE = [sys.executable, "-m", "edge"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_all(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run the commands at once (each pays its own imports) and wait for all."""
    procs = {
        name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, cmd in cases.items()
    }
    out = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=300)
        finally:
            p.kill()
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


# ---- 1. every flag is checked before anything loads ------------------------------------------


def test_bad_flags_fail_with_status_2_before_any_model_loads():
    addr = f"127.0.0.1:{closed_port()}"  # never contacted: the flags fail first
    gen = [*_jaxspec(), "generate", "--checkpoint", MISSING, "--draft", MISSING, "--prompt", "x"]
    edge = [*EDGE, "generate", "--verifier", addr, "--draft", MISSING, "--prompt", "x"]
    demo = [*_jaxspec(), "demo", "--checkpoint", MISSING, "--draft", MISSING, "--plain"]
    cases = {
        "generate --max-new-tokens 0": (
            [*gen, "--max-new-tokens", "0"],
            "--max-new-tokens must be >= 1, got 0",
        ),
        "generate --temperature -1": ([*gen, "--temperature", "-1"], "temperature must be"),
        "generate --gamma 65": ([*gen, "--gamma", "65"], "gamma must be in [0, 64], got 65"),
        "edge --temperature -1": ([*edge, "--temperature", "-1"], "temperature must be"),
        "edge --seed -1": ([*edge, "--seed", "-1"], "--seed must be in [0, 2**32)"),
        "edge --timeout-s 0": ([*edge, "--timeout-s", "0"], "--timeout-s must be > 0"),
        "edge --verifier a fleet with a bad address": (
            [*edge[:4], "--verifier", f"{addr},nohost", *edge[6:]],
            "a verifier address is host:port, got 'nohost'",
        ),
        "demo --temperature -1": ([*demo, "--temperature", "-1"], "temperature must be"),
    }
    results = run_all({name: cmd for name, (cmd, _) in cases.items()})
    for name, (_, message) in cases.items():
        r = results[name]
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        assert message in r.stderr, (name, r.stderr)
        assert NOT_LOADED not in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
        assert "unavailable" not in r.stderr, (name, r.stderr)  # the verifier was not asked
        assert "verifier pid" not in r.stdout, (name, r.stdout)  # no verifier was spawned


def _flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_sampling_flags(p)
    add_draft_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=4)
    return p.parse_args(argv)


def test_check_args_uses_the_librarys_validators():
    assert check_args(_flags("--gamma", "3", "--encoding", "onehot")) == DraftSpec(
        gamma=3, encoding="onehot"
    )
    for argv, message in (
        (["--temperature", "nan"], "temperature"),
        (["--top-k", "-1"], "top_k"),
        (["--top-p", "1.5"], "top_p"),
        (["--seed", str(1 << 32)], "--seed"),
        (["--gamma", "65"], "gamma"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
    ):
        with pytest.raises(ValueError, match=message):
            check_args(_flags(*argv))


# ---- 2/3. the verifier is checked first; a wrong address says it retries -----------------


def test_a_closed_port_is_reported_with_its_retry_deadline_before_any_model_loads():
    addr = f"127.0.0.1:{closed_port()}"
    edge_cmd = [*EDGE, "generate", "--verifier", addr, "--draft", MISSING, "--prompt", "x"]
    edge_cmd += ["--resume-timeout-s", "1", "--timeout-s", "2"]
    demo_cmd = [*_jaxspec(), "demo", "--verifier", addr, "--draft", MISSING, "--plain"]
    results = run_all({"edge": edge_cmd, "demo": demo_cmd})
    edge = results["edge"]
    assert edge.returncode == 1, edge.stderr
    notice = f"verifier {addr} unavailable (connection refused); retrying until "
    assert notice in edge.stderr and "(1 s)" in edge.stderr, edge.stderr
    assert f"UNAVAILABLE: verifier {addr} unavailable (connection refused); gave up after 1 s" in (
        edge.stderr
    )
    demo = results["demo"]
    assert demo.returncode == 1, demo.stderr
    assert f"UNAVAILABLE: verifier {addr} unavailable (connection refused)" in demo.stderr
    assert "loading" not in demo.stdout  # nothing was loaded, nor compiled
    for r in (edge, demo):
        assert NOT_LOADED not in r.stderr and "Traceback" not in r.stderr, r.stderr


class _FlakyStats:
    """A verifier endpoint whose Stats fails with `errors` in turn, then answers."""

    target = "verifier.example:50051"

    def __init__(self, *errors: Exception | dict) -> None:
        self.answers = list(errors)

    async def stats(self) -> dict:
        a = self.answers.pop(0) if self.answers else {"serving": True, "steps": 7}
        if isinstance(a, Exception):
            raise a
        return a


def test_check_verifier_retries_says_so_once_then_answers_or_gives_up():
    heard: list[str] = []
    refused = Unavailable("failed to connect to all addresses; ... Connection refused")
    ep = _FlakyStats(refused, {"serving": False}, refused)  # down, warming up, down, then up
    stats = asyncio.run(check_verifier(ep, retry_s=5, backoff_s=0.01, on_retry=heard.append))
    assert stats["steps"] == 7
    assert len(heard) == 1 and heard[0].startswith(
        "verifier verifier.example:50051 unavailable (connection refused); retrying until "
    )
    assert heard[0].endswith("(5 s)")

    ep = _FlakyStats(*[refused] * 100)
    with pytest.raises(Unavailable, match=r"\(connection refused\); gave up after 0.05 s"):
        asyncio.run(check_verifier(ep, retry_s=0.05, backoff_s=0.01))
    with pytest.raises(Unauthenticated, match=r"refused the token \(missing or invalid token\)"):
        asyncio.run(check_verifier(_FlakyStats(Unauthenticated("missing or invalid token"))))
    with pytest.raises(Unavailable, match=r"unavailable \(connection refused\)$"):
        asyncio.run(check_verifier(_FlakyStats(refused)))  # no retry asked: at once
    warming = {"serving": False, "steps": 0}
    with pytest.raises(Unavailable, match=r"\(not serving: warming up or draining\)$"):
        asyncio.run(check_verifier(_FlakyStats(warming)))
    # Reachability and the token only (the demo, before it loads): warming up passes.
    assert asyncio.run(check_verifier(_FlakyStats(warming), serving=False)) == warming


def test_a_warming_verifier_is_waited_for_longer_than_a_missing_one():
    """A verifier that says it is warming up (a count in its Stats) is coming: waited for
    up to `warming_s` (the notice names that bound), not only `retry_s`; one that does not
    answer is given up after `retry_s`; a warm-up longer than `warming_s` too, saying so."""
    warming = {"serving": False, "warming_done": 3, "warming_total": 9}
    heard: list[str] = []
    ep = _FlakyStats(*[warming] * 20)  # ~0.2 s of warming up, then serving
    stats = asyncio.run(
        check_verifier(ep, retry_s=0.02, warming_s=30, backoff_s=0.01, on_retry=heard.append)
    )
    assert stats["steps"] == 7 and len(heard) == 1, heard
    assert "(warming up: 3/9 batch shapes compiled)" in heard[0] and heard[0].endswith("(30 s)")
    refused = Unavailable("failed to connect to all addresses; ... Connection refused")
    with pytest.raises(Unavailable, match=r"gave up after 0.02 s"):
        asyncio.run(check_verifier(_FlakyStats(*[refused] * 100), retry_s=0.02, warming_s=30,
                                   backoff_s=0.01))  # fmt: skip
    with pytest.raises(Unavailable, match=r"warming up: 3/9 .*gave up after 0.05 s"):
        asyncio.run(check_verifier(_FlakyStats(*[warming] * 100), retry_s=0.01, warming_s=0.05,
                                   backoff_s=0.01))  # fmt: skip


def test_check_verifier_says_how_far_the_warm_up_is_while_it_waits():
    """A verifier that is warming up tells its count in Stats: the notice, every later
    wait's words (with the time waited) and the final error say it; an older verifier (no
    count) keeps the general words."""
    heard: list[str] = []
    waits: list[str] = []
    warm = [{"serving": False, "warming_done": d, "warming_total": 9} for d in (0, 3, 5)]
    stats = asyncio.run(
        check_verifier(
            _FlakyStats(*warm), retry_s=5, backoff_s=0.01, on_retry=heard.append,
            on_wait=waits.append,
        )
    )  # fmt: skip
    assert stats["steps"] == 7
    assert heard == [heard[0]] and "(warming up: 0/9 batch shapes compiled)" in heard[0]
    target = _FlakyStats.target
    assert [re.sub(r"waited \d+ s$", "waited N s", w) for w in waits] == [
        f"verifier {target} warming up: 3/9 batch shapes compiled; waited N s",
        f"verifier {target} warming up: 5/9 batch shapes compiled; waited N s",
    ]
    with pytest.raises(Unavailable, match=r"\(warming up: 5/9 batch shapes compiled\)$"):
        asyncio.run(check_verifier(_FlakyStats(warm[2])))
    assert warming_words({"serving": True, "warming_done": 3, "warming_total": 9}) is None
    assert warming_words({"serving": False}) is None  # an older verifier: no count
    clock = iter([0.0, 1.0, 2.5, 3.0, 4.6]).__next__
    said: list[str] = []
    say = at_most_every(said.append, 2.0, clock)
    for word in "abcde":
        say(word)
    assert said == ["a", "c", "e"]  # at once, then at most one per 2 s


def test_short_reasons_and_the_retry_notice():
    assert short_reason(Exception("errors resolving nosuch.invalid:5: ...")) == "name not resolved"
    assert short_reason(Exception("something else")) == "something else"
    notice = retry_notice("h:1", Exception("Connection refused"), 30)
    assert notice.startswith("verifier h:1 unavailable (connection refused); retrying until ")
    assert notice.endswith(" (30 s)")


class _Down:
    """An endpoint whose verifier never comes back."""

    async def open_session(self, config: SessionConfig):
        raise Unavailable("connection refused")

    async def close_session(self, session_id: str) -> None:
        pass


class _SpecOnly:
    spec = DraftSpec()


def test_run_session_says_it_retries_and_how_long_it_tried():
    heard: list[tuple[str, float]] = []
    config = SessionConfig(prompt=(1, 2))
    session = run_session(
        _Down(),
        _SpecOnly(),
        config,
        resume_timeout_s=0.2,
        resume_backoff_s=0.02,
        on_retry=lambda e, s: heard.append((str(e), s)),
    )
    with pytest.raises(Unavailable, match=r"connection refused \(gave up after 0.2 s\)"):
        asyncio.run(session)
    assert heard == [("connection refused", 0.2)]
    heard.clear()
    with pytest.raises(Unavailable, match=r"^connection refused$"):  # no retrying asked
        asyncio.run(
            run_session(_Down(), _SpecOnly(), config, on_retry=lambda e, s: heard.append(e))
        )
    assert heard == []


# ---- 6. transformers' torch notice --------------------------------------------------------


def test_the_pytorch_was_not_found_notice_is_not_printed():
    """Without torch (hidden from this subprocess), `import transformers` prints a notice;
    importing jaxspec first drops that one message and nothing else transformers logs."""
    hide = "import sys; sys.modules['torch'] = None; "
    other = "transformers.logging.get_logger('transformers').warning('another message'); "
    with_jaxspec = hide + "import jaxspec, transformers; from transformers import AutoTokenizer; "
    results = run_all(
        {
            "plain": [sys.executable, "-c", hide + "import transformers"],
            "jaxspec": [sys.executable, "-c", with_jaxspec + other],
        }
    )
    assert "PyTorch was not found" in results["plain"].stderr  # the control: it is printed
    assert results["jaxspec"].returncode == 0, results["jaxspec"].stderr
    assert "PyTorch was not found" not in results["jaxspec"].stderr
    assert "another message" in results["jaxspec"].stderr
