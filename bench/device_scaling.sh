#!/usr/bin/env bash
# Issue 43's device checks in one prepared run (about 9 minutes) on a lent machine with
# one CUDA GPU and 16 cores; every figure lands in OUT_DIR (default bench/results):
#   A. the CUDA tests (tests/test_device.py -k cuda)                            ~60 s
#   B. 16 cores + GPU: LunarLander-v3 launch -> 200 with 2, 4, 8 and 14 actors, rows
#      batches (the preset's 4,096 rows an update, whatever the fleet), learner on cuda
#      (bench/fleet.py --device cuda; targets: 14 actors <= 15 s and <= 0.3x the
#      time of 2)                                                               ~270 s
#   C. 16 cores: CartPole-v1 whose steps wait 10 ms, 1, 4, 16 and 32 actors, learner
#      on the CPU (bench/fleet.py --wait-ms 10)                                  ~150 s
#   D. the learner ceiling on cuda at 2 and 14 simulated actors
#      (bench/learner_ceiling.py)                                                 ~60 s
# On 2 cores (no GPU) it runs C with 1, 2, 4, 8, 16 actors and B with 2 actors on the CPU.
#
#   bash bench/device_scaling.sh [OUT_DIR]
# Env: BASE_TREE (a checkout of the revision to compare with, measured in C; default
# .base, skipped when missing), PYTHON (default python3).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-bench/results}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
base=()
[ -d "${BASE_TREE:-.base}" ] && base=(--base-tree "${BASE_TREE:-.base}")
cores=$(nproc)
gpu=$($py -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
part() { echo; echo "=== $1 ($(date +%T))"; }

if [ "$gpu" = 1 ]; then
    part "A. CUDA tests"
    timeout 90 $py -m pytest -q -p no:cacheprovider tests/test_device.py \
        -k "cuda_graph or equals_the_cpu_update or cuda_checkpoints" 2>&1 | tail -15
    part "B. 16 cores + GPU: LunarLander-v3 to 200 by actors"
    timeout 300 $py bench/fleet.py --env LunarLander-v3 --actors 2 4 8 14 --seeds 0 \
        --cap 70 --out "$out/fleet_gpu_lunarlander.json" -- --device cuda
fi

part "C. CartPole-v1, 10 ms a step, by actors"
if [ "$cores" -ge 16 ]; then
    timeout 200 $py bench/fleet.py --wait-ms 10 --actors 1 4 16 32 --seeds 0 --cap 60 \
        --out "$out/fleet_wait10_16core.json"
else
    timeout 3000 $py bench/fleet.py --wait-ms 10 --actors 1 2 4 8 16 --seeds 0 1 2 \
        "${base[@]}" --cap 400 --out "$out/fleet_wait10_2core.json"
    timeout 1800 $py bench/fleet.py --env LunarLander-v3 --actors 2 --seeds 0 --cap 600 \
        --out "$out/fleet_lunarlander_2core.json" -- --device cpu
fi

if [ "$gpu" = 1 ]; then
    part "D. learner ceiling on cuda"
    timeout 60 $py bench/learner_ceiling.py --actors 2 14 --updates 8 --device cuda \
        --out "$out/ceiling_cuda.json"
fi
echo "=== done ($(date +%T))"
