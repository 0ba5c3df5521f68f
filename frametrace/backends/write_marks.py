"""Which failures of a compiled graph came before it wrote its inputs.

A backend that applies a graph's input writes only after the rest of it (AOTAutograd:
after the compiled graph returns, or, keeping them in an inference graph, as `copy_`
ops at its end) lets the frame run again in CPython after a failure, but only one that
came before those writes; a failure in a write, or after (AOTAutograd's epilogue that
makes input-aliasing outputs again), must go on as it is: a rerun would write the
inputs a second time.  The wrappers here mark what the graph's ops raise before its
first write (exc.mark_before_input_writes); codegen's failure path reads the mark.

    compiled = boxed(gm)            # what AOTAutograd's fw_compiler returns
"""
from __future__ import annotations

import re
import threading

import torch
from torch import fx

from ..exc import mark_before_input_writes

_writing = threading.local()


def _writes_begin():
    _writing.now = True


def _first_write(graph):
    """The first node that may write a tensor in place, or None: an op whose schema is
    mutable, a higher-order op (a body may write), a module or method call.  (Plain
    functions in AOTAutograd's graphs are getitem, size arithmetic, grad-mode switches.)"""
    for node in graph.nodes:
        if node.op == "call_function":
            schema = getattr(node.target, "_schema", None)
            if schema is not None and schema.is_mutable or \
                    isinstance(node.target, torch._ops.HigherOrderOperator):
                return node
        elif node.op in ("call_module", "call_method"):
            return node
    return None


# `torch.ops.aten.copy_.default(`, `torch.ops.aten.add_.Tensor(`: an in-place op's call
_IN_PLACE_CALL = re.compile(r"\.\w+_\.\w+\(")


def _unmarked(forward):
    def run(args):
        return forward(*args)
    run._boxed_call = True
    return run


def boxed(gm):
    """`gm` as AOTAutograd calls a compiled graph (one list of arguments), what it
    raises before its first write marked."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        # A graph rebuilt from the on-disk cache as its code alone (aot_cache._CodeOnly):
        # one with any in-place op call marks nothing (no rerun: never a second write).
        code = getattr(gm, "_code", None) or getattr(gm, "code", "") or ""
        if _IN_PLACE_CALL.search(code) or "higher_order" in code:
            return _unmarked(gm.forward)
        first = None
    else:
        first = _first_write(graph)
    if first is None:
        forward = gm.forward

        def run(args):
            try:
                return forward(*args)
            except Exception as e:
                mark_before_input_writes(e)
                raise
    else:
        # A copy that says when its writes begin (`gm` itself stays as AOTAutograd
        # made it: the on-disk cache keeps it).
        graph = fx.Graph()
        env: dict = {}
        out = graph.graph_copy(gm.graph, env)
        graph.output(out)
        with graph.inserting_before(env[first]):
            graph.call_function(_writes_begin, ())
        forward = fx.GraphModule(gm, graph).forward

        def run(args):
            outer = getattr(_writing, "now", False)
            _writing.now = False
            try:
                return forward(*args)
            except Exception as e:
                if not _writing.now:
                    mark_before_input_writes(e)
                raise
            finally:
                _writing.now = outer       # (a graph called from inside another's ops)
    run._boxed_call = True      # (AOTAutograd's make_boxed_func's mark)
    return run


def _version(t):
    try:
        return t._version
    except RuntimeError:        # (an inference tensor counts no versions)
        return None


def unboxed(fn):
    """`fn(*args)` (torch.func.functionalize's wrapper, which writes the inputs after
    the rest), what it raises marked where no tensor argument's version moved: its
    writes had not begun.  An argument without versions (an inference tensor) leaves
    it unmarked."""
    def run(*args):
        before = [_version(a) for a in args if isinstance(a, torch.Tensor)]
        try:
            return fn(*args)
        except Exception as e:
            if None not in before and \
                    before == [_version(a) for a in args if isinstance(a, torch.Tensor)]:
                mark_before_input_writes(e)
            raise
    return run
