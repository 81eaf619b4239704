"""The shared command-line flags (`jaxspec_host.flags`) and the one shape bucket
(`jaxspec.compilation.shapes`)."""

from __future__ import annotations

import argparse

import pytest

from jaxspec.compilation.shapes import bucket
from jaxspec.protocol import DraftSpec
from jaxspec_host.flags import (
    add_draft_flags,
    add_penalty_flags,
    add_sampling_flags,
    check_args,
    draft_spec_from_args,
    is_loopback,
    logit_bias_from_args,
    penalties_from_args,
)


def parser(**draft) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_sampling_flags(p, temperature=0.7, top_p=None)
    add_draft_flags(p, **draft)
    return p


def test_defaults_per_command_and_left_out_flags():
    a = parser(mode="pipelined").parse_args([])
    assert (a.temperature, a.top_k, a.seed, a.mode) == (0.7, 0, 0, "pipelined")
    assert not hasattr(a, "top_p")  # None: the command has no such flag
    assert draft_spec_from_args(a) == DraftSpec()
    with pytest.raises(SystemExit):
        parser().parse_args(["--top-p", "0.9"])


def test_values_reach_one_validated_draft_spec():
    a = parser().parse_args(["--gamma", "6", "--encoding", "sparse", "--sparse-k", "3"])
    assert draft_spec_from_args(a) == DraftSpec(gamma=6, encoding="sparse", sparse_k=3)
    # A command without --encoding/--sparse-k gets DraftSpec's defaults for them.
    b = parser(encoding=None, sparse_k=None).parse_args(["--gamma", "2", "--mode", "sync"])
    assert draft_spec_from_args(b) == DraftSpec(gamma=2)
    with pytest.raises(ValueError, match="gamma"):
        draft_spec_from_args(parser().parse_args(["--gamma", "-1"]))
    assert draft_spec_from_args(parser().parse_args(["--gamma", "0"])) == DraftSpec(gamma=0)
    with pytest.raises(SystemExit):  # choices come from protocol.MODES / ENCODINGS
        parser().parse_args(["--encoding", "dense"])


def test_gamma_auto_is_an_adaptive_spec_and_reaches_the_wire():
    """--gamma auto (commands that opt in): DraftSpec(gamma=--longest-block, adaptive=True), and
    the flag survives the protocol's bytes; an old client's message (no field) is not
    adaptive. Commands that did not opt in refuse "auto" as a usage error."""
    from jaxspec.proto import verifier_pb2 as pb
    from jaxspec.protocol import SessionConfig, wire

    auto = parser(auto_gamma=True)
    assert draft_spec_from_args(auto.parse_args(["--gamma", "auto"])) == DraftSpec(
        gamma=8, adaptive=True
    )
    spec = draft_spec_from_args(auto.parse_args(["--gamma", "AUTO", "--longest-block", "3"]))
    assert spec == DraftSpec(gamma=3, adaptive=True)
    fixed = draft_spec_from_args(auto.parse_args(["--gamma", "5"]))
    assert fixed == DraftSpec(gamma=5) and not fixed.adaptive
    with pytest.raises(ValueError, match="gamma"):
        draft_spec_from_args(auto.parse_args(["--gamma", "auto", "--longest-block", "65"]))
    with pytest.raises(SystemExit):
        auto.parse_args(["--gamma", "fast"])
    with pytest.raises(SystemExit):
        parser().parse_args(["--gamma", "auto"])
    assert not hasattr(parser().parse_args([]), "longest_block")

    cfg = SessionConfig(prompt=(1, 2), draft=spec)
    raw = wire.config_to_proto(cfg).SerializeToString()
    assert wire.config_from_proto(pb.OpenSessionRequest.FromString(raw)) == cfg
    old_client = pb.OpenSessionRequest(prompt=[1, 2], max_new_tokens=8, gamma=3)
    d = wire.config_from_proto(old_client).draft
    assert (d.gamma, d.adaptive) == (3, False)
    with pytest.raises(ValueError, match="integer"):
        DraftSpec(gamma="auto")
    import jaxspec

    with pytest.raises(ValueError, match="integer or 'auto'"):  # "auto" measures and picks
        jaxspec.generate(jaxspec.load("default"), [1], draft=jaxspec.load("default"), gamma="a")


def test_help_overrides_name_real_flags():
    p = argparse.ArgumentParser()
    add_sampling_flags(p, helps={"seed": "tenant i samples with seed + i"})
    assert "tenant i samples" in p.format_help()
    with pytest.raises(ValueError, match="no such flag"):
        add_sampling_flags(argparse.ArgumentParser(), helps={"gamma": "x"})


@pytest.mark.parametrize(
    ("n", "minimum", "want"),
    [(0, 1, 1), (1, 1, 1), (2, 1, 2), (3, 1, 4), (5, 8, 8), (9, 8, 16), (64, 64, 64),
     (65, 64, 128), (100, 512, 512), (513, 512, 1024)],
)  # fmt: skip
def test_bucket_is_the_next_power_of_two_at_least_minimum(n, minimum, want):
    assert bucket(n, minimum) == want


def test_bucket_equals_the_five_formulas_it_replaced():
    for n in range(1, 2100):
        assert bucket(n) == max(1, 1 << max(0, (n - 1).bit_length()))  # generate._bucket
        assert bucket(n, 8) == 1 << max(3, (n - 1).bit_length())  # drafter prefill
        assert bucket(n, 64) == 1 << max(6, (n - 1).bit_length())  # session, bench suite
        assert bucket(n, 512) == max(512, 1 << (n - 1).bit_length())  # demo's verifier
    with pytest.raises(ValueError):
        bucket(-1)


def test_penalty_flags():
    p = argparse.ArgumentParser()
    add_penalty_flags(p)
    assert penalties_from_args(p.parse_args([])) == {
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    }  # fmt: skip
    a = p.parse_args(["--repetition-penalty", "1.2", "--presence-penalty", "-0.5"])
    assert penalties_from_args(a)["repetition_penalty"] == pytest.approx(1.2)
    for bad, why in (
        (["--repetition-penalty", "0"], "repetition_penalty"),
        (["--presence-penalty", "nan"], "presence_penalty"),
        (["--frequency-penalty", "3"], "frequency_penalty"),
    ):
        with pytest.raises(ValueError, match=why):
            check_args(p.parse_args(bad))
    # a command without the flags gets the defaults
    assert penalties_from_args(argparse.Namespace())["repetition_penalty"] == 1.0


def test_min_p_and_logit_bias_flags():
    a = parser().parse_args(["--min-p", "0.05", "--logit-bias", "2:-100, 17:1.5"])
    assert a.min_p == 0.05 and logit_bias_from_args(a) == {2: -100.0, 17: 1.5}
    assert logit_bias_from_args(parser().parse_args([])) == {}
    for bad, why in (("2", "ID:BIAS"), ("x:1", "ID:BIAS"), ("2:200", "within"), ("-3:1", ">= 0")):
        with pytest.raises(ValueError, match=why):
            check_args(parser().parse_args([f"--logit-bias={bad}"]))
    with pytest.raises(ValueError, match="min_p"):
        check_args(parser().parse_args(["--min-p", "1.5"]))


# ---- every command: one set of flags (issue 30) ---------------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name as typed."""
    from edge.__main__ import build_parser as edge_parser
    from jaxspec_apps.cli import build_parser as cli_parser
    from verify.__main__ import build_parser as verify_parser

    out = {}
    for prog, top in (("jaxspec", cli_parser()), ("python -m edge", edge_parser()),
                      ("python -m verify", verify_parser())):  # fmt: skip
        for name, sub in top._subparsers._group_actions[0].choices.items():
            out[f"{prog} {name}"] = sub
    return out


def test_every_flag_of_every_command_has_help_and_shows_its_default():
    for name, p in _commands().items():
        fmt = p._get_formatter()
        for action in p._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name} {action.option_strings[0]}: no help text"
            text = fmt._expand_help(action)
            silent = action.nargs == 0 or action.default in (None, argparse.SUPPRESS)
            assert silent or "default" in text, (name, action.option_strings, text)
            if not silent and isinstance(action.default, int | float):
                said = (str(action.default), f"{action.default:g}")
                assert any(v in text for v in said), (name, action.option_strings, text)


def test_the_same_meaning_has_the_same_name_and_default_everywhere():
    cmds = _commands()
    required = {
        "jaxspec generate": ["--checkpoint", "x", "--prompt", "y"],
        "jaxspec demo": [],
        "python -m edge generate": ["--verifier", "h:1", "--prompt", "y"],
    }
    for name, argv in required.items():  # every command where speculation runs
        p = cmds[name]
        auto = p.parse_args([*argv, "--gamma", "auto"])
        assert (auto.gamma, auto.longest_block) == ("auto", 8), name
        assert p.parse_args(argv).gamma == 4, name
        flags = {s for a in p._actions for s in a.option_strings}
        assert {"--max-new-tokens", "--temperature", "--seed", "--mode", "--gamma"} <= flags, name
    # --tenants is the verifier's tenants file; the demo's count of tenants is --num-tenants.
    demo = cmds["jaxspec demo"]
    assert "--num-tenants" in demo.format_help() and "--tenants " not in demo.format_help()
    assert demo.parse_args(["--max-new-tokens", "9"]).max_new_tokens == 9
    assert demo.parse_args(["--num-tenants", "2"]).tenants == 2
    assert "TOML" in cmds["python -m verify serve"].format_help()


# ---- the serving commands' one home (issue 49) --------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("Localhost", True),
     ("LOCALHOST", True), ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
     ("10.0.0.5", False), ("example.org", False), ("localhost.example.org", False)],
)  # fmt: skip
def test_one_loopback_rule(host, loopback):
    """`is_loopback`: the rule of `python -m verify serve`, `python -m edge serve` and
    `jaxspec serve` alike (the OpenAI endpoint's fixed list is gone)."""
    from jaxspec_host.flags import add_serve_flags, check_serve_args

    assert is_loopback(host) is loopback
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    args = p.parse_args(["--host", host])
    if loopback:
        check_serve_args(args)  # no --api-key needed
    else:
        with pytest.raises(ValueError, match="is not loopback"):
            check_serve_args(args)


def _serving_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each serving command's (sub)parser, by command."""
    from edge.__main__ import build_parser as edge_parser
    from jaxspec_apps.cli import build_parser as cli_parser
    from verify.__main__ import build_parser as verify_parser

    def sub(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        return p._subparsers._group_actions[0].choices[name]

    return {
        "verify serve": sub(verify_parser(), "serve"),
        "edge generate": sub(edge_parser(), "generate"),
        "edge serve": sub(edge_parser(), "serve"),
        "jaxspec serve": sub(cli_parser(), "serve"),
        "jaxspec demo": sub(cli_parser(), "demo"),
    }


def _actions(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in p._actions if a.option_strings}


def test_the_serving_commands_share_one_definition_of_each_flag():
    """The same flag has the same default, type and choices in every command that has it."""
    seen: dict[str, tuple] = {}
    flags = ("--pair", "--quantize", "--gamma", "--mode", "--depth", "--longest-block",
             "--encoding", "--sparse-k", "--max-sessions", "--max-len", "--token")  # fmt: skip
    for command, p in _serving_parsers().items():
        actions = _actions(p)
        assert "--checkpoint" in actions and "--pair" in actions, command
        for flag in flags:
            if flag in actions:
                a = actions[flag]
                shape = (a.default, a.type, tuple(a.choices or ()))
                assert seen.setdefault(flag, shape) == shape, (command, flag)


def test_jaxspec_serve_takes_verify_serves_defaults():
    """`jaxspec serve`'s sizes default as `python -m verify serve`'s: SchedulerConfig's own."""
    from jaxspec_apps.serve import _config
    from verify import SchedulerConfig
    from verify.serve import scheduler_config_from_args

    parsers = _serving_parsers()
    verify_args = parsers["verify serve"].parse_args([])
    serve_args = parsers["jaxspec serve"].parse_args([])
    for field in ("max_sessions", "max_len"):
        want = getattr(SchedulerConfig, field)
        assert getattr(serve_args, field) == getattr(verify_args, field) == want, field
    verify_args.mesh = (1, 1)
    assert scheduler_config_from_args(verify_args) == SchedulerConfig()
    spec = check_args(serve_args)
    assert _config(serve_args, spec) == SchedulerConfig(max_gamma=max(spec.gamma, 1))


def test_the_sampling_settings_are_made_once():
    """`check_args` keeps the settings (`args.sampling`); a session reuses them unless the
    model's settings fill an unset flag (a chat)."""
    from jaxspec_host.flags import model_sampling, sampling_for_model

    p = argparse.ArgumentParser()
    add_sampling_flags(p, from_model=True)
    args = p.parse_args(["--temperature", "0.5"])
    check_args(args)
    assert sampling_for_model(args, {"temperature": 0.2})[0] is args.sampling
    model = {"temperature": 0.2, "top_k": 20.0, "top_p": 0.9, "min_p": 0.1}
    assert model_sampling(model, ("top_k", "top_p")) == {"top_k": 20, "top_p": 0.9}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["demo", "--gama", "4"], "jaxspec demo: error: unrecognized arguments: --gama 4; "
         "did you mean --gamma?"),
        (["demo", "--tenants", "2"], "jaxspec demo: error: unrecognized arguments: --tenants 2; "
         "did you mean --num-tenants?"),
        (["serve", "--max-new-tokns", "9"], "did you mean --max-new-tokens?"),
        (["demo", "--zzz"], "jaxspec demo: error: unrecognized arguments: --zzz"),
    ],
)  # fmt: skip
def test_a_flag_no_command_knows_is_refused_in_the_words_of_the_command_run(argv, said, capsys):
    """The subcommand that was run refuses it (its usage, not the top level's), with the
    nearest flag it has."""
    from jaxspec_apps.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err, err
    assert f"usage: jaxspec {argv[0]}" in err
