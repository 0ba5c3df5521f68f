"""Structural pattern matching (`match` statements) over Vars: what MATCH_SEQUENCE,
MATCH_MAPPING, MATCH_KEYS and MATCH_CLASS ask of a subject, as ceval.c answers it.
"""
from __future__ import annotations

import collections

from .base import Var, unsupported
from .builtins import _class_value, _instance_check
from .constant import ConstVar
from .containers import DictVar, TupleVar, _dict_key as dict_key

_TPFLAGS_SEQUENCE, _TPFLAGS_MAPPING = 1 << 5, 1 << 6
# Mappings whose get() is dict's own (MATCH_KEYS calls the subject's get()).
_PLAIN_MAPPINGS = (dict, collections.OrderedDict, collections.defaultdict)
# Classes whose single positional sub-pattern matches the subject itself.
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)




def is_sequence_subject(subject: Var) -> bool:
    """MATCH_SEQUENCE: the subject's type is a sequence (Py_TPFLAGS_SEQUENCE)."""
    return bool(subject.python_type().__flags__ & _TPFLAGS_SEQUENCE)


def is_mapping_subject(subject: Var) -> bool:
    """MATCH_MAPPING: the subject's type is a mapping (Py_TPFLAGS_MAPPING)."""
    return bool(subject.python_type().__flags__ & _TPFLAGS_MAPPING)


def match_keys(tx, subject: Var, keys_var: Var) -> Var:
    """MATCH_KEYS: the subject's values of a mapping pattern's keys (a tuple), or None
    when one is missing."""
    keys = [dict_key(k) for k in keys_var.unpack(tx)]
    if not isinstance(subject, DictVar) or subject.python_type() not in _PLAIN_MAPPINGS:
        # Others answer through their own get(), which may be user code.
        unsupported(f"mapping pattern on {subject}")
    if len(set(keys)) != len(keys):
        unsupported("mapping pattern checks a key twice (ValueError)")
    if all(k in subject.items for k in keys):
        return TupleVar([subject.items[k] for k in keys])
    return ConstVar(None)


def match_class(tx, subject, cls_var, npos, names):
    """MATCH_CLASS: the subject's attributes a class pattern binds, or None (no match)."""
    cls = _class_value(cls_var)
    if not isinstance(cls, type):
        unsupported("called match pattern must be a class (TypeError)")
    if not _instance_check(tx, subject, cls_var):
        return ConstVar(None)
    attrs = []
    if npos:
        match_args = cls_var.getattr(tx, "__match_args__") if hasattr(cls, "__match_args__") else None
        if match_args is None:
            if cls not in _SELF_MATCHING or npos > 1:
                unsupported(f"{cls.__name__}() accepts 0 positional sub-patterns (TypeError)")
            attrs.append(subject)
            positional = ()
        else:
            positional = match_args.as_const() if match_args.is_const() else None
            if type(positional) is not tuple or not all(type(n) is str for n in positional):
                unsupported(f"{cls.__name__}.__match_args__ must be a tuple of strings")
            if npos > len(positional):
                unsupported(f"{cls.__name__}() accepts {len(positional)} positional sub-patterns")
            positional = positional[:npos]
    else:
        positional = ()
    seen = set()
    for name in (*positional, *names):
        if name in seen:
            unsupported(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        # A missing attribute is no match in CPython; here it stops the trace (the
        # tracer cannot tell "missing" from "not followed").
        attrs.append(tx._getattr(subject, name))
    return TupleVar(attrs)
