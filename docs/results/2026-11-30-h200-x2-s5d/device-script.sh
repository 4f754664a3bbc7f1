#!/usr/bin/env bash
# session 5 call D (x2): the whole real-rank suite at HEAD (with the compile-skew launch if time allows),
# then the AG/RS bench (ReduceScatter rows, 512 KiB), then virtual-rank decode ITL with the fused path
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD SOLLAT_CACHE_DIR=/tmp/sollat-cache
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
R=/tmp/r; mkdir -p $R
el "1 real-rank suite"
OUT=$R RUNS=1 SKEW=0 RUN_TIMEOUT=260 timeout 330 bash scripts/real_rank_suite.sh > /dev/null 2>&1
tail -1 $R/real-ranks-summary.txt
grep -h "fail\|FAIL\|symmetric:\|SUMMARY" $R/real-ranks-run1.txt | head -16
el "2 AG/RS bench real"
timeout 45 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gather_scatter_bench.py --commit $SOLLAT_COMMIT --into $R/gs-real > $R/gs-real.txt 2>&1; echo "rc=$?"; grep -E "^ *(all_gather|reduce_scatter|floor)" $R/gs-real.txt | cut -c1-200 | head -30
el "3 virtual decode ITL (TP 2 on GPU 0, 8 layers of Llama-3.1-70B)"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m sollat.apps.decode --virtual-tp 2 --layers 8 --context 4096 --steps 32 --backends reference,sollat,sollat_fused --json $R/decode-virtual.json > $R/decode-virtual.txt 2>&1; echo "rc=$?"; tail -12 $R/decode-virtual.txt | cut -c1-200
cp .ab/s5d.sh $R/device-script.sh
tar czf $OUT/s5d.tgz -C $R .
el done
