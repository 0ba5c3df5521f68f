"""Python builtins while tracing: evaluated at trace time on constants, or given
meaning on traced values (len of a list, isinstance of a tensor, zip of lists ...)."""
from __future__ import annotations

import operator

import torch

from .base import Var, unsupported
from .constant import ConstVar
from .containers import DictVar, IteratorVar, ListVar, TupleVar
from .objects import (MethodVar, ObjectVar, SuperVar, TorchFnVar, _all_const, _const_kwargs,
                      _consts)
from .tensor import TensorVar


class BuiltinVar(ObjectVar):
    """A Python builtin: evaluated at trace time on constants, or given meaning on
    traced values (len of a list, isinstance of a tensor, ...)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        fn = self.value
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in _FOLDABLE_BUILTINS and _all_const(args, kwargs):
            try:
                return ConstVar(fn(*_consts(args), **_const_kwargs(kwargs)))
            except Exception as e:
                unsupported(f"{fn.__name__}() raised {type(e).__name__}: {e}")
        unsupported(f"builtin {fn.__name__}() on {args}")


def _python_type_of(tx, v: Var) -> type:
    return v.python_type()


def _len(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return ConstVar(args[0].length(tx))


def _isinstance(tx, args, kwargs):
    if len(args) != 2 or kwargs or not args[1].is_const() and not isinstance(args[1], ObjectVar) \
            and not isinstance(args[1], TupleVar):
        return None
    classes = args[1].as_const() if args[1].is_const() else (
        args[1].value if isinstance(args[1], ObjectVar)
        else tuple(c.value if isinstance(c, ObjectVar) else c.as_const() for c in args[1].items))
    t = _python_type_of(tx, args[0])
    if isinstance(args[0], TensorVar):
        # A FakeTensor stands for a plain tensor or a Parameter.
        probe = torch.nn.Parameter if t is torch.nn.Parameter else torch.Tensor
        return ConstVar(_class_covers(probe, classes))
    return ConstVar(_class_covers(t, classes))


def _class_covers(t, classes):
    try:
        return issubclass(t, classes)
    except TypeError:
        unsupported(f"isinstance with {classes!r}")


def _range(tx, args, kwargs):
    if _all_const(args, kwargs):
        return ConstVar(range(*_consts(args)))


def _tuple_list(kind):
    def handler(tx, args, kwargs):
        if kwargs or len(args) > 1:
            return None
        items = args[0].unpack(tx) if args else []
        return TupleVar(items) if kind is tuple else ListVar(items)
    return handler


def _dict(tx, args, kwargs):
    if args:
        return None
    return DictVar(kwargs)


def _enumerate(tx, args, kwargs):
    if len(args) in (1, 2) and not kwargs:
        start = args[1].as_const() if len(args) == 2 else 0
        return ListVar([TupleVar([ConstVar(i + start), v]) for i, v in enumerate(args[0].unpack(tx))])


def _zip(tx, args, kwargs):
    if not kwargs:
        cols = [a.unpack(tx) for a in args]
        return ListVar([TupleVar(list(row)) for row in zip(*cols)])


def _reversed(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return ListVar(list(reversed(args[0].unpack(tx))))


def _iter(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        return IteratorVar(args[0].unpack(tx))


def _abs(tx, args, kwargs):
    if len(args) == 1 and isinstance(args[0], TensorVar):
        return tx.output.call("call_function", operator.abs, (args[0],), {})


def _getattr(tx, args, kwargs):
    if len(args) in (2, 3) and args[1].is_const() and not kwargs:
        try:
            return args[0].getattr(tx, args[1].as_const())
        except Exception:
            if len(args) == 3:
                return args[2]
            raise


def _type(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        from .builder import wrap
        return wrap(tx, _python_type_of(tx, args[0]), None, guard=False)


def _super(tx, args, kwargs):
    if not args and not kwargs:
        return tx.zero_arg_super()
    if len(args) == 2:
        return SuperVar(args[0], args[1])


def _callable(tx, args, kwargs):
    from .functions import BoundMethodVar, NestedFunctionVar, PartialVar, UserFunctionVar
    if len(args) == 1:
        v = args[0]
        if isinstance(v, (UserFunctionVar, NestedFunctionVar, BoundMethodVar, PartialVar,
                          TorchFnVar, BuiltinVar, MethodVar)):
            return ConstVar(True)
        if isinstance(v, (ConstVar, TensorVar, TupleVar, ListVar, DictVar)):
            return ConstVar(callable(v.as_const()) if v.is_const() else False)
        if isinstance(v, ObjectVar):
            return ConstVar(callable(v.value))


def _hasattr(tx, args, kwargs):
    if len(args) == 2 and args[1].is_const():
        from .base import Unsupported
        try:
            args[0].getattr(tx, args[1].as_const())
            return ConstVar(True)
        except Unsupported:
            t = args[0].python_type()
            if isinstance(args[0], ObjectVar):
                return ConstVar(hasattr(args[0].value, args[1].as_const()))
            from .user_objects import UserObjectVar
            if isinstance(args[0], UserObjectVar):
                return ConstVar(hasattr(args[0].value, args[1].as_const()))
            return ConstVar(hasattr(t, args[1].as_const()))


_BUILTIN_HANDLERS = {
    len: _len, isinstance: _isinstance, range: _range, tuple: _tuple_list(tuple),
    list: _tuple_list(list), dict: _dict, enumerate: _enumerate, zip: _zip,
    reversed: _reversed, iter: _iter, abs: _abs, getattr: _getattr, type: _type,
    super: _super, callable: _callable, hasattr: _hasattr,
}

_FOLDABLE_BUILTINS = {abs, min, max, int, float, bool, str, round, divmod, pow, len, sum,
                      all, any, hash, repr, chr, ord, hex, oct, bin, sorted, complex}
