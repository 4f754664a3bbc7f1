#!/usr/bin/env bash
# session 6 call E (x2), final commit: the apps' GPU tests (virtual TP fused/unfused, 2-GPU torchrun)
# and the fused tests that name auto or torch.compile
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 apps GPU tests"
timeout 150 python3 -m pytest -q tests/gpu/test_apps_gpu.py > $R/gpu-apps.txt 2>&1; echo "rc=$?"; grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-apps.txt | cut -c1-250 | head
el "2 rmsnorm auto/compile tests"
left=$(( 225 - ($(date +%s) - T0) ))
CUDA_VISIBLE_DEVICES=0 timeout $left python3 -m pytest -q tests/gpu/test_rmsnorm.py -k "auto or compile or fault" > $R/gpu-rmsnorm.txt 2>&1; echo "rc=$? (limit $left s)"; grep -a -E "^FAILED|^ERROR|passed|failed" $R/gpu-rmsnorm.txt | cut -c1-250 | head
cp .ab/s6e.sh $R/device-script.sh
tar czf $OUT/s6e.tgz -C $R .
el done
