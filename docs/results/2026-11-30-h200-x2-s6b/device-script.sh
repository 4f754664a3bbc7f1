#!/usr/bin/env bash
# session 6 call B (x2): the fused kernels after the NVRTC 13.0 fix: real-rank rmsnorm section (as
# shipped, then with the experimental two-shot), virtual tests with the two-shot, real-rank bench
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
mp() { timeout $1 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/mp_suite.py > $2 2>&1; echo "rc=$?"; grep -a -E "FAIL|SUMMARY" $2 | cut -c1-250 | head -8; }
el "1 real-rank rmsnorm section, as shipped"
SOLLAT_MP_SECTIONS=rmsnorm mp 150 $R/mp-rmsnorm.txt
export SOLLAT_EXPERIMENTAL_RMSNORM_TWOSHOT=1
el "2 real-rank rmsnorm section with the two-shot"
SOLLAT_MP_SECTIONS=rmsnorm mp 120 $R/mp-rmsnorm-twoshot.txt
el "3 virtual rmsnorm tests with the two-shot"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q --maxfail=5 tests/gpu/test_rmsnorm.py > $R/gpu-rmsnorm-twoshot.txt 2>&1; echo "rc=$?"; grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-rmsnorm-twoshot.txt | cut -c1-250 | head -12
el "4 real-rank rmsnorm bench"
timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/rmsnorm_bench.py --replays 15 --shapes 1x8192,8x8192,32x8192,128x8192,512x8192 --commit $SOLLAT_COMMIT --into $R/rmsnorm-real > $R/rmsnorm-real.txt 2>&1; echo "rc=$?"; grep -a -v "^\[\|Warning\|warn" $R/rmsnorm-real.txt | cut -c1-300 | tail -9
cp .ab/s6b.sh $R/device-script.sh
tar czf $OUT/s6b.tgz -C $R .
el done
