#!/usr/bin/env bash
# session 10 call C (one H200): the PTX-sound protocols (merge of protofix): the whole virtual-rank GPU
# suite at this commit, then the AllReduce latency A/B against 1be0c58, virtual ranks R = 2, 4, 8, fp32 and
# bf16, 4 B - 64 KiB, alternating twice (scripts/ab_latency.py: graph replay of 100 calls, median of 15).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
cp docs/results/2026-12-01-h200-s10c/device-script.sh $OUT/device-script.sh; nvidia-smi -L; cat .ab/commit
mkdir -p /tmp/old && tar -xf .ab/old-1be0c58.tar -C /tmp/old
NEW=$PWD
PYTHONPATH=$NEW python3 -m sollat precompile -j 16 --no-progress 2>&1 | tail -1 | tee $OUT/precompile.txt
PYTHONPATH=$NEW timeout 300 python3 -m pytest -q -ra -p no:cacheprovider tests/gpu 2>&1 | tail -25 | tee $OUT/gpu-tests.txt
for v in new old new old; do
  root=$NEW; [ $v = old ] && root=/tmp/old
  for dt in float32 bfloat16; do
    for R in 2 4 8; do
      timeout 60 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype $dt --replays 11 --calls 50 \
        --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,8192,65536 --tag $v-R$R
    done
  done
done 2>&1 | grep -a "^AB\|rror" > $OUT/ab.txt
python3 - "$OUT/ab.txt" <<'PY'
import re, sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"AB (new|old)-R(\d+) (\S+) (\S+) (\d+) B: ([\d.]+)", line)
    if m: d[(m[2], m[3], m[4], int(m[5]), m[1])].append(float(m[6]))
keys = sorted({k[:4] for k in d}, key=lambda k: (int(k[0]), k[1], k[2], k[3]))
print("R algo dtype bytes new old new/old")
for k in keys:
    n, o = d.get(k + ("new",)), d.get(k + ("old",))
    if n and o: print(*k, f"{min(n):.3f} {min(o):.3f} {min(n)/min(o):.3f}")
PY
grep -c WRONG $OUT/ab.txt
