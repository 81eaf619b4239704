"""`SamplingSettings`: the one sampling-settings type (issue 38), checked once when made, the
arrays built from it in one place (`SamplingParams.of`), and made again where settings cross a
trust boundary (the wire, an HTTP request)."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

import jaxspec
from edge.openai_api import ApiError, parse_request, session_fields
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.decoding.sampling import SamplingParams, settings_per_row
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.protocol import InvalidArgument, SamplingSettings, SessionConfig, wire
from jaxspec_host.flags import (
    add_penalty_flags,
    add_sampling_flags,
    check_args,
    sampling_from_args,
)

BAD = [
    ("temperature", -0.1),
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", 1e40),  # inf in float32, as the rule reads it
    ("temperature", "warm"),
    ("top_k", -1),
    ("top_k", 2**31),  # past int32
    ("top_k", 2.5),
    ("top_p", 0.0),
    ("top_p", 1e-50),  # 0 in float32
    ("top_p", 1.5),
    ("top_p", float("nan")),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("min_p", float("nan")),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", 1e-50),  # 0 in float32
    ("repetition_penalty", float("inf")),
    ("presence_penalty", 2.5),
    ("presence_penalty", float("nan")),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", float("-inf")),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"3": 1.0}),
    ("logit_bias", {1 << 40: 1.0}),
    ("logit_bias", {3: 100.5}),
    ("logit_bias", {3: float("nan")}),
    ("logit_bias", {3: "x"}),
    ("logit_bias", dict.fromkeys(range(33), 1.0)),
    ("logit_bias", 7),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_each_bad_value_is_invalid_argument_naming_its_field(field, value):
    with pytest.raises(InvalidArgument, match=field):
        SamplingSettings(**{field: value})
    assert issubclass(InvalidArgument, ValueError)  # `pytest.raises(ValueError)` still holds


def test_values_are_kept_as_plain_numbers_and_the_bias_as_sorted_pairs():
    s = SamplingSettings(
        temperature=np.float32(0.5), top_k=np.int64(3), logit_bias={9: 1, 2: np.float32(-0.25)}
    )
    assert (type(s.temperature), type(s.top_k)) == (float, int)
    assert s.logit_bias == ((2, -0.25), (9, 1.0))
    assert s == SamplingSettings(temperature=0.5, top_k=3, logit_bias=((9, 1.0), (2, -0.25)))
    assert hash(s) == hash(SamplingSettings(temperature=0.5, top_k=3, logit_bias=s.logit_bias))
    assert not s.penalized and SamplingSettings(presence_penalty=0.5).penalized
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 1.0


def test_check_vocab_is_the_one_model_dependent_rule():
    s = SamplingSettings(logit_bias={63: -100.0})
    s.check_vocab(64)
    with pytest.raises(InvalidArgument, match=r"logit_bias token id 63 is outside \[0, 63\)"):
        s.check_vocab(63)


def test_the_arrays_are_built_in_one_place():
    """`make` is `of` over `settings_per_row`; `of` pads with greedy filler rows exactly as
    `pad` does; the values reach the arrays as float32 / int32 of the same numbers."""
    rows = [
        SamplingSettings(temperature=0.7, top_k=5, top_p=0.9, logit_bias={3: 2.5}),
        SamplingSettings(min_p=0.1, repetition_penalty=1.3, presence_penalty=-0.5),
    ]
    params = SamplingParams.of(rows, rows=4)
    same = SamplingParams.make(
        2, temperature=[0.7, 1.0], top_k=[5, 0], top_p=[0.9, 1.0], min_p=[0.0, 0.1],
        logit_bias=[{3: 2.5}, None], repetition_penalty=[1.0, 1.3],
        presence_penalty=[0.0, -0.5],
    ).pad(4)  # fmt: skip
    for f in dataclasses.fields(SamplingParams):
        a, b = np.asarray(getattr(params, f.name)), np.asarray(getattr(same, f.name))
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
    assert params.temperature.dtype == np.float32 and params.top_k.dtype == np.int32
    assert float(params.temperature[0]) == float(np.float32(0.7))
    assert params.bias_ids[0, 0] == 3 and params.bias_values[0, 0] == 2.5
    assert settings_per_row(3, temperature=0.5) == [SamplingSettings(temperature=0.5)] * 3
    with pytest.raises(InvalidArgument, match=r"temperature has \(2,\) values for 3 rows"):
        settings_per_row(3, temperature=[0.5, 1.0])


WIRE = SamplingSettings(
    temperature=0.5, top_k=7, top_p=0.75, min_p=0.125, logit_bias={3: -100.0, 0: 2.5},
    repetition_penalty=1.25, presence_penalty=-0.5, frequency_penalty=2.0,
)  # fmt: skip


def test_settings_survive_the_wire_unchanged():
    cfg = SessionConfig(prompt=(1, 2), sampling=WIRE, seed=4)
    raw = wire.config_to_proto(cfg).SerializeToString()
    back = wire.config_from_proto(pb.OpenSessionRequest.FromString(raw))
    assert back.sampling == WIRE and back == cfg
    plain = wire.config_from_proto(wire.config_to_proto(SessionConfig(prompt=(1,))))
    assert plain.sampling == SamplingSettings()


FROM_THE_WIRE = [
    ("temperature", -1.0),
    ("top_p", 1.5),
    ("min_p", float("nan")),
    ("top_k", 2**31),
    ("repetition_penalty", 0.0),
    ("presence_penalty", 3.0),
    ("frequency_penalty", float("inf")),
    ("logit_bias", {3: 101.0}),
    ("logit_bias", {-2: 1.0}),
]


@pytest.mark.parametrize(("field", "value"), FROM_THE_WIRE)
def test_a_config_off_the_wire_with_a_bad_value_is_refused_there(field, value):
    """The trust boundary: `config_from_proto` makes the settings, so a bad value never
    reaches the verifier's scheduler (which does not check the values again)."""
    m = wire.config_to_proto(SessionConfig(prompt=(1, 2)))
    if isinstance(value, dict):
        m.logit_bias.clear()
        m.logit_bias.update(value)
    else:
        setattr(m, field, value)
    with pytest.raises(InvalidArgument, match=field):
        wire.config_from_proto(pb.OpenSessionRequest.FromString(m.SerializeToString()))


def test_generate_takes_settings_or_the_keyword_shorthand_not_both():
    cfg = tiny_config()
    model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
    prompts = [[1, 2, 3], [4, 5]]
    kw = dict(temperature=[0.0, 0.8], top_k=[0, 5], logit_bias={7: 3.0})
    short = jaxspec.generate(model, prompts, 6, **kw, seed=2).tokens
    rows = [
        SamplingSettings(temperature=0.0, logit_bias={7: 3.0}),
        SamplingSettings(temperature=0.8, top_k=5, logit_bias={7: 3.0}),
    ]
    assert jaxspec.generate(model, prompts, 6, sampling=rows, seed=2).tokens == short
    one = SamplingSettings(temperature=0.0)
    assert (
        jaxspec.generate(model, prompts, 6, sampling=one).tokens
        == jaxspec.generate(model, prompts, 6, temperature=0.0).tokens
    )
    with pytest.raises(ValueError, match="not both"):
        jaxspec.generate(model, prompts, 6, sampling=one, temperature=1.0)
    with pytest.raises(ValueError, match="one per prompt"):
        jaxspec.generate(model, prompts, 6, sampling=[one])
    with pytest.raises(InvalidArgument, match=r"outside \[0, 64\)"):
        jaxspec.generate(model, prompts, 6, sampling=SamplingSettings(logit_bias={64: 1.0}))
    with pytest.raises(InvalidArgument, match="top_p"):
        jaxspec.generate(model, prompts, 6, top_p=[1.0, 0.0])


def test_the_flags_become_one_settings():
    p = argparse.ArgumentParser()
    add_sampling_flags(p)
    add_penalty_flags(p)
    argv = ["--temperature", "0.5", "--top-k", "4", "--min-p", "0.25", "--logit-bias", "9:1,2:-3",
            "--repetition-penalty", "1.5"]  # fmt: skip
    assert sampling_from_args(p.parse_args(argv)) == SamplingSettings(
        temperature=0.5, top_k=4, min_p=0.25, logit_bias={2: -3.0, 9: 1.0},
        repetition_penalty=1.5,
    )  # fmt: skip
    assert sampling_from_args(argparse.Namespace()) == SamplingSettings()  # no flags: defaults
    with pytest.raises(InvalidArgument, match="min_p"):
        check_args(p.parse_args(["--min-p", "2"]))


def test_an_http_request_is_checked_by_making_settings():
    """The OpenAI request is a trust boundary too: each sampling field is checked by making
    `SamplingSettings` of it (400 naming the field); the session gets the settings, the
    model's chat defaults where the request gave none."""
    for body, field in (
        ({"top_p": 0}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"-3": 1}}, "logit_bias"),
    ):
        with pytest.raises(ApiError) as e:
            parse_request("completion", {"prompt": "x", **body})
        assert e.value.status == 400 and e.value.param == field and field in str(e.value)
    chat = parse_request(
        "chat", {"messages": [{"role": "user", "content": "x"}], "top_p": 0.5, "seed": 3}
    )
    defaults = {"temperature": 0.25, "top_k": 8.0}  # a GGUF's top_k is a float
    fields = session_fields(chat, defaults=defaults, max_tokens=9, seed=0)
    assert fields == {
        "sampling": SamplingSettings(temperature=0.25, top_k=8, top_p=0.5),
        "max_new_tokens": 9,
        "seed": 3,
        "stop_tokens": None,  # the model's end tokens
    }
