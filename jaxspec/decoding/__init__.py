"""Decoding: plain and speculative generation, sampling and its position-keyed
randomness, the verification rule, the figures and the papers' analytic model."""
