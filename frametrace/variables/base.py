"""The Var protocol: every operation the interpreter can ask of a value."""
from __future__ import annotations

from ..exc import Unsupported  # noqa: F401  (re-exported for variables)


def unsupported(reason: str, hint: str | None = None):
    """Stop tracing: this frame (or, with fullgraph, the user) gets `reason`, said in
    the user's words (a Var in an f-string reads as its `noun()`), and `hint`: what the
    user can change, where there is something."""
    raise Unsupported(reason, hint=hint)


def safe_repr(obj) -> str:
    """repr() of a program's object for a message: a user __repr__ may fail (a
    half-built dataclass) or be slow, and a message must never raise."""
    try:
        text = repr(obj)
    except Exception:
        return f"<{type(obj).__qualname__} object>"
    return text if len(text) <= 200 else text[:197] + "..."


def a_type(cls) -> str:
    """"a float", "an int", "a Logger object": a value of `cls`, for a message."""
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "value")
    if getattr(cls, "__module__", None) != "builtins":
        name += " object"
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def nouns(values) -> str:
    """Traced values listed for a message, each as its `noun()`."""
    return ", ".join(map(str, values)) or "nothing"


def short_repr(obj, limit: int = 60) -> str:
    text = safe_repr(obj)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# Entry points of the protocol that modules above base implement, so that the Var
# modules under them reach other kinds without importing them:
#   builder      wrap (the rules that pick a Var for a value, type by type, import
#                every Var module)
#   operators    binary_op, unary_op, is_same, contains (an operator on Vars tries each
#                operand kind's rule)
#   exceptions   raise_builtin, raise_folded (a traced exception is an object of a
#                user-level class)
#   builtins     iter_of, var_iter, var_list, sorted_list (iteration: iter(), the items
#                of an iterable, sorted()); set_key (hashing: what stands for a value
#                among a set's members or a dict's keys, by value or identity)
#   user_objects namedtuple_member (a method a NamedTuple class body wrote is a user
#                function)
#   objects      object_var (a Python object used as is: the kind all others fall
#                back to)
#   contexts     call_in_grad_mode (a function called under a grad mode it sets)
#   construction construct (calling a class: its instance may be of any kind)
#   subclasses   fromkeys_var, call_unbound_builtin, base_container_method (a builtin
#                container's methods reached through its class, or through super() on
#                a user subclass)
# Each implementation registers itself (`@register`) when its module loads, which
# variables/__init__ makes happen with the package.
def registrar(table: dict):
    """A decorator factory that registers the decorated rule in `table` under each of
    the callables it is given (a callable is registered once):

        call_rule = registrar(_CALL_RULES)

        @call_rule(len)
        def _len(tx, args, kwargs): ...
    """
    def rule_for(*fns):
        def register_rule(rule):
            for fn in fns:
                assert fn not in table, fn
                table[fn] = rule
            return rule
        return register_rule
    return rule_for


def register(fn):
    """Make `fn` the implementation of the entry point of its name."""
    assert fn.__name__ in _ENTRY_POINTS, fn
    globals()["_" + fn.__name__] = fn
    return fn


_ENTRY_POINTS = ("wrap", "binary_op", "unary_op", "is_same", "contains", "raise_builtin",
                 "raise_folded", "iter_of", "var_iter", "var_list", "sorted_list", "set_key",
                 "namedtuple_member", "object_var", "call_in_grad_mode", "construct",
                 "fromkeys_var", "call_unbound_builtin", "base_container_method")
_wrap = _binary_op = _unary_op = _is_same = _contains = _raise_builtin = _raise_folded = None
_iter_of = _var_iter = _var_list = _sorted_list = _set_key = _namedtuple_member = None
_object_var = _call_in_grad_mode = _construct = None
_fromkeys_var = _call_unbound_builtin = _base_container_method = None


def wrap(tx, value, source, guard: bool = True):
    """Make a Var for `value`, read from `source` (builder.wrap)."""
    return _wrap(tx, value, source, guard)


def binary_op(tx, fn, a, b):
    """`fn(a, b)` for an operator function of two Vars (operators.binary_op)."""
    return _binary_op(tx, fn, a, b)


def unary_op(tx, fn, v):
    """`fn(v)` for an operator function of one Var (operators.unary_op)."""
    return _unary_op(tx, fn, v)


def is_same(a, b, tx=None) -> bool:
    """`a is b` (operators.is_same)."""
    return _is_same(a, b, tx)


def contains(tx, container, item) -> bool:
    """`item in container` (operators.contains)."""
    return _contains(tx, container, item)


def raise_builtin(cls, *args):
    """The traced program raises `cls(*args)` here (exceptions.raise_builtin)."""
    _raise_builtin(cls, *args)


def raise_folded(e: Exception, what: str):
    """A builtin run now on constants raised `e` (exceptions.raise_folded)."""
    _raise_folded(e, what)


def iter_of(tx, v):
    """iter(v) (builtins.iter_of)."""
    return _iter_of(tx, v)


def var_list(tx, v) -> list:
    """All items of an iterable Var (builtins.var_list)."""
    return _var_list(tx, v)


def var_iter(tx, v):
    """A Python iterator over the Vars iterating over `v` gives (builtins.var_iter)."""
    return _var_iter(tx, v)


def sorted_list(tx, args, kwargs):
    """sorted(*args, **kwargs) as a ListVar, None where the call is not one sorted()
    takes (builtins.sorted_list)."""
    return _sorted_list(tx, args, kwargs)


def set_key(v):
    """What stands for `v` among a set's members (builtins.set_key)."""
    return _set_key(v)


def namedtuple_member(tx, var, name):
    """A member a NamedTuple class body wrote in Python, read on `var`, else None
    (user_objects.namedtuple_member)."""
    return _namedtuple_member(tx, var, name)


def object_var(value, source=None):
    """The Var of a Python object used as-is (objects.object_var: an ObjectVar)."""
    return _object_var(value, source)


def construct(tx, cls, args, kwargs):
    """The Var of `cls(*args, **kwargs)`, None where calling the class is not traced
    (construction.construct)."""
    return _construct(tx, cls, args, kwargs)


def fromkeys_var(tx, cls):
    """The Var of ``cls.fromkeys`` when it is the builtin dict's, else None
    (subclasses.fromkeys_var)."""
    return _fromkeys_var(tx, cls)


def call_unbound_builtin(tx, method, args, kwargs):
    """``list.append(l, x)`` and the like on a traced container, else None
    (subclasses.call_unbound_builtin)."""
    return _call_unbound_builtin(tx, method, args, kwargs)


def base_container_method(obj, klass, name, attr):
    """``super().name`` on `obj` found as `attr` on the builtin container `klass`: the
    Var of the base's method bound to a user subclass's instance, else None
    (subclasses.base_container_method)."""
    return _base_container_method(obj, klass, name, attr)


def call_in_grad_mode(tx, mode: bool, fn, args, kwargs):
    """Call the function Var `fn` with grad mode set to `mode`, restored after
    (contexts.call_in_grad_mode)."""
    return _call_in_grad_mode(tx, mode, fn, args, kwargs)


class _Null:
    """The NULL that CPython's call protocol pushes below a callable."""
    __slots__ = ()

    def __repr__(self):
        return "NULL"


NULL = _Null()


class Var:
    """A traced value.  `source` says where it came from in the frame, if anywhere;
    values made while tracing have none."""
    __slots__ = ("source",)

    def __init__(self, source=None):
        self.source = source

    # -- what it is --
    def python_type(self) -> type:
        unsupported(f"type of {self}")

    def is_const(self) -> bool:
        return False

    def as_const(self):
        unsupported(f"{self} is not a Python constant")

    # -- operations, each raising Unsupported by default --
    def getattr(self, tx, name: str) -> Var:
        unsupported(f"attribute {name!r} of {self}")

    def call(self, tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
        unsupported(f"calling {self}")

    def call_method(self, tx, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def setattr(self, tx, name: str, value: Var) -> None:
        unsupported(f"setting attribute {name!r} on {self}")

    def getitem(self, tx, key: Var) -> Var:
        unsupported(f"indexing {self}")

    def setitem(self, tx, key: Var, value: Var) -> None:
        unsupported(f"item assignment on {self}")

    def unpack(self, tx) -> list[Var]:
        unsupported(f"iterating over {self}")

    def truth(self, tx) -> bool:
        unsupported(f"truth value of {self}")

    def length(self, tx) -> int:
        return len(self.unpack(tx))

    # -- optional parts of the protocol, with the answer of kinds that lack them --
    def value_key(self):
        """What stands for this value among a set's members or a dict's keys when it
        hashes by value (a user object of a frozen dataclass), else None (by identity)."""
        return None

    def mapping_items(self, tx):
        """The items `dict.update(d, v)` and ``**v`` take from a user mapping: a dict
        of them, else None (not a mapping: an iterable of pairs, or unsupported)."""
        return None

    # Methods that only some kinds have, None on the others (the caller then tries
    # another way, or stops):
    #   contains(tx, item) -> bool      `item in v`, answered by the kind itself
    #   _dunder(tx, name, args) -> Var  a user class's own special method, traced
    #   delitem(tx, key)                `del v[key]`
    #   delattr(tx, name)               `del v.name`
    contains = _dunder = delitem = delattr = None
    # A context manager's (variables/contexts.py; ExitVar calls the last two):
    #   enter(tx) -> Var                `with v:` entered (the kind also has exit(tx))
    #   exit_with(tx, args) -> Var      __exit__ given the exception (else exit(tx))
    #   reconstruct_exit(cg)            pushes its __exit__ in a resumed frame
    enter = exit_with = reconstruct_exit = None
    # An exception's (variables/exceptions.py):
    #   str_of(tx, kind) -> Var         str(v) or repr(v), as `kind` says
    #   builtin_init() -> Var           BaseException.__init__ bound to it (super())
    str_of = builtin_init = None

    def reconstruct(self, cg) -> None:
        """Emit bytecode that pushes this value in the transformed frame."""
        if self.source is None:
            unsupported(f"returning {self} from a compiled frame")
        self.source.reconstruct(cg)

    def noun(self) -> str:
        """This value as the user would name it in a message ("the tensor x",
        "a float computed outside the graph"), never as the tracer's class: reasons
        put Vars in f-strings, which read this through __str__ (repr stays ours)."""
        try:
            return a_type(self.python_type())
        except Exception:
            return "a value"

    def __str__(self):
        try:
            return self.noun()
        except Exception:
            return "a value"

    def __repr__(self):
        return f"{type(self).__name__}()"


class ValueVar(Var):
    """A Var standing for one real Python object, held in `value`."""
    __slots__ = ("value",)

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def noun(self):
        return a_type(type(self.value))


class _Deleted(Var):
    """What a deleted attribute holds in the side effects: replayed as a delete."""
    __slots__ = ()

    def reconstruct(self, cg):
        cg.load_const(None)


DELETED = _Deleted(None)
