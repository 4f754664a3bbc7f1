#!/usr/bin/env bash
# final call A (x2): real-rank suite at the final commit, then the 2-GPU bench (mode distributed)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
RUNS=1 RUN_TIMEOUT=330 SKEW_TIMEOUT=90 timeout 430 bash scripts/real_rank_suite.sh > /dev/null 2>&1
tail -3 $OUT/real-ranks-summary.txt
t0=$(date +%s)
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m sollat bench --quick --barrier --no-progress \
  --commit "$SOLLAT_COMMIT" --into /tmp/bench2 > $OUT/bench-console.txt 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" | tee -a $OUT/bench-console.txt
tar czf $OUT/bench2.tgz -C /tmp/bench2 . 2>/dev/null
grep -h "FAIL\|REAL-RANKS" $OUT/real-ranks-run1.txt | head -20
