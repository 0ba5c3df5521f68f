"""Dict subclasses: objects made in the frame keep their instance attributes and their
__dict__ (HF's ModelOutput reads `self.__dict__.get(name)`); a dict subclass passed in has
its membership, length, truth and items guarded."""
import collections

import torch

from differential import check


class Record(collections.OrderedDict):
    pass


def attrs_through_dict(x):
    r = Record()
    r.a = x + 1
    r["k"] = x * 2
    return r.__dict__.get("a") * 3, r.__dict__.get("missing"), "a" in r.__dict__, len(r.__dict__), r["k"]


def test_dict_subclass_dict_reads_its_attributes():
    check(attrs_through_dict, [torch.ones(2), torch.randn(2)], graphs=1, breaks=0)


# -- a dict subclass's membership, length, truth and items are guarded --
class Registry(dict):
    """A dict subclass: its `in`, `len` and `[]` are dict's builtins, read on the object."""


class OrderedRegistry(collections.OrderedDict):
    pass


def _branch_on_keys(x, d):
    if "key1" in d:
        x = x + 2
    if "key2" in d:
        x = x + 4
    return x + 8


def test_dict_subclass_membership_is_guarded():
    for cls in (Registry, OrderedRegistry):
        check(_branch_on_keys, [(torch.ones(3), cls(key1=torch.ones(3))),
                                (torch.ones(3), cls(key2=torch.ones(3))),
                                (torch.ones(3), cls(key1=1, key2=2))], graphs=3, breaks=0)


def test_dict_subclass_length_and_truth_are_guarded():
    def f(x, d):
        if d:
            x = x + len(d)
        return x * 2

    check(f, [(torch.ones(2), Registry(a=1)), (torch.ones(2), Registry(a=1, b=2)),
              (torch.ones(2), Registry())], graphs=3, breaks=0)


def test_dict_subclass_item_is_guarded():
    def f(x, d):
        return x * d["scale"]

    check(f, [(torch.ones(2), Registry(scale=2)), (torch.ones(2), Registry(scale=3)),
              (torch.ones(2), Registry(scale=3))], graphs=2, breaks=0)
