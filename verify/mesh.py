"""Whether a ("data", "model") mesh can hold a model's verifier, known from its config alone
(before any weight loads; docs/multihost.md, "Running it").

The "model" axis splits what `verify.step` shards over it: the KV cache by head (so
`num_key_value_heads`, and the query heads with it), the MLP's `intermediate_size` columns
and rows, and for a quantized checkpoint the scale groups of `o_proj` and `down_proj` rows.
The "data" axis splits the KV slots (`--max-sessions`; every row bucket is a multiple of
data when they are). JAX refuses a dimension that an axis does not divide, but only when the
weights are placed, after loading them ("axis of size 3 partitioned 2 ways"): SmolLM2's 3
KV heads and `--mesh data=4,model=2` failed that way. `mesh_problem` says so at start,
with the numbers and the meshes that would work.
"""

from __future__ import annotations

import math

from jaxspec.nn.config import LlamaConfig


def model_axis_sizes(config: LlamaConfig, group_size: int | None = None) -> dict[str, int]:
    """Every size the "model" axis splits, by name (`group_size`: a quantized checkpoint's,
    whose scales split o_proj's and down_proj's groups of rows)."""
    sizes = {
        "num_key_value_heads": config.num_key_value_heads,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
    }
    if group_size:
        attn_in = config.num_attention_heads * config.head_dim  # o_proj's rows
        sizes["o_proj's scale groups"] = math.ceil(attn_in / min(group_size, attn_in))
        mlp_in = config.intermediate_size
        sizes["down_proj's scale groups"] = math.ceil(mlp_in / min(group_size, mlp_in))
    return sizes


def fitting_model_sizes(config: LlamaConfig, group_size: int | None = None) -> list[int]:
    """The model-axis sizes that divide every size it splits (1 always does)."""
    g = math.gcd(*model_axis_sizes(config, group_size).values())
    return [m for m in range(1, g + 1) if g % m == 0]


def mesh_problem(
    config: LlamaConfig,
    data: int,
    model: int,
    *,
    max_sessions: int,
    group_size: int | None = None,
    name: str = "the model",
) -> str | None:
    """Why a data x model mesh cannot hold a verifier of `config` with `max_sessions` slots
    (None: it can): the sizes an axis does not divide, the model sizes that would, and the
    meshes of as many devices that fit."""
    sizes = model_axis_sizes(config, group_size)
    bad = [f"{k}={v}" for k, v in sizes.items() if v % model]
    problems = []
    fits = fitting_model_sizes(config, group_size)
    if bad:
        problems.append(
            f"the model axis splits {', '.join(f'{k}={v}' for k, v in sizes.items())}, and "
            f"model={model} does not divide {' or '.join(bad)}; "
            f"model={' or '.join(map(str, fits))} would"
        )
    if max_sessions % data:
        problems.append(
            f"the data axis splits the {max_sessions} KV slots (--max-sessions), and "
            f"data={data} does not divide them"
        )
    if not problems:
        return None
    devices = data * model
    options = [
        f"--mesh data={devices // m},model={m}"
        for m in fits
        if devices % m == 0 and max_sessions % (devices // m) == 0
    ]
    if options:
        instead = f"with {devices} devices: {' or '.join(options)}"
    else:
        instead = f"no mesh of {devices} devices fits; change the device count or --max-sessions"
    why = "; ".join(problems)
    return f"--mesh data={data},model={model} does not fit {name}: {why} ({instead})"
