"""A program fuzzer for frametrace: small Python programs generated from a grammar of the
constructs that have given wrong answers before, each run in CPython and compiled by the
differential harness (`differential.check`).

A generated program is the text of a whole module: user classes, helper functions,
globals, the function ``f`` under test, ``make_inputs()`` (several calls with varied
tensors, ints, floats, containers, objects and aliasing, so that recompiles and cache
hits both happen) and ``GLOBALS`` (the globals ``f`` may change).  It is run by
exec-ing the text into a fresh module, so a failure prints as a readable program, and
a saved failure runs on its own: ``python failing_program.py``.

Besides the general grammar, focused families (`Focus`, `FAMILIES`) draw programs at one
mechanism each, from what found wrong answers before (issue 29): views written in place
with operands that require grad and under no_grad, the view returned and written by a
caller (`CALLER`); transposed, channels-last, expanded and sliced inputs read back through
`.contiguous()`, `.view(-1)`, `.is_contiguous()`, `.stride()`; dict keys of mixed types that
compare equal (1, True, 1.0, an IntEnum, a str subclass, tuples of them) read back;
class attributes of a base changed between calls (`Then`) and read by walking the class;
floats that become nan, inf, -0.0, 1e20 or an int on later calls, also with
``dynamic=True`` (`OPTIONS`); optimizers with fused/foreach flags stepped in f.

Used by ``tests/test_fuzz.py`` (a fixed-seed CI budget) and from the command line for
long runs (``--family`` draws from one family only)::

    nice python tests/fuzz_programs.py --examples 5000 --seed 1 --out /tmp/fuzz
    nice python tests/fuzz_programs.py --reduce /tmp/fuzz/some_kind/0001.py

A long run forks a child per program (a crash or hang of the tracer is a failure kind,
not the end of the run), prints each program's outcome and writes every failing program
to ``--out/<kind>/``; ``--reduce`` shrinks one statement at a time while the failure
keeps its kind.
"""
from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import linecache
import os
import re
import signal
import sys
import types

from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

FILENAME = "<fuzz-program>"
TIMEOUT_S = 60          # per program; a tracer that loops forever is a failure kind

# --------------------------------------------------------------------------- module parts
# Each part is module-level source that a program includes when it uses the name.
CLASSES = {
    "Box": '''\
class Box:
    def __init__(self, v, n=0):
        self.v = v
        self.n = n

    def bump(self, t):
        self.n += 1
        self.v = self.v + t
        return self.n
''',
    "SBox": '''\
class SBox:
    __slots__ = ("v", "n")

    def __init__(self, v, n=0):
        self.v = v
        self.n = n

    def bump(self, t):
        self.n += 1
        self.v = self.v + t
        return self.n
''',
    "PBox": '''\
class PBox:
    def __init__(self, v, n=0):
        self._v = v
        self.n = n

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, value):
        self.n += 1
        self._v = value

    def bump(self, t):
        self.n += 1
        self.v = self.v + t
        return self.n
''',
    "DBox": '''\
@dataclasses.dataclass
class DBox:
    v: torch.Tensor
    n: int = 0

    def bump(self, t):
        self.n += 1
        self.v = self.v + t
        return self.n
''',
}

GLOBAL_INIT = {"G_N": "G_N = 0", "G_T": "G_T = torch.ones(1)", "G_L": "G_L = []"}

HELPERS = {
    "h_append": ('''\
def h_append(lst, t):
    lst.append(t * 2)
    return len(lst)
''', ()),
    "h_raise": ('''\
def h_raise(t, n):
    if n > 2:
        raise ValueError(f"n too big: {n}")
    return t + n
''', ()),
    "h_gen": ('''\
def h_gen(lst, log):
    for u in lst:
        log.append(len(log))
        yield u * 2
''', ()),
    "h_count": ('''\
def h_count(n, log):
    i = 0
    while i < n:
        log.append(i)
        yield i
        i += 1
''', ()),
    "h_obj": ('''\
def h_obj(o, t):
    o.v = o.v + t
    o.n += 1
    return o.n
''', ()),
    "h_global": ('''\
def h_global(t):
    global G_N
    G_N += 1
    return t * G_N
''', ("G_N",)),
    "h_nested": ('''\
def h_nested(t, k):
    def sq(a):
        return a * a + k
    return sq(t) + 1
''', ()),
    "h_print": ('''\
def h_print(t, out):
    print("h", t.sum(), file=out)
    return t + 1
''', ()),
    "h_inplace": ('''\
def h_inplace(t):
    t.mul_(2)
    return t
''', ()),
    "h_branch": ('''\
def h_branch(t):
    if t.sum() > 0:
        return t - 1
    return t + 1
''', ()),
    "h_try": ('''\
def h_try(t, n):
    try:
        if n % 2:
            raise KeyError(n)
        return t + 1
    except KeyError:
        return t - 1
    finally:
        t.add_(0.5)
''', ()),
    "h_swap": ('''\
def h_swap(lst):
    if len(lst) >= 2:
        lst[0], lst[1] = lst[1], lst[0]
    return lst
''', ()),
    "h_dict": ('''\
def h_dict(d, t):
    d["h"] = t
    return d.pop("a", t)
''', ()),
    "h_kw": ('''\
def h_kw(t, *, scale=2, shift=0):
    return t * scale + shift
''', ()),
    "h_star": ('''\
def h_star(*ts, **kw):
    total = ts[0] * 0
    for t in ts:
        total = total + t
    return total * kw.get("scale", 1)
''', ()),
    "make_acc": ('''\
def make_acc(base):
    def acc(t):
        nonlocal base
        base = base + t
        return base
    return acc
''', ()),
    "make_counter": ('''\
def make_counter():
    count = 0
    def inc():
        nonlocal count
        count += 1
        return count
    return inc
''', ()),
}

OUT_CLASS = '''\
class Out:
    """What print() wrote, compared as a side effect on an argument."""
    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)
'''

MAIN = '''
if __name__ == "__main__":
    sys.path.insert(0, {tests!r})
    from fuzz_programs import check_module
    print(check_module(sys.modules[__name__]))
'''


class Program:
    """A generated program: the source of a module defining f, make_inputs and GLOBALS."""
    __slots__ = ("source", "family")

    def __init__(self, source, family="general"):
        self.source = source
        self.family = family

    def __repr__(self):     # hypothesis prints the falsifying example with repr()
        return "Program(<<<\n" + self.source + ">>>)"

    def script(self):
        """The program as a file that runs itself through the harness."""
        return self.source + MAIN.format(tests=HERE)


# --------------------------------------------------------------------------- the grammar
class Scope:
    """Names in scope, by type.  Every tensor named here has shape (L,), the size of
    the call's tensors; `scalars` are 0-d tensors."""
    __slots__ = ("tensors", "scalars", "ints", "counters", "floats", "lists", "dicts",
                 "sets", "objs", "funcs", "logs")

    def __init__(self):
        self.tensors, self.scalars, self.ints, self.counters = [], [], [], []
        self.floats, self.lists, self.dicts, self.sets = [], [], [], []
        self.objs, self.funcs, self.logs = [], [], []

    def copy(self):
        s = Scope()
        for name in self.__slots__:
            v = getattr(self, name)
            setattr(s, name, v.copy())
        return s


class Gen:
    """Draws one program.  Every choice is a hypothesis draw whose smallest value is
    the simplest form, so shrinking gives small programs."""

    MAX_DEPTH = 2

    def __init__(self, draw):
        self.draw = draw
        self.used = set()         # classes, helpers and globals the program needs
        self.global_writes = set()
        self.counter = 0
        self.stmts_left = 0
        self.depth = 0            # blocks around the statement being drawn
        self.loop_depth = 0
        self.no_grow = 0          # inside a loop over a container: it must not grow
        self.s = Scope()
        self.pending = []         # names a statement defines: in scope after it

    # -- drawing helpers
    def index(self, n):
        """An index below n, drawn as bits: hypothesis biases its integer draws toward
        constants it finds in the modules loaded so far, which would make the programs
        of a seed depend on what ran before; booleans have no such bias."""
        i = 0
        for _ in range((n - 1).bit_length()):
            i = 2 * i + self.draw(st.booleans())
        return i % n

    def pick(self, options):
        return options[self.index(len(options))]

    def num(self, lo, hi):
        return lo + self.index(hi - lo + 1)

    def flag(self):
        return self.draw(st.booleans())

    def fresh(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def one_of(self, options):
        """options: (weight, available, fn); calls one available fn, chosen by draw."""
        avail = [fn for w, ok, fn in options if ok for _ in range(w)]
        return self.pick(avail)()

    # -- expressions
    def tensor(self, d=0):
        s = self.s
        if d >= 2 or not self.flag():
            return self.pick(s.tensors)
        t = lambda: self.tensor(d + 1)
        return self.wrap(d, [
            (3, True, lambda: f"{t()} + {t()}"),
            (2, True, lambda: f"{t()} * {self.number()}"),
            (1, True, lambda: f"{t()} - {t()}"),
            (2, True, lambda: f"{t()}.{self.pick(['relu', 'sin', 'abs', 'neg', 'cos', 'tanh', 'sigmoid'])}()"),
            (1, True, lambda: f"{t()} + {t()}.{self.pick(['sum', 'mean', 'max', 'min'])}()"),
            (1, True, lambda: f"torch.where({t()} > 0, {t()}, {t()})"),
            (1, True, lambda: f"{t()}.clamp({self.pick(['-2, 2', 'min=0', 'max=1'])})"),
            (1, True, lambda: f"{t()}.{self.pick(['flip(0)', 'cumsum(0)', 'clone()', 'view(-1)', 'exp().log()'])}"),
            (1, True, lambda: f"torch.stack([{t()}, {t()}]).{self.pick(['sum', 'mean', 'amax'])}(0)"),
            (1, True, lambda: f"torch.cat([{t()}, {t()}]).view(2, -1).sum(0)"),
            (1, True, lambda: f"({t()} if {self.cond(d + 1)} else {t()})"),
            (1, True, lambda: f"{t()} / 2"),
            (1, True, lambda: f"{t()} ** 2"),
            (1, bool(s.scalars), lambda: f"{t()} * {self.pick(s.scalars)}"),
            (2, bool(s.lists), lambda: f"({(l := self.pick(s.lists))}[{self.pick(['0', '-1'])}] if {l} else {t()})"),
            (1, bool(s.dicts), lambda: f"{self.pick(s.dicts)}.get({self.key()}, {t()})"),
            (2, bool(s.objs), lambda: f"{self.obj()}.v"),
            (2, bool(s.funcs), lambda: f"{self.pick(s.funcs)}({t()})"),
            (3, True, lambda: self.helper_tensor(t)),
            (1, True, lambda: self.use_global("G_T") and f"{t()} + G_T"),
            # An index only the data decide: out of range when every element is > -1.
            (1, True, lambda: f"{t()} + {t()}.view(-1)[({t()} > -1).long().sum().view(1)]"),
        ])

    def wrap(self, d, options):
        """A composite expression: parenthesized where it is an operand."""
        e = self.one_of(options)
        return f"({e})" if d > 0 else e

    def helper_tensor(self, t):
        name = self.pick(["h_nested", "h_raise", "h_branch", "h_kw", "h_star", "h_inplace",
                          "h_global", "h_try", "h_print", "h_dict", "h_obj"])
        if name == "h_dict" and (not self.s.dicts or self.no_grow) or name == "h_obj" and not self.s.objs:
            name = "h_nested"
        self.use(name)
        if name == "h_nested":
            return f"h_nested({t()}, {self.integer(1)})"
        if name in ("h_raise", "h_try"):
            return f"{name}({t()}, {self.integer(1)})"
        if name == "h_kw":
            return f"h_kw({t()}, {self.pick(['scale=3', 'shift=1', 'shift=1, scale=-1', ''])})".replace(", )", ")")
        if name == "h_star":
            args = ", ".join(t() for _ in range(self.num(1, 3)))
            return f"h_star({args}{self.pick(['', ', scale=2'])})"
        if name == "h_print":
            return f"h_print({t()}, out)"
        if name == "h_dict":
            return f"h_dict({self.pick(self.s.dicts)}, {t()})"
        if name == "h_obj":
            return f"({t()} * h_obj({self.obj()}, {t()}))"
        return f"{name}({t()})"

    def number(self):
        return self.one_of([
            (2, True, lambda: self.pick(["2", "-1", "0.5", "3"])),
            (2, True, lambda: self.integer(1)),
            (2, bool(self.s.floats), lambda: self.pick(self.s.floats)),
        ])

    def integer(self, d=0):
        s = self.s
        ints = s.ints + s.counters
        if d >= 2 or not self.flag():
            return self.pick(ints) if ints and self.flag() else self.pick(["0", "1", "2", "3"])
        i = lambda: self.integer(d + 1)
        return self.wrap(d, [
            (3, True, lambda: f"{i()} + {i()}"),
            (1, True, lambda: f"{i()} * 2 % 7"),
            (1, True, lambda: f"{i()} // 2"),
            (2, bool(s.lists), lambda: f"len({self.pick(s.lists)})"),
            (1, bool(s.dicts), lambda: f"len({self.pick(s.dicts)})"),
            (1, bool(s.sets), lambda: f"len({self.pick(s.sets)})"),
            (2, True, lambda: f"{self.pick(s.tensors)}.{self.pick(['shape[0]', 'numel()', 'size(0)', 'dim()'])}"),
            (1, True, lambda: f"int({self.tensor(d + 1)}.sum().item()) % 5"),
            (1, bool(s.objs), lambda: f"{self.obj()}.n"),
            (1, True, lambda: self.use_global("G_N") and "G_N"),
            (1, True, lambda: f"{self.pick(['max', 'min'])}({i()}, {i()})"),
            (1, bool(s.lists), lambda: f"sum(1 for u in {self.pick(s.lists)} if u.sum() > 0)"),
            (1, bool(s.sets), lambda: f"sum({self.pick(s.sets)})"),
        ])

    def floating(self):
        s = self.s
        return self.one_of([
            (2, bool(s.floats), lambda: self.pick(s.floats)),
            (2, True, lambda: f"{self.tensor(1)}.{self.pick(['sum', 'max', 'mean'])}().item()"),
            (1, True, lambda: f"float({self.integer(1)})"),
            (1, bool(s.floats), lambda: f"{self.pick(s.floats)} * 2 + 0.5"),
        ])

    def cond(self, d=0):
        s = self.s
        return self.wrap(d, [
            (3, True, lambda: f"{self.integer(d + 1)} > {self.num(0, 3)}"),
            (1, True, lambda: f"{self.integer(d + 1)} % 2 == 0"),
            (4, True, lambda: f"{self.tensor(d + 1)}.sum() > 0"),
            (1, True, lambda: f"bool(({self.tensor(d + 1)} > 0).all())"),
            (2, bool(s.lists), lambda: f"len({self.pick(s.lists)}) > {self.num(0, 2)}"),
            (1, bool(s.dicts), lambda: f"{self.key()} in {self.pick(s.dicts)}"),
            (1, bool(s.floats), lambda: f"{self.pick(s.floats)} > 0.5"),
            (1, bool(s.sets), lambda: f"{self.num(0, 3)} in {self.pick(s.sets)}"),
            (1, True, lambda: f"{self.pick(s.tensors)}.shape[0] > 3"),
            (1, bool(s.lists), lambda: f"any(u.sum() > 0 for u in {self.pick(s.lists)})"),
            (1, bool(s.objs), lambda: f"{self.obj()}.n > 1"),
            (1, bool(s.scalars), lambda: f"{self.pick(s.scalars)} > 0"),
            (1, d < 2, lambda: f"not {self.cond(d + 1)}"),
            (1, d < 2, lambda: f"{self.cond(d + 1)} {self.pick(['and', 'or'])} {self.cond(d + 1)}"),
        ])

    def key(self):
        return self.pick(['"a"', '"b"', '"c"'])

    def obj(self):
        return self.pick(self.s.objs)

    def use(self, name):
        self.used.add(name)
        for g in HELPERS.get(name, ("", ()))[1]:
            self.use_global(g, write=True)
        return True

    def use_global(self, name, write=False):
        self.used.add(name)
        if write:
            self.global_writes.add(name)
        return True

    def any_value(self):
        s = self.s
        return self.one_of([
            (3, True, lambda: self.tensor(1)),
            (2, True, lambda: self.integer(1)),
            (1, bool(s.floats), lambda: self.floating()),
            (1, bool(s.lists), lambda: f"len({self.pick(s.lists)})"),
            (1, bool(s.dicts), lambda: f"sorted({self.pick(s.dicts)})"),
            (1, bool(s.sets), lambda: f"sorted({self.pick(s.sets)})"),
        ])

    # -- statements: each returns a list of lines indented relative to the block
    def block(self, n_max, allow_return=False):
        lines = []
        for _ in range(self.num(1, n_max)):
            if self.stmts_left <= 0:
                break
            self.stmts_left -= 1
            lines += self.statement(allow_return)
            for kind, name in self.pending:
                getattr(self.s, kind).append(name)
            self.pending.clear()
        return lines or ["pass"]

    def nested(self, n_max=3, names=()):
        """A block whose new names end with it, indented; `names` (kind, name) are in
        scope inside it."""
        saved, pending = self.s, self.pending
        self.s, self.pending = saved.copy(), []
        for kind, name in names:
            getattr(self.s, kind).append(name)
        try:
            return indent(self.block(n_max, allow_return=True))
        finally:
            self.s, self.pending = saved, pending

    def statement(self, allow_return=False):
        s = self.s
        depth_ok = self.depth < self.MAX_DEPTH
        in_loop = self.loop_depth > 0
        grow = not self.no_grow
        return self.one_of([
            (4, True, self.st_assign_tensor),
            (3, True, self.st_inplace),
            (2, bool(s.counters), self.st_int),
            (2, grow, self.st_new_container),
            (3, True, self.st_mutate_container),
            (2, bool(s.objs), self.st_object),
            (2, True, self.st_global),
            (3, True, self.st_graph_break),
            (2, True, self.st_swap),
            (3, depth_ok, self.st_if),
            (4, depth_ok, self.st_for),
            (1, depth_ok, self.st_while),
            (2, depth_ok, self.st_try),
            (1, True, self.st_raise),
            (2, True, self.st_closure),
            (2, True, self.st_generator),
            (1, depth_ok, self.st_no_grad),
            (2, in_loop, lambda: [f"if {self.cond()}:", f"    {self.pick(['break', 'continue'])}"]),
            (1, allow_return and self.depth > 0, lambda: [f"if {self.cond()}:",
                                                           f"    return {self.result()}"]),
        ])

    def deeper(self, fn):
        self.depth += 1
        try:
            return fn()
        finally:
            self.depth -= 1

    def target_tensor(self, new=True):
        """A name to assign a tensor to: new (then in scope) or one in scope."""
        s = self.s
        if new and self.flag():
            return self.new_name("tensors", "a")
        return self.pick(s.tensors)

    def st_assign_tensor(self):
        rhs = self.tensor()
        return [f"{self.target_tensor()} = {rhs}"]

    def st_inplace(self):
        s = self.s
        t = self.pick(s.tensors)
        return self.one_of([
            (3, True, lambda: [f"{t} += {self.tensor(1)}"]),
            (2, True, lambda: [f"{t}.{self.pick(['add_', 'sub_', 'mul_'])}({self.tensor(1)})"]),
            (1, True, lambda: [f"{t}.{self.pick(['mul_(2)', 'clamp_(-3, 3)', 'neg_()', 'zero_()', 'add_(1)'])}"]),
            (1, True, lambda: [f"{t}[0] = {self.number()}"]),
            (1, True, lambda: [f"{t}[{self.tensor(1)} > 0] = 0"]),
            (1, True, lambda: [f"{t}.copy_({self.tensor(1)})"]),
            (1, True, lambda: [f"{t} *= {self.number()}"]),
            (1, bool(s.objs), lambda: [f"{self.obj()}.v.add_({self.tensor(1)})"]),
            (1, bool(s.lists), lambda: [f"if {(l := self.pick(s.lists))}:", f"    {l}[0].mul_(2)"]),
        ])

    def st_int(self):
        s = self.s
        c = self.pick(s.counters)
        return self.one_of([
            (3, True, lambda: [f"{c} += {self.pick(['1', '2'])}"]),
            (2, True, lambda: [f"{c} += {self.integer()}"]),
            (1, True, lambda: [f"{c} = ({self.integer()}) % 97"]),
            (1, True, lambda: [f"{c} += int({self.tensor(1)}.{self.pick(['max', 'sum'])}().item() > 0)"]),
        ])

    def new_name(self, kind, prefix):
        """A fresh name, in scope from the next statement on."""
        name = self.fresh(prefix)
        self.pending.append((kind, name))
        return name

    def st_new_container(self):
        s = self.s
        pt = lambda: self.pick(s.tensors)
        lst = lambda: self.pick(s.lists)

        def new_list(rhs):
            return [f"{self.new_name('lists', 'l')} = {rhs}"]

        def new_dict(rhs):
            return [f"{self.new_name('dicts', 'm')} = {rhs}"]
        return self.one_of([
            (2, True, lambda: new_list(f"[{pt()}, {self.tensor(1)}]")),
            (1, True, lambda: new_list("[]")),
            (1, bool(s.lists), lambda: new_list(f"list({lst()})")),
            (2, bool(s.lists), lambda: new_list(f"[{self.pick(['u * 2', 'u + 1', 'u.relu()'])} for u in {lst()}]")),
            (1, bool(s.lists), lambda: new_list(f"[u for u in {lst()} if u.sum() > 0]")),
            (2, bool(s.lists), lambda: new_list(lst())),                       # an alias
            (1, bool(s.lists), lambda: new_list(f"{lst()}[{self.pick([':2', '1:', '::-1'])}]")),
            (2, True, lambda: new_dict(f'{{"a": {pt()}, "b": {self.tensor(1)}}}')),
            (1, bool(s.lists), lambda: new_dict(f'dict(zip(("a", "b", "c"), {lst()}))')),
            (1, bool(s.dicts), lambda: new_dict(f"{{k: v * 2 for k, v in {self.pick(s.dicts)}.items()}}")),
            (1, bool(s.dicts), lambda: new_dict(f"dict({self.pick(s.dicts)})")),
            (1, True, lambda: [f"{self.new_name('sets', 's')} = {self.pick(['{1, 2}', 'set()', 'set(range(3))'])}"]),
            (1, True, lambda: [f"{self.new_name('counters', 'c')} = {self.integer()}"]),
            (1, True, lambda: [f"{self.new_name('logs', 'log')} = []"]),
            (1, True, lambda: [f"{self.new_name('floats', 'f')} = {self.floating()}"]),
            (1, True, lambda: [f"{self.new_name('scalars', 'z')} = {self.tensor(1)}.{self.pick(['sum', 'max', 'mean'])}()"]),
            (1, True, lambda: self.new_object()),
            (1, True, lambda: [f"{(a := self.new_name('tensors', 'a'))}, {self.new_name('counters', 'c')} = "
                               f"({self.tensor(1)}, {self.integer(1)})"]),
        ])

    def new_object(self):
        cls = self.pick(["Box", "SBox", "PBox", "DBox"])
        self.use(cls)
        rhs = f"{cls}({self.tensor(1)})"
        return [f"{self.new_name('objs', 'b')} = {rhs}"]

    def st_mutate_container(self):
        s = self.s
        grow = not self.no_grow
        lst = lambda: self.pick(s.lists)
        dct = lambda: self.pick(s.dicts)
        st_ = lambda: self.pick(s.sets)
        t = lambda: self.tensor(1)
        if not (s.lists or s.dicts or s.sets):
            return self.st_assign_tensor()
        return self.one_of([
            (3, bool(s.lists) and grow, lambda: [f"{lst()}.append({t()})"]),
            (1, bool(s.lists) and grow, lambda: [f"{lst()}.extend([{t()}, {t()}])"]),
            (1, bool(s.lists) and grow, lambda: [f"{lst()}.insert(0, {t()})"]),
            (1, bool(s.lists) and grow, lambda: [f"{lst()} += [{t()}]"]),
            (2, bool(s.lists), lambda: [f"if {(l := lst())}:", f"    {l}.pop({self.pick(['', '0'])})"]),
            (2, bool(s.lists), lambda: [f"if {(l := lst())}:", f"    {l}[{self.pick(['0', '-1'])}] = {t()}"]),
            (1, bool(s.lists), lambda: [f"if {(l := lst())}:", f"    del {l}[0]"]),
            (1, bool(s.lists), lambda: [f"{lst()}.reverse()"]),
            (1, bool(s.lists), lambda: [f"{lst()}[:] = [{t()}]"]),
            (1, bool(s.lists) and grow, lambda: self.use("h_append") and
             [f"{self.target_int()} = h_append({lst()}, {t()})"]),
            (1, bool(s.lists), lambda: self.use("h_swap") and [f"h_swap({lst()})"]),
            (3, bool(s.dicts) and grow, lambda: [f"{dct()}[{self.key()}] = {t()}"]),
            (2, bool(s.dicts) and grow, lambda: [f"{dct()}.pop({self.key()}, None)"]),
            (1, bool(s.dicts) and grow, lambda: [f"{dct()}.update({self.pick(['a', 'b', 'c'])}={t()})"]),
            (1, bool(s.dicts) and grow, lambda: [f"{dct()}.setdefault({self.key()}, {t()})"]),
            (1, bool(s.dicts) and grow, lambda: [f"if {(k := self.key())} in {(m := dct())}:", f"    del {m}[{k}]"]),
            (1, bool(s.dicts), lambda: [f"if {(k := self.key())} in {(m := dct())}:", f"    {m}[{k}] = {m}[{k}] + 1"]),
            (2, bool(s.sets) and grow, lambda: [f"{st_()}.add({self.integer(1)})"]),
            (1, bool(s.sets) and grow, lambda: [f"{st_()}.discard({self.integer(1)})"]),
            (1, bool(s.sets) and grow, lambda: [f"{st_()} |= {{{self.integer(1)}}}"]),
            (1, bool(s.lists) and bool(s.dicts), lambda: [f"{lst()}.append({dct()}.get({self.key()}, {t()}))"]
             if grow else [f"{dct()}.get({self.key()})"]),
        ])

    def target_int(self):
        if self.s.counters and self.flag():
            return self.pick(self.s.counters)
        return self.new_name("counters", "c")

    def st_object(self):
        s = self.s
        o = self.obj()
        return self.one_of([
            (3, True, lambda: [f"{o}.v = {self.tensor(1)}"]),
            (2, True, lambda: [f"{o}.n += 1"]),
            (1, True, lambda: [f"{o}.n = {self.integer(1)}"]),
            (2, True, lambda: [f"{self.target_int()} = {o}.bump({self.tensor(1)})"]),
            (1, True, lambda: self.use("h_obj") and [f"h_obj({o}, {self.tensor(1)})"]),
            (1, True, lambda: [f'setattr({o}, "n", getattr({o}, "n", 0) + 1)']),
            (1, True, lambda: [f"{o}.v, {o}.n = {o}.v * 2, {o}.n - 1"]),
            (1, len(s.objs) > 1, lambda: [f"{o}.v, {(p := self.obj())}.v = {p}.v, {o}.v"]),
        ])

    def st_global(self):
        return self.one_of([
            (2, True, lambda: self.use_global("G_N", True) and [f"G_N += {self.integer(1)}"]),
            (2, True, lambda: self.use_global("G_T", True) and [f"G_T = G_T + {self.tensor(1)}.sum()"]),
            (1, True, lambda: self.use_global("G_T", True) and ["G_T.add_(1)"]),
            (2, True, lambda: self.use_global("G_L", True) and [f"G_L.append({self.any_value()})"]),
            (1, True, lambda: self.use_global("G_L", True) and ["if G_L:", "    G_L.pop()"]),
            (1, True, lambda: self.use("h_global") and [f"{self.target_tensor()} = h_global({self.tensor(1)})"]),
        ])

    def st_graph_break(self):
        return self.one_of([
            (3, True, lambda: [f"print({self.any_value()}, file=out)"]),
            (1, True, lambda: [f'print("{self.fresh("p")}", {self.any_value()}, {self.any_value()}, file=out)']),
            (2, True, lambda: [f"{self.new_name('floats', 'f')} = {self.tensor(1)}.sum().item()"]),
            (1, True, lambda: [f"{self.target_tensor()} = {self.helper_break()}"]),
        ])

    def helper_break(self):
        name = self.pick(["h_print", "h_branch"])
        self.use(name)
        return f"h_print({self.tensor(1)}, out)" if name == "h_print" else f"h_branch({self.tensor(1)})"

    def st_swap(self):
        s = self.s
        a, b = self.pick(s.tensors), self.pick(s.tensors)
        return self.one_of([
            (2, True, lambda: [f"{a}, {b} = {b}, {a}"]),
            (1, True, lambda: [f"{a}, {b} = {b}, {a} + {b}"]),
            (1, len(s.lists) > 0, lambda: [f"if len({(l := self.pick(s.lists))}) >= 2:",
                                           f"    {l}[0], {l}[1] = {l}[1], {l}[0]"]),
            (1, bool(s.lists), lambda: [f"if {(l := self.pick(s.lists))}:",
                                        f"    {a}, *{(r := self.fresh('r'))} = {l}",
                                        f"    {a} = {a} + len({r})"]),
        ])

    def st_if(self):
        def go():
            lines = [f"if {self.cond()}:"] + self.nested()
            if self.flag():
                lines += [f"elif {self.cond()}:"] + self.nested(2)
            if self.flag():
                lines += ["else:"] + self.nested(2)
            return lines
        return self.deeper(go)

    def loop(self, header, body_scope=(), freeze=False, orelse=False):
        """A loop: header, then a nested body with the loop's names in scope."""
        def go():
            self.loop_depth += 1
            self.no_grow += freeze
            try:
                body = self.nested(3, body_scope)
            finally:
                self.loop_depth -= 1
                self.no_grow -= freeze
            lines = [header] + body
            if orelse:
                lines += ["else:"] + self.nested(1)
            return lines
        return self.deeper(go)

    def bound(self):
        s = self.s
        return self.one_of([
            (2, bool(s.ints), lambda: self.pick(s.ints)),
            (2, True, lambda: str(self.num(1, 4))),
            (1, bool(s.lists), lambda: f"len({self.pick(s.lists)})"),
            (1, True, lambda: f"{self.pick(s.tensors)}.shape[0]"),
            (1, bool(s.counters), lambda: f"min({self.pick(s.counters)}, 4)"),
        ])

    def st_for(self):
        s = self.s
        i, u, w = self.fresh("i"), self.fresh("u"), self.fresh("w")
        lst = lambda: self.pick(s.lists)
        orelse = self.num(0, 4) == 4
        return self.one_of([
            (3, True, lambda: self.loop(f"for {i} in range({self.bound()}):", [("ints", i)], orelse=orelse)),
            (3, bool(s.lists), lambda: self.loop(f"for {u} in {lst()}:", [("tensors", u)], True, orelse)),
            (2, bool(s.lists), lambda: self.loop(f"for {i}, {u} in enumerate({lst()}{self.pick(['', ', 1'])}):",
                                                 [("ints", i), ("tensors", u)], True)),
            (2, bool(s.lists), lambda: self.loop(f"for {u}, {w} in zip({lst()}, {lst()}):",
                                                 [("tensors", u), ("tensors", w)], True)),
            (1, True, lambda: self.loop(f"for {u}, {w} in zip({self.pick(s.tensors)}, {self.pick(s.tensors)}):",
                                        [("scalars", u), ("scalars", w)])),
            (2, bool(s.lists), lambda: self.loop(f"for {u} in reversed({lst()}):", [("tensors", u)], True)),
            (2, bool(s.dicts), lambda: self.loop(f"for {w}, {u} in {self.pick(s.dicts)}.items():",
                                                 [("tensors", u)], True)),
            (1, bool(s.dicts), lambda: self.loop(f"for {w} in {self.pick(s.dicts)}:", [], True)),
            (1, bool(s.lists), lambda: self.loop(f"for {i} in range(len({lst()})):", [("ints", i)])),
            (1, True, lambda: self.loop(f"for {u} in {self.pick(s.tensors)}:", [("scalars", u)])),
            (1, bool(s.sets), lambda: self.loop(f"for {i} in sorted({self.pick(s.sets)}):", [("ints", i)], True)),
            (1, bool(s.lists), lambda: self.use("h_gen") and
             self.loop(f"for {u} in h_gen({lst()}, {self.log()}):", [("tensors", u)], True)),
            (1, bool(s.lists), lambda: self.loop(f"for {i}, ({u}, {w}) in enumerate(zip({lst()}, {lst()})):",
                                                 [("ints", i), ("tensors", u), ("tensors", w)], True)),
        ])

    def st_while(self):
        s = self.s
        w = self.fresh("w")
        header = self.one_of([
            (2, True, lambda: f"while {w} < {self.bound()}:"),
            (1, True, lambda: f"while {w} < 4 and {self.tensor(1)}.sum() < 10:"),
            (1, bool(s.lists), lambda: f"while {w} < 5 and {self.pick(s.lists)}:"),
        ])
        lines = self.loop(header, [("ints", w)])
        return [f"{w} = 0", lines[0], f"    {w} += 1"] + lines[1:]

    def st_try(self):
        def go():
            s = self.s
            body = self.nested(3)
            raiser = self.one_of([
                (2, True, lambda: [f"if {self.cond()}:", f'    raise ValueError("v{self.num(0, 9)}")']),
                (1, True, lambda: self.use("h_raise") and [f"{self.target_tensor(False)} = h_raise({self.tensor(1)}, {self.integer(1)})"]),
                (1, bool(s.dicts), lambda: [f"{self.target_tensor(False)} = {self.pick(s.dicts)}[{self.key()}]"]),
                (1, bool(s.lists), lambda: [f"{self.target_tensor(False)} = {self.pick(s.lists)}[{self.integer(1)}]"]),
                (1, True, lambda: []),
            ])
            at = self.pick([len(body), 0])
            lines = ["try:"] + body[:at] + indent(raiser) + body[at:]
            exc = self.pick(["ValueError as e", "(KeyError, IndexError) as e", "Exception as e"])
            handler = self.one_of([
                (2, True, lambda: ["print(type(e).__name__, e, file=out)"]),
                (1, bool(s.counters), lambda: [f"{self.pick(s.counters)} += 1"]),
                (1, True, lambda: None),
            ])
            lines += [f"except {exc}:"] + (indent(handler) if handler else self.nested(2))
            if self.flag():
                lines += ["finally:"] + self.nested(2)
            return lines
        return self.deeper(go)

    def st_raise(self):
        return [f"if {self.cond()}:",
                f'    raise {self.pick(["ValueError", "RuntimeError", "KeyError"])}("r{self.num(0, 9)}")']

    def st_closure(self):
        s = self.s
        c, fn = self.fresh("c"), self.fresh("fn")

        def counter_closure():
            k = self.tensor(1) if self.flag() else self.pick(s.tensors)
            self.pending += [("counters", c), ("funcs", fn)]
            return [f"{c} = 0", f"def {fn}(a):", f"    nonlocal {c}", f"    {c} += 1",
                    f"    return a * {c} + {k}"]

        def factory():
            self.use("make_acc")
            self.pending.append(("funcs", fn))
            return [f"{fn} = make_acc({self.tensor(1)})"]

        def count_factory():
            self.use("make_counter")
            self.pending.append(("counters", c))
            return [f"{(inc := self.fresh('inc'))} = make_counter()", f"{c} = {inc}() + {inc}()"]

        def lam():
            self.pending.append(("funcs", fn))
            return [f"{fn} = lambda a: {self.pick(['a * 2', 'a + 1', 'a.relu()'])} + {self.pick(s.tensors)}"]

        def nested_def():
            self.pending.append(("funcs", fn))
            inner = self.fresh("g")
            return [f"def {fn}(a):", f"    def {inner}(b):", f"        return b * 2",
                    f"    return {inner}(a) + {self.pick(s.tensors)}"]

        def returned_closure():
            self.pending.append(("funcs", fn))
            return [f"def {(mk := self.fresh('mk'))}(base):", f"    def {(inner := self.fresh('g'))}(a):",
                    f"        return a + base", f"    return {inner}", f"{fn} = {mk}({self.tensor(1)})"]

        return self.one_of([(3, True, counter_closure), (2, True, factory), (1, True, count_factory),
                            (1, True, lam), (1, True, nested_def), (1, True, returned_closure)])

    def log(self):
        """A list for a generator's side effects: never one that a loop iterates."""
        s = self.s
        return self.pick(s.logs) if s.logs and self.flag() else "[]"

    def st_generator(self):
        s = self.s
        lst = lambda: self.pick(s.lists)

        def counted():
            self.use("h_count")
            g = self.fresh("gen")
            return [f"{g} = h_count({self.bound()}, {self.log()})",
                    f"{self.target_int()} = next({g}, -1) + sum({g})"]

        return self.one_of([
            (2, bool(s.lists), lambda: [f"{self.target_int()} = int(any(u.sum() > 0 for u in {lst()}))"]),
            (2, bool(s.lists), lambda: [f"{self.target_tensor()} = next((u for u in {lst()} if u.sum() > 0), "
                                        f"{self.pick(s.tensors)})"]),
            (1, bool(s.lists), lambda: [f"{self.target_tensor()} = sum((u * 2 for u in {lst()}), "
                                        f"{self.pick(s.tensors)} * 0)"]),
            (2, bool(s.lists) and not self.no_grow, lambda: self.use("h_gen") and
             [f"{(g := self.fresh('gen'))} = h_gen({lst()}, {self.log()})",
              f"{self.target_tensor()} = next({g}, {self.pick(s.tensors)})"]),
            (1, bool(s.lists) and not self.no_grow, lambda: self.use("h_gen") and
             [f"for {(u := self.fresh('u'))}, {(w := self.fresh('w'))} in zip({lst()}, h_gen({lst()}, {self.log()})):",
              f"    {self.pick(s.tensors)}.add_({u} - {w})"]),
            (1, True, counted),
            (1, bool(s.lists), lambda: [f"{self.target_int()} = int(all(u.sum() > 0 for u in {lst()}))"]),
        ])

    def st_no_grad(self):
        return self.deeper(lambda: ["with torch.no_grad():"] + self.nested(2))

    def result(self):
        s = self.s
        names = s.tensors + s.scalars + s.counters + s.floats + s.lists + s.dicts + s.objs + s.logs
        k = self.num(1, 4)
        picked = [self.pick(names) for _ in range(k)]
        return ", ".join(picked) + ("," if k == 1 else "")

    # -- the whole program
    def program(self):
        s = self.s
        params = ["t0", "t1"]
        s.tensors += ["t0", "t1"]
        if self.flag():
            params.append("xs"); s.lists.append("xs")
        if self.flag():
            params.append("n"); s.ints.append("n")
        if self.flag():
            params.append("ys"); s.lists.append("ys")
        if self.flag():
            params.append("x"); s.floats.append("x")
        if self.flag():
            params.append("dd"); s.dicts.append("dd")
        if self.flag():
            params.append("o"); s.objs.append("o")
            obj_cls = self.pick(["Box", "SBox", "PBox", "DBox"])
            self.use(obj_cls)
        else:
            obj_cls = None
        if self.flag():
            params.append("k"); s.ints.append("k")
        self.stmts_left = self.num(2, 14)
        body = self.block(8)
        body.append(f"return {self.result()}")
        params.append("out")
        out = self.pick(["Out()", "io.StringIO()"])      # print() to a user object or a StringIO
        if out == "Out()":
            self.use("Out")
        head = []
        if self.global_writes & {"G_N", "G_T"}:
            head.append("global " + ", ".join(sorted(self.global_writes & {"G_N", "G_T"})))
        inputs = self.inputs(params, obj_cls, out)
        return Program(self.assemble(params, head + body, inputs))

    def assemble(self, params, body, inputs):
        parts = ["import dataclasses", "import io", "import sys", "", "import torch", ""]
        globals_ = [g for g in GLOBAL_INIT if g in self.used]
        parts += [GLOBAL_INIT[g] for g in globals_]
        parts.append(f"GLOBALS = {tuple(globals_)!r}")
        if "Out" in self.used:
            parts += ["", "", OUT_CLASS.rstrip()]
        for name, src in CLASSES.items():
            if name in self.used:
                parts += ["", "", src.rstrip()]
        for name, (src, _) in HELPERS.items():
            if name in self.used:
                parts += ["", "", src.rstrip()]
        parts += ["", "", f"def f({', '.join(params)}):"] + indent(body)
        parts += ["", "", "def make_inputs():", "    calls = []"] + indent(inputs) + ["    return calls"]
        return "\n".join(parts) + "\n"

    # -- inputs
    def tensor_lit(self, size):
        vals = [self.num(-3, 3) for _ in range(size)]
        return f"torch.tensor([{', '.join(f'{v}.0' for v in vals)}])"

    def inputs(self, params, obj_cls, out):
        lines = []
        vary_size = self.flag()
        size = self.num(2, 5)
        n_calls = self.num(2, 5)
        for c in range(n_calls):
            L = self.num(2, 5) if vary_size else size
            alias = self.pick(["none", "none", "t1 is t0", "t1 views t0", "ys is xs", "xs holds t0",
                               "o.v is t1"])
            args = {}
            t0 = self.tensor_lit(L)
            lines.append(f"t0 = {t0}")
            if alias == "t1 is t0":
                lines.append("t1 = t0")
            elif alias == "t1 views t0":
                lines.append(f"t1 = t0{self.pick(['[:]', '.view(-1)', '.flip(0)', '[1:].view(-1)[:1].expand(' + str(L) + ')'])}")
            else:
                lines.append(f"t1 = {self.tensor_lit(L)}")
            args["t0"], args["t1"] = "t0", "t1"
            if "xs" in params:
                items = ["t0"] if alias == "xs holds t0" else []
                items += [self.tensor_lit(L) for _ in range(self.num(0, 3))]
                lines.append(f"xs = [{', '.join(items)}]")
                args["xs"] = "xs"
            if "ys" in params:
                if alias == "ys is xs" and "xs" in params:
                    args["ys"] = "xs"
                else:
                    args["ys"] = f"[{', '.join(self.tensor_lit(L) for _ in range(self.num(0, 3)))}]"
            if "n" in params:
                args["n"] = str(self.num(0, 4))
            if "x" in params:
                args["x"] = self.pick(["0.5", "1.5", "-2.0", "0.0", "2.5"])
            if "dd" in params:
                keys = self.pick([("a", "b"), ("a",), ("b", "a"), ("a", "b", "c"), ()])
                args["dd"] = "{" + ", ".join(f'"{k}": {self.tensor_lit(L)}' for k in keys) + "}"
            if "o" in params:
                v = "t1" if alias == "o.v is t1" else self.tensor_lit(L)
                args["o"] = f"{obj_cls}({v}, {self.num(0, 2)})"
            if "k" in params:
                args["k"] = str(self.num(0, 3))
            args["out"] = out
            lines.append(f"calls.append(({', '.join(args[p] for p in params)},))")
        return lines


def indent(lines, by="    "):
    return [by + line for line in lines]


# --------------------------------------------------------------------------- focused families
# Whole programs aimed at one mechanism each: the classes of wrong answers that issue 29
# found and the grammar above never drew (its tensors are all contiguous and of shape
# (L,), its dict keys strings, its classes fixed, its floats ordinary numbers).  A module
# may define CALLER (`def caller(fn, *args)`: f called and its results used, as a
# caller would, outside the compiled frame) and OPTIONS (keywords of frametrace.optimize).

class Focus(Gen):
    """Draws one focused program (see FAMILIES)."""

    def module(self, preamble, params, body, calls, options=None, caller=None, imports=()):
        parts = ["import collections", "import enum", "import io", "import math", "import sys", "",
                 "import torch", "import torch.nn.functional as F", *imports, "", "GLOBALS = ()"]
        if options:
            parts.append(f"OPTIONS = {options!r}")
        if preamble:
            parts += ["", ""] + preamble
        parts += ["", "", f"def f({', '.join(params)}):"] + indent(body)
        if caller:
            parts += ["", "", "def caller(fn, *args):"] + indent(caller) + ["", "", "CALLER = caller"]
        parts += ["", "", "def make_inputs():", "    calls = []"] + indent(calls) + ["    return calls"]
        return Program("\n".join(parts) + "\n")

    def floats_lit(self, n, lo=-3, hi=3):
        return "[" + ", ".join(f"{self.num(lo, hi)}.0" for _ in range(n)) + "]"

    # -- views written in place
    VIEW_STEPS = {      # name: (rank it needs, source template, rank after)
        "split": (1, "{v}.split(2)[{i}]", None), "unbind": (1, "{v}.unbind(0)[{i}]", -1),
        "chunk": (1, "{v}.chunk(2)[{i}]", None), "split_last": (1, "{v}.split(2, -1)[{i}]", None),
        "unbind_last": (2, "{v}.unbind(-1)[{i}]", -1), "chunk_last": (1, "{v}.chunk(3, -1)[{i}]", None), "view": (1, "{v}.view(-1)", "flat"),
        "t": (2, "{v}.t()", None), "transpose": (2, "{v}.transpose(0, 1)", None),
        "narrow": (1, "{v}.narrow(0, {i}, 1)", None), "select": (2, "{v}.select(1, {i})", -1),
        "slice": (1, "{v}[{i}:]", None), "expand": (1, "{v}[:1].expand(3, *{v}.shape[1:])", "expand"),
        "diagonal": (2, "{v}.diagonal()", -1), "unsqueeze": (1, "{v}.unsqueeze(0)", 1),
    }

    def fam_views(self):
        rank = 2
        steps, v = [], "b"
        for _ in range(self.num(1, 3)):
            if rank < 1:
                break
            names = [n for n, (need, _, _) in self.VIEW_STEPS.items() if rank >= need and rank <= 3]
            name = self.pick(names)
            need, tmpl, after = self.VIEW_STEPS[name]
            v = tmpl.format(v=v, i=self.num(0, 1))
            if after == -1:
                rank -= 1
            elif after == 1:
                rank += 1
            elif after == "flat":
                rank = 1
            steps.append(name)
        base = self.pick(["x * 1", "x.clone()", "x", "x.detach()", "x.view(3, 4).t().reshape(4, 3)"])
        operand = self.pick(["w.sum()", "2.0", "w.mean().expand_as(u)", "u * 2", "torch.ones_like(u) * w.mean()",
                             "w.detach().sum()"])
        write = self.pick(["u.add_({o})", "u.mul_({o})", "u.copy_({o})", "u[...] = {o}", "u += {o}",
                           "u.zero_()", "u.clamp_(min=0)"]).format(o=operand)
        ng_view, ng_write = self.flag() and self.flag(), self.flag() and self.flag()
        body = [f"b = {base}"]
        body += (["with torch.no_grad():", f"    v = {v}"] if ng_view else [f"v = {v}"])
        if self.flag():
            body += [f"u = v.{self.pick(['view(-1)', 't()' if rank == 2 else 'flatten()', 'unsqueeze(0)', 'clone()'])}"]
        else:
            body += ["u = v"]
        body += (["with torch.no_grad():", f"    {write}"] if ng_write else [write])
        body += [self.pick(["r = b.sum() * w.sum()", "r = (v * w.sum()).sum()", "r = b.detach().sum()"]),
                 f"return {self.pick(['v, b', 'u, r', 'v, r, b.requires_grad, v.requires_grad', 'v'])}"]
        caller = ["res = fn(*args)", "v = res[0] if isinstance(res, tuple) else res"]
        caller += [self.pick(["v.add_(1)", "v.mul_(args[1].sum())", "v[...] = 0", "pass"])
                   if self.flag() else "pass"]
        if self.flag():
            caller += ["v.sum().backward() if v.requires_grad else None"]
        caller += ["return snapshot(res), [a.grad for a in args]"]
        calls = []
        for _ in range(self.num(2, 4)):
            xg, wg = self.pick(["True", "False"]), self.pick(["True", "False", "True"])
            rows = ", ".join(self.floats_lit(3) for _ in range(4))
            calls.append(f"calls.append((torch.tensor([{rows}], "
                         f"requires_grad={xg}), torch.tensor({self.floats_lit(2)}, requires_grad={wg})))")
        return self.module(self.SNAPSHOT, ["x", "w"], body, calls, caller=caller)

    # What the caller compares of a result: reading a view that a write made invalid
    # (a multi-output view's base written in place) raises, on both sides alike.
    SNAPSHOT = ["def snapshot(r):", "    if isinstance(r, tuple):", "        return tuple(snapshot(u) for u in r)",
                "    if not isinstance(r, torch.Tensor):", "        return r", "    try:",
                "        return r.detach().clone(), r.requires_grad, r.is_leaf, r._is_view()",
                "    except RuntimeError as e:", "        return str(e)"]

    # -- layouts of inputs
    LAYOUT_OPS = [
        "{x} + 1", "{x} * y", "{x}.relu()", "{x}.abs()", "torch.roll({x}, 1, 0)", "torch.roll({x}, 1, -1)", "{x}.flip(0)",
        "torch.floor_divide({x}, 2)", "torch.copysign({x}, y)", "torch.xlogy({x}, y)", "{x}.clone()",
        "torch.where({x} > 0, {x}, y)", "{x}.transpose(0, 1)", "{x}.contiguous()", "{x}.sum(0)", "{x}.exp()",
        "torch.maximum({x}, y)", "{x}.clamp(-1, 1)", "{x}[1:]", "{x}.narrow(-1, 1, 2)",
    ]
    LAYOUT_OPS4 = ["F.channel_shuffle({x}, 2)", "F.batch_norm({x}, None, None, training=True)",
                   "{x}.to(memory_format=torch.channels_last)", "F.max_unpool2d(*F.max_pool2d({x}, 2, return_indices=True), 2)",
                   "torch.roll({x}, 1, 1)", "{x}.permute(0, 2, 3, 1)", "F.relu({x})"]
    LAYOUT_OPS2 = ["F.one_hot(({x}.abs() % 4).long(), 4)", "F.batch_norm({x}, None, None, training=True)",
                   "{x}.t()", "{x} @ y.t()"]

    def layout_input(self, rank, which):
        if rank == 2:
            return {"contiguous": "torch.arange(-5.0, 7.0).view(3, 4)",
                    "transposed": "torch.arange(-5.0, 7.0).view(4, 3).t()",
                    "expanded": "torch.arange(-1.0, 3.0).view(1, 4).expand(3, 4)",
                    "sliced": "torch.arange(-9.0, 15.0).view(3, 8)[:, ::2]",
                    "channels_last": "torch.arange(-17.0, 7.0).view(2, 3, 4)[1]"}[which]
        b = "torch.arange(-20.0, 28.0).view(2, 4, 2, 3)"
        return {"contiguous": b, "transposed": "torch.arange(-20.0, 28.0).view(2, 4, 3, 2).transpose(2, 3)",
                "expanded": "torch.arange(-3.0, 5.0).view(1, 4, 2, 1).expand(2, 4, 2, 3)",
                "sliced": "torch.arange(-40.0, 56.0).view(2, 4, 2, 6)[..., ::2]",
                "channels_last": f"{b}.contiguous(memory_format=torch.channels_last)"}[which]

    def fam_layouts(self):
        rank = self.pick([2, 4])
        ops = self.LAYOUT_OPS + (self.LAYOUT_OPS4 if rank == 4 else self.LAYOUT_OPS2)
        body = []
        cur = "x"
        for i in range(self.num(1, 3)):
            op = self.pick(ops).format(x=cur)
            body.append(f"y{i} = {op}")
            cur = f"y{i}"
        tails = [f"z = {cur}.contiguous()", f"z = {cur}.contiguous().view(-1)", f"z = {cur}.view(-1)",
                 f"z = {cur}.reshape(-1)", f"z = {cur}.contiguous(memory_format=torch.channels_last)" if rank == 4
                 else f"z = {cur}.t().contiguous()", f"z = {cur}.clone(memory_format=torch.preserve_format)"]
        body.append(self.pick(tails))
        reads = [f"{cur}.is_contiguous()", f"{cur}.stride()", "z.is_contiguous()", "z.stride()",
                 f"z is {cur}", "z.data_ptr() == x.data_ptr()", f"{cur}.is_contiguous(memory_format=torch.channels_last)"
                 if rank == 4 else f"{cur}.shape"]
        body.append(f"facts = ({', '.join(self.pick(reads) for _ in range(self.num(1, 3)))},)")
        if self.flag():
            body.append(self.pick(["z.add_(1)", "z.mul_(-1)", "z[0] = 7.0" if rank == 2 else "z.zero_()",
                                   f"{cur}.add_(1) if not {cur}.requires_grad else None"]))
        if self.flag():
            body.append(f"if {cur}.is_contiguous():\n        z = z * 2")
        body.append(f"return {self.pick(['z, facts', f'z, {cur}, facts', 'facts, x'])}")
        calls = []
        kinds = ["contiguous", "transposed", "expanded", "sliced", "channels_last"]
        for _ in range(self.num(2, 4)):
            xl, yl = self.pick(kinds), self.pick(kinds)
            calls.append(f"calls.append(({self.layout_input(rank, xl)}, {self.layout_input(rank, yl)}.abs() + 0.5))")
        return self.module([], ["x", "y"], body, calls)

    # -- dict keys of mixed types that compare equal
    KEYS = ["1", "True", "1.0", "E.A", "'a'", "S('a')", "(1, 'a')", "(True, S('a'))", "(1.0, 'a')",
            "2", "E.B", "2.0", "0", "False", "-0.0", "'b'", "S('b')"]
    DICT_PRE = ["class E(enum.IntEnum):", "    A = 1", "    B = 2", "", "",
                "class S(str):", "    pass"]

    def fam_dict_keys(self):
        key = lambda: self.pick(self.KEYS)
        reads = [
            "k0 = next(iter(d))", "out.append((type(k0).__name__, k0 is True, str(k0), repr(k0)))",
            f"out.append(d.get({key()}, t).sum())", "out.append(k in d)",
            "out.append(d[k] * 2 if k in d else None)", "out.append([type(q).__name__ for q in d])",
            "out.append(sorted(map(str, d)))", "out.append(list(d))",
            "out.append(sum(v.sum() * (2 if q is True else 1) for q, v in d.items()))",
            "out.append(isinstance(next(iter(d)), bool))", "out.append(type(k) is int)",
            f"d[{key()}] = t * 2", "d[k] = t + 1", f"out.append(d.pop({key()}, None))",
            "out.append({**d})", "out.append(list(dict.fromkeys(d)))", "out.append(k is True)",
            "out.append(str(k))", "out.append([q is k for q in d])", f"out.append({key()} in d)",
            "out.append(list(reversed(d)))",
        ]
        body = ["out = []", "k0 = None", "if d:", "    k0 = next(iter(d))"]
        for _ in range(self.num(2, 6)):
            r = self.pick(reads)
            body.append(f"if d:\n        {r}" if "k0" in r or "next(iter" in r else r)
        body.append("return t * len(d), out")
        calls = []
        ordered = self.flag()
        for _ in range(self.num(2, 5)):
            keys = [key() for _ in range(self.num(0, 3))]
            items = ", ".join(f"({k}, torch.tensor({self.floats_lit(2)}))" for k in keys)
            d = f"collections.OrderedDict([{items}])" if ordered else f"dict([{items}])"
            calls.append(f"calls.append(({d}, {key()}, torch.tensor({self.floats_lit(2)})))")
        return self.module(self.DICT_PRE, ["d", "k", "t"], body, calls)

    # -- class hierarchies changed between calls
    CLASS_READS = [
        "type(o).__mro__[1].k", "o.__class__.__bases__[0].k", "type(o).__base__.k", "type(o).k", "o.k",
        "type(o).__dict__.get('z', -1)", "type(o).__mro__[1].__dict__.get('k', 0)",
        "getattr(type(o).__mro__[1], NAME, 0)", "getattr(type(o), 'w', 0)", "int(hasattr(type(o), 'w'))",
        "next((c.__dict__['k'] for c in type(o).__mro__ if 'k' in c.__dict__), 0)",
        "type(o).__mro__[-2].k", "vars(Base).get('k', 0)", "getattr(o, 'z', 0)",
    ]
    CLASS_ACTIONS = [
        "Base.k = 5", "Base.k = 1.5", "Base.k = True", "Mid.k = 3", "Base.w = 7", "B.z = -1.0",
        "Base.z = 4.0",
        "if 'k' in vars(Mid):\n    del Mid.k", "if 'w' in vars(Base):\n    del Base.w",
        "if 'z' in vars(B):\n    del B.z", "Mid.z = 2", "Base.k = Base.k + 1",
    ]

    def fam_classes(self):
        pre = ["NAME = 'k'", "", "",
               "class Base:", "    k = 1", "", "    def __init__(self, v):", "        self.v = v", "", "",
               "class Mid(Base):", "    pass" if self.flag() else "    k = 2", "", "",
               "class B(Mid):", "    pass", "", "",
               "class C(Base):", "    z = 9"]
        acts = []
        for j in range(self.num(1, 3)):
            acts += ["", "", f"def change{j}():"] + indent(self.pick(self.CLASS_ACTIONS).split("\n"))
        pre += acts
        body = ["acc = o.v * 0"]
        for _ in range(self.num(1, 4)):
            r = self.pick(self.CLASS_READS)
            body.append(self.pick([f"acc = acc + t * ({r})", f"if ({r}) > 1:\n        acc = acc + 1",
                                   f"out.append({r})"]))
        body.append("return acc, out")
        n_acts = sum(1 for a in acts if a.startswith("def change"))
        calls = []
        for c in range(self.num(3, 5)):
            cls = self.pick(["B", "B", "C", "Mid"]) if c else "B"
            args = f"{cls}(torch.tensor({self.floats_lit(2)})), torch.tensor({self.floats_lit(2)}), []"
            if c and self.flag():
                calls.append(f"calls.append(Then(change{self.index(n_acts)}, {args}))")
            else:
                calls.append(f"calls.append(Call({args}))")
        return self.module(pre, ["o", "t", "out"], body, calls, imports=["", "from differential import Call, Then"])

    # -- floats that become nan, inf, -0.0, 1e20
    FLOAT_EXPRS = ["m * 0", "(m + 1.0) - m", "m - m", "(1 / m if m != 0 else 0.0)", "math.copysign(1, m)",
                   "str(m)", "m == m", "math.isnan(m)", "m > 0", "-m", "abs(m)", "m * 2 / 2", "max(m, 0.0)",
                   "type(m).__name__", "repr(m)", "m + 0.0", "(m * 0 == 0)", "math.isinf(m)", "m ** 2",
                   "(1.0 / m if m else -1.0)", "(m if m == m else 'nan')", "m + n", "n * m - m * n"]
    FLOAT_VALUES = ["1.0", "2.0", "0.5", "3.0", "1", "2", "0", "0.0", "-0.0", "float('nan')", "float('inf')",
                    "float('-inf')", "1e20", "-1e20", "1e308"]

    def fam_floats(self):
        body = ["out = []"]
        for _ in range(self.num(2, 5)):
            e = self.pick(self.FLOAT_EXPRS)
            body.append(self.pick([f"out.append({e})", f"out.append({e})",
                                   f"t = t + ({e})" if "str" not in e and "repr" not in e and "__name__" not in e
                                   else f"out.append({e})",
                                   f"out.append(sign(t * 0 + ({e})))" if not any(
                                       s in e for s in ("str", "repr", "__name__", "==", ">", "isnan", "isinf", "'nan'"))
                                   else f"out.append({e})"]))
        body.append(self.pick(["return t * m, out", "return t, out", "return out"]))
        calls = []
        first = self.pick(["1.0", "2.0", "0.5"])
        for c in range(self.num(3, 6)):
            m = first if c == 0 else self.pick(self.FLOAT_VALUES)
            calls.append(f"calls.append((torch.tensor({self.floats_lit(2)}), {m}, {self.pick(['1', '2', '1.0', '0'])}))")
        options = self.pick([None, {"dynamic": True}])
        # A NaN's sign bit is not specified by IEEE 754 (x86 makes inf * 0 a negative NaN).
        pre = ["def sign(z):", "    return torch.where(z.isnan(), 0.5, z.signbit().double())"]
        return self.module(pre, ["t", "m", "n"], body, calls, options=options)

    # -- optimizers stepped in the compiled function
    OPTIMIZERS = ["torch.optim.SGD(ps, lr=0.1, momentum=0.9{f})", "torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True{f})",
                  "torch.optim.Adam(ps, lr=0.05{f})", "torch.optim.Adam(ps, lr=0.05, amsgrad=True{f})",
                  "torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1{f})", "torch.optim.Adagrad(ps, lr=0.1{f})",
                  "torch.optim.SGD(ps, lr=0.1{f})"]

    def fam_optimizers(self):
        opt = self.pick(self.OPTIMIZERS).format(f=self.pick([", fused=True", ", foreach=True", ", foreach=False", ""]))
        grad = self.pick(["p.grad = p.detach() * 0.5 + t.sum() + i",
                          "p.grad = torch.ones_like(p) * (i + 1)",
                          "p.grad = (p * t.mean()).detach()"])
        body = [f"for i in range({self.num(1, 3)}):"]
        if self.flag():
            body += ["    loss = sum((p * t.mean()).sum() for p in ps)", "    opt.zero_grad()", "    loss.backward()"]
        else:
            body += ["    for p in ps:", f"        {grad}"]
        body += ["    opt.step()"]
        if self.flag():
            body += [f"    opt.zero_grad(set_to_none={self.pick(['True', 'False'])})"]
        # (|p| summed, not p: torch.optim's step under a compiler computes its bias
        # corrections in float32 tensors where eager uses Python floats, a few ulps per
        # parameter, which a sum of opposite signs would turn into a large relative error)
        body.append(self.pick(["return [p.detach().clone() for p in ps]", "return len(opt.state)",
                               "return ps[0].abs().sum().item()"]))
        calls = []
        for _ in range(self.num(2, 3)):
            n = self.num(1, 2)
            ps = ", ".join(f"torch.tensor({self.floats_lit(self.num(2, 4))}, requires_grad=True)" for _ in range(n))
            warm = self.flag()
            calls.append(f"ps = [{ps}]")
            calls.append(f"opt = {opt}")
            if warm:        # state made by an eager step first
                calls.append("for p in ps:\n        p.grad = torch.ones_like(p)\n    opt.step()")
            calls.append(f"calls.append((ps, opt, torch.tensor({self.floats_lit(2)})))")
        return self.module([], ["ps", "opt", "t"], body, calls)


FAMILIES = ["views", "layouts", "dict_keys", "classes", "floats", "optimizers"]


# What a program is drawn from: the general grammar, or a focused family (Focus.fam_*).
# Sixteen entries, so that the draw is uniform bits; the general grammar keeps the
# largest share, each family enough that a CI run draws each about a hundred times.
DRAWN = ["general"] * 5 + ["floats", "views", "layouts", "dict_keys", "classes"] * 2 + ["optimizers"]


@st.composite
def programs(draw, family=None):
    """A hypothesis strategy of generated Programs; `family` draws from one only."""
    g = Focus(draw)
    family = family or g.pick(DRAWN)
    program = g.program() if family == "general" else getattr(g, "fam_" + family)()
    program.family = family
    return program


# --------------------------------------------------------------------------- running
class Timeout(BaseException):
    """Not an Exception: the tracer's own `except Exception` must not swallow it."""


def _alarm(signum, frame):
    raise Timeout(f"program ran past {TIMEOUT_S} s")


def load(source):
    """Exec `source` into a fresh module; its text is registered for tracebacks."""
    mod = types.ModuleType("fuzz_program")
    mod.__file__ = FILENAME
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    sys.modules["fuzz_program"] = mod       # dataclasses look their module up
    try:
        exec(compile(source, FILENAME, "exec"), mod.__dict__)
    finally:
        sys.modules.pop("fuzz_program", None)
    return mod


def check_module(mod, backend="eager"):
    """`differential.check` of a program's module: its f over make_inputs(), compiled
    with its OPTIONS, called through its CALLER where it has one."""
    import frametrace
    from differential import check
    options = getattr(mod, "OPTIONS", {})
    caller = getattr(mod, "CALLER", None)
    if caller is None:
        return check(mod.f, mod.make_inputs(), backend=backend, globals=mod.GLOBALS, graphs=None, **options)
    fn = functools.wraps(mod.f)(lambda *args: caller(mod.f, *args))
    compiled = lambda counter: lambda *args: caller(frametrace.optimize(backend=counter, **options)(mod.f), *args)
    return check(fn, mod.make_inputs(), backend=backend, globals=mod.GLOBALS, graphs=None, compiled=compiled)


def run_program(program, backend="eager", timeout=TIMEOUT_S):
    """Compile and compare the program's f over its inputs; raises AssertionError (with
    the program's text) on a difference, an internal tracer error or a timeout."""
    import frametrace
    source = program.source if isinstance(program, Program) else program
    frametrace.reset()
    old = signal.signal(signal.SIGALRM, _alarm) if timeout else None
    if timeout:
        signal.alarm(timeout)
    try:
        mod = load(source)
        sys.modules["fuzz_program"] = mod
        return check_module(mod, backend)
    except (AssertionError, Timeout) as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n--- the program ---\n{source}") from e
    finally:
        if timeout:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        sys.modules.pop("fuzz_program", None)
        frametrace.reset()


# --------------------------------------------------------------------------- failure kinds
def failure_kind(message):
    """A short name for what went wrong, the same for the same kind of failure."""
    first = message.split("\n--- the program ---")[0]
    if first.startswith("Timeout"):
        return "timeout"
    m = re.search(r"reasons=\[(.*)\]\)", first, re.S)
    if "internal tracer errors" in first and m:
        internal = re.findall(r"internal error: (\w+): ([^'\"]*)", m.group(1))
        if internal:
            etype, msg = internal[0]
            return f"internal-{etype}-{_slug(msg)}"
        return "internal-error"
    m = re.search(r"call \d+ of \w+: (.*)", first)
    text = m.group(1) if m else first
    if text.startswith("CPython"):        # one side raised: name the exception and its message
        return _slug(text.replace("CPython ", "cpython-").replace(", compiled ", " compiled-"), 90)
    m = re.match(r"exception: (\w+)\((.*)\) != (\w+)\((.*)\)", text)
    if m:
        return _slug(f"exception {m.group(1)} compiled-{m.group(3)} {m.group(4)}", 90)
    where = re.match(r"(global \w+|[a-z ]+)", text)
    what = "values" if "values differ" in text else "type" if ": type " in text else \
        "length" if "length" in text else "keys" if "keys" in text else \
        "exception" if text.startswith("exception") else "value"
    return _slug(f"wrong {where.group(1) if where else 'result'} {what}")


def _slug(text, n=60):
    text = re.sub(r"\d+", "N", text)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:n].lower() or "unknown"


# --------------------------------------------------------------------------- reducing
def _statement_lists(tree):
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            seq = getattr(node, field, None)
            if isinstance(seq, list) and seq and isinstance(seq[0], (ast.stmt, ast.excepthandler)):
                yield node, field


def _candidates(source):
    """Programs one step smaller: a statement removed, or a compound statement
    replaced by its body."""
    tree = ast.parse(source)
    for node, field in list(_statement_lists(tree)):
        seq = getattr(node, field)
        for i in range(len(seq)):
            item = seq[i]
            replacements = [[]]
            if isinstance(item, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                replacements.append(item.body)
            if isinstance(item, ast.Try):
                replacements.append(item.body + item.finalbody)
            for rep in replacements:
                new = seq[:i] + rep + seq[i + 1:]
                if not new and field in ("body", "finalbody"):
                    new = [ast.Pass()] if field == "body" else []
                if not new and field == "handlers":
                    continue
                setattr(node, field, new)
                try:
                    yield ast.unparse(tree) + "\n"
                finally:
                    setattr(node, field, seq)


def reduce(source, kind, attempt):
    """Greedy statement-level reduction keeping the failure kind; `attempt(source)`
    returns the kind of the failure a source gives, or None."""
    changed = True
    while changed:
        changed = False
        for cand in _candidates(source):
            if len(cand) >= len(source):
                continue
            if attempt(cand) == kind:
                source, changed = cand, True
                break
    return source


# --------------------------------------------------------------------------- long runs
def _in_child(fn):
    """fn() in a forked child: returns (ok, text, report); a crash is a failure."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            rep = fn()
            out = {"ok": True, "graphs": rep.graphs, "breaks": rep.breaks,
                   "fallbacks": rep.fallbacks, "reasons": rep.reasons()}
        except AssertionError as e:
            out = {"ok": False, "msg": str(e)}
        except BaseException as e:      # noqa: BLE001 - report anything, in the child
            out = {"ok": False, "msg": f"harness error {type(e).__name__}: {e}"}
        with os.fdopen(w, "w") as f:
            json.dump(out, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return False, f"crash: child exited with status {status}", None
    out = json.loads(data)
    return out["ok"], out.get("msg", ""), out


def attempt(source, fork=True):
    """(kind of failure or None, the report's counts of a passing run)."""
    try:
        compile(source, FILENAME, "exec")
    except SyntaxError:
        return None, None
    if fork:
        ok, msg, rep = _in_child(lambda: run_program(source))
    else:
        try:
            r = run_program(source)
            ok, msg, rep = True, "", {"graphs": r.graphs, "breaks": r.breaks,
                                      "fallbacks": r.fallbacks, "reasons": r.reasons()}
        except AssertionError as e:
            ok, msg, rep = False, str(e), None
        except Exception as e:          # noqa: BLE001 - a program the reducer broke
            ok, msg, rep = False, f"harness error {type(e).__name__}: {e}", None
    if ok:
        return None, rep
    if msg.startswith("crash"):
        return "crash", None
    return ("harness-error" if msg.startswith("harness error") else failure_kind(msg)), None


def attempt_kind(source, fork=True):
    return attempt(source, fork)[0]


WARMUP = """\
import torch


class Out:
    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)


def f(t0, xs, d, n, out):
    for u in xs:
        if u.sum() > 0:
            t0 = t0 + u * n
        print(n, file=out)
    d["a"] = t0.relu()
    return t0.sum().item(), [t0 * 2 for t0 in xs], len(d)


def make_inputs():
    return [(torch.ones(k), [torch.ones(k), -torch.ones(k)], {}, k, Out()) for k in (2, 3, 4)]


GLOBALS = ()
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="fuzz-failures", help="folder for failing programs")
    ap.add_argument("--reduce", metavar="FILE", help="shrink one failing program and print it")
    ap.add_argument("--reduce-all", action="store_true", help="after the run, shrink one program per kind")
    ap.add_argument("--no-fork", action="store_true")
    ap.add_argument("--checkout", help="the checkout whose frametrace to test (default: this one)")
    ap.add_argument("--family", choices=["general"] + FAMILIES, help="draw programs of one family only")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.checkout or os.path.dirname(HERE))
    import torch
    torch.set_num_threads(1)
    fork = not args.no_fork
    if args.reduce:
        source = strip_main(open(args.reduce).read())
        kind = attempt_kind(source, fork)
        print(f"# kind: {kind}", file=sys.stderr)
        if kind:
            source = reduce(source, kind, lambda s: attempt_kind(s, fork))
            print(source)
        return 0
    from hypothesis import HealthCheck, Phase, given, seed, settings
    if fork:            # the children start warm: torch and frametrace load lazily, and slowly
        attempt(WARMUP, fork=False)
    os.makedirs(args.out, exist_ok=True)
    kinds: dict[str, list[str]] = {}
    count = [0]
    seen = collections.Counter()            # what the passing programs compiled

    @seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(programs(args.family))
    def fuzz(program):
        count[0] += 1
        n = count[0]
        kind, rep = attempt(program.source, fork)
        if kind is None:
            seen["passed"] += 1
            seen["compiled a graph"] += rep["graphs"] > 0
            seen["fell back somewhere"] += rep["fallbacks"] > 0
            seen["graph breaks"] += rep["breaks"]
            for reason in rep["reasons"]:
                seen["reason: " + re.sub(r"\(.*|\[.*", "", reason)[:70]] += 1
            if not args.quiet:
                print(f"{n:5d} ok", flush=True)
            return
        folder = os.path.join(args.out, kind)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{args.seed}-{n:05d}.py")
        with open(path, "w") as f:
            f.write(program.script())
        kinds.setdefault(kind, []).append(path)
        print(f"{n:5d} FAIL {kind}  ({path})", flush=True)

    fuzz()
    print(f"\n{count[0]} programs, {sum(map(len, kinds.values()))} failures, {len(kinds)} kinds:")
    for kind, paths in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(paths):5d}  {kind}  e.g. {paths[0]}")
    print("passing programs:")
    for what, k in seen.most_common(25):
        print(f"  {k:5d}  {what}")
    if args.reduce_all:
        for kind, paths in kinds.items():
            smallest = min(paths, key=os.path.getsize)
            source = reduce(strip_main(open(smallest).read()), kind, lambda s: attempt_kind(s, fork))
            path = os.path.join(args.out, kind, "reduced.py")
            with open(path, "w") as f:
                f.write(Program(source).script())
            print(f"reduced {kind}: {path}")
    return 0


def strip_main(source):
    return source.split('\nif __name__ == "__main__":')[0].rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
