"""Python's operators over Vars: what BINARY_OP, COMPARE_OP, UNARY_*, IS_OP and
CONTAINS_OP mean for each kind of value, and the same semantics for the Vars that
apply an operator themselves (operator.add, a container's __contains__, sorted()'s
comparisons, ...).

A tensor operand makes a graph node (after guarding that no user dunder of the other
operand's class would run instead); containers, sets and dicts apply their own
methods; constants fold; symbolic sizes become SymNode nodes.  Whatever is not known
to be right stops the trace.
"""
from __future__ import annotations

import operator

import torch
import enum

from .base import Var, nouns, register, unsupported
from .builtins import IdVar, SetVar, is_picked, refuse_picked
from .constant import BINARY_FOLD, INPLACE_TO_PLAIN, ConstVar
from .containers import DictVar, IteratorVar, ListVar, SizeVar, TupleVar, _dict_key as dict_key, _matches
from .exceptions import ExceptionVar, raise_builtin, raise_folded
from .fx_values import to_fake
from .classes import class_attr
from .modules import NNModuleVar
from .numpy import is_numpy_var, numpy_binary_op, numpy_unary_op
from .objects import ObjectVar
from .scalars import capturing
from .subclasses import container_format, is_user_container, user_container_binary_op
from .symbolic import SliceVar, SymNodeVar, lazily_formatted
from .tensor import TensorVar, guard_operator
from .user_objects import is_user_object, user_object_binary_op

# Symbols of BINARY_OP's argument (dis._nb_ops) to operator functions, and COMPARE_OP's
# to relations: the interpreter's handlers apply them with binary_op.
BINARY_OPS = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv,
    "<<=": operator.ilshift, "@=": operator.imatmul, "*=": operator.imul,
    "%=": operator.imod, "|=": operator.ior, "**=": operator.ipow, ">>=": operator.irshift,
    "-=": operator.isub, "/=": operator.itruediv, "^=": operator.ixor,
}
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}

_SET_DUNDERS = {operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__",
                operator.xor: "__xor__", operator.eq: "__eq__", operator.ne: "__ne__",
                operator.le: "__le__", operator.ge: "__ge__", operator.lt: "__lt__",
                operator.gt: "__gt__"}
_SET_INPLACE = {operator.ior: "__ior__", operator.iand: "__iand__", operator.isub: "__isub__",
                operator.ixor: "__ixor__"}

@register
def binary_op(tx, fn, a: Var, b: Var) -> Var:
    """``fn(a, b)`` for a BINARY_OP or COMPARE_OP."""
    plain = INPLACE_TO_PLAIN.get(fn, fn)
    if is_user_object(a) or is_user_object(b) and not isinstance(a, TensorVar):
        made = user_object_binary_op(tx, fn, a, b, lambda x, y: is_same(x, y, tx))
        if made is not None:
            return made
    if isinstance(a, IdVar) or isinstance(b, IdVar):
        if plain in (operator.eq, operator.ne) and isinstance(a, IdVar) and isinstance(b, IdVar):
            return ConstVar(is_same(a.target, b.target, tx) == (plain is operator.eq))
        unsupported(f"{plain.__name__} on {a} and {b} (an address known only at run time)")
    if is_numpy_var(a) or is_numpy_var(b):
        return numpy_binary_op(tx, fn, a, b)
    if isinstance(a, TensorVar):
        guard_operator(tx, a, fn, reflected=False)
        return tx.output.call("call_function", fn, (a, b), {})
    if isinstance(b, TensorVar) and not (isinstance(a, ListVar) and fn is operator.iadd):
        # Only a tensor has in-place operators here: `x += t` on a number rebinds x to
        # `x + t` (int has no __iadd__), and the graph must record it that way.
        guard_operator(tx, b, plain, reflected=True)
        return tx.output.call("call_function", plain, (a, b), {})
    if isinstance(a, ListVar) and fn in (operator.iadd, operator.imul):
        a._check_mutable(tx)
        if fn is operator.iadd:
            a.items.extend(b.unpack(tx))
        else:
            a.items[:] = a.items * b.as_const()
        return a
    if is_user_container(a) or is_user_container(b):
        return user_container_binary_op(tx, fn, a, b)
    if isinstance(a, SetVar):
        if _no_set_operand(b) and plain not in (operator.eq, operator.ne) and \
                (plain in _SET_DUNDERS or fn in _SET_INPLACE):
            # Neither side takes the other (a constant has no reflected set operator).
            _operand_type_error(fn, plain, a, b)
        if fn in _SET_INPLACE and a.kind is set:
            return a.call_method(tx, _SET_INPLACE[fn], [b], {})
        if plain in _SET_DUNDERS:
            return a.call_method(tx, _SET_DUNDERS[plain], [b], {})
    if isinstance(b, SetVar) and plain in (operator.eq, operator.ne):
        return b.call_method(tx, _SET_DUNDERS[plain], [a], {})      # reflected
    if isinstance(a, DictVar) and plain is operator.or_:
        if fn is operator.or_ and isinstance(b, DictVar) and not isinstance(b, SetVar) and \
                b.python_type() is not a.python_type() and issubclass(b.python_type(), a.python_type()):
            return b.call_method(tx, "__ror__", [a], {})     # the subclass's reflected first
        return a.call_method(tx, "__ior__" if fn is operator.ior else "__or__", [b], {})
    seq = (TupleVar, ListVar)
    if plain is operator.add and TupleVar in (type(a), type(b)):
        # A constant tuple (`() + (t,)`) joins a traced one item by item.
        a, b = (TupleVar([ConstVar(i) for i in v.value])
                if isinstance(v, ConstVar) and type(v.value) is tuple else v for v in (a, b))
    if plain is operator.add and isinstance(a, seq) and type(a) is type(b):
        return type(a)(a.items + b.items)
    if plain is operator.add and {type(a), type(b)} == {TupleVar, ConstVar} and \
            type((a if isinstance(a, ConstVar) else b).value) is tuple:
        # A constant tuple (`()`) and a traced one.
        items = [x.unpack(tx) if isinstance(x, TupleVar) else [ConstVar(c) for c in x.value]
                 for x in (a, b)]
        return TupleVar(items[0] + items[1])
    if plain is operator.mul and isinstance(a, seq) and isinstance(b, (ConstVar, SymNodeVar)):
        return type(a)(a.items * b.as_const())
    if plain is operator.mul and isinstance(b, seq) and isinstance(a, (ConstVar, SymNodeVar)):
        return type(b)(b.items * a.as_const())
    if _symbolic(a) or _symbolic(b):
        return _symbolic_op(tx, plain, a, b)
    if a.is_const() and b.is_const() and not isinstance(a, ListVar) and not isinstance(b, ListVar) \
            and plain in BINARY_FOLD:
        try:
            return ConstVar(plain(a.as_const(), b.as_const()))
        except Exception as e:
            raise_folded(e, f"{plain.__name__} on constants")
    kinds = _sequence_kinds(a, b) if plain in (operator.eq, operator.ne) else None
    if kinds is not None:
        # list_richcompare / tuplerichcompare: lengths, then item by item (`is`, then
        # `==`) up to the first that differs; a list and a tuple are never equal
        ia, ib = a.unpack(tx), b.unpack(tx)
        equal = kinds and len(ia) == len(ib) and all(_matches(tx, x, y) for x, y in zip(ia, ib))
        return ConstVar(equal == (plain is operator.eq))
    if plain in (operator.eq, operator.ne) and isinstance(a, ObjectVar) and isinstance(b, ObjectVar):
        same = a.value == b.value
        return ConstVar(same if plain is operator.eq else not same)
    if plain in (operator.eq, operator.ne) and _compares_by_identity(tx, a) and _compares_by_identity(tx, b):
        # (`layer == self.layer0`: object.__eq__ on both sides, an identity test)
        return ConstVar(is_same(a, b, tx) == (plain is operator.eq))
    unsupported(f"{plain.__name__} on {a} and {b}")


def _compares_by_identity(tx, v) -> bool:
    """A module whose class keeps object's __eq__ and __ne__ (guarded)."""
    if not isinstance(v, NNModuleVar):
        return False
    cls = type(v.module)
    return all(class_attr(tx, cls, name) is getattr(object, name) for name in ("__eq__", "__ne__"))


def _sequence_kinds(a, b):
    """For two lists or tuples the trace holds the items of: whether they are of one
    kind (two lists, or two tuples: a namedtuple is one).  None for anything else."""
    if not (isinstance(a, (TupleVar, ListVar)) and isinstance(b, (TupleVar, ListVar))):
        return None
    ta, tb = a.python_type(), b.python_type()
    if not all(t is list or issubclass(t, tuple) for t in (ta, tb)):
        return None
    return ta is tb is list or issubclass(ta, tuple) and issubclass(tb, tuple)


_OP_SYMBOLS = {operator.or_: "|", operator.and_: "&", operator.sub: "-", operator.xor: "^",
               operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
               operator.ior: "|=", operator.iand: "&=", operator.isub: "-=", operator.ixor: "^="}


def _no_set_operand(v: Var) -> bool:
    return isinstance(v, ConstVar) and type(v.value) in (int, float, complex, str, bytes, bool,
                                                         type(None), tuple)


def _operand_type_error(fn, plain, a, b):
    left, right = a.python_type().__name__, type(b.value).__name__
    if plain in (operator.lt, operator.le, operator.gt, operator.ge):
        raise_builtin(TypeError, f"'{_OP_SYMBOLS[plain]}' not supported between instances of "
                                 f"'{left}' and '{right}'")
    symbol = _OP_SYMBOLS[fn] if fn in _OP_SYMBOLS else _OP_SYMBOLS[plain]
    raise_builtin(TypeError, f"unsupported operand type(s) for {symbol}: '{left}' and '{right}'")


def _symbolic(v: Var) -> bool:
    if isinstance(v, SymNodeVar):
        return True
    return isinstance(v, TupleVar) and any(isinstance(i, SymNodeVar) for i in v.items)


def _symbolic_op(tx, fn, a: Var, b: Var) -> Var:
    """An operator on symbolic sizes: numbers become graph nodes with a symbolic result;
    sequences (shapes) are compared item by item, each comparison a guard."""
    if not isinstance(a, TupleVar) and not isinstance(b, TupleVar):
        if not all(isinstance(v, SymNodeVar) or v.is_const() for v in (a, b)):
            unsupported(f"{fn.__name__} on {a} and {b}")
        return tx.output.call("call_function", fn, (a, b), {})
    if fn is operator.add:
        seqs = [v if isinstance(v, TupleVar) else TupleVar([ConstVar(i) for i in v.value])
                if isinstance(v, ConstVar) and isinstance(v.value, tuple) else None for v in (a, b)]
        if None not in seqs:
            # torch.Size wins on either side (Size.__radd__), as in CPython.
            kind = SizeVar if any(isinstance(v, SizeVar) or isinstance(v, ConstVar) and
                                  isinstance(v.value, torch.Size) for v in (a, b)) else TupleVar
            return kind(seqs[0].items + seqs[1].items)
    if fn in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
        return ConstVar(bool(fn(to_fake(a), to_fake(b))))
    unsupported(f"{fn.__name__} on {a} and {b}")


@register
def unary_op(tx, fn, v: Var) -> Var:
    if is_numpy_var(v):
        return numpy_unary_op(tx, fn, v)
    if isinstance(v, (TensorVar, SymNodeVar)):
        if isinstance(v, TensorVar):
            guard_operator(tx, v, fn, reflected=False)
        return tx.output.call("call_function", fn, (v,), {})
    if isinstance(v, ConstVar):
        return ConstVar(fn(v.value))
    unsupported(f"{fn.__name__} on {v}")


def _real_identity(v: Var):
    """The real object a Var stands for, when there is exactly one."""
    for attr in ("value", "fn", "module"):
        if attr in getattr(type(v), "__slots__", ()) or hasattr(v, attr):
            obj = getattr(v, attr, _MISSING)
            if obj is not _MISSING and not isinstance(obj, Var):
                return obj
    return _MISSING


_MISSING = object()


# Constants whose identity follows from their type and value (guarded by both).
_ONE_OBJECT_PER_VALUE = (type(None), bool, type(Ellipsis), type(NotImplemented), torch.dtype)


def _constant_identity(tx, a, b, same: bool):
    """`a is b` of two constants was answered from the objects traced.  Where their
    guarded types and values do not decide it (two NaNs, two equal large ints or
    strings, equal tuples), that they are, or are not, one object is a fact: guarded
    between their sources, or (a constant made in the frame, or read back from a
    container) the comparison is left to CPython."""
    va, vb = a.value, b.value
    if type(va) is not type(vb) or isinstance(va, _ONE_OBJECT_PER_VALUE) or isinstance(va, enum.Enum):
        return
    try:
        if va == va and vb == vb and va != vb:
            return          # two values: never one object
    except Exception:
        pass
    if tx is None or a.source is None or b.source is None:
        unsupported(f"'is' between equal constants {a} and {b} (which objects they are is not guarded)")
    (tx.guards.same_object if same else tx.guards.distinct_objects)(a.source, b.source)


def _frame_tuples_identity(tx, a, b):
    """`a is b` of two tuples read from the frame (an argument, a dict's key read back),
    each with its source: the objects traced answer, guarded between the sources (the
    same object, or two).  None where that is not known."""
    def real(v):
        if type(v) is TupleVar and v.source is not None:
            return getattr(v, "real", None)
        if isinstance(v, ConstVar) and type(v.value) is tuple and v.source is not None:
            return v.value
        return None
    ra, rb = real(a), real(b)
    if tx is None or ra is None or rb is None:
        return None
    same = ra is rb
    (tx.guards.same_object if same else tx.guards.distinct_objects)(a.source, b.source)
    return same


@register
def is_same(a: Var, b: Var, tx=None) -> bool:
    if a is b:
        return True
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        same = a.value is b.value
        _constant_identity(tx, a, b, same)
        return same
    ra, rb = _real_identity(a), _real_identity(b)
    if ra is not _MISSING and rb is not _MISSING and not isinstance(a, TensorVar):
        return ra is rb
    if isinstance(a, TensorVar) and isinstance(b, TensorVar):
        if a.example is b.example:      # one FakeTensor per real tensor
            return True
        if tx is not None and (is_picked(tx, a) or is_picked(tx, b)):
            refuse_picked("`is`")
        ia, ib = (tx.output.input_of(a), tx.output.input_of(b)) if tx is not None else (None, None)
        if ia is not None and ib is not None:
            # Two inputs, distinct objects now: the answer holds while they stay so.
            tx.guards.distinct_objects(*sorted((ia.source, ib.source), key=lambda s: s.name()))
        return False
    if any((is_user_container(v) or is_user_object(v)) and v.source is None for v in (a, b)):
        return False        # an object of a user class made in the frame: a new one
    same = _frame_tuples_identity(tx, a, b)
    if same is not None:
        return same
    if isinstance(a, ConstVar) or isinstance(b, ConstVar):
        const, other = (a, b) if isinstance(a, ConstVar) else (b, a)
        if type(other) is TupleVar and type(const.value) is tuple and other.is_const() and \
                other.as_const() == const.value:     # (unequal: two objects)
            # An equal tuple may be that very object (a dict's key read back, the code's
            # constant): which it is, is not guarded
            unsupported(f"'is' between equal tuples {a} and {b} (which objects they are is not guarded)")
        if isinstance(other, (TensorVar, TupleVar, ListVar, DictVar, SymNodeVar)):
            return False
        try:
            # a constant is not an object of another type (`cache is None` for a cache
            # object made in the frame)
            if not isinstance(other, ConstVar) and type(const.value) is not other.python_type():
                return False
        except Exception:
            pass
    if isinstance(a, (TupleVar, ListVar, DictVar)) or isinstance(b, (TupleVar, ListVar, DictVar)):
        # Objects of two different types are two objects (a tuple default `is` a
        # sentinel object: torch.optim's `required`).
        try:
            if a.python_type() is not b.python_type():
                return False
        except Exception:
            pass
    unsupported(f"'is' between {a} and {b}")


def is_none(v: Var) -> bool:
    if isinstance(v, ConstVar):
        return v.value is None
    if isinstance(v, ObjectVar):
        return v.value is None
    return False          # OpaqueVar: see InstructionTranslator._is_none


@register
def contains(tx, container: Var, item: Var) -> bool:
    if container.contains is not None:
        return container.contains(tx, item)
    dunder = container._dunder
    if dunder is not None:
        return dunder(tx, "__contains__", [item]).truth(tx)
    if isinstance(container, DictVar):
        return container.has_key(dict_key(item))
    if isinstance(container, ConstVar) and item.is_const():
        # The container's own __contains__: substrings of str and bytes, ranges ...
        try:
            return item.as_const() in container.value
        except Exception as e:
            unsupported(f"'in' {container.value!r} raised {type(e).__name__}: {e}")
    if isinstance(container, (TupleVar, ListVar)) and item.is_const():
        members = container.unpack(tx)
        if all(m.is_const() for m in members):
            # (`is`, then `==`: which NaN objects they are is not guarded, see _matches)
            return any(_matches(tx, m, item) for m in members)
    if isinstance(item, ObjectVar) and isinstance(container, (TupleVar, ListVar)):
        return any(isinstance(m, ObjectVar) and m.value is item.value for m in container.items)
    if isinstance(container, (TupleVar, ListVar)):
        # each item in order: `is`, then `==` and its truth (a tensor found by identity
        # before any other is compared by value)
        return any(_matches(tx, m, item) for m in container.unpack(tx))
    if isinstance(container, IteratorVar):
        # Consumed up to the first match, as CPython's (`is`, then `==`).
        while True:
            m = container.next()
            if m is None:
                return False
            if _matches(tx, m, item):
                return True
    unsupported(f"'in' with {item} and {container}")


def delete_list_item(tx, seq, key: Var):
    """``del seq[key]`` on a list (or deque) the trace holds the items of."""
    if not key.is_const():
        unsupported(f"del with index {key}")
    k = key.as_const()
    if isinstance(k, slice) and seq.python_type() is not list:
        unsupported("sequence index must be integer, not 'slice' (TypeError)")
    if not isinstance(k, (int, slice)):
        unsupported(f"list indices must be integers or slices, not {type(k).__name__} (TypeError)")
    if isinstance(k, int) and not -len(seq.items) <= k < len(seq.items):
        unsupported("list assignment index out of range (IndexError)")
    seq._check_mutable(tx)
    del seq.items[k]


def make_slice(parts, tx) -> Var:
    """slice(*parts) (BUILD_SLICE, BINARY_SLICE, STORE_SLICE): a constant, or a SliceVar
    with symbolic bounds."""
    if any(isinstance(p, TensorVar) for p in parts) and capturing():
        # A tensor bound is read by __index__: a number of the graph (see scalars.py).
        parts = [p.call_method(tx, "__index__", [], {}) if isinstance(p, TensorVar) else p
                 for p in parts]
    if any(isinstance(p, SymNodeVar) for p in parts):
        return SliceVar(parts)
    if not all(p.is_const() for p in parts):
        unsupported(f"slice with non-constant bounds {nouns(parts)}")
    return ConstVar(slice(*(p.as_const() for p in parts)))


def format_value(tx, value: Var, conv: int, spec: str) -> Var:
    """f-string formatting of `value` (FORMAT_VALUE/CONVERT_VALUE/FORMAT_SIMPLE/
    FORMAT_WITH_SPEC): conv 0 none, 1 str, 2 repr, 3 ascii; a symbolic value stays lazy."""
    if isinstance(value, ExceptionVar) and conv in (0, 1) and not spec:
        value = value.format_of(tx)
    lazy = lazily_formatted(value, conv, spec)
    if lazy is not None:
        return lazy
    if not value.is_const():
        text = container_format(tx, value, "repr" if conv == 2 else "str") \
            if conv != 3 and not spec else None
        if text is None:
            unsupported(f"formatting {value} into a string")
        return ConstVar(text)
    v = value.as_const()
    v = {0: v, 1: str(v) if conv == 1 else v, 2: repr(v), 3: ascii(v)}[conv] if conv else v
    return ConstVar(format(v, spec))
