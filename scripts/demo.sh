#!/usr/bin/env bash
# Demo: Inductor autotunes custom ops with collective implementations (CPU/gloo by default).
#
# Sets up .venv/ (scripts/bootstrap.sh), then runs
# scripts/demo_collective_autotuning.py under torchrun on one machine.
#
#   ./scripts/demo.sh                                 # 2 ranks, all four collectives
#   NPROC=3 ./scripts/demo.sh --ops all_reduce        # 3 ranks, one collective
#   ./scripts/demo.sh --numel 1048576 --nruns 50      # bigger inputs, more runs
#   ./scripts/demo.sh --device cuda                   # tensors on the GPU (NCCL with
#                                                     # a GPU per rank, else gloo)
#
# NPROC: number of ranks (default 2).  Other arguments go to the Python script
# (--numel, --nruns, --warmup, --device, --ops; see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# One intra-op thread per rank, set explicitly so torchrun does not warn about it.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/torchrun --standalone --nproc-per-node "${NPROC:-2}" scripts/demo_collective_autotuning.py "$@"
