#!/usr/bin/env bash
# final call B (x2 with one GPU visible, as the 1-GPU machine): README's two commands exactly as
# written, timed, with a cold kernel cache. pip has no network there: it reads the carried wheels.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl CUDA_VISIBLE_DEVICES=0
rm -rf ~/.cache/sollat
nproc > $OUT/readme-env.txt; nvidia-smi -L >> $OUT/readme-env.txt
t0=$(date +%s)
{ (python3 -c 'import torch' 2>/dev/null || python3 -m pip install torch==2.13.0) && python3 -m pip install -e '.[bench,nvrtc,test]' && python3 -m sollat bench --quick; } > $OUT/readme-cmd1.txt 2>&1
echo "README command 1: rc=$? $(( $(date +%s) - t0 )) s" | tee -a $OUT/readme-cmd1.txt
t0=$(date +%s)
timeout 420 python3 -m pytest -q tests > $OUT/readme-cmd2.txt 2>&1
echo "README command 2: rc=$? $(( $(date +%s) - t0 )) s" | tee -a $OUT/readme-cmd2.txt
tail -3 $OUT/readme-cmd2.txt
