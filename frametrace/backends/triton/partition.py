"""What the forward saves for the backward and what the backward recomputes.

`RECOMPUTABLE_OPS`: OpOverloads whose results the partitioner may recompute in the
backward from their inputs instead of saving them (cheap, and deterministic given their
inputs).  Other modules add their ops to it (rng.py: the seeded random op, so that a
dropout mask is recomputed from its seed rather than saved).
"""
from __future__ import annotations

RECOMPUTABLE_OPS: set = set()
