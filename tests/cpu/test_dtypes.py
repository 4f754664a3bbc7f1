from __future__ import annotations

import pytest
import torch

from sollat.device.dtypes import DTYPES, lookup
from sollat.errors import UnsupportedError

INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_float(bits: int, dtype: torch.dtype) -> torch.Tensor:
    size = DTYPES[dtype].size
    signed = bits - (1 << (8 * size)) if bits >= 1 << (8 * size - 1) else bits
    return torch.tensor([signed], dtype=INT[size]).view(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
def test_sentinel_and_canonical_nan_are_nans_and_differ(dtype: torch.dtype) -> None:
    d = DTYPES[dtype]
    assert torch.isnan(_as_float(d.sentinel, dtype)).all()
    assert torch.isnan(_as_float(d.canonical_nan, dtype)).all()
    assert d.sentinel != d.canonical_nan
    assert d.sentinel == (1 << (8 * d.size)) - 1  # all ones: one reset pattern for every dtype


def test_0x7e00_is_a_nan_in_fp16_but_not_in_bf16() -> None:
    assert torch.isnan(_as_float(0x7E00, torch.float16)).all()
    assert torch.isfinite(_as_float(0x7E00, torch.bfloat16)).all()


def test_lookup_rejects_unsupported_dtypes_clearly() -> None:
    with pytest.raises(UnsupportedError, match="int32.*supported dtypes: float32, bfloat16, float16, float64"):
        lookup(torch.int32)
