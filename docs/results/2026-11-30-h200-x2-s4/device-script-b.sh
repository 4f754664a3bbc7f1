#!/usr/bin/env bash
# session 4 call B: README command 2 timed with one GPU visible and a cold kernel cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
python3 -m pip install -q -e '.[bench,nvrtc,test]' > $OUT/pip.txt 2>&1; echo "pip rc=$?"
rm -rf ~/.cache/sollat
nproc > $OUT/readme-env.txt; nvidia-smi -L >> $OUT/readme-env.txt
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 560 python3 -m pytest -q tests > $OUT/readme-cmd2.txt 2>&1
echo "README command 2: rc=$? $(( $(date +%s) - t0 )) s" | tee -a $OUT/readme-cmd2.txt
grep -E "^(FAILED|ERROR)|passed|failed|sollat:" $OUT/readme-cmd2.txt | head -30
