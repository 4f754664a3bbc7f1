"""No built-in kernel instantiation spills registers, for sm_90 and sm_100 (ptxas -v through NVRTC,
no GPU and no CUDA toolkit needed: sollat/device/resources.py). A kernel's registers per thread are
bounded by its threads per block (abi.KERNELS, abi.SPILL_FREE_THREADS); docs/design.md, "Writing a
collective with the device API", says how a kernel keeps within them. To list what spills:

    PYTHONPATH=. python3 tests/cpu/test_spills.py
"""

from __future__ import annotations

import os

import pytest

from sollat.collectives import instantiations
from sollat.device import resources

cuda_core = pytest.importorskip("cuda.core")

ARCHS = ("sm_90", "sm_100")

_LOG = """\
ptxas info    : 215 bytes gmem
ptxas info    : Compiling entry function 'twoshot' for 'sm_90'
ptxas info    : Function properties for helper
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for twoshot
ptxas         .     64 bytes stack frame, 258 bytes spill stores, 156 bytes spill loads
ptxas info    : Used 128 registers, used 0 barriers, 64 bytes cumulative stack size
ptxas info    : Compile time = 204.738 ms
"""

# 64 live floats per thread, each used against all the others: at 32 registers per thread
# (__launch_bounds__(1024, 2)) ptxas must spill; at 1 block of 64 threads it has 255 and need not.
_PRESSURE = """
extern "C" __global__ void __launch_bounds__(%(threads)d, %(blocks)d) pressure(float* p, int n) {
  float a[%(live)d];
#pragma unroll
  for (int i = 0; i < %(live)d; ++i) a[i] = p[i * n + threadIdx.x];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < %(live)d; ++i)
#pragma unroll
    for (int j = 0; j < %(live)d; j += 8) s += a[i] * a[(i + j) %% %(live)d];
  p[threadIdx.x] = s;
}
"""


def jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def spilled(arch: str) -> dict[str, list[int]]:
    """Every instantiation that spills for ``arch``: module_key -> [bytes stored, bytes loaded]."""
    work = list(instantiations.all_instantiations())
    report = instantiations.resource_report(arch, jobs=jobs())
    assert len(report) == len(work) >= 100
    out = {}
    for filename, defines, funcs in report:
        assert funcs, (filename, defines)
        if any(f.spills for f in funcs):
            out[module_key(filename, defines)] = [sum(f.spill_stores for f in funcs), sum(f.spill_loads for f in funcs)]
    return dict(sorted(out.items()))


def module_key(filename: str, defines: dict[str, str]) -> str:
    """An instantiation as the failure lists it: the kernel file and its sorted defines."""
    return filename + " " + " ".join(f"{k}={v}" for k, v in sorted(defines.items()))


def test_ptxas_log_is_parsed() -> None:
    got = resources.parse_ptxas_log(_LOG)
    assert [(f.name, f.stack_frame, f.spill_stores, f.spill_loads, f.registers) for f in got] == [
        ("helper", 8, 0, 0, None), ("twoshot", 64, 258, 156, 128)]
    assert got[1].spills and not got[0].spills
    with pytest.raises(ValueError, match="no stack frame"):
        resources.parse_ptxas_log("ptxas info    : Function properties for k\nsomething else\n")


@pytest.mark.parametrize("arch", ARCHS)
def test_a_forced_spill_is_seen_and_a_clean_build_is_not(arch: str) -> None:
    """The detector itself: a kernel that cannot fit 32 registers spills, the same kernel with 255
    registers does not, and the registers ptxas used are reported."""
    tight = resources.compile_resources(_PRESSURE % {"threads": 1024, "blocks": 2, "live": 64}, arch=arch)
    assert [f.name for f in tight] == ["pressure"]
    assert tight[0].spills and tight[0].spill_stores > 0 and tight[0].spill_loads > 0, tight
    assert tight[0].registers is not None and tight[0].registers <= 32, tight
    roomy = resources.compile_resources(_PRESSURE % {"threads": 64, "blocks": 1, "live": 64}, arch=arch)
    assert not roomy[0].spills and roomy[0].stack_frame == 0, roomy
    assert roomy[0].registers is not None and roomy[0].registers > 64, roomy


@pytest.mark.slow  # every instantiation compiled for one arch: minutes on 2 cores
@pytest.mark.parametrize("arch", ARCHS)
def test_no_instantiation_spills(arch: str) -> None:
    spilled_now = spilled(arch)
    assert not spilled_now, (f"{len(spilled_now)} instantiations spill for {arch} (bytes stored, loaded): "
                             + "; ".join(f"{k}: {v}" for k, v in spilled_now.items()))


if __name__ == "__main__":
    for arch in ARCHS:
        print(arch, spilled(arch) or "nothing spills")
