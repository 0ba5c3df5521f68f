"""Standard-library callables with meaning while tracing (math, operator, functools,
itertools, collections).  Each handler takes (tx, args, kwargs) and returns a Var, or
None to say it does not apply (the call is then unsupported).

math functions fold on constants; operator functions follow the interpreter's own
semantics (graph ops on tensors, folding on constants); itertools give lazy iterators
(see iterators.LazyIteratorVar); collections.OrderedDict / defaultdict / deque made
while tracing are Vars of their own (below), rebuilt by the transformed code when
returned."""
from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
import traceback
import types

import torch

from . import log_calls as _log_calls
from .base import Var, binary_op, contains, is_same, unary_op, unsupported
from .builtins import _dict, _is_none_var, call_item_fn, var_iter, var_list
from .iterators import LazyIteratorVar, const_key
from .constant import ConstVar, fold_call
from .containers import DictVar, IteratorVar, ListVar, TupleVar, _dict_key, key_var
from .objects import ObjectVar, _all_const
from .symbolic import SymNodeVar
from .tensor import TensorVar
from .exceptions import TracebackVar
from .functions import cached_call, is_inlinable


class LibraryFnVar(ObjectVar):
    """A standard-library function whose call is handled in LIBRARY_HANDLERS."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        result = LIBRARY_HANDLERS[self.value](tx, args, kwargs)
        if result is None:
            unsupported(f"{getattr(self.value, '__qualname__', self.value)}() with these arguments")
        return result


def _fold(fn):
    """Evaluate `fn` now on constant arguments."""
    name = getattr(fn, "__qualname__", repr(fn))

    def handler(tx, args, kwargs):
        if not _all_const(args, kwargs):
            if any(isinstance(a, TensorVar) for a in (*args, *kwargs.values())):
                unsupported(f"{name}() of a tensor needs the tensor's data")
            return None
        return fold_call(fn, args, kwargs, name)
    return handler


# --------------------------------------------------------------------------- functools
def _reduce(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    fn, items = args[0], var_iter(tx, args[1])
    if len(args) == 3:
        acc = args[2]
    else:
        acc = next(items, None)
        if acc is None:
            unsupported("reduce() of an empty iterable with no initial value (TypeError)")
    for item in items:
        acc = fn.call(tx, [acc, item], {})
    return acc


class CachedFunctionVar(ObjectVar):
    """A Python function wrapped by functools.lru_cache / functools.cache.  CPython
    answers a repeated call from the cache, and the wrapped function runs again only on
    a miss, so the answer is the cache's, not what the function would compute now: the
    real call is made, and its guard calls again (see functions.cached_call)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        return cached_call(tx, self, args, kwargs)


# --------------------------------------------------------------------------- operator
def _op_binary(fn):
    def handler(tx, args, kwargs):
        if len(args) == 2 and not kwargs:
            return binary_op(tx, fn, args[0], args[1])
    return handler


def _op_unary(fn):
    def handler(tx, args, kwargs):
        if len(args) == 1 and not kwargs:
            return unary_op(tx, fn, args[0])
    return handler


def _op_abs(tx, args, kwargs):
    if len(args) == 1 and not kwargs:
        if isinstance(args[0], TensorVar):
            return tx.output.call("call_function", operator.abs, (args[0],), {})
        if args[0].is_const():
            return ConstVar(abs(args[0].as_const()))


def _op_truth(negate):
    def handler(tx, args, kwargs):
        if len(args) == 1 and not kwargs:
            return ConstVar(args[0].truth(tx) != negate)
    return handler


def _op_is(negate):
    def handler(tx, args, kwargs):
        if len(args) == 2 and not kwargs:
            return ConstVar(is_same(args[0], args[1], tx) != negate)
    return handler


def _op_contains(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        return ConstVar(contains(tx, args[0], args[1]))


def _op_getitem(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        return args[0].getitem(tx, args[1])


def _op_setitem(tx, args, kwargs):
    if len(args) == 3 and not kwargs:
        args[0].setitem(tx, args[1], args[2])
        return ConstVar(None)


def _op_delitem(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        delitem = args[0].delitem
        if delitem is None:
            unsupported(f"del on {args[0]}")
        delitem(tx, args[1])
        return ConstVar(None)


def _op_call(tx, args, kwargs):
    if args:
        return args[0].call(tx, list(args[1:]), kwargs)


class GetterVar(Var):
    """operator.itemgetter / attrgetter / methodcaller with constant arguments."""
    __slots__ = ("kind", "keys", "args", "kwargs")

    def __init__(self, kind, keys, args=(), kwargs=None):
        super().__init__(None)
        self.kind = kind
        self.keys = list(keys)
        self.args = list(args)
        self.kwargs = dict(kwargs or {})

    def python_type(self):
        return self.kind

    def _one(self, tx, obj, key):
        if self.kind is operator.itemgetter:
            return obj.getitem(tx, ConstVar(key))
        if self.kind is operator.attrgetter:
            for part in key.split("."):
                obj = obj.getattr(tx, part)
            return obj
        return obj.call_method(tx, key, self.args, self.kwargs)

    def call(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            unsupported(f"{self.kind.__name__} called with {len(args)} arguments")
        values = [self._one(tx, args[0], k) for k in self.keys]
        return values[0] if len(values) == 1 else TupleVar(values)

    def reconstruct(self, cg):
        cg.load_constructor(self.kind)
        for k in self.keys:
            cg.load_const(k)
        for a in self.args:
            a.reconstruct(cg)
        for v in self.kwargs.values():
            v.reconstruct(cg)
        cg.call_kw(len(self.keys) + len(self.args) + len(self.kwargs), tuple(self.kwargs))


def _getter(kind):
    def handler(tx, args, kwargs):
        if kind is operator.methodcaller:
            if not args:
                return None
            return GetterVar(kind, [const_key(args[0], "method name")], args[1:], kwargs)
        if not args or kwargs:
            return None
        return GetterVar(kind, [const_key(a, f"{kind.__name__} argument") for a in args])
    return handler


# --------------------------------------------------------------------------- itertools
def _lazy(gen, kind):
    return LazyIteratorVar(gen, kind)


def _chain(tx, args, kwargs):
    if kwargs:
        return None
    iters = [var_iter(tx, a) for a in args]
    return _lazy(itertools.chain(*iters), itertools.chain)


def _chain_from_iterable(tx, args, kwargs):
    if kwargs or len(args) != 1:
        return None
    outer = var_iter(tx, args[0])

    def gen():
        for inner in outer:
            yield from var_iter(tx, inner)
    return _lazy(gen(), itertools.chain)


def _product(tx, args, kwargs):
    if set(kwargs) - {"repeat"}:
        return None
    repeat = const_key(kwargs.get("repeat", ConstVar(1)), "repeat")
    pools = [var_list(tx, a) for a in args]
    return _lazy((TupleVar(list(p)) for p in itertools.product(*pools, repeat=repeat)),
                 itertools.product)


def _combinatoric(kind):
    def handler(tx, args, kwargs):
        if not args or len(args) > 2 or set(kwargs) - {"r"}:
            return None
        pool = var_list(tx, args[0])
        r = args[1] if len(args) == 2 else kwargs.get("r", ConstVar(None))
        r = const_key(r, "r")
        if r is None:
            if kind is not itertools.permutations:
                return None
            gen = kind(pool)
        else:
            gen = kind(pool, r)
        return _lazy((TupleVar(list(p)) for p in gen), kind)
    return handler


def _accumulate(tx, args, kwargs):
    if not args or len(args) > 2 or set(kwargs) - {"func", "initial"}:
        return None
    func = args[1] if len(args) == 2 else kwargs.get("func", ConstVar(None))
    initial = kwargs.get("initial", ConstVar(None))
    source = var_iter(tx, args[0])

    def gen():
        acc = None if _is_none_var(initial) else initial
        if acc is not None:
            yield acc
        for v in source:
            if acc is None:
                acc = v
            elif _is_none_var(func):
                acc = binary_op(tx, operator.add, acc, v)
            else:
                acc = call_item_fn(tx, func, [acc, v])
            yield acc
    return _lazy(gen(), itertools.accumulate)


def _islice(tx, args, kwargs):
    if kwargs or not 2 <= len(args) <= 4:
        return None
    bounds = [const_key(a, "islice bound") for a in args[1:]]
    try:
        gen = itertools.islice(var_iter(tx, args[0]), *bounds)
    except (ValueError, TypeError) as e:
        unsupported(f"islice(): {e}")
    return _lazy(gen, itertools.islice)


def _zip_longest(tx, args, kwargs):
    if set(kwargs) - {"fillvalue"}:
        return None
    fill = kwargs.get("fillvalue", ConstVar(None))
    iters = [var_iter(tx, a) for a in args]
    return _lazy((TupleVar(list(row)) for row in itertools.zip_longest(*iters, fillvalue=fill)),
                 itertools.zip_longest)


def _repeat(tx, args, kwargs):
    if not args or len(args) > 2 or set(kwargs) - {"times"}:
        return None
    obj = args[0]
    times = args[1] if len(args) == 2 else kwargs.get("times")
    if times is None:
        return _lazy(itertools.repeat(obj), itertools.repeat)
    return _lazy(itertools.repeat(obj, const_key(times, "times")), itertools.repeat)


def _count(tx, args, kwargs):
    if len(args) > 2 or set(kwargs) - {"start", "step"}:
        return None
    start = args[0] if args else kwargs.get("start", ConstVar(0))
    step = args[1] if len(args) > 1 else kwargs.get("step", ConstVar(1))
    gen = itertools.count(const_key(start, "count start"), const_key(step, "count step"))
    return _lazy((ConstVar(v) for v in gen), itertools.count)


def _cycle(tx, args, kwargs):
    if kwargs or len(args) != 1:
        return None
    source = var_iter(tx, args[0])
    return _lazy(itertools.cycle(source), itertools.cycle)


def _pairwise(tx, args, kwargs):
    if kwargs or len(args) != 1:
        return None
    return _lazy((TupleVar([a, b]) for a, b in itertools.pairwise(var_iter(tx, args[0]))),
                 itertools.pairwise)


def _starmap(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    fn, source = args[0], var_iter(tx, args[1])
    return _lazy((call_item_fn(tx, fn, var_list(tx, row)) for row in source), itertools.starmap)


def _while(kind):
    def handler(tx, args, kwargs):
        if kwargs or len(args) != 2:
            return None
        fn, source = args[0], var_iter(tx, args[1])
        pred = lambda v: call_item_fn(tx, fn, [v]).truth(tx)  # noqa: E731
        return _lazy(kind(pred, source), kind)
    return handler


def _same_key(tx, a, b) -> bool:
    """PyObject_RichCompareBool(a, b, Py_EQ): identity first, then ==."""
    if a is b or isinstance(a, ConstVar) and isinstance(b, ConstVar) and a.value is b.value:
        return True
    return binary_op(tx, operator.eq, a, b).truth(tx)


class _GroupBy:
    """itertools.groupby as CPython's C code runs it: one underlying iterator; a group
    yields only while it is the newest group (advancing the outer ends the others)."""

    def __init__(self, tx, source, key):
        self.tx, self.source, self.key = tx, source, key
        self.tgtkey = self.currkey = self.currvalue = None
        self.current = None

    def _step(self) -> bool:
        value = next(self.source, None)
        if value is None:
            return False
        self.currkey = value if _is_none_var(self.key) else call_item_fn(self.tx, self.key, [value])
        self.currvalue = value
        return True

    def groups(self):
        while True:
            self.current = None
            while not (self.currkey is not None and (self.tgtkey is None or not _same_key(
                    self.tx, self.tgtkey, self.currkey))):
                if not self._step():
                    return
            self.tgtkey = self.currkey
            token = self.current = object()
            yield TupleVar([self.currkey, _lazy(self._group(token, self.tgtkey), _GROUPER)])

    def _group(self, token, tgtkey):
        while self.current is token:
            if self.currvalue is None and not self._step():
                return
            if not _same_key(self.tx, tgtkey, self.currkey):
                return
            value, self.currvalue = self.currvalue, None
            yield value


_GROUPER = type(next(itertools.groupby([1]))[1])


def _groupby(tx, args, kwargs):
    if len(args) > 2 or set(kwargs) - {"key"} or not args and "iterable" not in kwargs:
        return None
    source = var_iter(tx, args[0])
    key = args[1] if len(args) == 2 else kwargs.get("key", ConstVar(None))
    return _lazy(_GroupBy(tx, source, key).groups(), itertools.groupby)


def _tee(tx, args, kwargs):
    if kwargs or not 1 <= len(args) <= 2:
        return None
    n = const_key(args[1], "tee count") if len(args) == 2 else 2
    if not isinstance(n, int) or n < 0:
        unsupported("tee(): n must be >= 0 (ValueError)")
    source = var_iter(tx, args[0])
    buffer = []

    def follower():
        i = 0
        while True:
            if i == len(buffer):
                v = next(source, None)
                if v is None:
                    return
                buffer.append(v)
            i += 1
            yield buffer[i - 1]
    return TupleVar([_lazy(follower(), _TEE) for _ in range(n)])


_TEE = type(itertools.tee([])[0])


def _compress(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    data, selectors = var_iter(tx, args[0]), var_iter(tx, args[1])
    return _lazy((d for d, s in zip(data, selectors) if s.truth(tx)), itertools.compress)


# --------------------------------------------------------------------------- collections
def _mutating(var, tx):
    if var.source is not None:
        tx.side_effects.mutate_container(var, var)


class OrderedDictVar(DictVar):
    """A collections.OrderedDict made while tracing."""
    __slots__ = ()

    def python_type(self):
        return collections.OrderedDict

    def is_const(self):
        return False

    def as_const(self):
        return collections.OrderedDict(super().as_const())

    def call_method(self, tx, name, args, kwargs):
        if name == "move_to_end" and args and set(kwargs) <= {"last"}:
            key = _dict_key(args[0])
            if key not in self.items:
                unsupported(f"move_to_end of missing key {key!r} (KeyError)")
            _mutating(self, tx)
            last = const_key(args[1] if len(args) > 1 else kwargs.get("last", ConstVar(True)))
            od = collections.OrderedDict(self.items)
            od.move_to_end(key, last)
            self.items = dict(od)
            return ConstVar(None)
        if name == "popitem" and len(args) <= 1 and set(kwargs) <= {"last"}:
            if not self.items:
                unsupported("popitem(): dictionary is empty (KeyError)")
            _mutating(self, tx)
            last = const_key(args[0] if args else kwargs.get("last", ConstVar(True)))
            key = list(self.items)[-1 if last else 0]
            return TupleVar([self.key_var(key), self.items.pop(key)])
        if name == "copy" and not args:
            return OrderedDictVar(self.items)
        return super().call_method(tx, name, args, kwargs)

    def copy_with(self, items):
        return OrderedDictVar(items)

    def reconstruct(self, cg):
        # One object however many places refer to it; one from outside is itself.
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        cg.load_constructor(collections.OrderedDict)
        self.emit_items(cg)
        cg.call(1)
        cg.keep_rebuilt(self)


class DefaultDictVar(DictVar):
    """A collections.defaultdict made while tracing: missing keys call the factory."""
    __slots__ = ("factory",)

    def __init__(self, factory, items, source=None):
        super().__init__(items, source)
        self.factory = factory

    def python_type(self):
        return collections.defaultdict

    def is_const(self):
        return False

    def getitem(self, tx, key):
        k = _dict_key(key)
        if k not in self.items:
            if _is_none_var(self.factory):
                unsupported(f"missing key {k!r} (KeyError)")
            _mutating(self, tx)
            self.store_key(key, self.factory.call(tx, [], {}))
        return self.items[k]

    def getattr(self, tx, name):
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "copy" and not args:
            return DefaultDictVar(self.factory, self.items)
        return super().call_method(tx, name, args, kwargs)

    def copy_with(self, items):
        return DefaultDictVar(self.factory, items)

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        cg.load_constructor(collections.defaultdict)
        self.factory.reconstruct(cg)
        self.emit_items(cg)
        cg.call(2)
        cg.keep_rebuilt(self)

    def __repr__(self):
        return f"DefaultDictVar({self.factory!r}, {self.items!r})"


class DequeVar(ListVar):
    """A collections.deque made while tracing."""
    __slots__ = ("maxlen",)

    def __init__(self, items, maxlen=None, source=None):
        super().__init__(items, source)
        self.maxlen = maxlen
        self._trim(left=True)

    def python_type(self):
        return collections.deque

    def is_const(self):
        return False

    def _trim(self, left):
        if self.maxlen is not None and len(self.items) > self.maxlen:
            extra = len(self.items) - self.maxlen
            if left:
                del self.items[:extra]
            else:
                del self.items[-extra:]

    def getattr(self, tx, name):
        if name == "maxlen":
            return ConstVar(self.maxlen)
        return super().getattr(tx, name)

    def getitem(self, tx, key):
        k = const_key(key, "deque index")
        if isinstance(k, slice):
            unsupported("sequence index must be integer, not 'slice' (TypeError)")
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        if kwargs:
            unsupported(f"deque.{name} with keyword arguments")
        if name in _DEQUE_MUTATORS:
            self._check_mutable(tx)         # a deque from outside: written back
        if name == "append" and len(args) == 1:
            items.append(args[0])
            if self.maxlen is not None and len(items) > self.maxlen:
                del items[0]
            return ConstVar(None)
        if name == "appendleft" and len(args) == 1:
            items.insert(0, args[0])
            if self.maxlen is not None and len(items) > self.maxlen:
                del items[-1]
            return ConstVar(None)
        if name in ("extend", "extendleft") and len(args) == 1:
            # Item by item as they come (a generator reading the deque sees them),
            # except the deque itself, which CPython copies first.
            add = "append" if name == "extend" else "appendleft"
            src = var_list(tx, args[0]) if args[0] is self else var_iter(tx, args[0])
            for v in src:
                self.call_method(tx, add, [v], {})
            return ConstVar(None)
        if name in ("pop", "popleft") and not args:
            if not items:
                unsupported(f"{name} from an empty deque (IndexError)")
            return items.pop() if name == "pop" else items.pop(0)
        if name == "rotate" and len(args) <= 1:
            n = const_key(args[0]) if args else 1
            if items:
                n %= len(items)
                items[:] = items[-n:] + items[:-n] if n else items
            return ConstVar(None)
        if name == "clear" and not args:
            items.clear()
            return ConstVar(None)
        if name == "copy" and not args:
            return DequeVar(items, self.maxlen)
        if name == "insert":
            if self.maxlen is not None and len(items) >= self.maxlen:
                unsupported("deque already at its maximum size (IndexError)")
            return super().call_method(tx, name, args, kwargs)
        if name in ("reverse", "index", "count", "__getitem__", "__len__", "remove"):
            if name == "remove":
                for i, v in enumerate(items):
                    if binary_op(tx, operator.eq, v, args[0]).truth(tx):
                        del items[i]
                        return ConstVar(None)
                unsupported("deque.remove(x): x not in deque (ValueError)")
            return super().call_method(tx, name, args, kwargs)
        unsupported(f"deque.{name}")

    def reconstruct(self, cg):
        # One object: the deque from outside itself, or one new deque however many
        # places refer to it.
        if self.source is not None:
            return self.source.reconstruct(cg)
        if cg.load_rebuilt(self):
            return
        self._construct(cg)
        cg.keep_rebuilt(self)

    def _construct(self, cg):
        cg.load_constructor(collections.deque)
        for v in self.items:
            v.reconstruct(cg)
        cg.build(list, len(self.items))
        if self.maxlen is None:
            cg.call(1)
        else:
            cg.load_const(self.maxlen)
            cg.call(2)

    def __repr__(self):
        return f"DequeVar({self.items!r}, maxlen={self.maxlen})"


_DEQUE_MUTATORS = frozenset({"append", "appendleft", "extend", "extendleft", "pop", "popleft",
                             "rotate", "clear", "insert", "reverse", "remove"})


def _dict_items(tx, args, kwargs):
    return _dict(tx, args, kwargs).items


def _ordered_dict(tx, args, kwargs):
    if len(args) > 1:
        return None
    return OrderedDictVar(_dict_items(tx, args, kwargs))


def _defaultdict(tx, args, kwargs):
    if len(args) > 2:
        return None
    factory = args[0] if args else ConstVar(None)
    return DefaultDictVar(factory, _dict_items(tx, args[1:], kwargs))


def _deque(tx, args, kwargs):
    if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"}:
        return None
    iterable = args[0] if args else kwargs.get("iterable")
    maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen", ConstVar(None))
    items = var_list(tx, iterable) if iterable is not None else []
    return DequeVar(items, const_key(maxlen, "maxlen"))


def _dict_fromkeys(tx, args, kwargs):
    if kwargs or len(args) not in (1, 2):
        return None
    value = args[1] if len(args) == 2 else ConstVar(None)
    return DictVar({const_key(k, "dict key"): value for k in var_iter(tx, args[0])})


# --------------------------------------------------------------------------- tables
LIBRARY_HANDLERS = {
    functools.reduce: _reduce,
    itertools.chain: _chain,
    itertools.chain.from_iterable: _chain_from_iterable,
    itertools.product: _product,
    itertools.permutations: _combinatoric(itertools.permutations),
    itertools.combinations: _combinatoric(itertools.combinations),
    itertools.combinations_with_replacement: _combinatoric(itertools.combinations_with_replacement),
    itertools.accumulate: _accumulate,
    itertools.islice: _islice,
    itertools.zip_longest: _zip_longest,
    itertools.repeat: _repeat,
    itertools.count: _count,
    itertools.cycle: _cycle,
    itertools.pairwise: _pairwise,
    itertools.starmap: _starmap,
    itertools.takewhile: _while(itertools.takewhile),
    itertools.dropwhile: _while(itertools.dropwhile),
    itertools.compress: _compress,
    itertools.groupby: _groupby,
    itertools.tee: _tee,
    collections.OrderedDict: _ordered_dict,
    collections.defaultdict: _defaultdict,
    collections.deque: _deque,
    dict.fromkeys: _dict_fromkeys,
    operator.itemgetter: _getter(operator.itemgetter),
    operator.attrgetter: _getter(operator.attrgetter),
    operator.methodcaller: _getter(operator.methodcaller),
}

def _math(fn):
    """A math function: on sizes, a symbolic graph node (torch's ``_sym_sqrt`` and
    friends; floor and ceil take SymFloats as they are), else folded on constants."""
    fold = _fold(fn)
    symbolic = fn if fn in (math.floor, math.ceil, math.trunc) else \
        getattr(torch, f"_sym_{fn.__name__}", None)

    def handler(tx, args, kwargs):
        if symbolic is not None and not kwargs and any(isinstance(a, SymNodeVar) for a in args):
            return tx.output.call("call_function", symbolic, tuple(args), {})
        return fold(tx, args, kwargs)
    return handler



def _clear_frames(tx, args, kwargs):
    # The traceback of an exception raised in the trace has no frame objects to clear
    # (unittest's assertRaises clears the one it caught).
    if len(args) == 1 and not kwargs and isinstance(args[0], TracebackVar):
        return ConstVar(None)
    return None


LIBRARY_HANDLERS[traceback.clear_frames] = _clear_frames
# warnings.warn and logging.info ...: replayed after the graph (log_calls.py)
LIBRARY_HANDLERS.update(_log_calls.HANDLERS)


def _math_pow(tx, args, kwargs):
    """math.pow on a symbolic number (a step counter): libm's pow on the two floats,
    as `float ** float` is wherever the base is positive (elsewhere the two differ:
    math.pow raises where ** gives a complex number or raises another error), so with
    the base guarded positive it is `float(x) ** float(y)`, kept symbolic."""
    if kwargs or len(args) != 2 or not any(isinstance(a, SymNodeVar) for a in args) or \
            not all(isinstance(a, SymNodeVar) or (a.is_const() and type(a.as_const()) in (int, float))
                    for a in args) or \
            not binary_op(tx, operator.gt, args[0], ConstVar(0)).truth(tx):
        return _fold_pow(tx, args, kwargs)
    floats = [tx.output.call("call_function", torch.sym_float, (a,), {}) if isinstance(a, SymNodeVar)
              else ConstVar(float(a.as_const())) for a in args]
    return binary_op(tx, operator.pow, *floats)

for _name, _fn in vars(math).items():
    if not _name.startswith("_") and isinstance(_fn, types.BuiltinFunctionType):
        LIBRARY_HANDLERS[_fn] = _math(_fn)
_fold_pow = LIBRARY_HANDLERS[math.pow]
LIBRARY_HANDLERS[math.pow] = _math_pow

# operator: the interpreter's semantics for each.
_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift",
           "and_", "or_", "xor", "matmul", "lt", "le", "eq", "ne", "gt", "ge",
           "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "ilshift",
           "irshift", "iand", "ior", "ixor", "imatmul")
for _name in _BINARY:
    LIBRARY_HANDLERS[getattr(operator, _name)] = _op_binary(getattr(operator, _name))
LIBRARY_HANDLERS[operator.concat] = _op_binary(operator.add)
LIBRARY_HANDLERS[operator.iconcat] = _op_binary(operator.iadd)
for _name, _plain in (("neg", operator.neg), ("pos", operator.pos), ("invert", operator.invert),
                      ("inv", operator.invert)):
    LIBRARY_HANDLERS[getattr(operator, _name)] = _op_unary(_plain)
LIBRARY_HANDLERS.update({
    operator.abs: _op_abs, operator.not_: _op_truth(True), operator.truth: _op_truth(False),
    operator.is_: _op_is(False), operator.is_not: _op_is(True), operator.contains: _op_contains,
    operator.getitem: _op_getitem, operator.setitem: _op_setitem, operator.delitem: _op_delitem,
    operator.index: _fold(operator.index), operator.countOf: _fold(operator.countOf),
    operator.indexOf: _fold(operator.indexOf), operator.length_hint: _fold(operator.length_hint),
})
if hasattr(operator, "call"):
    LIBRARY_HANDLERS[operator.call] = _op_call


def library_var(value, source):
    """The Var for `value` if it is a handled library callable, else None."""
    if isinstance(value, functools._lru_cache_wrapper) and \
            isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        if is_inlinable(value.__wrapped__):
            return CachedFunctionVar(value, source)
    try:
        if value in LIBRARY_HANDLERS:
            return LibraryFnVar(value, source)
    except Exception:      # unhashable, or a __hash__ that fails (a half-built frozen dataclass)
        pass
    return None


__all__ = ["LIBRARY_HANDLERS", "LibraryFnVar", "library_var", "OrderedDictVar",
           "DefaultDictVar", "DequeVar", "GetterVar", "TupleVar", "IteratorVar", "torch"]
