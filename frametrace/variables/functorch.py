"""torch.func transforms over traced functions: vmap, grad, grad_and_value, jacrev, jacfwd,
vjp and jvp (torch.vmap and torch.func.* are the same functions).

The transformed function is speculated once into a subgraph (subgraph.py) over tensors
that look like what the transform hands it (per-example slices for vmap), and the frame's
graph calls the real transform on that subgraph (functorch_runtime.py): values,
batching rules, errors and gradients through the result are torch's own, on every
backend.  Whatever the subgraph cannot hold (a side effect, a data-dependent branch, a
graph break) refuses the call, which then runs in CPython."""
from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
import torch.func as func
import types

from .. import functorch_runtime as runtime
from .fx_values import map_graph_vars, to_fake, to_node_arg
from .base import Var, unsupported
from .constant import ConstVar
from .containers import DictVar, ListVar, NamedTupleVar, TupleVar
from .objects import ObjectVar
from .symbolic import SymNodeVar
from .tensor import TensorVar

# The options of each transform after `func`, in signature order, with torch's defaults,
# and how many of them may be passed by position.
_OPTIONS = {
    "vmap": ((("in_dims", 0), ("out_dims", 0), ("randomness", "error"), ("chunk_size", None)), 3),
    "grad": ((("argnums", 0), ("has_aux", False)), 2),
    "grad_and_value": ((("argnums", 0), ("has_aux", False)), 2),
    "jacrev": ((("argnums", 0), ("has_aux", False), ("chunk_size", None),
                ("_preallocate_and_copy", False)), 1),
    "jacfwd": ((("argnums", 0), ("has_aux", False), ("randomness", "error")), 3),
}


@functools.lru_cache(None)
def _transforms():
    return {func.vmap: "vmap", torch.vmap: "vmap", func.grad: "grad",
            func.grad_and_value: "grad_and_value", func.jacrev: "jacrev",
            func.jacfwd: "jacfwd", func.vjp: "vjp", func.jvp: "jvp"}


def functorch_var(value, source):
    """The Var for a torch.func transform, or None."""
    # By identity: hashing a program's object runs its __hash__, which may fail.
    kind = next((k for f, k in _transforms().items() if f is value), None)
    if kind is None:
        return None
    if kind in ("vjp", "jvp"):
        return (VjpVar if kind == "vjp" else JvpVar)(value, source)
    return TransformVar(value, source, kind)


class TransformVar(ObjectVar):
    """torch.func.vmap / grad / ...: calling it with a function makes a TransformedVar."""
    __slots__ = ("kind",)

    def __init__(self, value, source, kind):
        super().__init__(value, source)
        self.kind = kind

    def call(self, tx, args, kwargs):
        if not args:
            unsupported(f"torch.func.{self.kind} without a function")
        return TransformedVar(self.kind, args[0], _bind_options(self.kind, args[1:], kwargs))


def _bind_options(kind, args, kwargs) -> tuple:
    """The options the call gave, as (name, constant) pairs: passed on as keywords, so
    torch's own defaults apply to the rest."""
    names, positional = _OPTIONS[kind]
    if len(args) > positional:
        unsupported(f"torch.func.{kind}: too many positional arguments")
    bound = dict(zip((n for n, _ in names), args))
    for k, v in kwargs.items():
        if k not in dict(names) or k in bound:
            unsupported(f"torch.func.{kind}: unexpected argument {k!r}")
        bound[k] = v
    for name, v in bound.items():
        if not _is_constant(v):
            unsupported(f"torch.func.{kind}'s {name} is not a constant")
    return tuple((name, _constant(bound[name])) for name, _ in names if name in bound)


def option(kind, options, name):
    return dict(options).get(name, dict(_OPTIONS[kind][0])[name])


def _is_constant(v) -> bool:
    if isinstance(v, ConstVar):
        return True
    return type(v) in (TupleVar, ListVar) and all(map(_is_constant, v.items))


def _constant(v):
    if isinstance(v, ConstVar):
        return v.value
    items = [_constant(x) for x in v.items]
    return tuple(items) if type(v) is TupleVar else items


class TransformedVar(Var):
    """``torch.func.<kind>(fn, **options)``: a function that, called, is one graph node
    applying the transform to fn's subgraph."""
    __slots__ = ("kind", "fn", "options")

    def __init__(self, kind, fn, options):
        super().__init__(None)
        self.kind = kind
        self.fn = fn
        self.options = options

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        what = f"the function given to torch.func.{self.kind}"
        for v in (*args, *kwargs.values()):
            _check_argument(v, self.kind)
        if self.kind == "vmap":
            inner_args = _per_example(tx, args, option("vmap", self.options, "in_dims"))
        else:
            inner_args = _differentiated(tx, args, option(self.kind, self.options, "argnums"),
                                         self.kind)
        # vmap's function may write its inputs in place: the batched tensors are written
        # through when the transform runs, at run time, as in CPython (and over the
        # FakeTensors while tracing, so the graph knows its inputs are written).
        sub = tx.subgraphs.speculate(tx, _ArgsAs(self.fn, inner_args, self.kind == "vmap"), args, what,
                                     kwargs, allow_input_mutation=self.kind == "vmap")
        return _emit(tx, runtime.apply_transform, runtime.transformed, sub,
                     lambda body, spec, a, kw, lifted: (body, self.kind, self.options, spec, a, kw, lifted),
                     args, kwargs)

    def reconstruct(self, cg):
        # Held on the stack at a graph break: the real transform of the real function.
        cg.call_const(runtime.remake_transform, [lambda cg: cg.load_const(self.kind),
                                                 self.fn.reconstruct,
                                                 lambda cg: cg.load_const(self.options)])

    def __repr__(self):
        return f"TransformedVar({self.kind}, {self.fn})"


class _ArgsAs(Var):
    """Calls `fn` with the subgraph's placeholders re-described: speculate makes each
    placeholder like the tensor passed, and a transform hands its function something
    else (vmap a slice without the batch dimension, grad a tensor that needs grad)."""
    __slots__ = ("fn", "examples", "hides_layout")

    def __init__(self, fn, examples, hides_layout=False):
        super().__init__(None)
        self.fn = fn
        self.examples = examples      # per argument: a list of FakeTensors (or None) in order
        self.hides_layout = hides_layout

    def call(self, tx, args, kwargs):
        if self.hides_layout:
            tx.output.hides_layout = True
        redone = []
        for arg, examples in zip(args, self.examples):
            it = iter(examples)
            redone.append(map_graph_vars(arg, lambda t: _with_example(tx, t, next(it))))
        return self.fn.call(tx, redone, kwargs)


def _with_example(tx, var, example):
    if example is None or not isinstance(var, TensorVar):
        return var
    node = var.node
    node.meta["example_value"] = node.meta["val"] = example
    # The transform's wrapper is a new tensor, not the frame's input (whose Python
    # attributes and identity it does not share).
    tx.output._outer_of[node] = TensorVar(None, example)
    return TensorVar(node, example)


def _check_argument(v, kind):
    def leaf(t):
        if isinstance(t, SymNodeVar):
            unsupported(f"a symbolic number passed to a torch.func.{kind}-transformed function")
        return t
    map_graph_vars(v, leaf)
    if not isinstance(v, (TensorVar, ConstVar)) and type(v) not in (TupleVar, ListVar, DictVar):
        unsupported(f"torch.func.{kind} over an argument of type {v}")


def _tensors(v) -> list:
    found = []
    map_graph_vars(v, lambda t: found.append(t) or t)
    return found


def _per_example(tx, args, in_dims) -> list:
    """For each argument, the FakeTensors vmap's function sees in place of its tensors."""
    if isinstance(in_dims, int) or in_dims is None:
        in_dims = (in_dims,) * len(args)
    if not isinstance(in_dims, (tuple, list)) or len(in_dims) != len(args):
        unsupported("vmap's in_dims do not match the arguments")
    sizes, out = [], []
    with tx.output.fake_mode:
        for arg, dim in zip(args, in_dims):
            if dim is not None and not isinstance(dim, int):
                unsupported("vmap with nested in_dims")
            examples = []
            for t in _tensors(arg):
                if dim is None:
                    examples.append(None)
                    continue
                ex = t.example
                if not -ex.dim() <= dim < ex.dim():
                    unsupported("vmap's in_dim is out of range for an argument")
                d = dim % ex.dim()
                sizes.append(ex.shape[d])
                shape = ex.shape[:d] + ex.shape[d + 1:]
                examples.append(torch.empty(shape, dtype=ex.dtype, device=ex.device)
                                .requires_grad_(ex.requires_grad))
            out.append(examples)
    # (Comparing symbolic sizes guards that they stay equal.)
    if not sizes or any(s != sizes[0] for s in sizes[1:]):
        unsupported("vmap over no batched tensor, or over batch sizes that differ")
    return out


def _differentiated(tx, args, argnums, kind) -> list:
    """For grad/jacrev, the differentiated arguments' tensors need grad inside the
    function (torch.func wraps them so)."""
    if kind == "jacfwd":
        return [[None] * len(_tensors(a)) for a in args]
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    nums = {n % len(args) for n in nums if isinstance(n, int) and -len(args) <= n < len(args)}
    out = []
    with tx.output.fake_mode:
        for i, arg in enumerate(args):
            out.append([_needing_grad(t.example) if i in nums else None for t in _tensors(arg)])
    return out


def _needing_grad(ex):
    if not ex.is_floating_point() and not ex.is_complex():
        return None
    return torch.empty_strided(ex.shape, ex.stride(), dtype=ex.dtype,
                               device=ex.device).requires_grad_(True)


# ---------------------------------------------------------------- emitting the node
def body_spec(sub) -> tuple:
    """The runtime's description of what the body returned (functorch_runtime.py)."""
    def convert(spec):
        kind = spec[0]
        if kind in ("leaf",):
            return ("leaf",)
        if kind == "const":
            return ("const", spec[1].as_const())
        if kind in (TupleVar, ListVar):
            return ("tuple" if kind is TupleVar else "list", tuple(convert(s) for s in spec[1]))
        if kind is DictVar and all(type(k) in (str, int, bool) for k in spec[2]):
            return ("dict", tuple(convert(s) for s in spec[1]), spec[2])
        unsupported(f"{sub.what} returns a {type(kind).__name__}, which the transform cannot rebuild")
    return convert(sub.spec)


def node_arg(tx, v):
    """An argument of the graph's call: Vars of this graph as nodes, constants as is."""
    return to_node_arg(map_graph_vars(v, lambda t: tx.subgraphs.lift_into(tx.output, t)))


def _emit(tx, target, whole, sub, make_args, args, kwargs):
    """Install `sub` and record ``target(*make_args(body, spec, args, kwargs, lifted))``,
    whose result is `whole`'s result flattened; returns `whole`'s result over outer Vars."""
    spec = body_spec(sub)
    lifted = list(sub.output.lifted)
    body = sub.module()
    fake_args = make_args(body, spec, tuple(to_fake(a) for a in args),
                          {k: to_fake(v) for k, v in kwargs.items()},
                          tuple(t.example for t in lifted))
    try:
        with tx.output.fake_mode:
            result = whole(*fake_args)
    except Exception as e:
        unsupported(f"{target.__name__} failed while tracing: {type(e).__name__}: {e}")
    leaves, tree = pytree.tree_flatten(result)
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        unsupported("a torch.func transform returned something other than tensors")
    body_node = tx.output.install_subgraph(f"{getattr(target, '__name__', 'body')}_body", body)
    node_args = make_args(body_node, spec, tuple(node_arg(tx, a) for a in args),
                          {k: node_arg(tx, v) for k, v in kwargs.items()},
                          tuple(node_arg(tx, t) for t in lifted))
    outs = tx.subgraphs.call_hop(tx, target, node_args, _fresh(tx, leaves))
    return as_var(pytree.tree_unflatten(outs, tree))


def _fresh(tx, examples):
    # A result is a new tensor: it must not be one the trace already holds.
    with tx.output.fake_mode:
        return [torch.empty_strided(e.shape, e.stride(), dtype=e.dtype, device=e.device)
                .requires_grad_(e.requires_grad) for e in examples]


def as_var(value):
    """Python tuples, lists and dicts of Vars as Vars."""
    if isinstance(value, Var):
        return value
    if isinstance(value, tuple):
        return TupleVar([as_var(v) for v in value])
    if isinstance(value, list):
        return ListVar([as_var(v) for v in value])
    if isinstance(value, dict):
        return DictVar({k: as_var(v) for k, v in value.items()})
    if value is None or isinstance(value, (int, float, bool, str)):
        return ConstVar(value)
    unsupported(f"a torch.func transform returned {type(value).__name__}")


# ---------------------------------------------------------------- jvp
class JvpVar(ObjectVar):
    """torch.func.jvp(fn, primals, tangents, *, strict, has_aux): one graph node running
    the real jvp over fn's subgraph (tensors fn reads from outside get no tangent, as in
    eager)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        if len(args) != 3 or set(kwargs) - {"strict", "has_aux"}:
            unsupported("torch.func.jvp with arguments other than fn, primals, tangents, "
                        "strict and has_aux")
        for k, v in kwargs.items():
            if not isinstance(v, ConstVar):
                unsupported(f"torch.func.jvp's {k} is not a constant")
        fn, primals, tangents = args
        if type(primals) not in (TupleVar, ListVar):
            unsupported("torch.func.jvp's primals are not a tuple")
        for v in (primals, tangents):
            _check_argument(v, "jvp")
        items = list(primals.items)
        sub = tx.subgraphs.speculate(tx, _ArgsAs(fn, [[None] * len(_tensors(p)) for p in items]), items,
                        "the function given to torch.func.jvp")
        options = tuple((k, v.value) for k, v in kwargs.items())
        return _emit(tx, runtime.apply_jvp, runtime.jvp_result, sub,
                     lambda body, spec, a, kw, lifted: (body, options, spec, a, kw["t"], lifted),
                     items, {"t": tangents})


# ---------------------------------------------------------------- vjp
class VjpVar(ObjectVar):
    """torch.func.vjp(fn, *primals, has_aux=False): fn's output (one graph node calling
    its subgraph) and a VjpFnVar, whose call is a node running vjp on the same subgraph
    (which computes fn again: so fn must not draw random numbers)."""
    __slots__ = ()

    def call(self, tx, args, kwargs):
        if not args or set(kwargs) - {"has_aux"}:
            unsupported("torch.func.vjp with arguments other than fn, primals and has_aux")
        has_aux = kwargs.get("has_aux", ConstVar(False))
        if not isinstance(has_aux, ConstVar):
            unsupported("torch.func.vjp's has_aux is not a constant")
        fn, primals = args[0], list(args[1:])
        for v in primals:
            _check_argument(v, "vjp")
        with tx.output.fake_mode:
            inner = [[_needing_grad(t.example) for t in _tensors(p)] for p in primals]
        sub = tx.subgraphs.speculate(tx, _ArgsAs(fn, inner), primals, "the function given to torch.func.vjp")
        if _draws_random_numbers(sub.graph):
            unsupported("torch.func.vjp over a function that draws random numbers "
                        "(its vjp function would draw others)")
        options = (("has_aux", has_aux.value),)
        out = _emit(tx, runtime.call_body, _call_body_whole, sub,
                    lambda body, spec, a, kw, lifted: (body, spec, a, lifted), primals, {})
        pullback = VjpFnVar(sub, options, primals)
        if has_aux.value:
            if not isinstance(out, TupleVar) or len(out.items) != 2:
                unsupported("torch.func.vjp with has_aux over a function not returning a pair")
            return TupleVar([out.items[0], pullback, out.items[1]])
        return TupleVar([out, pullback])


def _call_body_whole(body, spec, args, lifted):
    return runtime._as_function(body, spec, lifted)(*args)


class VjpFnVar(Var):
    """The vjp function torch.func.vjp returned; it exists only inside the trace (a
    frame that returns or stores it breaks its graph)."""
    __slots__ = ("sub", "options", "primals")

    def __init__(self, sub, options, primals):
        super().__init__(None)
        self.sub = sub
        self.options = options
        self.primals = primals

    def call(self, tx, args, kwargs):
        if kwargs or len(args) != 1:
            unsupported("a vjp function called with other than one cotangent structure")
        cotangents = args[0]
        options = self.options
        return _emit(tx, runtime.apply_vjp, runtime.vjp_result, self.sub,
                     lambda body, spec, a, kw, lifted: (body, options, spec, a, kw["ct"], lifted),
                     self.primals, {"ct": cotangents})


_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform",
                 "poisson", "exponential", "geometric", "cauchy", "log_normal", "seed")


def _draws_random_numbers(graph) -> bool:
    """Whether a graph may draw random numbers: any op named like a sampler, or any
    call of a nested subgraph's op (looked into through its module) — conservative."""
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if any(w in str(name).lower() for w in _RANDOM_WORDS):
            return True
        tags = getattr(node.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            return True
    owner = getattr(graph, "owning_module", None)
    for sub in (owner.children() if owner is not None else ()):
        if isinstance(sub, torch.fx.GraphModule) and _draws_random_numbers(sub.graph):
            return True
    return False
