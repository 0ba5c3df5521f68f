"""Layout reads (`stride()`, `is_contiguous()`) of tensors the graph computes answer
what CPython's kernels give, or break.  A FakeTensor's strides come from Python meta
functions; for some ops and input layouts they are not the kernel's (batch_norm of a
transposed input: the kernel's result is contiguous, the fake keeps the transposed
order; one_hot of a transposed index tensor likewise; roll, channel_shuffle,
max_unpool2d of channels-last ones the other way round).  variables/tensor_layout.py
lists those ops (found by tests/layout_sweep.py); a read of what they made, or of
anything computed from it, is a graph break (CPython reads the real tensor).  Reads
of inputs (strides guarded) and of what trusted ops make of them stay in the graph."""
import pytest
import torch
import torch.nn.functional as F

from differential import check


def _cl(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


_BN = torch.nn.BatchNorm1d(4).eval()


def reads(t):
    return t.is_contiguous(), t.stride(), t.is_contiguous(memory_format=torch.channels_last), \
        t.stride(0)


PRODUCERS = {
    "batch_norm_t": (lambda x: F.batch_norm(x, torch.zeros(4), torch.ones(4)),
                     lambda: torch.randn(4, 5, 3).transpose(0, 1)),
    "batch_norm_train_t": (lambda x: F.batch_norm(x, torch.zeros(4), torch.ones(4), training=True),
                           lambda: torch.randn(4, 5, 3).transpose(0, 1)),
    "batch_norm_module_t": (lambda x: _BN(x),
                            lambda: torch.randn(4, 5, 3).transpose(0, 1)),
    "instance_norm_t": (lambda x: F.instance_norm(x), lambda: torch.randn(4, 5, 3).transpose(0, 1)),
    "one_hot_t": (lambda i: F.one_hot(i, 3), lambda: torch.randint(0, 3, (4, 5)).t()),
    "roll_cl": (lambda x: torch.roll(x, 1, 1), lambda: _cl(2, 4, 3, 3)),
    "channel_shuffle_cl": (lambda x: F.channel_shuffle(x, 2), lambda: _cl(2, 4, 3, 3)),
    "max_unpool2d_cl": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
                        lambda: _cl(2, 4, 4, 4)),
    "pad_reflect_cl": (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), lambda: _cl(2, 4, 3, 3)),
    "copysign_t": (lambda x: torch.copysign(x, torch.ones(4, 5)), lambda: torch.randn(5, 4).t()),
    "glu_t": (lambda x: F.glu(x, 1), lambda: torch.randn(1, 2, 8, 6).transpose(-1, -2)),
    "bce_t": (lambda x: F.binary_cross_entropy(x.sigmoid(), torch.full((4, 5), 0.5), reduction="none"),
              lambda: torch.randn(5, 4).t()),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", list(PRODUCERS))
def test_reads_of_an_unsure_layout(name, backend):
    if name == "one_hot_t" and backend == "aot_eager":
        pytest.xfail("AOTAutograd runs one_hot decomposed (arange == index): its result "
                     "is strided as the index tensor, not as the kernel's (torch.compile too)")
    op, make = PRODUCERS[name]

    def f(x):
        y = op(x)
        return reads(y), y * 2

    r = check(f, [make(), make(), make()], backend=backend, breaks=1, max_graphs=2)
    assert any("layout" in why for why in r.reasons()), r


@pytest.mark.parametrize("name", ["batch_norm_t", "one_hot_t", "roll_cl"])
def test_reads_after_the_unsure_op(name):
    # What is computed from an unsure layout (an elementwise op, a view, a reduction over
    # one dim) has strides that follow it: unsure too.
    op, make = PRODUCERS[name]

    def f(x):
        y = op(x) + 1
        z = y.transpose(0, 1)[1:]
        w = y.sum(-1)
        return reads(y), reads(z), reads(w)

    check(f, [make(), make()], breaks=1, max_graphs=2)


def test_unsure_layout_made_sure():
    # contiguous(memory_format=...) and clone(memory_format=...) give a result of that
    # layout whatever the kernel's was; reads of those compile.  (contiguous() itself
    # breaks: whether it copies is the kernel's layout's to say.)
    def f(x):
        y = F.batch_norm(x, torch.zeros(4), torch.ones(4))
        a = y.clone(memory_format=torch.contiguous_format)
        b = torch.empty_like(y, memory_format=torch.contiguous_format)
        return reads(a), reads(b), (a + b).stride()

    check(f, [torch.randn(4, 5, 3).transpose(0, 1)] * 2, graphs=1, breaks=0)


def test_sure_layouts_read_in_the_graph():
    # Inputs of every layout, trusted ops on them, and untrusted ops on contiguous inputs.
    def f(x, c, e, s):
        return (reads(x), reads(c), reads(e), reads(s), reads(x + 1), reads(c.sin()),
                reads(e * 2), reads(s[:, 1:]), reads(x.t().mm(x)),
                reads(F.batch_norm(s.contiguous(), torch.zeros(4), torch.ones(4))),
                reads(F.one_hot(torch.arange(5) % 3, 3)),
                reads(torch.roll(x.contiguous(), 1, 0)))

    def make():
        base = torch.randn(8, 6)
        return (torch.randn(5, 4).t(), _cl(2, 3, 4, 4), torch.randn(1, 4).expand(3, 4),
                base.view(2, 4, 6)[:, :, ::2].permute(1, 0, 2)[:, :, :3].transpose(0, 1))

    check(f, [make(), make()], graphs=1, breaks=0)


def test_empty_tensors_made_in_the_graph():
    # Kernels stride empty tensors as they like (zeros_like of a sliced empty one):
    # stride() of an empty tensor made in the graph breaks; is_contiguous() is True.
    def f(x):
        y = torch.zeros_like(x)
        return y.stride(), y.is_contiguous(), x.stride()

    x = torch.randn(0, 5, 4)[:, :, ::2]
    check(f, [x, x.clone()], breaks=1, max_graphs=2)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_batch_norm_of_channels_last_keeps_a_sure_layout(backend):
    # A CNN's batch norms run on channels-last activations, where the fakes' strides are
    # the kernels' (swept): the flatten of the head, stride reads and contiguous() stay
    # in the graph.
    def f(x, w, b):
        y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True).relu()
        pooled = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        return torch.flatten(pooled, 1), y.stride(), y.is_contiguous(), y.contiguous().sum()

    def make():
        return (torch.randn(2, 4, 5, 5).contiguous(memory_format=torch.channels_last),
                torch.randn(4), torch.randn(4))
    check(f, [make(), make(), make()], backend=backend, graphs=1, breaks=0)


# -- a batch norm output's layout (found by the program fuzzer) --
def batch_norm_layout(x):
    y = torch.nn.functional.batch_norm(x, None, None, training=True)
    z = y.clone(memory_format=torch.preserve_format)
    return z.stride(), y.is_contiguous(), z


def test_layout_of_a_batch_norm_output_on_expanded_transposed_and_sliced_inputs():
    # (layouts family; 6 of 80 programs on 32f4331, none on main) strides read after a
    # batch norm of a non-contiguous input: answered from the fake tensor's layout
    calls = [(torch.arange(-1.0, 3.0).view(1, 4).expand(3, 4),),
             (torch.arange(-5.0, 7.0).view(4, 3).t(),),
             (torch.arange(-9.0, 15.0).view(3, 8)[:, ::2],)]
    r = check(batch_norm_layout, calls)
    assert r.graphs >= 1 and r.breaks >= 1      # the batch norm compiled, the stride read a break


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_group_norm_of_channels_last(backend):
    # torch 2.14's meta kernel makes a channels-last input's result contiguous, the CPU
    # kernel keeps it channels-last (2.13's meta kernel too): reads and contiguous()
    # of the result answer what CPython's give, a break on 2.14.
    def f(x, w, b):
        y = torch.native_group_norm(x, w, b, 2, 6, 15, 2, 1e-5)[0]
        z = F.group_norm(x, 2, w, b)
        return reads(y), reads(z), y.contiguous(), z.contiguous() * 2
    check(f, [(_cl(2, 6, 5, 3), torch.randn(6), torch.randn(6))] * 2, backend=backend,
          max_graphs=3)
