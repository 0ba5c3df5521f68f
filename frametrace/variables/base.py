"""The Var protocol: every operation the interpreter can ask of a value."""
from __future__ import annotations

from ..exc import Unsupported  # noqa: F401  (re-exported for variables)


def unsupported(reason: str):
    """Stop tracing: this frame (or, with fullgraph, the user) gets `reason`."""
    raise Unsupported(reason)


def safe_repr(obj) -> str:
    """repr() of a program's object for a message: a user __repr__ may fail (a
    half-built dataclass) or be slow, and a message must never raise."""
    try:
        text = repr(obj)
    except Exception:
        return f"<{type(obj).__qualname__} object>"
    return text if len(text) <= 200 else text[:197] + "..."


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

    def reconstruct(self, cg) -> None:
        """Emit bytecode that pushes this value in the transformed frame."""
        if self.source is None:
            unsupported(f"returning {self} from a compiled frame")
        self.source.reconstruct(cg)

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


class CollectionVar(Var):
    """A Var holding traced items (tuple, list, dict)."""
    __slots__ = ("items",)

    def getattr(self, tx, name):
        if callable(getattr(self.python_type(), name, None)):
            from .objects import MethodVar
            return MethodVar(self, name)
        unsupported(f"attribute {name!r} of {self.python_type().__name__}")

    def length(self, tx):
        return len(self.items)

    def truth(self, tx):
        return bool(self.items)
