"""Names looked up on classes as CPython's type lookup does (the dicts along the MRO),
and the guards a trace that relies on the answer needs: classes are mutable, so a
method can be replaced, in a base class too."""
from __future__ import annotations

from ..source import AttrSource, ConstSource


def class_lookup(cls, name):
    """What `cls.__mro__`'s dicts hold for `name` (a descriptor unbound), else None."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def class_defines(cls, name) -> bool:
    """Whether `cls` or a base holds `name` (`class_lookup` answers None both for a
    missing name and for a class attribute set to None)."""
    return any(name in klass.__dict__ for klass in cls.__mro__)


def guard_class_none(tx, cls, name):
    """The trace took ``cls.name`` to be None (a class attribute, not a missing one)."""
    tx.guards.value(AttrSource(ConstSource(cls, cls.__qualname__), name), None)


def class_attr(tx, cls, name):
    """`class_lookup`, for a trace that relies on the answer: guarded."""
    found = class_lookup(cls, name)
    tx.guards.class_attr(cls, name, found)
    return found
