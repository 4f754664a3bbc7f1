#!/usr/bin/env bash
# session 3, x2, call 2a: handover check, max_blocks sweep, tune with the best, 2-GPU one-shot breakdown
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sc SOLLAT_COMMIT=$(cat .ab/commit) PYTHONPATH=$PWD
python3 -m sollat precompile -j 32 > $OUT/precompile.txt 2>&1
TRUN="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
AB="timeout 150 $TRUN scripts/ab_latency.py --dtype bfloat16"
S=65536,262144,1048576,4194304,16777216,67108864
timeout 150 $TRUN tests/gpu/mp_suite.py --only auto > $OUT/suite-auto.txt 2>&1; echo "suite auto rc=$?" >> $OUT/suite-auto.txt
{
  $AB --algos torch_twoshot,nccl --sizes $S --tag lib
  for mb in 16 32 64 128; do
    SOLLAT_MAX_BLOCKS=$mb $AB --algos oneshot_ll,oneshot_sentinel,twoshot_ll,twoshot_sentinel --sizes $S --tag mb$mb
  done
} 2>&1 | grep "^AB\|rror" | tee $OUT/blocks.txt
BEST=$(python3 - "$OUT/blocks.txt" <<'PY'
import re, math, collections, sys
t = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    m = re.match(r"AB mb(\d+) (\w+) \w+ (\d+) B: ([\d.]+)", l)
    if m and "WRONG" not in l:
        mb, size = int(m[1]), int(m[3])
        t[mb][size] = min(t[mb].get(size, 1e9), float(m[4]))
sizes = set.intersection(*(set(v) for v in t.values())) if t else set()
score = {mb: sum(math.log(v[s]) for s in sizes) for mb, v in t.items()}
print(min(score, key=score.get) if score else 16)
PY
)
echo "best max_blocks: $BEST" | tee -a $OUT/blocks.txt
SOLLAT_MAX_BLOCKS=$BEST timeout 240 $TRUN -m sollat tune --out /tmp/tune > $OUT/tune.txt 2>&1; echo "tune rc=$?" >> $OUT/tune.txt
cp /tmp/tune/*.json $OUT/ 2>/dev/null
{
  $AB --dtype float32 --algos oneshot_ll,oneshot_sentinel --sizes 128 --tag full
  for k in 3 2 1 4; do
    $AB --dtype float32 --algos oneshot_ll --sizes 128 --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=$k --tag bd$k
  done
  $AB --dtype float32 --algos oneshot_ll --sizes 128 --kernel-file oneshot_ll=diag_oneshot_breakdown.cu --define SOLLAT_BREAKDOWN=0 --define SOLLAT_PROTO=ProtoLLReset --tag bd0reset
  $AB --dtype float32 --algos oneshot_ll,oneshot_sentinel --sizes 128 --tag full2
} 2>&1 | grep "^AB\|rror" | tee $OUT/breakdown.txt
