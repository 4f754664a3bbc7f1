#!/usr/bin/env bash
# One H200, three steps, each under its own timeout, logs tarred into $OUT/logs.tgz:
#   1. a call that differs between 3 processes sharing GPU 0 (ranks 0 and 2 fp32 of n elements,
#      rank 1 bf16 of 2n) on 4c1dd9c's package (.ab/base = `git archive 4c1dd9c sollat`) and on
#      this tree (mismatch_procs.py, kept beside this script);
#   2. the decode app with the fused AllReduce + RMSNorm off and on, virtual TP 2, 4, 8;
#   3. the process launches of the GPU suite: the engine adapter core and the real-rank suite as
#      3 processes sharing GPU 0.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1
D=docs/results/2026-12-03-h200-s17a
L=$OUT/logs; mkdir -p $L
cp $D/device-script.sh $D/mismatch_procs.py $L/
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; echo "commit ${SOLLAT_COMMIT:-unknown}"; date -u +%FT%TZ; python3 -c 'import torch; print("torch", torch.__version__)'; } > $L/env.txt 2>&1
echo "== 1 mismatch ($SECONDS s)"
PYTHONPATH=$PWD/.ab/base timeout 150 torchrun --nproc-per-node 3 $D/mismatch_procs.py 4c1dd9c > $L/mismatch-4c1dd9c.txt 2>&1
echo "4c1dd9c rc $?"; grep -a "MISMATCH\|pairs" $L/mismatch-4c1dd9c.txt | tail -14
PYTHONPATH=$PWD timeout 150 torchrun --nproc-per-node 3 $D/mismatch_procs.py new > $L/mismatch-new.txt 2>&1
echo "new rc $?"; grep -a "MISMATCH\|pairs" $L/mismatch-new.txt | tail -14
unset TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES
export PYTHONPATH=$PWD
echo "== 2 decode ($SECONDS s)"
for tp in 2 4 8; do
  timeout 90 python3 -m sollat.apps.decode --virtual-tp "$tp" --layers 8 --context 4096 --batch 8 --steps 64 \
    --warmup 8 --backends sollat,sollat_fused,sollat_fused:unfused --json "$L/decode-tp$tp.json" \
    > "$L/decode-tp$tp.txt" 2>&1
  echo "TP $tp rc=$?"; grep -a -E "^sollat|^no AllReduce|result:" "$L/decode-tp$tp.txt"
done
echo "== 3 process tests ($SECONDS s)"
timeout -s INT -k 10 200 python3 -m pytest -q -ra -p no:cacheprovider --durations=10 \
  tests/gpu/test_engine_processes.py tests/gpu/test_multiprocess.py > $L/proc-tests.txt 2>&1
echo "rc $? at $SECONDS s"; tail -15 $L/proc-tests.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
