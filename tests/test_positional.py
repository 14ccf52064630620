"""Sinusoidal positional encoding (csrc/positional.c): the specification.

PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model))
(paper, section 3.5), computed in double and rounded to float32 once. Tolerance: at most
MAX_ULP float32 ulp from the float64 numpy table rounded once (libm and numpy may differ in the
last double bit, which can move a float32 rounding by one step); nearly all entries identical.
"""

import numpy as np
import pytest

from transformer import _C, ops

from conftest import num_threads

MAX_ULP = 1


def pe_ref(max_len, d_model):
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / d_model)
    table = np.empty((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return table.astype(np.float32)


def assert_table_equal(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == np.float32
    ulps = np.abs(actual.view(np.int32).astype(np.int64) - expected.view(np.int32).astype(np.int64))
    # sin/cos change sign through 0: compare the values there too
    ulps = np.where(np.sign(actual) != np.sign(expected), np.abs(actual - expected) / 1e-45, ulps)
    assert ulps.max(initial=0) <= MAX_ULP, f"max ulp difference {ulps.max()}, max |diff| {np.abs(actual - expected).max()}"
    assert (ulps == 0).mean() > 0.999 if ulps.size else True



@pytest.mark.parametrize("max_len, d_model", [(1, 1), (1, 2), (5, 1), (7, 3), (50, 16), (33, 17),
                                              (64, 63), (128, 65), (512, 512), (0, 8), (3, 0)])
def test_table_matches_float64_reference(max_len, d_model):
    out = np.full((max_len, d_model), np.nan, dtype=np.float32)
    _C.positional_encoding(out)
    assert_table_equal(out, pe_ref(max_len, d_model))


def test_paper_definition_on_known_values():
    pe = ops.positional_encoding(3, 4)
    assert np.array_equal(pe[0], [0, 1, 0, 1])
    assert pe[1, 0] == np.float32(np.sin(1.0)) and pe[1, 1] == np.float32(np.cos(1.0))
    assert pe[2, 2] == np.float32(np.sin(2 / 100.0)) and pe[2, 3] == np.float32(np.cos(2 / 100.0))


def test_odd_d_model_ends_with_a_sine_column():
    pe = ops.positional_encoding(10, 5)
    assert_table_equal(pe[:, 4], np.sin(np.arange(10) / 10000.0 ** (4 / 5)).astype(np.float32))


def test_same_bits_on_one_and_two_threads():
    tables = []
    for n in (1, 2):
        with num_threads(n):
            tables.append(ops.positional_encoding(400, 96))
    assert np.array_equal(tables[0], tables[1])


def test_matches_torch_float64_formula():
    torch = pytest.importorskip("torch")
    import math
    max_len, d_model = 100, 32
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    ours = ops.positional_encoding(max_len, d_model)
    assert np.abs(ours - pe.numpy()).max() <= 6e-8


def test_ops_positional_encoding_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_len"):
        ops.positional_encoding(-1, 8)
    with pytest.raises(ValueError, match="d_model"):
        ops.positional_encoding(4, 0)
    with pytest.raises(TypeError, match="max_len"):
        ops.positional_encoding(4.0, 8)
    with pytest.raises(TypeError, match="d_model"):
        ops.positional_encoding(4, True)


def test_strict_door_rejects_bad_out():
    out = np.zeros((4, 8), np.float32)
    ro = out.copy()
    ro.flags.writeable = False
    cases = [
        (TypeError, lambda: _C.positional_encoding(out.astype(np.float64))),
        (TypeError, lambda: _C.positional_encoding(out.astype(np.float16))),
        (TypeError, lambda: _C.positional_encoding([[0.0]])),
        (ValueError, lambda: _C.positional_encoding(out[0])),
        (ValueError, lambda: _C.positional_encoding(out[None])),
        (ValueError, lambda: _C.positional_encoding(out[:, ::2])),
        (ValueError, lambda: _C.positional_encoding(out.T)),
        (ValueError, lambda: _C.positional_encoding(ro)),
    ]
    for exc, call in cases:
        with pytest.raises(exc, match="out"):
            call()
