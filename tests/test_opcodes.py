"""Every opcode a function body can hold has a handler, and the statements behind the
rarer ones (match, del, yield from, generator.send) trace: differential tests with the
graphs and breaks torch.compile would have."""
import collections
import dis
import sys

import pytest
import torch

import frametrace
from differential import check
from frametrace.interpreter import _DISPATCH

# Opcodes no function body holds, with why.
NOT_IN_FUNCTION_BODIES = {
    "LOAD_NAME": "module and class bodies", "STORE_NAME": "module and class bodies",
    "DELETE_NAME": "module and class bodies", "LOAD_CLASSDEREF": "class bodies",
    "LOAD_LOCALS": "class bodies and annotation scopes",
    "LOAD_FROM_DICT_OR_DEREF": "class bodies and annotation scopes",
    "LOAD_FROM_DICT_OR_GLOBALS": "class bodies and annotation scopes",
    "SETUP_ANNOTATIONS": "module and class bodies", "IMPORT_STAR": "module bodies (a SyntaxError in a function)",
    "PRINT_EXPR": "the interactive prompt", "INTERPRETER_EXIT": "CPython's own entry frames",
    "RESERVED": "never emitted",
    "ENTER_EXECUTOR": "3.13's tier-2 executors, patched into the live bytecode (co_code and dis show the original)",
    "EXIT_INIT_CHECK": "3.13's shim frame of a class call (CALL_ALLOC_AND_ENTER_INIT)",
}
# Exception machinery: handled by the exception-table work, not here.
OWNED_BY_EXCEPTION_HANDLING = {"PUSH_EXC_INFO", "CHECK_EXC_MATCH", "CHECK_EG_MATCH", "RERAISE",
                               "POP_EXCEPT", "WITH_EXCEPT_START", "PREP_RERAISE_STAR"}


def _emittable():
    names = set()
    for name, op in dis.opmap.items():
        if op >= getattr(dis, "MIN_PSEUDO_OPCODE", 256):
            continue        # 3.12's pseudo-instructions exist only inside the compiler
        if name.startswith("INSTRUMENTED_"):
            continue        # sys.monitoring's copies; dis shows the plain opcode
        names.add(name)
    return names - set(NOT_IN_FUNCTION_BODIES) - OWNED_BY_EXCEPTION_HANDLING


def test_every_function_body_opcode_has_a_handler():
    missing = sorted(n for n in _emittable() if n not in _DISPATCH)
    assert not missing, f"opcodes without a handler on {sys.version_info[:2]}: {missing}"


# --------------------------------------------------------------------------- match
def match_shapes(x, spec):
    match spec:
        case [a, b, *rest]:
            return x * a + b + len(rest)
        case {"scale": s, **others}:
            return x * s, sorted(others)
        case (int() | float()) as k:
            return x + k
        case _:
            return x


def test_match_sequence_mapping_literal_patterns():
    inputs = [(torch.randn(3), [2, 3, 4]), (torch.randn(3), {"scale": 2.0, "a": 1}),
              (torch.randn(3), 5), (torch.randn(3), "s"), (torch.randn(3), (1, 2))]
    check(match_shapes, inputs, fullgraph=True)


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


def match_point(t, p):
    match p:
        case Point(0, y):
            return t + y
        case Point(x, y=3):
            return t * x
        case Point(x=x):
            return t - x
    return t


def test_match_class_positional_and_keyword():
    check(match_point, [(torch.randn(2), Point(0, 5)), (torch.randn(2), Point(2, 3)),
                        (torch.randn(2), Point(4, 1)), (torch.randn(2), 7)], fullgraph=True)


def match_builtin_class(t, v):
    match v:
        case int(n):
            return t + n
        case str(s):
            return t, s
        case list([a, b]):
            return t * a * b
    return t


def test_match_class_of_builtin_binds_the_subject():
    check(match_builtin_class, [(torch.randn(2), 3), (torch.randn(2), "q"), (torch.randn(2), [2, 3])],
          fullgraph=True)


class Opaque:
    def __init__(self, v):
        self.v = v


def match_missing_attr(t, o):
    match o:
        case Opaque(w=w):          # no attribute w: no match, in CPython
            return t + w
        case Opaque(v=v):
            return t * v
    return t


def test_match_class_with_missing_attribute_breaks_and_is_right():
    r = check(match_missing_attr, [(torch.randn(2), Opaque(2))])
    assert r.fallbacks == 0 and r.breaks >= 1


class Config(collections.abc.Mapping):
    def __init__(self, **kw):
        self.kw = kw

    def __getitem__(self, k):
        return self.kw[k]

    def __iter__(self):
        return iter(self.kw)

    def __len__(self):
        return len(self.kw)


def match_user_mapping(t, cfg):
    t = t + 1
    match cfg:
        case {"scale": s}:
            return t * s
    return t


def test_match_on_a_user_mapping_breaks_at_the_pattern():
    r = check(match_user_mapping, [(torch.randn(2), Config(scale=3)), (torch.randn(2), Config(a=1))])
    assert r.fallbacks == 0 and r.breaks >= 1


# --------------------------------------------------------------------------- del
def del_list_items(x, xs):
    del xs[1:3]
    del xs[0]
    ys = [x, x + 1, x + 2]
    del ys[-1]
    return x + len(xs), ys


def test_del_list_index_and_slice():
    check(del_list_items, [(torch.randn(2), [1, 2, 3, 4, 5]), (torch.randn(2), [0, 1, 2, 3])],
          fullgraph=True)


def del_out_of_range(x, xs):
    y = x + 1
    del xs[10]
    return y


def test_del_list_index_out_of_range_raises_as_cpython():
    check(del_out_of_range, [(torch.randn(2), [1, 2])], graphs=None)


class Box:
    def __init__(self):
        self.a = 1
        self.b = 2


class Guarded(Box):
    @property
    def v(self):
        return self.b

    @v.deleter
    def v(self):
        del self.b


def del_attribute(x, box):
    y = x + box.a
    del box.a
    box.c = y
    del box.c                   # set and deleted by the frame: absent afterwards
    fresh = Box()
    del fresh.b
    return y * 2, hasattr(box, "a"), getattr(box, "a", 7), hasattr(fresh, "b"), fresh


def test_del_attribute_of_an_argument_and_of_a_new_object():
    check(del_attribute, [(torch.randn(2), Box()), (torch.randn(2), Box())], fullgraph=True, graphs=1)


def del_through_a_property(x, obj):
    del obj.v
    return x + 1, hasattr(obj, "b")


def test_del_through_a_property_deleter():
    check(del_through_a_property, [(torch.randn(2), Guarded())], fullgraph=True, graphs=1)


def del_missing_attribute(x, box):
    y = x + 1
    del box.zz
    return y


def test_del_of_a_missing_attribute_breaks_and_raises_as_cpython():
    r = check(del_missing_attribute, [(torch.randn(2), Box())], graphs=None)
    assert r.fallbacks == 0 and r.breaks == 1


def _del_in_inlined(x):
    y = x + 1

    def g():
        return y * 2
    r = g()
    del y
    return r


def del_closure_variable_inlined(x):
    return _del_in_inlined(x)


def test_del_of_a_closure_variable_in_an_inlined_call():
    check(del_closure_variable_inlined, [torch.randn(2)], fullgraph=True)


def del_closure_variable_of_the_frame(x):
    y = x + 1

    def g():
        return y * 2
    r = g()
    del y
    return r + 1, g


def test_del_of_a_closure_variable_of_the_frame_breaks_there():
    compiled = frametrace.optimize(backend="eager")(del_closure_variable_of_the_frame)
    x = torch.randn(2)
    r, g = compiled(x)
    assert torch.equal(r, (x + 1) * 2 + 1)
    with pytest.raises(NameError):
        g()                     # the cell was emptied, as CPython's


def match_rest_of_mapping(x, d):
    match d:
        case {"a": a, **rest}:
            del rest["b"]
            return x * a, rest
    return x


def test_match_mapping_rest_and_del_key():
    check(match_rest_of_mapping, [(torch.randn(2), {"a": 2, "b": 3, "c": 4})], fullgraph=True)


# --------------------------------------------------------------------------- yield from / send
def _inner(x):
    yield x + 1
    yield x + 2
    return 10


def _outer(x):
    got = yield from _inner(x)
    yield x * got
    yield from [x - 1, x - 2]


def yield_from(x):
    return list(_outer(x))


def test_yield_from_a_generator_and_a_list():
    check(yield_from, [torch.randn(3)], fullgraph=True, graphs=1)


def _accumulator():
    total = 0
    while True:
        v = yield total
        if v is None:
            return total
        total = total + v


def generator_send(x):
    acc = _accumulator()
    next(acc)
    acc.send(x)
    out = acc.send(x * 2)
    return out


def test_generator_send():
    check(generator_send, [torch.randn(3)], fullgraph=True, graphs=1)


def _delegate():
    r = yield from _accumulator()
    yield r * 10


def send_through_yield_from(x):
    g = _delegate()
    next(g)
    g.send(x)
    a = g.send(x + 1)
    b = g.send(None)           # the inner returns: the outer yields r * 10
    return a, b


def test_send_through_yield_from():
    check(send_through_yield_from, [torch.randn(3)], fullgraph=True, graphs=1)


def send_to_fresh_generator(x):
    g = _accumulator()
    return g.send(x)


def test_send_non_none_to_a_fresh_generator_raises_as_cpython():
    check(send_to_fresh_generator, [torch.randn(3)], graphs=None)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
