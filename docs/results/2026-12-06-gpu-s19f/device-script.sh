#!/usr/bin/env bash
# One GPU, virtual ranks: the fused kernel with a warp barrier before the parity-reuse fence,
# checked by the RMSNorm GPU tests and the batch-invariance test (the kernels they need
# precompiled first). Logs under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache PYTHONPATH=$PWD
cp docs/results/2026-12-06-gpu-s19f/device-script.sh $OUT/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; } > $OUT/env.txt 2>&1
timeout 45 python3 - > $OUT/precompile.txt 2>&1 <<'PY'
import time
from sollat.collectives import instantiations

def virtual(f: str, d: dict) -> bool:
    if f == "add_rmsnorm.cu":
        return d["SOLLAT_TABLE_RANKS"] in ("1", "2", "4", "8")
    return (d.get("SOLLAT_FENCE_SYS") == "0" and d.get("SOLLAT_OP", "OpSum") == "OpSum"
            and d.get("SOLLAT_MAX_RANKS") in ("2", "4", "8"))

t = time.monotonic()
n = instantiations.precompile(jobs=16, only=virtual)
print(f"{n} modules in {time.monotonic() - t:.1f} s")
PY
echo "precompile rc $? at $SECONDS s"; tail -1 $OUT/precompile.txt
timeout -s INT -k 5 ${TESTS_S:-110} python3 -m pytest -q -x -p no:cacheprovider --durations=3 tests/gpu/test_rmsnorm.py \
  tests/gpu/test_batch_invariance.py > $OUT/pytest-rmsnorm.txt 2>&1
echo "pytest rc $? at $SECONDS s"; tail -3 $OUT/pytest-rmsnorm.txt | cut -c1-300
