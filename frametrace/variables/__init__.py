"""Values of the symbolic interpreter ("variables"): what a stack slot or local holds
while tracing.  `builder.wrap` turns a real value from the frame into one, adding the
guards it needs."""
from .base import NULL, Var, unsupported
from .constant import ConstVar, MethodVar
from .containers import DictVar, IteratorVar, ListVar, TupleVar
from .modules import NNModuleVar
from .builtins import BuiltinVar
from .objects import ObjectVar, TorchFnVar
from .tensor import TensorVar
# (the implementations of base's entry points, which register themselves)
from . import builder, construction, exceptions, operators  # noqa: F401

__all__ = ["NULL", "Var", "unsupported", "ConstVar", "DictVar", "IteratorVar", "ListVar",
           "TupleVar", "BuiltinVar", "MethodVar", "NNModuleVar", "ObjectVar", "TorchFnVar",
           "TensorVar"]
