"""Class lookups made by the attribute protocol (frametrace/variables/attributes.py) and
by nn.Module stores are guarded: patching a class between calls (a method, a property,
__getattr__, __setattr__, a metaclass's __instancecheck__) recompiles or still gives
CPython's answer.  Each test changes the class with `Then` (test_outside_state_guards.py)."""
import torch

from differential import check
from test_outside_state_guards import Then


def x():
    return torch.arange(4.0)


class Scaler:
    def __init__(self, k):
        self.k = k

    def scale(self, v):
        return v * self.k


SCALER = Scaler(2)


def uses_outside_object(v):
    return SCALER.scale(v)


def test_method_of_outside_object_replaced_on_its_class_is_seen():
    original = Scaler.scale
    try:
        check(uses_outside_object, [x(), Then(lambda: setattr(Scaler, "scale", lambda self, v: v - self.k), x())])
    finally:
        Scaler.scale = original


def uses_new_object(v):
    return Scaler(3).scale(v)


def test_method_of_object_made_in_frame_replaced_on_its_class_is_seen():
    original = Scaler.scale
    try:
        check(uses_new_object, [x(), Then(lambda: setattr(Scaler, "scale", lambda self, v: v + self.k), x())])
    finally:
        Scaler.scale = original


class Holder:
    def __init__(self):
        self.k = 2


def reads_new_object_attribute(v):
    return v * Holder().k


def test_property_added_over_an_instance_attribute_is_seen():
    try:
        check(reads_new_object_attribute,
              [x(), Then(lambda: setattr(Holder, "k", property(lambda self: 5, lambda self, val: None)), x())])
    finally:
        del Holder.k


class Fallback:
    def __getattr__(self, name):
        return 1


def reads_missing_attribute(v):
    return v * Fallback().missing


def test_getattr_hook_replaced_is_seen():
    try:
        check(reads_missing_attribute, [x(), Then(lambda: setattr(Fallback, "__getattr__", lambda self, n: 4), x())])
    finally:
        Fallback.__getattr__ = lambda self, name: 1


class Plain:
    pass


def stores_then_reads(v):
    p = Plain()
    p.k = 3
    return v * p.k


def test_setattr_hook_added_is_seen():
    def hook(self, name, value):
        object.__setattr__(self, name, value * 10)
    try:
        check(stores_then_reads, [x(), Then(lambda: setattr(Plain, "__setattr__", hook), x())])
    finally:
        del Plain.__setattr__


class Net(torch.nn.Module):
    def forward(self, v):
        self.scale = 2
        return v * self.scale


NET = Net()


def calls_net(v):
    return NET(v)


def test_module_property_added_over_a_stored_attribute_is_seen():
    prop = property(lambda self: 7, lambda self, val: None)
    try:
        check(calls_net, [x(), Then(lambda: (NET.__dict__.pop("scale", None), setattr(Net, "scale", prop)), x())])
    finally:
        del Net.scale


class Meta(type):
    def __instancecheck__(cls, obj):
        return True


class Anything(metaclass=Meta):
    pass


def checks_instance(v):
    return v + 1 if isinstance(v, Anything) else v - 1


def test_metaclass_instancecheck_replaced_is_seen():
    try:
        check(checks_instance, [x(), Then(lambda: setattr(Meta, "__instancecheck__", lambda cls, obj: False), x())])
    finally:
        Meta.__instancecheck__ = lambda cls, obj: True
