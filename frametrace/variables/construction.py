"""Calling a class while tracing: which kind of Var the instance is (an exception, a
context manager, a dataclass, a namedtuple, a module, a container subclass, an object
of a user's class) and how it is made.  An entry point of base (`construct`): objects'
ObjectVar calls it for a class, and it reaches the kinds above objects from here."""
from __future__ import annotations

import dataclasses
import functools
import sys

import torch

from .autograd_function import construct_function_instance
from .base import register, unsupported
from .constant import ConstVar, is_constant_value
from .containers import NamedTupleVar
from .contexts import context_class
from .exceptions import construct_exception
from .functions import PartialVar, in_inlined_torch_package
from .modules import construct_module
from .subclasses import construct_container_subclass, container_base
from .tensor import new_parameter
from .user_objects import construct_user_object, make_dataclass_instance


@register
def construct(tx, cls, args, kwargs):
    """Calling a class while tracing: the Var of what it makes, else None."""
    if issubclass(cls, BaseException):
        return construct_exception(tx, cls, args, kwargs)
    made = context_class(tx, cls, args, kwargs)
    if made is not None:
        return made
    if cls is functools.partial and args:
        return PartialVar(args[0], args[1:], kwargs)
    if dataclasses.is_dataclass(cls):
        if container_base(cls) is not None:
            # a dict (list ...) that is a dataclass: its __init__, generated or not, and
            # the __post_init__ that calls run on the container
            return construct_container_subclass(tx, cls, args, kwargs)
        return make_dataclass_instance(tx, cls, args, kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        names = list(cls._fields)
        maker = next((k for k in cls.__mro__ if "__new__" in k.__dict__), None)
        if maker is None or "_make" not in maker.__dict__ or cls.__init__ is not object.__init__:
            # (a subclass's own __new__ or __init__ would run: made here, it would not)
            unsupported(f"{cls.__name__}() with a __new__ or __init__ of its own")
        if len(args) > len(names) or set(kwargs) - set(names[len(args):]):
            unsupported(f"{cls.__name__}() with unexpected arguments (TypeError)")
        # The defaults are those of its __new__ (what the call uses; _field_defaults
        # only reports them), when they are constants.
        defaults = getattr(getattr(cls, "__new__", None), "__defaults__", None) or ()
        defaults = dict(zip(names[len(names) - len(defaults):], defaults))
        values = list(args)
        for n in names[len(args):]:
            if n in kwargs:
                values.append(kwargs[n])
            elif n in defaults and is_constant_value(defaults[n]):
                values.append(ConstVar(defaults[n]))
            else:
                unsupported(f"{cls.__name__}() with missing fields")
        return NamedTupleVar(values, names, cls=cls)
    if cls is torch.nn.Parameter:
        return new_parameter(tx, args, kwargs)
    if issubclass(cls, torch.autograd.Function) and cls is not torch.autograd.Function:
        made = construct_function_instance(tx, cls, args, kwargs)
        if made is not None:
            return made
    if issubclass(cls, torch.nn.Module):
        return construct_module(tx, cls, args, kwargs)
    module = getattr(cls, "__module__", "") or ""
    if container_base(cls) is not None and not module.startswith("torch"):
        return construct_container_subclass(tx, cls, args, kwargs)
    if (in_inlined_torch_package(module) or not module.startswith(("torch", "builtins"))) and \
            not issubclass(cls, torch.nn.Module) and \
            (module.split(".")[0] not in sys.stdlib_module_names or _plain_python_class(cls)):
        return construct_user_object(tx, cls, args, kwargs)
    return None


def _plain_python_class(cls) -> bool:
    """A standard-library class written wholly in Python over `object` (unittest's
    assertRaises context, argparse.Namespace, inspect.BoundArguments, with __slots__ as a
    user's class may have): traced like a user's class.  Classes with a C base, their
    own metaclass or __new__ stay opaque."""
    return type(cls) is type and cls.__new__ is object.__new__ and \
        all(c is object or c.__flags__ & _TPFLAGS_HEAPTYPE for c in cls.__mro__)


_TPFLAGS_HEAPTYPE = 1 << 9
