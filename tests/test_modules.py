"""nn.Module targets: the wrapper, parameters and buffers as graph inputs, guards on the
module, and state passing through."""
import torch
import torch.nn.functional as F

import frametrace

from conftest import compile_with


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 4) * 0.3)
        self.bias = torch.nn.Parameter(torch.zeros(8))
        self.register_buffer("running", torch.ones(8))
        self.scale = 0.5
        self.dropout_p = 0.0

    def forward(self, x):
        h = F.linear(x, self.weight, self.bias) * self.running
        if self.training:
            h = F.dropout(h, self.dropout_p)
        return torch.relu(h) * self.scale


def test_module_compiles_to_one_graph(cnt):
    m = Net()
    x = torch.randn(3, 4)
    om = compile_with(cnt, m, fullgraph=True)
    assert isinstance(om, frametrace.OptimizedModule) and isinstance(om, torch.nn.Module)
    torch.testing.assert_close(om(x), m(x))
    torch.testing.assert_close(om(x), m(x))
    # linear, mul, relu, mul (dropout with p = 0 gives its input back: no node)
    assert cnt.frame_count == 1 and cnt.op_count == 4
    placeholders = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 4   # x, weight, bias, running


def test_attributes_and_state_dict_pass_through(cnt):
    m = Net()
    om = compile_with(cnt, m)
    assert om.weight is m.weight and om.scale == 0.5
    assert list(om.state_dict()) == list(m.state_dict()) == ["weight", "bias", "running"]
    assert [n for n, _ in om.named_parameters()] == ["weight", "bias"]
    om.scale = 2.0
    assert m.scale == 2.0
    other = Net()
    om.load_state_dict(other.state_dict())
    assert torch.equal(m.weight, other.weight)
    assert om.train() is om and m.training
    om.eval()
    assert not m.training and not om.training
    assert "Net" in repr(om)


def test_training_flag_and_attribute_changes_recompile(cnt):
    m = Net()
    om = compile_with(cnt, m)
    x = torch.randn(2, 4)
    m.eval()
    torch.testing.assert_close(om(x), m(x))
    m.train()
    torch.testing.assert_close(om(x), m(x))
    assert cnt.frame_count == 2
    m.scale = 3.0
    torch.testing.assert_close(om(x), m(x))
    assert cnt.frame_count == 3
    torch.testing.assert_close(om(x), m(x))
    assert cnt.frame_count == 3


def test_parameter_update_is_seen_without_recompile(cnt):
    m = Net().eval()
    om = compile_with(cnt, m)
    x = torch.randn(2, 4)
    om(x)
    with torch.no_grad():
        m.weight.mul_(2)
        m.running.fill_(3.0)
    torch.testing.assert_close(om(x), m(x))
    assert cnt.frame_count == 1


def test_replacing_a_parameter_is_guarded(cnt):
    m = Net().eval()
    om = compile_with(cnt, m)
    x = torch.randn(2, 4)
    om(x)
    m.weight = torch.nn.Parameter(torch.randn(8, 4))
    torch.testing.assert_close(om(x), m(x))
    m.bias = torch.nn.Parameter(torch.randn(8, dtype=torch.float64))
    m.double()
    torch.testing.assert_close(om(x.double()), m(x.double()))
    assert cnt.frame_count >= 2


def test_two_instances_of_one_class(cnt):
    a, b = Net().eval(), Net().eval()
    oa, ob = compile_with(cnt, a), compile_with(cnt, b)
    x = torch.randn(2, 4)
    torch.testing.assert_close(oa(x), a(x))
    torch.testing.assert_close(ob(x), b(x))
    torch.testing.assert_close(oa(x), a(x))
    assert cnt.frame_count == 2


def test_module_training_step_with_aot_eager():
    torch.manual_seed(0)
    m, ref = Net(), Net()
    ref.load_state_dict(m.state_dict())
    cnt = frametrace.testing.CompileCounter(inner="aot_eager")
    om = frametrace.optimize(backend=cnt, fullgraph=True)(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    for _ in range(3):
        for model, o in ((om, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x).pow(2).mean().backward()
            o.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert cnt.frame_count == 1


def test_forward_hooks_run(cnt):
    m = Net().eval()
    calls = []
    m.register_forward_hook(lambda mod, inp, out: calls.append(out.shape))
    om = compile_with(cnt, m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(om(x), m(x))
    assert len(calls) == 2 and cnt.frame_count == 1


def test_optimizing_an_optimized_module_unwraps(cnt):
    m = Net()
    om = frametrace.optimize(compile_with(cnt, m))
    assert om._orig_mod is m


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + 1


def _patch_forward(m, x):
    # nn.Module's call runs self.forward: what the frame just stored on the instance
    m.forward = lambda t: t * 7
    return m(x), m.__call__(x + 1)


def _patch_child_forward(m, x):
    m.lin.forward = lambda t: t.flip(-1) * 3
    return m(x)


def _patch_as_method(m, x):
    import types
    m.forward = types.MethodType(lambda self, t: self.lin(t) * 2, m)
    return m(x)


def test_forward_stored_on_the_instance_in_the_frame_is_the_one_called():
    # It was ignored (the class's forward ran, and the compiled call returned what the
    # unpatched module computes): now it is called in the graph, and the stores are
    # replayed on the argument (compared after each call).
    from differential import check
    for fn in (_patch_forward, _patch_child_forward):
        check(fn, [(_Block(), torch.randn(2, 4)) for _ in range(3)], breaks=0, fallbacks=0)
    # a bound method made in the frame: still right (its call runs in CPython)
    check(_patch_as_method, [(_Block(), torch.randn(2, 4)) for _ in range(2)], graphs=None)


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
        self.seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        self.n = 2

    def forward(self, x):
        for layer in self.layers[: self.n]:     # (as HF's decoders loop over their layers)
            x = layer(x)
        return x


def _inputs(n=3):
    return [(_Stack(), torch.randn(2, 4)) for _ in range(n)]


def test_a_slice_of_a_module_list_loops_in_the_graph():
    from differential import check
    check(lambda m, x: m(x), _inputs(), breaks=0, fallbacks=0)


def test_a_slice_of_a_module_container_is_a_container_of_its_class():
    # It was a list: returned as one, not callable, concatenated as lists, refused by
    # Module.__setattr__ (TypeError where CPython stores it).
    from differential import check

    def returned(m, x):
        return m.layers[1:], isinstance(m.layers[:2], torch.nn.ModuleList), type(m.seq[1:]).__name__

    def called(m, x):
        return m.seq[:2](x)

    def stored(m, x):
        setattr(m, "layers", m.layers[:1])
        return m(x)

    def added(m, x):
        return len(m.layers[::2]), m.layers[-2:][0](x), m.layers[:2] + m.layers[2:]

    for fn in (returned, called, stored, added):
        check(fn, _inputs(), graphs=None)


def test_module_tables_changed_in_the_frame_are_read_as_changed():
    # add_module / ModuleList.extend / a submodule stored as an attribute write the
    # module's tables when the graph's effects are replayed: reads of the tables after
    # them (iteration, named_children, len) saw the old tables.
    from differential import check

    def extended(m, x):
        m.layers.extend([m.layers[0]])
        return m.layers[0](x), len(m.layers), [type(c).__name__ for c in m.layers]

    def added(m, x):
        m.add_module("extra", torch.nn.Identity())
        return [n for n, _ in m.named_children()]

    def stored(m, x):
        m.head = m.layers[0]
        return [n for n, _ in m.named_modules()], len(list(m.parameters()))

    def replaced(m, x):
        m.layers[0] = m.seq[0]
        return m(x), sum(p.numel() for p in m.parameters())

    for fn in (extended, added, stored, replaced):
        check(fn, _inputs(), graphs=None)


class _MethodsFirst(torch.nn.Module):
    """Submodules, a parameter and a buffer named as methods or class attributes:
    object.__getattribute__ finds the class's (Module.__getattr__, which reads the
    tables, only runs where it finds nothing); instance attributes win over methods."""
    downsample = None

    def __init__(self):
        super().__init__()
        self.activation = torch.nn.ReLU()
        self.linear = torch.nn.Linear(4, 4)
        self.downsample = torch.nn.Linear(4, 4)
        self.t = torch.ones(4) * 0.5
        self.f = 1.5

    def activation(self, x):
        return x * 1.2

    def linear(self, x):
        return x * 2.0

    def t(self):
        return 0

    def f(self):
        return 0

    def forward(self, x):
        y = self.activation(self.linear(x + 1)) * self.t * self.f
        return y if self.downsample is None else self.downsample(y)


def test_class_attributes_come_before_the_module_tables():
    # (the submodules were taken instead of the methods: a wrong answer)
    from differential import check
    check(lambda m, x: m(x), [(_MethodsFirst(), torch.randn(2, 4)) for _ in range(3)], breaks=0)


class _Other(torch.nn.Module):
    def forward(self, x):
        return self.lin(x) * 3


class _StaticForward(torch.nn.Module):
    @staticmethod
    def forward(x):
        return x * 2 + 1


class _WithStatic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s = _StaticForward()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.s(self.lin(x))


def test_instance_and_static_forwards_are_called():
    import types
    from differential import check

    def patched():
        m = _Block()
        m.forward = types.MethodType(_Other.forward, m)
        return m

    for make in (patched, _WithStatic):
        check(lambda m, x: m(x), [(make(), torch.randn(2, 4)) for _ in range(3)], fullgraph=True)
    # the same module, its forward replaced and removed between calls: guarded
    cnt = frametrace.testing.CompileCounter()
    f = frametrace.optimize(lambda m, x: m(x), backend=cnt)
    m, x = _Block(), torch.randn(2, 4)
    torch.testing.assert_close(f(m, x), _Block.forward(m, x))
    m.forward = types.MethodType(_Other.forward, m)
    torch.testing.assert_close(f(m, x), _Other.forward(m, x))
    del m.forward
    torch.testing.assert_close(f(m, x), _Block.forward(m, x))
    assert cnt.frame_count == 2


class _Forwarding(torch.nn.Module):
    """A module that forwards self[i] and len(self) to its ModuleList."""

    def __init__(self, n=2):
        super().__init__()
        self.items = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(n)])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def forward(self, x):
        for i in range(len(self)):
            x = self[i](x)
        return x + (1 if self else 0)


class _Reversed(torch.nn.ModuleList):
    def __getitem__(self, i):
        return super().__getitem__(len(self) - 1 - i)


def test_a_modules_own_container_methods_and_identity_equality():
    from differential import check
    check(lambda m, x: m(x), [(_Forwarding(), torch.randn(2, 4)) for _ in range(3)], fullgraph=True)
    check(lambda m, x: x + 1 if m else x - 1, [(_Forwarding(0), torch.randn(2, 4)) for _ in range(2)])
    # a ModuleList subclass's own __getitem__ (its containers' was taken: a wrong answer)
    check(lambda m, x: m[0](x), [(_Reversed([torch.nn.Linear(4, 4), torch.nn.ReLU()]), torch.randn(2, 4))
                                 for _ in range(3)], fullgraph=True)

    def same_layer(m, x):
        for layer in [m.items[0], None, m.items[1]]:
            if layer is None or layer == m.items[0]:
                x = x + 1
            elif layer != m.items[0]:
                x = layer(x)
        return x

    check(same_layer, [(_Forwarding(), torch.randn(2, 4)) for _ in range(3)], fullgraph=True)
