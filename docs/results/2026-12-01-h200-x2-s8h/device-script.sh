#!/usr/bin/env bash
# session 8 call H (x2, 2026-12-01): where the one-shot's 128 B goes on 2 GPUs, at the final commit
# (csrc/kernels/diag_oneshot_breakdown.cu; results of the diagnostic builds are wrong on purpose)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp .ab/s8h.sh $OUT/device-script.sh; echo "commit $SOLLAT_COMMIT"
AB="timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/ab_latency.py"
{
  $AB --dtype float32 --algos oneshot_ll,oneshot_sentinel --sizes 128 --tag full
  for k in 3 2 1 4; do
    $AB --dtype float32 --algos oneshot_ll --sizes 128 --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=$k --tag bd$k
  done
  $AB --dtype float32 --algos oneshot_ll --sizes 128 --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=0 --tag bd0
  $AB --dtype float32 --algos oneshot_ll,oneshot_sentinel --sizes 128 --tag full2
  for k in 3 2 1 4; do
    $AB --dtype float32 --algos oneshot_ll --sizes 128 --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=$k --tag bd$k-again
  done
} 2>&1 | grep -a "^AB\|rror" | tee $OUT/breakdown.txt
