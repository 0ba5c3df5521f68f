"""Soundness of Python object semantics in traced code: descriptors and properties on
write and read, stores that raise, closure cells, globals, __class__ assignment,
values stored before a rebinding, and __bool__/__len__ results."""
import dataclasses
import sys
from collections import namedtuple

import pytest
import torch

from differential import check
import frametrace
import frametrace.testing
from conftest import counted

# ------------------------------------------------------------------ 1. descriptors


class Celsius:
    def __init__(self):
        self._c = 0.0

    @property
    def c(self):
        return self._c * 2

    @c.setter
    def c(self, v):
        self._c = v + 1


def test_property_setter_runs_and_getter_transforms():
    def f(x, o):
        o.c = 3.0
        return x + o.c

    check(f, [(torch.randn(3), Celsius()), (torch.randn(3), Celsius())])


class Counting:
    """A data descriptor counting its reads and writes on the instance."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        obj.reads += 1
        return getattr(obj, self.name) * 10

    def __set__(self, obj, value):
        obj.writes += 1
        setattr(obj, self.name, value)


class WithDescriptor:
    v = Counting()

    def __init__(self):
        self.reads = 0
        self.writes = 0
        self._v = 1


def test_data_descriptor_get_and_set_run():
    def f(x, o):
        a = o.v
        o.v = 5
        return x * a + o.v

    check(f, [(torch.randn(3), WithDescriptor()), (torch.randn(3), WithDescriptor())])


class Logged:
    def __init__(self):
        object.__setattr__(self, "log", [])

    def __setattr__(self, name, value):
        self.log.append(name)
        object.__setattr__(self, name, value * 2)


def test_custom_setattr_runs():
    def f(x, o):
        o.a = 2
        return x + o.a

    check(f, [(torch.randn(3), Logged()), (torch.randn(3), Logged())])


class Chained:
    def __init__(self):
        self._a = 1
        self.b = 0

    @property
    def a(self):
        return self._a

    @a.setter
    def a(self, v):
        self._a = v
        self.b = v * 3


def test_setter_writing_another_attribute():
    def f(x, o):
        o.a = 4
        return x + o.b + o.a

    check(f, [(torch.randn(3), Chained()), (torch.randn(3), Chained())])


# ------------------------------------------------------------------ 2. stores that raise


class Slotted:
    __slots__ = ("a",)

    def __init__(self):
        self.a = 1

    def __eq__(self, other):
        return type(other) is Slotted and self.a == other.a


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int = 1


class ReadOnly:
    @property
    def a(self):
        return 1


@pytest.mark.parametrize("make", [Slotted, Frozen, ReadOnly])
def test_store_that_raises_is_caught_in_place(make):
    def f(x, o):
        y = x + 1
        try:
            o.b = 1
            o.a = 2
        except (AttributeError, TypeError) as e:
            y = y * 2
        return y + o.a

    check(f, [(torch.randn(3), make()), (torch.randn(3), make())], graphs=None)


@pytest.mark.parametrize("make", [Slotted, Frozen, ReadOnly])
def test_store_that_raises_reaches_caller_in_place(make):
    def f(x, o, log):
        log.append(1)
        o.b = 1
        log.append(2)
        return x

    check(f, [(torch.randn(3), make(), []), (torch.randn(3), make(), [])], graphs=None)


# ------------------------------------------------------------------ 3. closure cells


def make_counter():
    n = 0

    def counter():
        nonlocal n
        n += 1
        return n
    return counter


def make_pair():
    n = 0

    def inc():
        nonlocal n
        n += 1

    def get():
        return n
    return inc, get


class Closures:
    """Closures made by `make`, made anew for each deep copy (deepcopy shares functions,
    so each side of the differential run gets its own cells)."""

    __slots__ = ("make", "fns")

    def __init__(self, make):
        self.make = make
        self.fns = make()

    def __deepcopy__(self, memo):
        return Closures(self.make)

    def state(self):
        fns = self.fns if isinstance(self.fns, tuple) else (self.fns,)
        return [c.cell_contents for fn in fns for c in fn.__closure__]

    def __eq__(self, other):
        return self.state() == other.state()


def test_closure_cell_written_by_two_inlined_calls():
    def f(x, c):
        counter = c.fns
        return x + counter() + counter()

    check(f, [(torch.randn(3), Closures(make_counter)), (torch.randn(3), Closures(make_counter))])


def test_closure_cell_shared_by_two_closures_from_outside():
    def f(x, c):
        inc, get = c.fns
        inc()
        a = get()
        inc()
        return x + a + get()

    check(f, [(torch.randn(3), Closures(make_pair)), (torch.randn(3), Closures(make_pair))])


def test_nonlocal_written_after_break_is_read_fresh():
    def f(x, c):
        a = c.fns()
        print(end="")
        b = c.fns()
        return x + a * 10 + b + c.fns()

    check(f, [(torch.randn(3), Closures(make_counter)), (torch.randn(3), Closures(make_counter))],
          breaks=1)


# A variation that already passed before the fix: it guards the new code path.
def test_cell_shared_by_closures_made_in_frame_and_returned():
    def f(x):
        n = 1

        def inc():
            nonlocal n
            n += 1
            return n

        def get():
            return n
        inc()
        return x + get(), inc, get

    def g(x):
        y, inc, get = f(x)
        inc()
        return y, get()

    import frametrace
    for _ in range(2):
        x = torch.randn(3)
        want = g(x)
        y, inc, get = frametrace.optimize(f)(x)
        inc()
        assert torch.allclose(y, want[0]) and get() == want[1]


# ------------------------------------------------------------------ 4. globals

G = 0


def test_global_written_through_globals_dict_read_by_name():
    def f(x):
        globals()["G"] = 5
        return x + G

    check(f, [torch.randn(3), torch.randn(3)], globals=["G"], breaks=0)


# A variation that already passed before the fix: it guards the new code path.
def test_global_statement_then_globals_dict_read():
    def f(x):
        global G
        G = 7
        return x + globals()["G"]

    check(f, [torch.randn(3), torch.randn(3)], globals=["G"])


THIS = sys.modules[__name__]


def test_module_dict_write_then_attribute_read():
    def f(x):
        vars(THIS)["G"] = 3
        a = THIS.G
        THIS.__dict__["G"] = a + 1
        return x + THIS.G + G

    check(f, [torch.randn(3), torch.randn(3)], globals=["G"], breaks=0)


def test_module_attribute_write_then_global_read():
    def f(x):
        global G
        THIS.G = 4
        a = G
        G = a + 1
        return x + THIS.G + globals()["G"] + ("G" in globals())

    check(f, [torch.randn(3), torch.randn(3)], globals=["G"], breaks=0)


def test_globals_dict_passed_through_a_graph_break():
    def f(x):
        g = globals()
        print(end="")
        g["G"] = 6
        return x + G

    check(f, [torch.randn(3), torch.randn(3)], globals=["G"])


# ------------------------------------------------------------------ 5. classes

class Pair(namedtuple("Pair", "a b")):
    pass


# A variation that already passed before the fix: it guards the new code path.
def test_attribute_on_namedtuple_subclass_instance():
    def f(x, p):
        p.extra = 4
        return x + p.a + p.extra

    check(f, [(torch.randn(3), Pair(1, 2)), (torch.randn(3), Pair(3, 4))])


def test_attribute_on_namedtuple_subclass_made_in_frame():
    def f(x):
        p = Pair(1, 2)
        p.extra = 4
        return x + p.a + p.extra, p

    check(f, [torch.randn(3), torch.randn(3)])


class A:
    def who(self):
        return 1


class B(A):
    def who(self):
        return 2


def test_class_assignment_changes_methods_and_isinstance():
    def f(x, o):
        o.__class__ = B
        return x + o.who() + isinstance(o, B)

    check(f, [(torch.randn(3), A()), (torch.randn(3), A())])


def test_class_assignment_on_object_made_in_frame():
    def f(x):
        o = A()
        o.__class__ = B
        return x + o.who() + isinstance(o, B), o

    check(f, [torch.randn(3), torch.randn(3)])


# ------------------------------------------------------------------ 6. stored before rebinding

# A variation that already passed before the fix: it guards the new code path.
def test_dict_holds_value_at_store_time_of_symbolic_int():
    def f(x, n, d):
        k = n
        d["a"] = k
        k = k + 1
        d["b"] = k
        return x + k

    check(f, [(torch.randn(3), i, {}) for i in (2, 3, 4, 5)])


def test_dict_holds_captured_symbolic_int_rebound_later():
    def f(x, n, d):
        def store():
            d["k"] = n
        store()
        n = n + 1
        return x + n

    r = check(f, [(torch.randn(3), i, {}) for i in (2, 3, 4, 5)])
    assert r.compiles == 2, r        # the second compile made n symbolic


def test_dict_holds_symbolic_int_rebound_by_inlined_closure():
    def f(x, n, d):
        d["a"] = [n, n * 2]

        def bump():
            nonlocal n
            n = n + 1
        bump()
        return x + n

    r = check(f, [(torch.randn(3), i, {}) for i in (2, 3, 4, 5)])
    assert r.compiles == 2, r


# ------------------------------------------------------------------ 7. __bool__ / __len__


class BadBool:
    def __bool__(self):
        return 1.0


class BadLen:
    def __len__(self):
        return 2.0


class NegLen:
    def __len__(self):
        return -1


@pytest.mark.parametrize("make", [BadBool, BadLen, NegLen])
def test_bool_of_bad_dunder_raises(make):
    def f(x, o):
        if o:
            return x + 1
        return x - 1

    check(f, [(torch.randn(3), make()), (torch.randn(3), make())], graphs=None)


@pytest.mark.parametrize("make", [BadLen, NegLen])
def test_len_of_bad_dunder_raises(make):
    def f(x, o):
        return x + len(o)

    check(f, [(torch.randn(3), make()), (torch.randn(3), make())], graphs=None)


def test_bad_bool_made_in_frame_raises():
    def f(x):
        return x + 1 if BadBool() else x

    check(f, [torch.randn(3), torch.randn(3)], graphs=None)


@dataclasses.dataclass
class WithLate:
    a: int
    b: int = dataclasses.field(init=False, default=0)

    def __post_init__(self):
        self.b = self.a * 2


def test_dataclass_made_in_frame_keeps_non_init_fields_and_new_attributes():
    def f(x):
        d = WithLate(3)
        d.c = 7
        return x + d.b + d.c, d

    check(f, [torch.randn(3), torch.randn(3)])


def test_frozen_dataclass_made_in_frame_store_raises():
    def f(x):
        d = Frozen(2)
        try:
            d.a = 5
        except dataclasses.FrozenInstanceError:
            x = x * 2
        return x + d.a

    check(f, [torch.randn(3), torch.randn(3)], graphs=None)


class Doubling:
    """A non-data descriptor: the instance's own attribute shadows it."""

    def __get__(self, obj, owner=None):
        return 2 if obj is None else obj.base * 2


class UsesDoubling:
    d = Doubling()

    def __init__(self):
        self.base = 5


# A variation that already passed before the fix: it guards the new code path.
def test_non_data_descriptor_read_and_shadowed_by_instance_attribute():
    def f(x, o):
        a = o.d
        o.d = 100
        return x + a + o.d

    check(f, [(torch.randn(3), UsesDoubling()), (torch.randn(3), UsesDoubling())])


def test_descriptor_on_object_made_in_frame():
    def f(x):
        o = WithDescriptor()
        o.v = 3
        return x + o.v + o.reads + o.writes

    check(f, [torch.randn(3), torch.randn(3)])


class SuperSetattr:
    def __setattr__(self, name, value):
        super().__setattr__(name, value + 1)


def test_setattr_hook_calling_super_setattr():
    def f(x, o):
        o.a = 1
        return x + o.a

    check(f, [(torch.randn(3), SuperSetattr()), (torch.randn(3), SuperSetattr())])


def test_custom_setattr_traced_into_one_graph():
    def f(x, o):
        o.a = 2
        return x + o.a

    check(f, [(torch.randn(3), Logged()), (torch.randn(3), Logged())], graphs=1, breaks=0)
    check(f, [(torch.randn(3), SuperSetattr()), (torch.randn(3), SuperSetattr())], graphs=1,
          breaks=0)


@dataclasses.dataclass
class Bag:
    items: list

    def __len__(self):
        return len(self.items)


def test_truth_of_dataclass_with_len_made_in_frame():
    def f(x, items):
        b = Bag(items)
        return x + 1 if b else x - 1

    check(f, [(torch.randn(3), []), (torch.randn(3), [1])])


class SymLen:
    def __init__(self, t):
        self.t = t

    def __bool__(self):
        return self.t.shape[0] > 2


# A variation that already passed before the fix: it guards the new code path.
def test_bool_returning_symbolic_comparison_is_guarded():
    def f(o):
        return o.t + 1 if o else o.t - 1

    check(f, [SymLen(torch.randn(n)) for n in (2, 3, 4, 5, 1)])


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._scale = 1.0

    @property
    def scale(self):
        return self._scale * 2

    @scale.setter
    def scale(self, v):
        self._scale = v + 1

    def forward(self, x):
        self.scale = 3.0
        return x * self.scale


def test_module_property_setter_runs_and_getter_transforms():
    def f(x, m):
        return m(x)

    check(f, [(torch.randn(3), Scaled()), (torch.randn(3), Scaled())])


def test_instance_dict_write_then_attribute_read():
    def f(x, o):
        o.__dict__["a"] = 3
        vars(o)["b"] = 4
        return x + o.a + o.b

    check(f, [(torch.randn(3), WithLateAttrs()), (torch.randn(3), WithLateAttrs())], breaks=0)


def test_attribute_write_then_instance_dict_read():
    def f(x, o):
        o.a = 5
        return x + o.__dict__["a"]

    # Two records of one state are refused: the frame may run in CPython, never wrong.
    check(f, [(torch.randn(3), WithLateAttrs()), (torch.randn(3), WithLateAttrs())], graphs=None)


class WithLateAttrs:
    def __init__(self):
        self.a = 1


def _shared_pair():
    return make_pair()


def _unshared_pair():
    return make_pair()[0], make_pair()[1]


def test_cell_shared_at_trace_time_is_guarded():
    def f(x, c):
        inc, get = c.fns
        inc()
        return x + get()

    r = check(f, [(torch.randn(3), Closures(_shared_pair)), (torch.randn(3), Closures(_unshared_pair)),
                  (torch.randn(3), Closures(_shared_pair))])
    assert r.compiles == 2, r


def test_module_store_that_raises_is_caught_in_place():
    def f(x, m, log):
        log.append(1)
        try:
            m.weight = x * 2
        except TypeError:
            log.append(2)
        return m(x)

    check(f, [(torch.randn(3), torch.nn.Linear(3, 3), []), (torch.randn(3), torch.nn.Linear(3, 3), [])],
          graphs=None)


def test_module_store_that_raises_reaches_caller_in_place():
    def f(x, m, log):
        log.append(1)
        m.weight = x * 2
        log.append(2)
        return x

    check(f, [(torch.randn(3), torch.nn.Linear(3, 3), []), (torch.randn(3), torch.nn.Linear(3, 3), [])],
          graphs=None)


def test_class_assignment_to_incompatible_layout_raises_in_place():
    def f(x, o, log):
        log.append(1)
        try:
            o.__class__ = Slotted
        except TypeError:
            log.append(2)
        return x + o.who()

    check(f, [(torch.randn(3), A(), []), (torch.randn(3), A(), [])], graphs=None)


class Namespace:
    """Holds a module's namespace; deep copies share it (a module cannot be copied)."""
    __slots__ = ("ns",)

    def __init__(self, ns):
        self.ns = ns

    def __deepcopy__(self, memo):
        return self


# A variation that already passed before the fix: it guards the new code path.
def test_module_namespace_reached_from_an_object_is_guarded_by_identity():
    import math

    def f(x, h):
        return x + len(h.ns["__name__"])

    r = check(f, [(torch.randn(3), Namespace(vars(THIS))), (torch.randn(3), Namespace(vars(math))),
                  (torch.randn(3), Namespace(vars(THIS)))])
    assert r.compiles == 2, r


class WithMethod:
    def m(self):
        return 1


def _shadowed(shadow):
    o = WithMethod()
    if shadow:
        o.m = lambda: 5
    return o


def test_method_shadowed_by_instance_attribute_is_noticed():
    def f(x, o):
        return x + o.m()

    r = check(f, [(torch.randn(3), _shadowed(False)), (torch.randn(3), _shadowed(True)),
                  (torch.randn(3), _shadowed(False))])
    assert r.compiles == 2, r


# -- hasattr/getattr after __class__ assignment in the frame --
class _Plain:
    def __init__(self):
        self.v = 1


class _WithFoo:
    foo = 5


def test_hasattr_and_getattr_follow_a_class_assigned_in_the_frame():
    def f(o, x):
        before = hasattr(o, "foo"), getattr(o, "foo", None)
        o.__class__ = _WithFoo
        return x + 1, before, hasattr(o, "foo"), getattr(o, "foo", 0), hasattr(o, "bar"), \
            hasattr(o, "v")
    check(f, [(_Plain(), torch.ones(2)), (_Plain(), torch.zeros(2))])


# -- an object made in the frame rebuilt where it held its values --
class _ReadOnly:
    def __init__(self, v):
        self.__dict__["x"] = v

    @property
    def x(self):
        return self.__dict__["x"] * 10


class _SetterRaises:
    def __init__(self, v):
        self.__dict__["x"] = v
        self.y = v + 1

    @property
    def x(self):
        return -1

    @x.setter
    def x(self, v):
        raise RuntimeError("setter ran")


class _SlotsAndDict:
    __slots__ = ("a", "__dict__")

    def __init__(self, v):
        self.a = v
        self.b = v


class _OwnSetattr:
    def __setattr__(self, k, v):
        raise RuntimeError("no")

    def __init__(self, v):
        object.__setattr__(self, "z", v)


@pytest.mark.parametrize("cls", [_ReadOnly, _SetterRaises, _SlotsAndDict, _OwnSetattr])
def test_object_made_in_the_frame_is_rebuilt_where_it_held_its_values(cls):
    # A read-only property filled through self.__dict__: the rebuild set it with
    # object.__setattr__, which raised (or ran the property's setter).
    def f(t):
        o = cls(3)
        return t + 1, o

    r = check(f, [torch.ones(2), torch.ones(2)], graphs=1, breaks=0)
    assert r.fallbacks == 0
    out = frametrace.optimize("eager")(f)(torch.ones(2))[1]
    assert type(out) is cls
    if cls is _ReadOnly:
        assert out.x == 30 and vars(out) == {"x": 3}
    if cls is _SlotsAndDict:
        assert out.a == 3 and vars(out) == {"b": 3}


# -- a returned closure keeps its cells --
def test_returned_closure_keeps_its_cells():
    def f(x):
        n = 3
        w = x * 2                       # a tensor the closure captures
        size = x.shape[0]               # a size (symbolic after a second shape)

        def inner(y):
            return y[:n] + w[:n] + size
        return inner, x + 1

    g, cnt = counted(f)
    for length in (5, 6, 7):
        x = torch.arange(float(length))
        inner, out = g(x)
        ref_inner, ref_out = f(x)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(inner(torch.ones(4)), ref_inner(torch.ones(4)))
    assert cnt.frame_count == 2


class _Holder:
    kind = "holder"

    def __init__(self):
        self.a = 1
        self.t = torch.ones(2)


def test_hasattr_and_getattr_see_writes_made_through_the_instance_dict():
    # obj.__dict__[k] = v and obj.__dict__.pop(k) change what hasattr/getattr answer
    # (the trace held the dict's items, hasattr read the real dict: opposite answers).
    def added(o, x):
        o.__dict__["c"] = 5
        return o.c, hasattr(o, "c"), getattr(o, "c", 0), x * 2

    def popped(o, x):
        o.__dict__.pop("a")
        return "a" in o.__dict__, hasattr(o, "a"), getattr(o, "a", 9), x + o.t

    def class_attr_and_missing(o, x):
        o.__dict__["b"] = 2
        return hasattr(o, "kind"), hasattr(o, "nothing"), getattr(o, "nothing", None), x - 1

    for fn in (added, popped, class_attr_and_missing):
        check(fn, [(_Holder(), torch.randn(2)) for _ in range(3)], breaks=0, fallbacks=0)
