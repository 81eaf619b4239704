"""Arguments that cannot work are refused before anything loads or binds, in one line, exit 2,
in the same words whichever command was run (`jaxspec_host.preflight`): a KV pool past the
machine's memory (it died in XLA with a traceback, allocating 1.97 TB), a --max-len that
holds no session (a server started that could serve nothing), a target and a draft (or a
client and its verifier) of different vocabularies (garbage, or every request refused),
--pair beside a named model (ignored without a word)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import jaxspec
from edge.__main__ import main as edge_main
from jaxspec.ckpts.checkpoint import BUILTIN_DIR
from jaxspec_apps.cli import main as cli_main
from jaxspec_host import preflight
from verify import LocalVerifier, SchedulerConfig
from verify.__main__ import main as verify_main
from verify.serve import start

HUGE = ["--max-len", "10000000"]


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory):
    """A checkpoint whose config says 300 tokens (the tiny pair has 4,096): no weights, for
    nothing may load before the refusal."""
    d = tmp_path_factory.mktemp("other_vocab")
    config = json.loads((BUILTIN_DIR / "draft" / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config | {"vocab_size": 300}))
    return str(d)


def _refusal(capsys, run, argv) -> str:
    """The one line `run(argv)` printed, checked to be a usage refusal (exit 2)."""
    try:
        code = run(argv)
    except SystemExit as e:  # argparse's own exit
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    return err[-1]


def test_each_check_alone():
    with pytest.raises(ValueError, match=r"--max-len 1 holds no session: .* at least 7"):
        preflight.refuse_sessionless(1, 4)
    preflight.refuse_sessionless(7, 4)
    config = preflight.checkpoint_config("default")[0]
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    assert preflight.kv_cache_bytes(config, 64, 512, 4) == per_position * 4 * 64 * 512
    with pytest.raises(ValueError, match=r"needs a KV cache of [\d.]+ TB for default"):
        preflight.refuse_unaffordable_cache("default", 64, 10_000_000 * 50)
    preflight.refuse_unaffordable_cache("default", 64, 512)
    preflight.refuse_other_vocabularies({"target": "default", "draft": "default-draft", "x": 0})
    with pytest.raises(ValueError, match=r"target default: 4096, .*, the verifier: 300\)"):
        preflight.refuse_other_vocabularies({"target": "default", "draft": "default-draft",
                                             "the verifier": 300})  # fmt: skip
    with pytest.raises(ValueError, match="--pair tiny with --checkpoint default"):
        preflight.refuse_pair_with_models("tiny", "default", None)
    preflight.refuse_pair_with_models("auto", "default", "default-draft")
    assert preflight.size_words(1.97e12) == "1.97 TB" and preflight.size_words(512) == "512 B"


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--pair", "tiny", *HUGE], "needs a KV cache of 3.93 TB for default"),
        (["--pair", "tiny", "--max-len", "1"], "--max-len 1 holds no session"),
        (["--checkpoint", "default", "--pair", "smollm2"], "--pair smollm2 with --checkpoint"),
    ],
)
def test_the_same_refusal_from_every_server(capsys, flags, words):
    """`python -m verify serve` and `jaxspec serve` refuse alike, nothing loaded or bound."""
    verify = _refusal(capsys, verify_main, ["serve", "--port", "0", *flags])
    colocated = _refusal(capsys, cli_main, ["serve", "--port", "0", "--gamma", "8", *flags])
    assert verify.startswith("python -m verify serve: error: ") and words in verify
    assert colocated.startswith("jaxspec serve: error: ") and words in colocated
    assert verify.split(": error: ")[1] == colocated.split(": error: ")[1]


def test_a_target_and_a_draft_of_other_vocabularies_are_refused(capsys, other_vocab):
    for run, argv in (
        (cli_main, ["serve", "--port", "0", "--checkpoint", "default", "--draft", other_vocab]),
        (cli_main, ["generate", "--checkpoint", "default", "--draft", other_vocab,
                    "--prompt", "x", "--max-new-tokens", "2"]),
    ):  # fmt: skip
        line = _refusal(capsys, run, argv)
        assert "vocabularies differ (tokens of target default: 4096, draft" in line, line


def test_a_client_of_another_vocabulary_is_refused_before_loading(capsys, other_vocab):
    """An edge whose draft (or tokenizer) has another vocabulary than the verifier's target
    (which Stats now says): refused at once, before its models load; it printed garbage
    (tiny verifier, SmolLM2 tokenizer) or failed 92 s later (the reverse)."""
    target = jaxspec.load("default", tokenizer=False)
    config = SchedulerConfig(max_sessions=2, max_len=64, max_gamma=4)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(60)  # noqa: E731
    server = run(start(LocalVerifier(target, config)))
    address = f"127.0.0.1:{server.port}"
    try:
        for flags in (["--draft", other_vocab], ["--checkpoint", other_vocab]):
            argv = ["generate", "--verifier", address, "--prompt", "x", *flags]
            line = _refusal(capsys, edge_main, argv)
            assert line.startswith("python -m edge generate: error: the models' vocab"), line
            assert f"the verifier at {address}: 4096" in line, line
    finally:
        run(server.stop(grace=0))
        loop.call_soon_threadsafe(loop.stop)
