"""Guards on memory shared between tensor inputs that a graph writes: many written
inputs (an optimizer's parameters and state) are checked in one pass, and every way of
sharing memory at run time that the trace did not see is still noticed."""
import pytest
import torch

from conftest import compiled_entries, counted
from differential import check
from frametrace import _C, guards


def sgd_update(ps, gs):
    for p, g in zip(ps, gs):
        p.add_(g, alpha=-0.1)
    return ps[0] * 2


def _lists(n, size=4):
    return [torch.randn(size) for _ in range(n)], [torch.randn(size) for _ in range(n)]


def c_ops(fn) -> list:
    """Per compiled entry of `fn`: its C checks (op names), and whether it still has
    guards that run as Python."""
    names = {i: n for n, i in _C.GUARD_OPS.items()}
    entries = [e for e in _C.entries(fn.__code__) if isinstance(e.check, _C.GuardCheck)]
    return [[names[i[0]] for i in e.check.program] for e in entries], [e.check.residual is not None for e in entries]


def many_updates(ps, gs):
    return sgd_update(ps, gs)


def test_many_written_inputs_are_guarded_in_one_pass_not_per_pair():
    ps, gs = _lists(40)
    r = check(many_updates, [(ps, gs), _lists(40)], graphs=1, breaks=0)
    [ops], [residual] = c_ops(many_updates)
    # one C check over all 80 tensors (not 3160 pair checks), nothing left to Python
    assert ops.count("UNSHARED") == 1 and ops.count("IS_NOT_REG") <= 1 and not residual
    assert r.graphs == 1


def _same_tensor_twice():
    ps, gs = _lists(6)
    ps[3] = ps[1]          # one parameter listed twice: its update applies twice
    return ps, gs


def _view_of_another():
    ps, gs = _lists(6, size=8)
    base = torch.randn(16)
    ps[2], ps[4] = base[:8], base[8:]   # two views of one storage, disjoint
    return ps, gs


def _written_read_elsewhere():
    ps, gs = _lists(6)
    gs[5] = ps[0]          # a gradient that is another input's parameter
    return ps, gs


def _empty_tensors():
    ps, gs = _lists(6)
    ps[1], ps[2] = torch.empty(0), torch.empty(0)
    gs[1], gs[2] = torch.empty(0), torch.empty(0)
    return ps, gs


def test_sharing_memory_at_run_time_is_noticed():
    # first calls: nothing shared; then each kind of sharing the trace did not see
    inputs = [_lists(6), _lists(6), _same_tensor_twice(), _view_of_another(),
              _written_read_elsewhere(), _lists(6)]
    r = check(sgd_update, inputs, breaks=0)
    assert r.graphs >= 3   # the shared cases compile programs of their own


def _far_apart_twice():
    ps, gs = _lists(40)
    ps[39] = ps[0]         # (the C check sorts: a pair far apart in the list)
    return ps, gs


def _grad_views_a_written_state():
    ps, gs = _lists(40, size=8)
    base = torch.randn(16)
    ps[17], gs[30] = base[:8], base[8:]    # disjoint views of one storage
    return ps, gs


def _sharing_cases():
    return [_lists(40), _lists(40), _far_apart_twice(), _grad_views_a_written_state(), _lists(40)]


def test_sharing_memory_among_many_inputs_is_noticed_by_the_c_check():
    r = check(many_updates, _sharing_cases(), breaks=0)
    assert r.graphs >= 3
    # the entry for unshared inputs checks them in C alone
    assert any(ops.count("UNSHARED") == 1 and not residual for ops, residual in zip(*c_ops(many_updates)))


def test_sharing_is_noticed_when_storages_are_read_through_python():
    # without the C++ reads (another torch, no compiler) the C check calls
    # t.untyped_storage().data_ptr() as the Python guard did
    was = _C.set_tensor_reads(None)
    try:
        r = check(many_updates, _sharing_cases(), breaks=0)
    finally:
        if was:
            guards._use_tensor_reads()
    assert r.graphs >= 3


def test_a_non_tensor_where_a_tensor_was_fails_the_check_instead_of_raising():
    def run(ps, gs):    # (entries of its own)
        return many_updates(ps, gs)
    ps, gs = _lists(40)
    bad_ps, bad_gs = _lists(40)
    bad_gs[7] = 3.0        # what the traced code would read as a tensor
    r = check(run, [(ps, gs), (bad_ps, bad_gs), _lists(40)], breaks=0)
    assert r.graphs == 2, r    # the odd input compiles its own; the third reuses the first


def test_empty_tensors_may_share_the_null_pointer():
    r = check(sgd_update, [_empty_tensors(), _empty_tensors(), _empty_tensors()], breaks=0)
    assert r.graphs == 1


def append_to_each(lists, x):
    for i, l in enumerate(lists):
        l.append(i)
    return x + len(lists[0])


def _lists_of_lists(n=40, same=None):
    ls = [[] for _ in range(n)]
    if same is not None:
        ls[same[1]] = ls[same[0]]   # one list twice: it gets both appends
    return ls, torch.randn(3)


def test_many_mutable_inputs_are_distinct_objects_checked_in_c():
    r = check(append_to_each, [_lists_of_lists(), _lists_of_lists(), _lists_of_lists(same=(0, 39)),
                               _lists_of_lists(same=(5, 6)), _lists_of_lists()], breaks=0)
    assert r.graphs >= 2
    ops, residual = c_ops(append_to_each)
    assert any(o.count("DISTINCT") == 1 and not res for o, res in zip(ops, residual)), ops


# -- aliased tensor and list inputs, identity of new lists --
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_aliased_tensor_inputs_recompile(backend):
    def f(x, y):
        x.add_(1)
        return y * 2
    g, cnt = counted(f, backend)
    a, b = torch.zeros(2), torch.zeros(2)
    torch.testing.assert_close(g(a, b), torch.zeros(2))
    c = torch.zeros(2)
    torch.testing.assert_close(g(c, c), torch.full((2,), 2.0))       # same tensor
    d = torch.zeros(4)
    torch.testing.assert_close(g(d[:2], d[:2].view(2)), torch.full((2,), 2.0))  # views
    assert cnt.frame_count >= 2


def test_aliased_list_inputs():
    def f(x, l1, l2):
        l1.append(1)
        return x + len(l2)
    g, cnt = counted(f)
    torch.testing.assert_close(g(torch.zeros(1), [], []), torch.zeros(1))
    shared = []
    torch.testing.assert_close(g(torch.zeros(1), shared, shared), torch.ones(1))
    assert shared == [1]
    assert cnt.frame_count == 2          # the lists being one object fails a guard


def test_list_identity_and_aliasing_of_new_lists():
    class O:
        pass

    def f(x, lst, o):
        lst.append(x)
        new = [x]
        o.a = new
        o.b = new
        return lst
    lst, o = [], O()
    g, cnt = counted(f)
    out = g(torch.ones(1), lst, o)
    assert out is lst and len(lst) == 1 and o.a is o.b
    # no tensor op, so no graph: the transformed code only replays the mutations
    assert cnt.frame_count == 0 and len(compiled_entries(f)) == 1


# -- alias guards only for inputs the graph writes --
def test_alias_guards_only_for_inputs_the_graph_writes():
    def f(x, y, z):
        h = x * 2
        h.add_(1)                  # an intermediate: no input can alias it
        y[:1].mul_(3)              # an input, through a view
        return h + z

    g, cnt = counted(f, "eager")
    x, y, z = torch.ones(2), torch.ones(2), torch.ones(2)
    torch.testing.assert_close(g(x, y, z), torch.full((2,), 4.0))
    texts = [gd.text for e in compiled_entries(f) for gd in e.check.guards]
    alias = sorted(t for t in texts if "memory" in t)
    assert alias == ["no other tensor input shares memory with y"]
    same, expected_same = torch.ones(2), torch.ones(2)
    expected = f(expected_same, expected_same, z)
    torch.testing.assert_close(g(same, same, z), expected)
    torch.testing.assert_close(same, expected_same)
    assert cnt.frame_count == 2


# -- inputs traced aliased --
def test_inputs_traced_aliased_do_not_recompile_on_every_call():
    def f(a, b):
        b.add_(1)                  # writes through a view of `a` when aliased
        return a * 2

    g, cnt = counted(f)
    for _ in range(4):
        base, ref_base = torch.zeros(6), torch.zeros(6)
        torch.testing.assert_close(g(base, base[1:]), f(ref_base, ref_base[1:]))
        torch.testing.assert_close(base, ref_base)
    assert cnt.frame_count == 1
    x, y = torch.zeros(5), torch.zeros(5)
    torch.testing.assert_close(g(x, y), torch.zeros(5))
    assert cnt.frame_count == 2
    texts = {gd.text for e in compiled_entries(f) for gd in e.check.guards}
    assert {"a and b share memory", "no other tensor input shares memory with b"} <= texts
