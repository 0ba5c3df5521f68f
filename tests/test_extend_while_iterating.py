"""list.extend / deque.extend / deque.extendleft take the items of a general iterable
one at a time, as CPython does: a generator that reads the container sees the items
already added (they used to be collected first: a wrong answer in one graph)."""
import collections

import torch

from differential import check


def _list_extend_reads_itself(x, n):
    y = [1]
    y.extend(y[-1] + z for z in range(n))
    y.extend(y)                           # the list itself: a copy first
    y.extend((y[0], len(y)))              # a tuple: built before the call
    return x + len(y), y


def _deque_extends_read_themselves(x):
    d = collections.deque([1])
    d.extend(d[-1] * 2 for _ in range(3))
    d.extendleft(d[0] + i for i in range(3))
    d.extend(d)
    return x * d[0], d


def test_list_extend_sees_its_own_growth():
    check(_list_extend_reads_itself, [(torch.randn(2), 3), (torch.randn(2), 3), (torch.randn(2), 3)],
          fullgraph=True)


def test_deque_extend_and_extendleft_see_their_own_growth():
    check(_deque_extends_read_themselves, [torch.randn(2), torch.randn(3)], fullgraph=True)
