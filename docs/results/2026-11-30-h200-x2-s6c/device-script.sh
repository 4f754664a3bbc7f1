#!/usr/bin/env bash
# session 6 call C (x2): the unfused hand-over of all_reduce_rmsnorm: virtual tests (every fused
# algorithm too, after the header move), the real-rank rmsnorm section, then the real-rank bench
# over rows (AUTO_FUSED_MAX_ROWS) at hidden 8192 and 4096
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 real-rank rmsnorm section (with unfused)"
SOLLAT_MP_SECTIONS=rmsnorm timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/mp_suite.py > $R/mp-rmsnorm.txt 2>&1; echo "rc=$?"; grep -a -E "FAIL|SUMMARY|calls checked" $R/mp-rmsnorm.txt | cut -c1-250 | head -8
el "2 real-rank rmsnorm bench over rows"
timeout 170 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --replays 15 --shapes 1x8192,8x8192,12x8192,16x8192,24x8192,32x8192,64x8192,128x8192,512x8192,8x4096,16x4096,32x4096,2048x8192 --commit $SOLLAT_COMMIT --into $R/rmsnorm-real > $R/rmsnorm-real.txt 2>&1; echo "rc=$?"; grep -a -v "^\[\|Warning\|warn\|\*\*\*" $R/rmsnorm-real.txt | cut -c1-200 | tail -16
el "3 virtual rmsnorm tests"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q --maxfail=5 tests/gpu/test_rmsnorm.py > $R/gpu-rmsnorm.txt 2>&1; echo "rc=$?"; grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-rmsnorm.txt | cut -c1-250 | head -12
cp .ab/s6c.sh $R/device-script.sh
tar czf $OUT/s6c.tgz -C $R .
el done
