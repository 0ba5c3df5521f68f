"""Soundness of tensors, modules and constants in the tracer: each test runs a program
in CPython and compiled (tests/differential.py) and checks what was compiled."""
import operator

import pytest
import torch

import frametrace
from differential import Call, check

S = "hello world"


# -- constant strings and bytes --
def test_substring_containment_on_constant_strings():
    def f(x):
        s = "xaby"
        return x + 1, "ab" in s, "ab" not in s, "q" in s, "" in s, "xaby" in s, "xabyz" in s, \
            "lo" in S, S.__contains__("lo")
    check(f, [torch.ones(2)], graphs=1, breaks=0)


def test_bytes_containment_and_methods():
    def f(x):
        b = b"xaby"
        return x + 1, b"ab" in b, 97 in b, b"q" not in b, b.startswith(b"xa"), b.upper(), \
            b.decode(), b[1:3], b[0], b.split(b"a"), b.hex(), b.find(b"y"), len(b)
    check(f, [torch.ones(2)], graphs=1, breaks=0)


def test_string_methods_and_membership_in_tuples_of_strings():
    def f(x):
        n = "weight"
        return x + 1, n in ("weight", "bias"), "w" in ("weight",), n in ["bias"], \
            S.startswith(("he", "x")), S.split(), S.count("o"), S[1:4], f"{S!r:>20}|{n}", \
            "%s-%d" % (n, 3), "{:>5}".format(3), n.removesuffix("ght"), n.partition("i"), \
            str.upper(n), ",".join((n, S)), n.translate({101: None}), [c for c in "ab"]
    check(f, [torch.ones(2)], graphs=1, breaks=0)


# -- graph targets FX can name --
def test_staticmethod_of_module_class_is_traced_through():
    def through_class(x):
        return x + torch.nn.Transformer.generate_square_subsequent_mask(x.shape[0])

    def through_instance(m, x):
        return x + m.generate_square_subsequent_mask(x.shape[0])
    check(through_class, [torch.ones(3, 3)], graphs=1, breaks=0)
    t = torch.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=8)
    check(through_instance, [(t, torch.ones(4, 4))], graphs=1, breaks=0)
    explained = frametrace.explain(through_class)(torch.ones(3, 3))
    assert explained.graph_count == 1 and not explained.break_reasons


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_small_transformer_end_to_end(mode):
    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=32)
    getattr(model, mode)()

    def run(m, src, tgt):
        mask = m.generate_square_subsequent_mask(tgt.shape[0])
        return m(src, tgt, tgt_mask=mask, tgt_is_causal=True)

    def detect_causal(m, src, tgt):
        # Without tgt_is_causal, nn.Transformer compares the mask's values: a graph break.
        return m(src, tgt, tgt_mask=m.generate_square_subsequent_mask(tgt.shape[0]))
    inputs = [(model, torch.randn(5, 2, 16), torch.randn(4, 2, 16))]
    check(run, inputs, graphs=1, breaks=0, rtol=1e-4, atol=1e-5)
    check(detect_causal, inputs, breaks=1, rtol=1e-4, atol=1e-5)


# -- identity of tensor results --
def test_ops_returning_self_give_the_same_tensor():
    def f(x):
        y = x * 2
        return x.add_(1) is x, x.float() is x, x.contiguous() is x, x.to(x.dtype) is x, \
            x.type_as(x) is x, x.detach() is x, x[...] is x, x.double() is x, \
            y.mul_(2) is y, y.t() is y, y.requires_grad_(False) is y, y
    check(f, [torch.ones(2, 3), torch.randn(2, 3)], graphs=1, breaks=0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_requires_grad_set_on_intermediate_is_kept(backend):
    def f(x):
        y = x * 2
        return y.requires_grad_() is y, y, y * 3
    check(f, [torch.ones(2)], backend=backend, breaks=1)


def test_returned_self_is_the_callers_tensor():
    def f(x):
        return x.add_(1), x.float()
    for backend in ("eager", "aot_eager"):
        g = frametrace.optimize(backend)(f)
        x = torch.ones(3)
        a, b = g(x)
        assert a is x and b is x and torch.equal(x, torch.full((3,), 2.0))


# -- in-place metadata changes --
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inplace_metadata_change_of_input_reaches_the_caller(backend):
    def resize(x):
        y = x * 2
        x.resize_(2, 2)
        return y, x.shape

    def needs_grad(x):
        x.requires_grad_()
        return x * 2

    def view_ops(x):
        x.t_()
        a = x.shape
        x.unsqueeze_(0)
        b = x.shape
        x.squeeze_()
        x.transpose_(0, 1)
        return x + 1, a, b, x.shape
    check(resize, [torch.arange(6.0), torch.arange(6.0) + 1], backend=backend, breaks=1)
    check(needs_grad, [torch.ones(3)], backend=backend, breaks=1)
    def out_resizes(x, y):
        torch.add(x, 1, out=y)
        return y.shape, y * 2
    check(view_ops, [torch.randn(2, 3), torch.randn(4, 5)], backend=backend, dynamic=True)
    check(out_resizes, [(torch.ones(3), torch.empty(0)), (torch.ones(3), torch.empty(0))],
          backend=backend, breaks=1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sizes_after_inplace_view_of_intermediate_are_current(backend):
    def f(x):
        y = x * 2
        y.t_()
        a = y.shape
        y.unsqueeze_(0)
        return y + 1, a, y.shape, y.size(1)
    check(f, [torch.randn(2, 3), torch.randn(4, 5), torch.randn(3, 7)], backend=backend,
          dynamic=True, graphs=1, breaks=0)


# -- the optimized module wrapper --
def test_optimized_module_follows_the_original_training_flag():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    cnt = frametrace.testing.CompileCounter()
    om = frametrace.optimize(backend=cnt)(m)
    x = torch.randn(8, 4)
    torch.manual_seed(1)
    want = m(x)
    torch.manual_seed(1)
    assert torch.equal(om(x), want) and om.training
    m.eval()
    assert om.training is False and not om.state_dict().keys() - m.state_dict().keys()
    assert torch.equal(om(x), m(x)) and cnt.frame_count == 2     # recompiled: dropout off
    om.train()
    assert m.training and m[1].training and om.training
    om.eval()
    assert not m.training and not m[1].training and not om.training
    torch.manual_seed(2)
    assert torch.equal(om(x), m(x)) and cnt.frame_count == 2


class _Tree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)
        self.b = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.register_buffer("buf", torch.ones(2))
        self.c = self.a             # shared: removed as a duplicate unless asked not to

    def forward(self, x):
        names = [n for n, _ in self.named_parameters(prefix="foo")]
        names += [n for n, _ in self.named_parameters(recurse=False)]
        names += [n for n, _ in self.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in self.named_buffers(prefix="bb", recurse=True)]
        names += [n for n, _ in self.named_modules(prefix="mm")]
        names += [n for n, _ in self.named_modules(remove_duplicate=False)]
        names += [n for n, _ in self.named_children()]
        names.append(len(list(self.parameters(recurse=False))))
        names.append(len(list(self.children())))
        first = next(self.parameters())
        total = sum(p.sum() for _, p in self.named_parameters(prefix="p", remove_duplicate=False))
        return x + first.sum() + total, names


def test_module_iterators_follow_their_arguments():
    m = _Tree()
    check(m.forward, [torch.ones(2)], graphs=1, breaks=0,
          compiled=lambda cnt: frametrace.optimize(backend=cnt)(m))


# -- isinstance / issubclass --
ACCEPT_INTS = True


class _DuckMeta(type):
    def __instancecheck__(cls, obj):
        return hasattr(obj, "shape")

    def __subclasscheck__(cls, sub):
        return ACCEPT_INTS and sub is int


class Duck(metaclass=_DuckMeta):
    pass


def test_metaclass_instancecheck_and_subclasscheck_are_followed():
    def f(x, n):
        return x + 1, isinstance(x, Duck), isinstance(n, Duck), isinstance(n, (str, Duck)), \
            issubclass(int, Duck), issubclass(float, (Duck, str)), isinstance(x, (Duck, int))
    check(f, [(torch.ones(2), 3), (torch.randn(2), 3)], graphs=1, breaks=0)

    def g(x):
        return x + 1, issubclass(int, Duck)

    global ACCEPT_INTS
    try:
        cnt = frametrace.testing.CompileCounter()
        h = frametrace.optimize(backend=cnt)(g)
        assert h(torch.ones(1))[1] is True
        ACCEPT_INTS = False          # the check read a global: the compiled code notices
        assert h(torch.ones(1))[1] is False and cnt.frame_count == 2
    finally:
        ACCEPT_INTS = True


def test_isinstance_of_legacy_tensor_types_follows_dtype():
    def f(x):
        return x + 1, isinstance(x, torch.FloatTensor), isinstance(x, torch.DoubleTensor), \
            isinstance(x, (torch.LongTensor, torch.IntTensor)), isinstance(x * 2, torch.FloatTensor), \
            isinstance(x, torch.cuda.FloatTensor), isinstance(x, torch.Tensor)
    check(f, [torch.ones(2), torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.long),
              torch.ones(2)], compiles=3, breaks=0)


# -- Hugging Face BART (small config, eval mode) --
def _small_bart(cls_name):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(
        vocab_size=100, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg).eval()


@pytest.mark.parametrize("cls_name", ["BartModel", "BartForConditionalGeneration"])
def test_bart_without_cache_matches_eager(cls_name):
    model = _small_bart(cls_name)

    def run(ids):
        out = model(input_ids=ids, use_cache=False)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    check(run, [ids], graphs=1, breaks=0, rtol=1e-4, atol=1e-5)


def test_bart_with_cache_matches_eager():
    # A graph break inside BartAttention (the EncoderDecoderCache is opaque) used to end
    # the decoder's `for idx, layer in enumerate(self.layers)` loop after the first layer.
    model = _small_bart("BartForConditionalGeneration")

    def run(ids):
        return model(input_ids=ids).logits
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    check(run, [ids], rtol=1e-4, atol=1e-5)


def test_operators_starting_with_i_that_do_not_write_stay_in_the_graph():
    # `~mask` of an expanded mask is operator.invert: not an in-place write (only iadd,
    # isub, ... are), so it is no reason to break on memory that elements share
    def f(x):
        mask = (x > 0)[:, None].expand(-1, 3)
        return (~mask).sum(), operator.index(2) * x, operator.is_(x, x)
    check(f, [(torch.randn(4),), (torch.randn(4),)], graphs=1, breaks=0)


def test_inplace_operator_on_an_expanded_tensor_still_breaks():
    def f(x, y):
        e = x[:, None].expand(-1, 3)
        e += y     # eager raises: elements of e share memory
        return e
    check(f, [(torch.randn(4), torch.randn(4, 3))])
