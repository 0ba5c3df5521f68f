"""Exceptions raised and caught inside a trace.

An exception object made while tracing is an `ExceptionVar` (its class, `args`, the
chaining attributes and its own attributes).  Raising one, by a `raise` or by a builtin
the trace runs (a missing dict key, an exhausted iterator), raises `TracedRaise` in the
tracer: the interpreter unwinds to the frame's handler as CPython's exception table
says, or passes it to the calling frame.  One that leaves the frame being compiled is an
`Unsupported` like any other: the graph breaks at the instruction that raised it and
CPython raises it there, so the user sees CPython's exception and traceback.
"""
from __future__ import annotations

import types

from ..exc import Unsupported
from .attributes import InstanceAttrs, MISSING
from .base import Var, iter_of, register, safe_repr, unsupported
from .constant import ConstVar
from .classes import class_attr
from .opaque import OpaqueVar
from .user_objects import NewObjectVar
from .iterators import drain
from .containers import TupleVar, attrs_dict
from .functions import UserFunctionVar


class _Unknown:
    """The exception being handled when the compiled frame was entered (its caller's):
    the trace does not know it, so nothing may depend on it."""
    __slots__ = ()

    def noun(self):
        return "the exception being handled by the caller"

    def __repr__(self):
        return "<the caller's exception>"


UNKNOWN = _Unknown()


class TracedRaise(Unsupported):
    """The traced program raised `exc` (an ExceptionVar).  Caught by the interpreter
    loop; as an Unsupported, any code that cannot handle it stops the trace."""

    def __init__(self, exc, fresh=True):
        # exc: an ExceptionVar, or (re-raised in a resume frame's handler) the OpaqueVar
        # of an exception CPython raised
        described = exc.describe() if isinstance(exc, ExceptionVar) else ""
        super().__init__(f"{exception_type(exc).__name__} raised{described}")
        self.exc = exc
        # A new raise (not a re-raise): the interpreter chains it to the exception
        # being handled (see chain) where it catches it.
        self.fresh = fresh


def exception_type(exc) -> type:
    return exc.cls if isinstance(exc, ExceptionVar) else exc.kind


def builtin_base(cls) -> type:
    """The first class in cls's MRO that is implemented in C (its fields' layout)."""
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) == "builtins":
            return klass
    return BaseException


# Attributes of BaseException the trace keeps itself.
_BASE_FIELDS = {name: BaseException.__dict__[name] for name in (
    "args", "__cause__", "__context__", "__suppress_context__", "__traceback__",
    "with_traceback", "add_note")}


class ExceptionVar(NewObjectVar):
    """An exception instance made while tracing.  `context` may be UNKNOWN (it was raised
    while the frame's caller was handling an exception)."""
    # root_origin: the instruction of the compiled frame it was raised from (a break there)
    __slots__ = ("exc_args", "cause", "context", "suppress", "root_origin")

    def __init__(self, cls, args, attrs=None):
        super().__init__(cls, attrs)
        self.exc_args = list(args)
        self.cause = ConstVar(None)
        self.context = ConstVar(None)
        self.suppress = False
        self.root_origin = None

    def describe(self) -> str:
        if all(a.is_const() for a in self.exc_args):
            return f": {safe_repr(tuple(a.as_const() for a in self.exc_args))}"
        return ""

    def getattr(self, tx, name):
        if name in _BASE_FIELDS and class_attr(tx, self.cls, name) is not _BASE_FIELDS[name]:
            return super().getattr(tx, name)            # a class of the user's redefines it
        if name == "args":
            return TupleVar(list(self.exc_args))
        if name == "__cause__":
            return self.cause
        if name == "__context__":
            if self.context is UNKNOWN:
                unsupported("__context__ of an exception raised while the caller handled another")
            return self.context
        if name == "__suppress_context__":
            return ConstVar(self.suppress)
        if name == "with_traceback":
            return _WithTracebackVar(self)
        if name in ("__traceback__", "add_note", "__notes__"):
            unsupported(f"{name} of a traced exception")
        attr = class_attr(tx, self.cls, name)
        if isinstance(attr, (types.GetSetDescriptorType, types.MemberDescriptorType)) and \
                name not in self.attrs:
            return self._builtin_field(name)
        return super().getattr(tx, name)

    def _builtin_field(self, name):
        """A field a builtin exception class computes from its arguments
        (StopIteration.value, OSError.errno, ...): read on a real instance."""
        if not all(a.is_const() for a in self.exc_args):
            unsupported(f"{self.cls.__name__}.{name} of non-constant arguments")
        real = self.real_builtin()
        value = getattr(real, name)
        if value is None or isinstance(value, (bool, int, float, str, tuple)):
            if len(self.exc_args) == 1 and value is self.exc_args[0].as_const():
                return self.exc_args[0]
            return ConstVar(value)
        unsupported(f"{self.cls.__name__}.{name}")

    def real_builtin(self):
        base = builtin_base(self.cls)
        try:
            return base(*(a.as_const() for a in self.exc_args))
        except Exception as e:
            unsupported(f"{base.__name__}{self.describe()} raised {type(e).__name__}")

    def setattr(self, tx, name, value):
        if name == "__cause__":
            self.cause = _exception_or_none(tx, value, "exception cause")
            self.suppress = True
        elif name == "__context__":
            self.context = _exception_or_none(tx, value, "exception context")
        elif name == "__suppress_context__":
            self.suppress = value.truth(tx)
        elif name == "args":
            self.exc_args = value.unpack(tx)
        elif name == "__traceback__":
            unsupported("setting __traceback__ of a traced exception")
        elif isinstance(class_attr(tx, self.cls, "__setattr__"), types.FunctionType):
            super().setattr(tx, name, value)
        else:
            self.generic_setattr(tx, name, value)      # BaseException's is the generic one

    def str_of(self, tx, kind):
        """str(exc) or repr(exc)."""
        method = class_attr(tx, self.cls, "__str__" if kind is str else "__repr__")
        if isinstance(method, types.FunctionType):
            return UserFunctionVar(method).call(tx, [self], {})
        if not all(a.is_const() for a in self.exc_args):
            unsupported(f"{kind.__name__}() of {self}")
        real = self.real_builtin()
        text = kind(real)
        if kind is repr and builtin_base(self.cls) is not self.cls:
            text = self.cls.__name__ + text[len(type(real).__name__):]
        return ConstVar(text)

    def format_of(self, tx):
        """format(exc, ""): object.__format__ gives str(exc)."""
        if class_attr(tx, self.cls, "__format__") is not object.__format__:
            unsupported(f"format() of {self}")
        return self.str_of(tx, str)

    def builtin_init(self):
        """BaseException.__init__ (and a builtin subclass's) bound to this exception:
        what super().__init__(...) reaches from a user exception's __init__."""
        return _BuiltinInitVar(self)

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        if self.context is UNKNOWN:
            unsupported("an exception raised while the caller handled another, leaving the frame")
        cg.call_const(rebuild_exception, [
            lambda cg: cg.load_const(self.cls),
            lambda cg: TupleVar(list(self.exc_args)).reconstruct(cg),
            attrs_dict(self.attrs),
            lambda cg: self.cause.reconstruct(cg),
            lambda cg: self.context.reconstruct(cg),
            lambda cg: cg.load_const(self.suppress)])
        cg.keep_rebuilt(self)

    def noun(self):
        return f"{self.cls.__qualname__}{self.describe()}"

    def __repr__(self):
        return f"ExceptionVar({self.cls.__name__}{self.describe()})"


def rebuild_exception(cls, args, attrs, cause, context, suppress):
    """The exception a trace made, without running a user __init__ again (its effects
    were traced): the builtin part is set up from `args` as its own __init__ would."""
    exc = cls.__new__(cls, *args)
    builtin_base(cls).__init__(exc, *args)
    for name, value in attrs.items():
        object.__setattr__(exc, name, value)
    exc.__cause__ = cause
    exc.__context__ = context
    exc.__suppress_context__ = suppress
    return exc


class _BuiltinInitVar(Var):
    __slots__ = ("exc",)

    def __init__(self, exc):
        super().__init__(None)
        self.exc = exc

    def call(self, tx, args, kwargs):
        if kwargs:
            unsupported(f"{self.exc.cls.__name__}.__init__ with keywords")
        self.exc.exc_args = list(args)
        return ConstVar(None)


def _exception_or_none(tx, value, what):
    if isinstance(value, ExceptionVar):
        return value
    if isinstance(value, ConstVar) and value.value is None:
        return value
    unsupported(f"{what} {value} is not an exception")


def is_exception_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


# Builtin exception classes whose constructor does more than store its arguments
# (OSError picks a subclass by errno; the Unicode errors check their arguments).
_SPECIAL_BUILTINS = (OSError, UnicodeError, SystemExit, KeyboardInterrupt, GeneratorExit,
                     BaseExceptionGroup)


def construct_exception(tx, cls, args, kwargs) -> ExceptionVar:
    """Calling an exception class while tracing: BaseException.__new__ keeps the
    arguments; a user __init__ is inlined (its super().__init__ sets `args` again)."""
    if issubclass(cls, _SPECIAL_BUILTINS):
        unsupported(f"creating a {cls.__name__} while tracing")
    new = class_attr(tx, cls, "__new__")
    if isinstance(new, (staticmethod, types.FunctionType)):
        unsupported(f"{cls.__name__} defines __new__")
    if type(cls) is not type and type(cls).__module__ not in ("abc",):
        unsupported(f"class {cls.__name__} has metaclass {type(cls).__name__}")
    exc = ExceptionVar(cls, args)
    init = class_attr(tx, cls, "__init__")
    if isinstance(init, types.FunctionType):
        UserFunctionVar(init).call(tx, [exc, *args], kwargs)
    elif kwargs:
        unsupported(f"{cls.__name__}() with keyword arguments")
    # (The other builtin __init__s store positional arguments of any number and kind.)
    return exc


def throw(exc: ExceptionVar):
    """Raise `exc` in the traced program."""
    raise TracedRaise(exc)


def chain(root, exc: ExceptionVar):
    """What CPython's raise does with the exception being handled: it becomes the new
    one's __context__ (a raise while none is handled leaves __context__ alone)."""
    handled = root.exc_handled
    if handled is UNKNOWN:
        exc.context = UNKNOWN
    elif isinstance(handled, ConstVar) and handled.value is None or handled is exc:
        pass
    elif not isinstance(handled, ExceptionVar):
        exc.context = UNKNOWN           # a real exception from CPython (a resume frame's)
    else:
        # Break a cycle exc -> ... -> exc, as CPython does.
        link = handled
        while isinstance(link, ExceptionVar):
            if link.context is exc:
                link.context = ConstVar(None)
                break
            link = link.context
        exc.context = handled


@register
def raise_builtin(cls, *args):
    """A builtin the trace runs raises `cls(*args)` (constant arguments)."""
    throw(ExceptionVar(cls, [ConstVar(a) for a in args]))


# Exceptions of builtins run on constants at trace time that the trace raises as they
# are: their arguments are the message (and, for KeyError, the key).
_FOLDED = (ValueError, TypeError, ZeroDivisionError, OverflowError, KeyError, IndexError,
           AttributeError)


@register
def raise_folded(e: Exception, what: str):
    """A builtin evaluated now on constants raised `e`: CPython raises it at this
    point too.  Unsupported for exceptions with state beyond constant arguments."""
    if type(e) in _FOLDED and all(type(a) in (str, int, float, bool, type(None)) for a in e.args) \
            and e.__cause__ is None and not getattr(e, "__notes__", None):
        throw(ExceptionVar(type(e), [ConstVar(a) for a in e.args]))
    unsupported(f"{what} raised {type(e).__name__}: {e}")


def matches(exc, classes) -> bool:
    """`except classes:` catches `exc`: a class or a tuple of classes."""
    # An exception CPython raised (given to a resume frame's handler) has a known type.
    cls = exc.cls if isinstance(exc, ExceptionVar) else exc.python_type()
    if isinstance(classes, tuple):
        flat = []
        for c in classes:
            flat.extend(c if isinstance(c, tuple) else (c,))
        classes = tuple(flat)
        bad = [c for c in classes if not is_exception_class(c)]
    else:
        bad = [] if is_exception_class(classes) else [classes]
    if bad:
        unsupported(f"except clause with {bad[0]!r}, which is not an exception class")
    return issubclass(cls, classes)


def caught(r: TracedRaise, classes) -> bool:
    """Whether a builtin that catches `classes` (hasattr: AttributeError) catches `r`."""
    return isinstance(r, TracedRaise) and issubclass(exception_type(r.exc), classes)


class _WithTracebackVar(Var):
    """``exc.with_traceback``: a traced exception carries no traceback of its own (one
    is made when CPython raises it), so setting None, or the traceback it was caught
    with, leaves nothing to change; it returns the exception."""
    __slots__ = ("exc",)

    def __init__(self, exc):
        super().__init__(None)
        self.exc = exc

    def call(self, tx, args, kwargs):
        if len(args) == 1 and not kwargs and (isinstance(args[0], TracebackVar) or
                                              isinstance(args[0], ConstVar) and args[0].value is None):
            return self.exc
        unsupported("with_traceback of a traced exception with another traceback")


class TracebackVar(Var):
    """The traceback WITH_EXCEPT_START passes to __exit__: not traced."""
    __slots__ = ()

    def noun(self):
        return "a traceback"

    def __repr__(self):
        return "TracebackVar()"


def exception_of(tx, v: Var) -> ExceptionVar:
    """What `raise v` raises: an instance, or an instance made by calling a class."""
    if isinstance(v, ExceptionVar):
        return v
    value = getattr(v, "value", MISSING)
    if is_exception_class(value):
        made = v.call(tx, [], {})
        if isinstance(made, ExceptionVar):
            return made
    unsupported(f"raise {v}")


# --------------------------------------------------------------------------- iterators
def _python_dunder(tx, v, name):
    """A user object's class's `name` when it is a Python function, else None."""
    if not isinstance(v, InstanceAttrs):
        return None
    method = class_attr(tx, v.instance_class(), name)
    return method if isinstance(method, types.FunctionType) else None


def user_iterator(tx, v):
    """iter(v) for an iterator of a user class (Python __iter__ and __next__): the items
    __next__ gives until it raises StopIteration, called one at a time as a loop asks
    (None if `v` is no such object: other iterables are unpacked as before)."""
    if _python_dunder(tx, v, "__iter__") is None or _python_dunder(tx, v, "__next__") is None:
        return None
    it = UserFunctionVar(_python_dunder(tx, v, "__iter__")).call(tx, [v], {})
    if _python_dunder(tx, it, "__next__") is None:
        return drain(iter_of(tx, it))
    return _next_items(tx, it)


def _next_items(tx, it):
    while True:
        try:
            item = UserFunctionVar(_python_dunder(tx, it, "__next__")).call(tx, [it], {})
        except TracedRaise as r:
            if issubclass(exception_type(r.exc), StopIteration):
                return
            raise
        yield item


def user_next(tx, it, default):
    """next(it[, default]) on an object of a user class with a Python __next__."""
    method = _python_dunder(tx, it, "__next__")
    if method is None:
        unsupported(f"next() of {it}, which is not an iterator")
    try:
        return UserFunctionVar(method).call(tx, [it], {})
    except TracedRaise as r:
        if default is not None and issubclass(exception_type(r.exc), StopIteration):
            return default
        raise


def is_exception(v) -> bool:
    """An exception the trace made, or one CPython raised (a resume frame's handler
    gets it as data)."""
    return isinstance(v, ExceptionVar) or (
        isinstance(v, OpaqueVar) and v.base is None and issubclass(v.kind, BaseException))


class CallerExceptionVar(Var):
    """The exception the caller was handling, saved on the stack by PUSH_EXC_INFO."""
    __slots__ = ()
