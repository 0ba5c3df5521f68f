"""What is known of each resume code (resume.py makes them): the code and offsets it was
made from, its locals that hold opaque data, the lists the break made for a loop's
iterator.  A leaf, so that the interpreter and the Vars tracing a resume code read these
without importing the frame-driving layer that makes them."""
from __future__ import annotations

import types

# resume code -> (original code, {offset in the resume code: offset in the original}),
# and the locals that hold opaque data there.
_origin: dict[types.CodeType, tuple] = {}
_opaque: dict[types.CodeType, frozenset] = {}
# resume code -> its parameters that are lists made by the break for an "i" slot: only
# the loop's iterator sees them.
_private: dict[types.CodeType, frozenset] = {}


def opaque_locals(code) -> frozenset:
    return _opaque.get(code, frozenset())


def original_code(code):
    """The code a resume code was made from (itself for any other code)."""
    hit = _origin.get(code)
    return code if hit is None else hit[0]


def private_lists(code) -> frozenset:
    return _private.get(code, frozenset())


def original_position(code, offset):
    """(original code, offset there) for an instruction of `code`, which may itself be
    a resume code: resuming a resume starts from the original, so a loop that breaks
    on every iteration reuses one resume code."""
    hit = _origin.get(code)
    if hit is None:
        return code, offset
    original, offsets = hit
    return original, offsets[offset]
