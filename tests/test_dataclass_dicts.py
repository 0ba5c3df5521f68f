"""Dataclasses that are dict subclasses, made in the frame (the shape of Hugging Face's
ModelOutput): the dataclass's __init__ (generated, or wrapped by a metaclass that
rewrites keywords) and the __post_init__ it calls run as CPython runs them, on the
container object; its own __setattr__ / __setitem__ overrides, super() calls, fields(),
getattr/setattr by name and `self.__dict__` all follow, and the object leaves the frame
with its items and attributes."""
import collections
import dataclasses
import functools
from dataclasses import dataclass, fields

import torch

from differential import check


@dataclass
class Scaled(collections.OrderedDict):
    a: torch.Tensor = None

    def __post_init__(self):
        self.n = 3
        self.a = self.a * 10


def post_init_stores_attributes(x):
    o = Scaled(a=x + 1)
    return o.a * o.n, o.n


def test_post_init_of_a_dict_dataclass_runs():
    # (it was skipped: a __post_init__ that changes a field gave the unchanged value)
    check(post_init_stores_attributes, [torch.ones(3), torch.randn(3)], graphs=1, breaks=0, fallbacks=0)


def post_init_object_returned(x):
    return Scaled(x)


def test_dict_dataclass_leaves_the_frame_with_its_attributes():
    check(post_init_object_returned, [torch.ones(3), torch.randn(3)], graphs=1, breaks=0, fallbacks=0)


class _OldKeywords(type):
    """Wraps the __init__ @dataclass sets on a class so that it takes `before=` for `now=`."""

    def __setattr__(cls, name, value):
        if name == "__init__":
            init = value

            @functools.wraps(init)
            def __init__(self, *args, **kwargs):
                if "before" in kwargs:
                    kwargs["now"] = kwargs.pop("before")
                init(self, *args, **kwargs)
            value = __init__
        super().__setattr__(name, value)


class Output(collections.OrderedDict, metaclass=_OldKeywords):
    """Items are the fields that are not None; attributes mirror them."""

    def __post_init__(self):
        names = fields(self)
        first = getattr(self, names[0].name)
        rest_unset = all(self.__dict__.get(f.name) is None for f in names[1:])
        if rest_unset and isinstance(first, dict):
            setattr(self, names[0].name, None)
            super().__delitem__(names[0].name)
            for k, v in first.items():
                setattr(self, k, v)
                if v is not None:
                    self[k] = v
        else:
            for f in names:
                v = self.__dict__.get(f.name)
                if v is not None:
                    self[f.name] = v

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __setattr__(self, name, value):
        if name in {f.name for f in fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclass
class Hidden(Output):
    last: torch.Tensor = None
    now: torch.Tensor = None
    extra: tuple = None


def output_read_every_way(x):
    o = Hidden(last=x + 1, before=x * 2)
    first, second = o.to_tuple()
    o.extra = (x.sin(),)
    o["now"] = o["now"] - 1
    return (o, o[0] + o["last"] + second, o[1:], len(o), list(o.keys()), o.extra[0],
            "extra" in o, o.get("missing", 5), list(o.values())[0], first)


def test_model_output_shaped_dataclass_compiles_to_one_graph():
    check(output_read_every_way, [torch.ones(3), torch.randn(3)], graphs=1, breaks=0, fallbacks=0)


def output_from_a_dict_first_field(x):
    o = Hidden({"last": x * 3, "now": None})
    return o, o[0], len(o), o.now is None


def test_post_init_that_spreads_a_dict_first_field():
    check(output_from_a_dict_first_field, [torch.ones(2), torch.randn(2)], graphs=1, breaks=0, fallbacks=0)


def output_with_none_fields(x, flag):
    o = Hidden(last=x + 1, now=None if flag else x * 2)
    return o.to_tuple(), len(o), o.now is None


def test_fields_left_none_are_not_items():
    check(output_with_none_fields, [(torch.ones(2), True), (torch.ones(2), False)],
          graphs=2, breaks=0, fallbacks=0)


class Cache:
    def __init__(self, t):
        self.t = t


@dataclass
class WithCache(Output):
    last: torch.Tensor = None
    cache: Cache = None


def output_holding_an_object(x):
    o = WithCache(last=x + 1, cache=Cache(x * 2))
    return o.cache.t + o[0], o.cache is None, o.__dict__.get("cache") is not None


def test_object_made_in_the_frame_is_not_none():
    check(output_holding_an_object, [torch.ones(2), torch.randn(2)], graphs=1, breaks=0, fallbacks=0)


class Table(collections.OrderedDict):
    def __getitem__(self, k):
        return super().__getitem__(k) * 2


def odict_views_read_the_table(x):
    t = Table(a=x, b=x + 1)
    return [v for _, v in t.items()], list(t.values()), list(t.keys()), t.get("a"), t["a"]


def test_odict_views_do_not_call_the_subclass_getitem():
    check(odict_views_read_the_table, [torch.ones(2), torch.randn(2)], graphs=1, breaks=0, fallbacks=0)


@dataclass
class Counted(dict):
    x: torch.Tensor = None
    y: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            self[f.name] = getattr(self, f.name)
        self.__dict__["total"] = len(self)


def plain_dict_dataclass(x):
    c = Counted(x, y=4)
    return c, c["x"] * c["y"] + c.total


def test_dict_dataclass_with_dict_writes_in_post_init():
    check(plain_dict_dataclass, [torch.ones(2), torch.randn(2)], graphs=1, breaks=0, fallbacks=0)


@dataclass
class Doubled(collections.OrderedDict):
    a: torch.Tensor = None

    def __post_init__(self):
        self.a = self.a * 2
        self["a"] = self.a


def post_init_changes_a_field(x):
    o = Doubled(x + 1)
    return o.a, o["a"]


def test_field_changed_by_post_init_is_the_changed_one():
    check(post_init_changes_a_field, [torch.ones(3), torch.randn(3)], graphs=1, breaks=0,
          fallbacks=0)


@dataclass
class Sized:
    a: torch.Tensor = None
    b: torch.Tensor = None

    def __len__(self):
        return 7


def len_of_a_plain_dataclass(x):
    return x * len(Sized(x))


def test_len_of_a_plain_dataclass_calls_its_len():
    check(len_of_a_plain_dataclass, [torch.ones(3), torch.randn(3)], graphs=1, breaks=0,
          fallbacks=0)
