"""backend="triton": cumsum, cumprod, logcumsumexp and cummax/cummin as `tl.associative_scan`
kernels (rows in registers, or looped over row chunks with a running total), over any
dimension, fused with the pointwise and reduction work around them; run in Triton's
interpreter on the CPU and compared with eager (bf16 with a float32 scan of its values)."""
import pytest
import torch

import frametrace

pytest.importorskip("triton")
from frametrace.backends.triton import backend, last_compiled  # noqa: E402
from conftest import short_loops  # noqa: E402
from triton_harness import triton_check  # noqa: E402


pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def looped(monkeypatch):
    """Rows longer than 16 loop over chunks of 16 (the interpreter is slow on real lengths)."""
    short_loops(monkeypatch)


def compiled_run(fn, *args, kernels=None, expected=None, atol=1e-5, rtol=1e-5):
    """fn compiled with the triton backend matches eager (or `expected`), with every scan
    in a kernel; returns the CompiledModule."""
    if expected is None:
        mod = triton_check(fn, *args, atol=atol, rtol=rtol, half_as_float=True)
    else:
        # (a reference computed at a higher precision than eager's: not differential)
        got = frametrace.optimize(backend="triton", fullgraph=True)(fn)(*args)
        if isinstance(got, torch.Tensor) and got.dtype in (torch.bfloat16, torch.float16):
            assert expected.dtype == got.dtype
            got, expected = got.float(), expected.float()
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
        mod = last_compiled()
        assert mod is not None, "the graph did not go through the triton backend"
    assert not mod.externs and not mod.fallback_ops, mod.source
    assert any("tl.associative_scan" in src for src in mod.unique_kernels)
    if kernels is not None:
        assert len(mod.kernels) == kernels, mod.source
    return mod


SCANS = {"cumsum": torch.cumsum, "cumprod": torch.cumprod, "logcumsumexp": torch.logcumsumexp}


def _input(name, *shape):
    x = torch.randn(*shape)
    # products of factors near 1 stay in range over long rows
    return x * 0.2 + 1 if name == "cumprod" else x


@pytest.mark.parametrize("name", sorted(SCANS))
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_scan_over_any_dim(name, dim):
    op = SCANS[name]
    compiled_run(lambda x: op(x, dim), _input(name, 6, 37, 5), kernels=1)


@pytest.mark.parametrize("name", sorted(SCANS))
@pytest.mark.parametrize("dim", [-1, 0])
def test_long_rows_loop_with_a_running_total(name, dim, looped):
    op = SCANS[name]
    x = _input(name, 3, 70) if dim == -1 else _input(name, 70, 9)
    mod = compiled_run(lambda x: op(x, dim), x, kernels=1, atol=1e-4, rtol=1e-4)
    src = mod.kernels[0].source
    assert "for roffset in range" in src and "tl.full([XBLOCK, 1]" in src, src


def test_strided_rows_loop_across_many_rows():
    """A scan along a strided dim with long rows: blocks of neighbouring rows, looped."""
    x = torch.randn(100, 7)
    mod = compiled_run(lambda x: torch.cumsum(x, 0), x, kernels=1, atol=1e-4, rtol=1e-4)
    assert "for roffset in range" in mod.kernels[0].source


@pytest.mark.parametrize("name", sorted(SCANS))
def test_bf16_accumulates_in_float32(name):
    op = SCANS[name]
    x = _input(name, 9, 45).to(torch.bfloat16)
    # a float32 scan of the same bf16 values, rounded once
    compiled_run(lambda x: op(x, 1), x, kernels=1, expected=op(x.float(), 1).bfloat16(),
                 atol=1e-2, rtol=1.6e-2)


def test_bf16_long_rows(looped):
    x = torch.randn(3, 50).to(torch.bfloat16)
    compiled_run(lambda x: torch.cumsum(x, 1), x, kernels=1,
                 expected=torch.cumsum(x.float(), 1).bfloat16(), atol=1e-2, rtol=1.6e-2)


def test_int64_cumsum_and_cumprod():
    x = torch.randint(-3, 4, (5, 23))
    compiled_run(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 0)), x, kernels=2)


def test_int32_and_bool_cumsum_promote_to_int64(looped):
    x = torch.randint(-3, 4, (5, 23), dtype=torch.int32)
    compiled_run(lambda x: (torch.cumsum(x, 1), torch.cumsum(x > 0, 1)), x, kernels=1)


def test_cumsum_to_a_given_dtype():
    x = torch.randn(4, 19)
    compiled_run(lambda x: torch.cumsum(x, 1, dtype=torch.float64), x, kernels=1)
    compiled_run(lambda x: torch.cumsum((x * 4).long(), 1, dtype=torch.float32), x, kernels=1)


@pytest.mark.parametrize("dim", [-1, 0])
def test_prologue_scan_epilogue_one_kernel(dim):
    x = torch.randn(11, 29)
    n = x.shape[dim]
    mod = compiled_run(lambda x: torch.cumsum(x * 2 + 1, dim) / n, x, kernels=1)
    src = mod.kernels[0].source
    assert src.count("tl.load(") == 1 and src.count("tl.store(") == 1, src


@pytest.mark.parametrize("persistent", [True, False])
def test_scan_after_a_row_reduction_one_kernel(persistent, monkeypatch):
    if not persistent:
        short_loops(monkeypatch)
    x = torch.randn(6, 41)
    compiled_run(lambda x: torch.logcumsumexp(x - x.amax(-1, keepdim=True), -1), x, kernels=1)
    compiled_run(lambda x: torch.cumsum(x, 1).sum(1), x, kernels=1, atol=1e-4)


def test_scan_of_a_scan_along_the_same_rows_one_kernel(looped):
    x = torch.randn(6, 33)
    compiled_run(lambda x: torch.cumsum(torch.cumprod(x * 0.1 + 1, 1), 1), x, kernels=1,
                 atol=1e-4, rtol=1e-4)


def test_scans_along_different_dims_are_two_kernels():
    x = torch.randn(6, 33)
    compiled_run(lambda x: torch.cumsum(torch.cumsum(x, 0), 1), x, kernels=2, atol=1e-4)


def test_prologue_stored_beside_a_strided_scan():
    """A value the scan reads and the graph returns is stored at the scan's positions."""
    x = torch.randn(7, 13, 3)
    compiled_run(lambda x: (torch.cumsum(x * 2, 1), x * 2, (x * 2).sum(1)), x, kernels=1)


def test_scan_of_a_view():
    x = torch.randn(7, 37, 3)
    compiled_run(lambda x: torch.cumsum(x.transpose(0, 1), 0), x, kernels=1)
    compiled_run(lambda x: torch.cumsum(x[:, 3:30:2], 1) / (torch.arange(14)[:, None] + 1), x,
                 kernels=1)


def test_logcumsumexp_with_infinities_and_nan(looped):
    x = torch.randn(4, 40)
    x[0, :5] = float("-inf")
    x[1, 7] = float("inf")
    x[1, 9] = float("inf")
    x[2, 20] = float("nan")
    x[3] = float("-inf")
    compiled_run(lambda x: torch.logcumsumexp(x, 1), x, kernels=1)


def test_one_element_rows():
    x = torch.randn(5, 1, 3)
    got = frametrace.optimize(backend="triton", fullgraph=True)(
        lambda x: (torch.cumsum(x, 1), torch.logcumsumexp(x, 1)))(x)
    torch.testing.assert_close(got, (x, x))
    assert not last_compiled().externs


def _ties_and_nans(*shape):
    x = torch.randn(*shape).round()  # ties: torch's index is the latest one
    x[0, 5] = float("nan")
    x[1, 2:9] = float("nan")
    x[2] = float("-inf")
    x[3, 10:] = float("inf")
    return x


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("persistent", [True, False])
def test_cummax_cummin_values_and_indices(op, persistent, monkeypatch):
    if not persistent:
        short_loops(monkeypatch)
    x = _ties_and_nans(4, 23)
    mod = compiled_run(lambda x: op(x, 1), x, kernels=1)
    # values and indices come from one (value, index) scan
    assert mod.kernels[0].source.count("tl.associative_scan") == 1
    compiled_run(lambda x: op(x.t() * 2, 0).values + 1, x, kernels=1)
    compiled_run(lambda x: op((x.nan_to_num() * 3).long(), 1).indices, x, kernels=1)


def test_cummax_of_bf16_and_one_element_rows():
    x = _ties_and_nans(5, 20).to(torch.bfloat16)
    compiled_run(lambda x: torch.cummax(x, 1), x, kernels=1)
    got = frametrace.optimize(backend="triton", fullgraph=True)(lambda x: torch.cummin(x, 1))(x[:, :1])
    torch.testing.assert_close(tuple(got), tuple(torch.cummin(x[:, :1], 1)), equal_nan=True)
    assert not last_compiled().externs


@pytest.mark.parametrize("case", ["row_length", "rows", "strided"])
def test_scans_of_symbolic_sizes(case):
    fn, make = {
        "row_length": (lambda x: torch.cumsum(x * 2, -1) + 1, lambda n: torch.randn(3, n)),
        "rows": (lambda x: torch.logcumsumexp(x, 1), lambda n: torch.randn(n, 4, 3)),
        "strided": (lambda x: torch.cumsum(x, 0) / 3, lambda n: torch.randn(70, n)),
    }[case]
    f = frametrace.optimize(backend="triton", dynamic=True)(fn)
    for n in (5, 6, 11):
        x = make(n)
        torch.testing.assert_close(f(x), fn(x), atol=1e-5, rtol=1e-5)
        mod = last_compiled()
        assert mod.symbolic and not mod.externs and len(mod.kernels) == 1, mod.source
        assert "tl.associative_scan" in mod.kernels[0].source


def test_one_long_row_stays_an_aten_scan(looped):
    """One row longer than a block would be one program's serial walk: aten's device-wide
    scan stays; a row that fits a block, or many long rows, are kernels."""
    x = torch.randn(40)
    got = frametrace.optimize(backend="triton", fullgraph=True)(lambda x: torch.cumsum(x * 2, 0) + 1)(x)
    torch.testing.assert_close(got, torch.cumsum(x * 2, 0) + 1)
    assert any("cumsum" in op for op in last_compiled().fallback_ops)
    compiled_run(lambda x: torch.cumsum(x * 2, 0), torch.randn(13), kernels=1)
    compiled_run(lambda x: torch.cumsum(x * 2, 1), torch.randn(2, 40), kernels=1)
