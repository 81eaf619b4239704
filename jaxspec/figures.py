"""The acceptance figures every layer counts in (docs/design.md, "Figures").

Standard library only, so that a screen or a report can hold them without loading JAX
(`jaxspec`'s package namespace is lazy: importing this module imports nothing else of it).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcceptanceFigures:
    """Speculative-decoding totals: the one host-side type every layer counts acceptance in
    (the co-located loop, the verifier's sessions, the edge's trace, the demo, the bench).

    The first four are vLLM's (its `vllm:spec_decode_*` metrics): num_drafts = rounds with at
    least one draft (a gamma-0 round is none); num_draft_tokens = drafts verified;
    num_accepted_tokens = drafts accepted and committed (cut at a stop token /
    max_new_tokens); accepted_per_position = `[gamma]`, entry i = rounds whose draft i was
    accepted. Then rounds = verification rounds (blocks verified; stale ones count nothing)
    and emitted = tokens those rounds committed (accepted drafts, corrections, bonus tokens).
    docs/design.md ("Figures") defines each derived figure once, as the properties do here.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    rounds: int = 0
    emitted: int = 0

    @classmethod
    def of_round(cls, drafted: int, accepted: int, emitted: int) -> AcceptanceFigures:
        """One verified round of `drafted` drafts whose first `accepted` were accepted (the
        rule accepts a prefix) and which committed `emitted` tokens."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, {drafted}], got {accepted}")
        return cls(
            num_drafts=int(drafted > 0),
            num_draft_tokens=drafted,
            num_accepted_tokens=accepted,
            accepted_per_position=(1,) * accepted + (0,) * (drafted - accepted),
            rounds=1,
            emitted=emitted,
        )

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted drafts / drafts verified; 0.0 before any draft."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's: 1 + accepted drafts per round with drafts (the tokens such a round yields,
        the verifier's own counted); 0.0 before any."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens committed per verification round (emitted / rounds); 0.0 before any."""
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        """`[gamma]`: the fraction of rounds with drafts whose draft i was accepted."""
        n = self.num_drafts
        return tuple(a / n if n else 0.0 for a in self.accepted_per_position)

    def __add__(self, other: AcceptanceFigures) -> AcceptanceFigures:
        """The totals of both (two chunks, two sessions of a resume, two tenants);
        per-position entries add by position."""
        a, b = self.accepted_per_position, other.accepted_per_position
        n = max(len(a), len(b))
        a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
        return AcceptanceFigures(
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            accepted_per_position=tuple(x + y for x, y in zip(a, b, strict=True)),
            rounds=self.rounds + other.rounds,
            emitted=self.emitted + other.emitted,
        )
