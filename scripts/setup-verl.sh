#!/usr/bin/env bash
# Create .venv-verl (if missing) with dyngen + verl 0.9.1 on the CPU: what tests/verl needs,
# at the versions of its lock (constraints/verl.txt, made by `bash scripts/lock.sh`).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/setup-verl.sh"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-verl
LOCK=verl
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
source scripts/install.sh
# torch first and pinned: 2.13.0 is the CPU build that lies on this machine's disk (pip's
# find-links). Plain `torch`, an open range, or a package that pulls torch in before it is
# installed downloads a multi-GB CUDA build instead.
pip_install torch==2.13.0
editable_install ".[dev,reasoning-gym]"
# verl's runtime imports on the dataset code path (rl_dataset, protocol, trainer.ppo.utils,
# torchdata's StatefulDataLoader); torch repeated so nothing may move it.
pip_install torch==2.13.0 ray==2.55.1 tensordict==0.10.0 torchdata==0.11.0 \
    pillow==13.0.0 codetiming==1.4.0
# Last, without its requirements (vLLM-era pins, wandb, tensorboard, peft, ...): the
# dataset path does not use them, and --no-deps also skips pip's conflict report on them.
pip_install --no-deps verl==0.9.1
