#!/usr/bin/env bash
# session 11 call A (one H200): where the sentinel signature word's cost comes from. Variants of this
# tree: new (8-byte word sig<<32|epoch, channel 0 polls every peer's in its data loop), w32 (a 4-byte
# word sig16|epoch16), nosig (no signature word: the rest of the PTX-sound changes), old (1be0c58).
# First the mismatch tests on new (must pass) and on nosig (the sentinel cases must fail), then the
# latency A/B on virtual ranks R = 2, 4, 8 (scripts/ab_latency.py: graph of 50 calls, median of 11 replays).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SOLLAT_CACHE_DIR=/tmp/sollat-cache
D=docs/results/2026-12-02-h200-s11a
cp $D/device-script.sh $OUT/device-script.sh; nvidia-smi -L; cat .ab/commit; git log -1 --format=%H 2>/dev/null
NEW=$PWD
mkdir -p /tmp/old /tmp/w32 /tmp/nosig && tar -xf .ab/old-1be0c58.tar -C /tmp/old
for v in w32 nosig; do tar --exclude=./.ab --exclude=./docs -cf - . | tar -xf - -C /tmp/$v; done
sed -i 's/  typedef u64 Word;/  typedef u32 Word;/' /tmp/w32/sollat/csrc/include/sollat/protocol_sentinel.h
sed -i 's/static constexpr bool kSignatureLine = true;/static constexpr bool kSignatureLine = false;/' /tmp/nosig/sollat/csrc/include/sollat/protocol_sentinel.h
grep -c "typedef u32 Word" /tmp/w32/sollat/csrc/include/sollat/protocol_sentinel.h
grep -c "kSignatureLine = false" /tmp/nosig/sollat/csrc/include/sollat/protocol_sentinel.h
T="tests/gpu/test_faults.py::test_mismatch_on_a_used_shape_is_seen_by_every_rank tests/gpu/test_gather_scatter.py::test_mismatch_is_detected_on_the_device tests/gpu/test_rmsnorm.py::test_call_mismatch_is_reported tests/gpu/test_custom.py::test_mismatch_is_detected_on_the_device"
for v in new nosig; do
  root=$NEW; [ $v = nosig ] && root=/tmp/nosig
  (cd $root && timeout 200 python3 -m pytest -q -ra -p no:cacheprovider -x $T 2>&1 | tail -15) > $OUT/mismatch-tests-$v.txt 2>&1
  [ $v = nosig ] && (cd $root && timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gather_scatter.py::test_mismatch_is_detected_on_the_device tests/gpu/test_custom.py::test_mismatch_is_detected_on_the_device 2>&1 | tail -8) >> $OUT/mismatch-tests-$v.txt 2>&1
  tail -3 $OUT/mismatch-tests-$v.txt
done
for round in 1 2; do
  for v in new w32 nosig old; do
    root=$NEW; [ $v != new ] && root=/tmp/$v
    for dt in float32 bfloat16; do
      for R in 2 4 8; do
        timeout 60 env PYTHONPATH=$root python3 $root/scripts/ab_latency.py --virtual $R --dtype $dt --replays 11 --calls 50 \
          --algos oneshot_ll,oneshot_sentinel,twoshot_sentinel --sizes 4,128,8192,65536 --tag $v-R$R
      done
    done
  done 2>&1 | grep -a "^AB\|rror" >> $OUT/ab.txt
  echo "round $round done at $SECONDS s"
done
grep -c WRONG $OUT/ab.txt
