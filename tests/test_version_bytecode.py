"""Constructs whose bytecode differs between CPython versions (3.11, 3.12, 3.13), traced
and broken at: closures over arguments (3.13 loads a cell with LOAD_FAST), keyword calls
at a break (KW_NAMES or CALL_KW), truth tests at a break (3.13's TO_BOOL, and jumps that
read only a bool), f-strings with conversions and specs (FORMAT_VALUE, or CONVERT_VALUE
and FORMAT_*), swaps (STORE_FAST_STORE_FAST), lambdas with defaults
(SET_FUNCTION_ATTRIBUTE) and loops left by exhaustion (END_FOR)."""
import torch

from differential import Then, check


def closure_over_argument_after_break(x, t):
    s = t.sum().item()

    def g():
        return x * 2 + s
    return g()


def test_closure_over_an_argument_made_after_a_break():
    check(closure_over_argument_after_break,
          [(torch.randn(3), torch.randn(2)), (torch.randn(3), torch.randn(2))],
          graphs=2, breaks=1)


def closure_made_before_break(x, t):
    def g():
        return x * 2
    s = t.sum().item()
    x = x + 1
    return g() + s


def test_closure_over_an_argument_called_after_a_break():
    check(closure_made_before_break, [(torch.randn(3), torch.randn(2)) for _ in range(2)],
          graphs=2, breaks=1)


def keywords_at_break(x):
    y = x.sin()
    return torch.full_like(y, fill_value=float(x.sum().item()), dtype=torch.float64) + y


def test_a_keyword_call_at_a_break():
    check(keywords_at_break, [torch.randn(4) for _ in range(3)], breaks=1)


def truth_at_break(x):
    y = x * 2
    if (y.sum() > 0).item():
        y = y + 1
    if not (y.mean() > 1):
        y = y - 1
    return y


def test_truth_of_tensors_at_breaks_takes_both_branches():
    inputs = [torch.ones(3), -torch.ones(3), torch.full((3,), 0.2), torch.full((3,), 3.0)]
    check(truth_at_break, inputs)


def formatted(x, scale: float, name: str):
    y = x * scale
    return y, f"{name!r:>10}|{scale:.3f}|{name!s}|{scale!a}|{len(name):{4}d}"


def test_fstrings_with_conversions_and_specs():
    check(formatted, [(torch.randn(2), 1.5, "ab"), (torch.randn(2), 2.25, "c")], graphs=2,
          breaks=0)


def swaps_and_defaults(x, y):
    x, y = y, x
    a = x
    b = a
    f = lambda u, k=2, *, m=3: u * k + m   # noqa: E731
    return f(x) - f(y, m=b.sum()), a, b


def test_swaps_and_a_lambda_with_defaults():
    check(swaps_and_defaults, [(torch.randn(3), torch.randn(3)) for _ in range(2)],
          graphs=1, breaks=0)


def loop_to_exhaustion(xs, t):
    total = t
    for x in xs:
        total = total + x
    for i, x in enumerate(xs):
        if i == 1:
            print("second:", x.sum().item() > 100)
        total = total * 1.5
    return total


def test_loops_left_by_exhaustion_and_a_break_inside_one():
    # (breaks: the .item(), then print() of the comparison made of it in the resume code)
    check(loop_to_exhaustion, [([torch.randn(2) for _ in range(3)], torch.randn(2)) for _ in range(2)],
          breaks=2)


def many_locals_loop(xs, ws, t):
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = t
    out = []
    for i, x in enumerate(xs):          # (i: slot 14, x: 15)
        if ws[i].item() != 1:
            out.append(x.sub(ws[i]).mul_(ws[i]))
        out.append(x + ws[i] + a0 + a9)
    return out, a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8


def test_a_resume_function_numbering_locals_anew_reads_the_right_ones():
    # (3.13 pairs two locals of slots below 16 in one instruction, `ws[i]`: the resume
    # code numbers its locals anew, i past 15)
    xs = [torch.randn(2) for _ in range(3)]
    check(many_locals_loop, [(xs, [torch.tensor(2.), torch.tensor(1.), torch.tensor(3.)], torch.randn(2)),
                             (xs, [torch.tensor(1.), torch.tensor(5.), torch.tensor(1.)], torch.randn(2))])


class Holder:
    pass


HOLDER = Holder()
HOLDER.flag = True
HOLDER.other = 2


def reads_an_attribute(x):
    return x * (2 if HOLDER.flag else 3) + HOLDER.other


def test_an_attribute_stored_through_the_object_after_its_dict_was_read():
    # (3.13: the instance dict shares the object's inline values, and a store through
    # the object leaves the dict's version as it was: the guard must read it again)
    def store(flag):
        vars(HOLDER)
        HOLDER.flag = flag

    check(reads_an_attribute, [Then(lambda f=f: store(f), torch.ones(2)) for f in (False, True) * 3],
          graphs=2, compiles=2)
