"""Tensors: an FX node plus the FakeTensor that describes it."""
from __future__ import annotations

import operator
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import tensor_attrs, tensor_facts
from .base import Var, unsupported
from .constant import ConstVar, MethodVar
from .optimizers import tensor_scalar_method
from .scalars import SCALAR_METHODS, capturing, scalar_method
from ..guards import FRESH
from ..source import LocalSource

# Metadata answered at trace time (and guarded); sizes may be symbolic.
_META_ATTRS = {"dtype", "device", "ndim", "requires_grad", "is_cuda", "is_quantized", "is_sparse", "is_meta", "is_complex_", "itemsize",
               "nbytes", "is_nested", "is_cpu", "is_sparse_csr", "is_mps", "is_xpu"}
# Attributes that are new tensors: graph nodes.
_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}
# Methods that need real data, or act outside the graph.
_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "backward", "register_hook", "data_ptr", "untyped_storage", "storage",
                 "retain_grad", "__array__", "__repr__", "__str__", "__format__"}

# Tensor methods whose result is a value of another kind (`t.numpy()`: an ndarray),
# name -> rule(tx, tensor_var, args, kwargs): the module that defines that kind
# registers the rule (`tensor_method`), so tensors need not import the kinds above them.
_OTHER_KIND_METHODS: dict = {}


def tensor_method(name: str):
    """Register the decorated rule as the tensor method `name`."""
    def register(rule):
        _OTHER_KIND_METHODS[name] = rule
        return rule
    return register


_ITEM_HINT = ("keep the value a tensor (x.sum() rather than x.sum().item()), read it after "
              "the compiled function returns, or set frametrace.config.capture_scalar_outputs = "
              "True to keep .item() in the graph")
_DATA_HINTS = {
    "item": _ITEM_HINT, "tolist": _ITEM_HINT, "__float__": _ITEM_HINT, "__int__": _ITEM_HINT,
    "backward": "compile the forward and the loss, and call backward() and the optimizer "
                "outside the compiled function",
    "__repr__": "print tensors outside the compiled function",
    "__str__": "print tensors outside the compiled function",
    "__format__": "print tensors outside the compiled function",
}


class TensorVar(Var):
    __slots__ = ("node", "example")

    def __init__(self, node, example, source=None):
        super().__init__(source)
        self.node = node
        self.example = example  # a FakeTensor

    def python_type(self):
        return type(self.example) if not _is_fake(self.example) else (
            torch.nn.Parameter if getattr(self.example, "_is_param", False) else torch.Tensor)

    def getattr(self, tx, name):
        if name == "shape":
            return tx.output.size_of(self)
        if name == "nbytes":
            numel = tx.output.size_of(self).call_method(tx, "numel", [], {})
            return tx.output.call("call_function", operator.mul,
                                  (numel, ConstVar(self.example.element_size())), {})
        if name in _META_ATTRS:
            return ConstVar(getattr(self.example, name))
        if name == "is_leaf":
            return tensor_facts.is_leaf(tx, self)
        if name in tensor_facts.LAYOUT_ATTRS:
            return tensor_facts.layout_attr(tx, self, name)
        if name in _TENSOR_ATTRS:
            return tx.output.call("call_function", getattr, (self, ConstVar(name)), {})
        if name == "grad":
            return tensor_attrs.grad(tx, self)
        if name == "grad_fn" and tensor_facts.is_leaf(tx, self).as_const():
            # (a leaf has no grad_fn; requires_grad, and an input's leafness, are guarded)
            return ConstVar(None)
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            return tensor_attrs.python_attr(tx, self, name)
        if callable(attr):
            guard_method(tx, self, name)
            return MethodVar(self, name)
        unsupported(f"Tensor attribute {name!r}")

    def setattr(self, tx, name, value):
        tensor_attrs.set_python_attr(tx, self, name, value)

    def delattr(self, tx, name):
        tensor_attrs.del_python_attr(tx, self, name)

    def call_method(self, tx, name, args, kwargs):
        guard_method(tx, self, name)
        if name in SCALAR_METHODS and capturing():
            return scalar_method(tx, self, name, args, kwargs)
        rule = _OTHER_KIND_METHODS.get(name)
        if rule is not None:
            return rule(tx, self, args, kwargs)
        if name in _DATA_METHODS:
            unsupported(f"Tensor.{name}() needs the tensor's data", hint=_DATA_HINTS.get(name))
        if name == "size" and len(args) <= 1 and not kwargs:
            # Sizes are read from the shape, not recorded as graph calls.
            shape = tx.output.size_of(self)
            return shape.getitem(tx, args[0]) if args else shape
        if name == "dim" and not args and not kwargs:
            return ConstVar(self.example.dim())
        if name == "storage_offset" and not args and not kwargs:
            if tx.output.layout_hidden():
                unsupported("Tensor.storage_offset() in a vmapped function")
            inp = tx.output.input_of(self)
            if inp is None:
                unsupported("storage_offset() of a tensor computed in the graph")
            tx.guards.storage_offset(inp.source, inp.value)
            return ConstVar(inp.value.storage_offset())
        if name in tensor_facts.STORAGE_FACTS and not args and not kwargs:
            return tensor_facts.storage_fact(tx, self, name)
        if name == "_is_view" and not args and not kwargs:
            return tensor_facts.is_view(tx, self)
        made = tensor_scalar_method(tx, self, name, args, kwargs)
        if made is not None:
            return made
        return tx.output.call("call_method", name, (self, *args), kwargs)

    def getitem(self, tx, key):
        guard_method(tx, self, "__getitem__")
        return tx.output.call("call_function", operator.getitem, (self, key), {})

    def setitem(self, tx, key, value):
        guard_method(tx, self, "__setitem__")
        tx.output.call("call_function", operator.setitem, (self, key, value), {})

    def unpack(self, tx):
        n = self.length(tx)
        return [self.getitem(tx, ConstVar(i)) for i in range(n)]

    def length(self, tx):
        if self.example.dim() == 0:
            unsupported("len() of a 0-d tensor")
        return tx.output.size_of(self).items[0].as_const()

    def truth(self, tx):
        unsupported("branching on a tensor's value (data-dependent control flow)",
                    hint="torch.where(cond, a, b) computes both sides in the graph; "
                         "torch.cond(pred, true_fn, false_fn, operands) branches inside it")

    def reconstruct(self, cg):
        cg.load_tensor(self)

    def noun(self):
        dtype = str(self.example.dtype).replace("torch.", "")
        shape = ", ".join(map(str, self.example.shape))
        what = f"the tensor {self.source.name()}" if isinstance(self.source, LocalSource) else "a tensor"
        return f"{what} ({dtype}[{shape}])"

    def __repr__(self):
        return f"TensorVar({self.node.name}: {tuple(self.example.shape)} {self.example.dtype})"


def guard_method(tx, var, name):
    """The trace gives `name` torch's meaning for tensors (a graph call, or a rule of
    its own): the tensor's class must still give torch's method.  A method replaced
    (``torch.Tensor.sigmoid = lambda self: ...``) is the user's code: a break, where
    CPython runs it; replaced after the trace, the guard fails and the frame is traced
    again (a backend that traces the method, as AOTAutograd, would keep the old one)."""
    cls = var.python_type()
    attr = getattr(cls, name, None)
    if attr is None:
        return
    # (guarded either way: the frame left to CPython for a replacement is compiled
    # again once torch's method is back)
    tx.guards.class_attr(cls, name, attr)
    if not _torchs_own(cls, attr):
        unsupported(f"Tensor.{name} is not torch's method (it was replaced by {attr!r})")


_SWAPPED = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "eq": "eq", "ne": "ne"}


def guard_operator(tx, var, fn, reflected: bool):
    """`guard_method` for the dunder an operator (`operator.add`, `operator.iadd` ...)
    calls on the tensor `var`: ``a + b`` runs ``type(a).__add__``, or, for the
    tensor on the right, ``type(b).__radd__`` (``__gt__`` for ``<``)."""
    name = getattr(fn, "__name__", "").rstrip("_")
    if not name:
        return
    if reflected:
        name = _SWAPPED.get(name) or "r" + name.removeprefix("i")
    guard_method(tx, var, f"__{name}__")


def _torchs_own(cls, attr) -> bool:
    """Whether `attr`, what `cls` gives for a name, is torch's: a Python function of
    torch's modules, or a C method of one of the class's own bases (TensorBase's,
    object's), not something assigned to it."""
    fn = getattr(attr, "__func__", attr)
    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and (module == "torch" or module.startswith("torch.")):
        return True
    if isinstance(fn, types.FunctionType):
        return False
    owner = getattr(attr, "__objclass__", None) or getattr(attr, "__self__", None)
    return isinstance(owner, type) and owner in cls.__mro__


def _is_fake(t) -> bool:
    return isinstance(t, FakeTensor)


# -- nn.Parameter made in the frame --
class NewParameterSource:
    """``nn.Parameter(data, requires_grad)`` of an input tensor, made by the transformed
    code before the graph runs (its first load makes it, later loads reuse it) and
    passed to the graph as an input, so ops on it in the graph reach the very Parameter
    the frame returns or stores (autograd included).  It has nothing to guard: what
    it is follows from `data`, whose source is guarded."""
    __slots__ = ("data", "requires_grad", "index")

    def __init__(self, data, requires_grad: bool, index: int):
        self.data = data
        self.requires_grad = requires_grad
        self.index = index

    def key(self):
        return (self.data, self.requires_grad, self.index)

    def __eq__(self, other):
        return type(self) is type(other) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def name(self):
        return f"Parameter({self.data.name()})#{self.index}"

    def guard_expr(self):
        return f"{FRESH}{self.index}"       # (GuardSet drops what mentions it)

    def reconstruct(self, cg):
        if cg.load_rebuilt(self):
            return
        cg.call_const(torch.nn.Parameter, [self.data.reconstruct,
                                           lambda cg: cg.load_const(self.requires_grad)])
        cg.keep_rebuilt(self)

    def __repr__(self):
        return f"NewParameterSource({self.name()})"


def new_parameter(tx, args, kwargs):
    """``nn.Parameter(t)``: for an input tensor, made before the graph (as
    torch.compile does); for a tensor the graph computes, a graph break (torch.compile's
    default, graph_break_on_nn_param_ctor, too)."""
    names = ("data", "requires_grad")
    if len(args) > 2 or set(kwargs) - set(names):
        unsupported("TypeError: nn.Parameter() takes data and requires_grad")
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in given:
            unsupported(f"TypeError: nn.Parameter() got multiple values for {k!r}")
        given[k] = v
    data, requires_grad = given.get("data"), given.get("requires_grad", ConstVar(True))
    if not isinstance(data, TensorVar) or not requires_grad.is_const():
        unsupported("nn.Parameter() of no tensor, or with a requires_grad not known when tracing")
    inp = tensor_facts.input_for(tx, data)
    if inp is None or data.node is not inp.node or id(data.example) in tx.output._last_inplace:
        unsupported("nn.Parameter() of a tensor computed in the frame")
    if any(not isinstance(s, int) for s in data.example.shape) or type(inp.value) is not torch.Tensor:
        unsupported("nn.Parameter() of a tensor with symbolic sizes, or of a Parameter")
    rg = bool(requires_grad.as_const())
    source = NewParameterSource(inp.source, rg, sum(isinstance(i.source, NewParameterSource)
                                                    for i in tx.output.inputs))
    return tx.output.add_input(torch.nn.Parameter(inp.value, rg), source, guarded=False)
