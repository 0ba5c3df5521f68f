"""`assert t, "message"` on a tensor: a check in the graph, not a break.

CPython's assert is ``bool(t)`` (the tensor's data) and, when false, ``raise
AssertionError("message")``.  The trace cannot know the data, but it need not branch:
the statement only goes on or raises.  It records ``frametrace::assert_true(t,
message, negate)``, an op that does exactly that when the graph runs (``bool(t)``,
with its errors for a tensor of several elements), and goes on past the assert.  A
failing call raises from the graph; the frame is then run again in CPython where it
can be (convert's reruns), which raises the program's own AssertionError after the
effects before the assert; else the op's AssertionError, with the same message, is
what the call raises.

Only the statement's own shape is taken (the jump over ``LOAD_ASSERTION_ERROR``, a
constant string message or none): a computed message, which CPython evaluates only on
failure, stays a break.  The op is marked as having a side effect, so that no backend
drops it for having no output.
"""
from __future__ import annotations

from typing import Optional

import torch
from .constant import ConstVar
from .objects import TorchFnVar, torch_call_rule
from .tensor import TensorVar
from .. import config

_OP = None


def _assert_op():
    global _OP
    if _OP is None:
        @torch.library.custom_op("frametrace::assert_true", mutates_args=())
        def assert_true(cond: torch.Tensor, msg: Optional[str], negate: bool) -> None:
            if bool(cond) == negate:
                raise AssertionError() if msg is None else AssertionError(msg)

        @assert_true.register_fake
        def _(cond, msg, negate):
            return None

        _OP = torch.ops.frametrace.assert_true.default
        torch.fx.node.has_side_effect(_OP)
    return _OP


def _message(instructions, ip):
    """(True, message or None) if the instructions from `ip` are an assert's failure
    branch with a constant (or no) message, else (False, None)."""
    ops = [i for i in instructions[ip:ip + 6] if i.opname not in ("PRECALL", "CACHE", "NOP")]
    names = [i.opname for i in ops]
    if names[:2] == ["LOAD_ASSERTION_ERROR", "RAISE_VARARGS"] and ops[1].arg == 1:
        return True, None
    if names[:4] == ["LOAD_ASSERTION_ERROR", "LOAD_CONST", "CALL", "RAISE_VARARGS"] and \
            isinstance(ops[1].argval, str) and ops[2].arg == 0 and ops[3].arg == 1:
        return True, ops[1].argval
    return False, None


def assert_in_graph(tx, cond, negate: bool) -> bool:
    """At a conditional jump on `cond` whose other way is an assert failing: record the
    check in the graph and say so (the caller takes the jump: the assert held)."""
    if not isinstance(cond, TensorVar) or not config.asserts_in_graph:
        return False
    ok, message = _message(tx.instructions, tx.ip)
    if not ok:
        return False
    tx.output.call("call_function", _assert_op(), (cond, ConstVar(message), ConstVar(negate)), {})
    return True


# what torch._assert_async(t) raises for a zero `t` (on the CPU; on CUDA a device assert,
# as the overload with a message gives too)
_ASSERT_ASYNC_MESSAGE = "Expected Tensor with single nonzero value, but got zero"


@torch_call_rule(torch._assert_async)
def assert_async_with_message(tx, fn, args, kwargs):
    """``torch._assert_async(t)`` recorded as the overload with eager's own message: the
    one without is no side effect to torch.fx, and AOTAutograd's dead-code pass dropped
    it (a zero tensor returned where eager raises, as under torch.compile).  None for a
    call that has its message (the graph records it as it is)."""
    if len(args) != 1 or kwargs:
        return None
    return TorchFnVar(fn).call(tx, [*args, ConstVar(_ASSERT_ASYNC_MESSAGE)], kwargs)
