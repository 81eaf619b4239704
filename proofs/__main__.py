"""`python -m proofs [--profile fast|full] [--seed N]`: run every exact proof, report, exit.

Exits 1 if any lossless check fails, any mutant is not caught, or any control fails.
"""

from __future__ import annotations

import argparse
import sys
import time

from proofs.check import PROFILES, run_all
from proofs.variants import MUTANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    results = run_all(args.profile, args.seed)
    elapsed = time.perf_counter() - start

    print(f"proofs: profile={args.profile} seed={args.seed}")
    failures = 0
    for suite, res in results.items():
        print(f"\n== {suite}: {'ok' if res.ok else 'FAILED'}")
        for key in sorted(res.counts):
            print(f"  {key}: {res.counts[key]}")
        for note in res.notes:
            print(f"  - {note}")
        for failure in res.failures:
            print(f"  FAIL {failure}")
        failures += len(res.failures)
    print("\nmutants (what each gets wrong):")
    for name, v in MUTANTS.items():
        print(f"  {name}: {v.how}")
    verdict = "all proofs hold, every mutant caught" if not failures else f"{failures} FAILED"
    print(f"\n{verdict} ({elapsed:.1f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
