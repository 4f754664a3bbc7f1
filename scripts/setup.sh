#!/usr/bin/env bash
# Installs sollat from this checkout, editable, with the extras the main job and the tests need
# (bench, nvrtc, test). A torch already installed is kept. Without one it installs torch 2.13.0:
# the CUDA build where `nvidia-smi` sees a GPU, otherwise the CPU build from PyTorch's CPU index
# (plain PyPI's torch==2.13.0 is the CUDA build on Linux, about 2.7 GB with its CUDA packages).
# Usage:  bash scripts/setup.sh
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup.sh: takes no argument, got '$1' (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
if ! python3 -c 'import torch' 2>/dev/null; then
  if nvidia-smi -L >/dev/null 2>&1; then
    python3 -m pip install torch==2.13.0
  else
    python3 -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
fi
python3 -m pip install -e '.[bench,nvrtc,test]'
