# A/B latency, virtual ranks: this tree (new) against .ab/old-1be0c58.tar (old), alternating twice.
# Usage (device): bash .ab/ab.sh > $OUT/ab.txt
mkdir -p /tmp/old && tar -xf .ab/old-1be0c58.tar -C /tmp/old
NEW=$PWD
for v in new old new old; do
  root=$NEW; [ $v = old ] && root=/tmp/old
  for dt in float32 bfloat16; do
    for R in 2 4 8; do
      timeout 60 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype $dt --replays 11 \
        --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,1024,8192,65536 --tag $v-R$R
    done
  done
done 2>&1 | grep -a "^AB\|rror"
