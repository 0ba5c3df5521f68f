"""Objects of dict subclasses made in the frame: their instance attributes and their
__dict__ (HF's ModelOutput reads `self.__dict__.get(name)`)."""
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
