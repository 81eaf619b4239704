"""Who may call the verifier service, and how fast (docs/design.md §4).

`Tenants` maps a Bearer token to a `Tenant` (a TOML file of tenants, or — no file — everyone
as one anonymous tenant). Only SHA-256 digests of tokens are kept, and a token is compared in
constant time. `RateLimits` holds one token bucket per tenant that has a `tokens_per_s` limit:
a Verify stream waits for its tenant's bucket before it queues a block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import pathlib
import time
import tomllib
from typing import Any

ANONYMOUS = "anonymous"


@dataclasses.dataclass(frozen=True)
class Tenant:
    """One caller identity and its limits."""

    name: str
    token_sha256: str  # never the token itself: nothing that could leak it is kept
    max_sessions: int = 16  # live sessions at once
    tokens_per_s: float = 0.0  # verified positions per second; 0 = unlimited
    admin: bool = False  # Stats answers verifier-wide figures (else the tenant's own)


class Tenants:
    """Bearer-token tenants from a TOML file, or (no file) everyone as one anonymous tenant.

    [tenants.alice]
    token = "..."            # or token_sha256 = "<hex>" to keep the secret out of the file
    max_sessions = 16        # live sessions at once
    tokens_per_s = 400       # verified positions per second (drafts + 1 per block), 0 = off
    admin = false            # true: Stats answers verifier-wide figures, not the tenant's own
    """

    def __init__(self, tenants: list[Tenant] | None, anonymous: Tenant | None = None):
        self.open = tenants is None
        self.by_hash = {t.token_sha256: t for t in tenants or ()}
        # no file: the one anonymous caller is the whole verifier's only user, and sees it all
        self.anonymous = anonymous or Tenant(ANONYMOUS, "", max_sessions=1 << 30, admin=True)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Tenants:
        """Read a tenants file; `ValueError` names what is wrong with it."""
        try:
            raw = tomllib.loads(pathlib.Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"cannot read tenants file {path}: {e}") from None
        out = []
        for name, t in raw.get("tenants", {}).items():
            if not isinstance(t, dict) or ("token" in t) == ("token_sha256" in t):
                raise ValueError(f"tenant {name!r} needs exactly one of token / token_sha256")
            digest = t.get("token_sha256") or token_sha256(str(t["token"]))
            if not isinstance(t.get("admin", False), bool):
                raise ValueError(f"tenant {name!r}: admin is true or false")
            out.append(
                Tenant(
                    name=name,
                    token_sha256=digest.lower(),
                    max_sessions=int(t.get("max_sessions", 16)),
                    tokens_per_s=float(t.get("tokens_per_s", 0.0)),
                    admin=t.get("admin", False),
                )
            )
        if not out:
            raise ValueError(f"tenants file {path} defines no [tenants.<name>] table")
        if len({t.token_sha256 for t in out}) != len(out):
            raise ValueError("two tenants share a token")
        return cls(out)

    def overcommitted(self, slots: int) -> str | None:
        """Why the tenants' live-session caps do not fit a pool of `slots` (their sum, or one
        cap, above it), naming each tenant and its cap; None when they fit (or no file)."""
        if self.open:
            return None
        tenants = sorted(self.by_hash.values(), key=lambda t: t.name)
        total = sum(t.max_sessions for t in tenants)
        if total <= slots:
            return None
        caps = ", ".join(f"{t.name} {t.max_sessions}" for t in tenants)
        over = [t.name for t in tenants if t.max_sessions > slots]
        alone = f"; alone above the pool: {', '.join(over)}" if over else ""
        return (
            f"the tenants' max_sessions sum to {total}, above the {slots} slots of "
            f"--max-sessions ({caps}{alone}): when the pool is full a tenant below its cap "
            "is refused RESOURCE_EXHAUSTED until a slot frees"
        )

    def identify(self, metadata: Any) -> Tenant | None:
        """The caller's tenant from exactly one `authorization: Bearer <token>` header, else
        None (no header, a bad one, an unknown token, or more than one header). Without a
        tenants file everyone is the anonymous tenant, whatever the headers."""
        if self.open:
            return self.anonymous
        values = [value for key, value in metadata or () if key == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            return None  # none, or several: never "the last one wins"
        scheme, _, rest = values[0].partition(" ")
        token = rest.strip() if scheme.lower() == "bearer" else ""
        if not token:
            return None
        digest = token_sha256(token)
        for known, tenant in self.by_hash.items():  # constant time per comparison
            if hmac.compare_digest(known, digest):
                return tenant
        return None


def authorization_headers(metadata: Any) -> int:
    """How many `authorization` headers `metadata` holds (the refusal says so when > 1)."""
    return sum(key == "authorization" for key, _ in metadata or ())


def token_sha256(token: str) -> str:
    """The hex digest a tenants file may hold instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenBucket:
    """`rate` per second, bursts up to one second's worth (or one cost, if larger)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.level = rate
        self.t = time.monotonic()

    async def take(self, cost: float) -> None:
        """Wait until `cost` is available, then spend it."""
        while True:
            now = time.monotonic()
            self.level = min(max(self.rate, cost), self.level + (now - self.t) * self.rate)
            self.t = now
            if self.level >= cost:
                self.level -= cost
                return
            await asyncio.sleep((cost - self.level) / self.rate)


class RateLimits:
    """One `TokenBucket` per rate-limited tenant, shared by all of its streams."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    async def take(self, tenant: Tenant, cost: float) -> None:
        """Wait for `cost` verified positions of `tenant`'s rate (no wait if unlimited)."""
        if tenant.tokens_per_s <= 0:
            return
        bucket = self._buckets.setdefault(tenant.name, TokenBucket(tenant.tokens_per_s))
        await bucket.take(cost)
