#!/usr/bin/env bash
# Issue 28's device checks in one prepared run (about 8 minutes) on a lent machine with
# one CUDA GPU and 16 cores; every figure lands in OUT_DIR (default bench/results):
#   A. per-minibatch cost of the PPO update on cuda with and without CUDA graphs, and on
#      one CPU thread (bench/gpu_check.py --only-update)                          ~70 s
#   B. the CUDA tests (tests/test_device.py -k cuda)                            ~60 s
#   C. 2 cores: LunarLander-v3 time to score, 2 actors, each run pinned to 2 cores of its
#      own, 8 runs at once: the base revision and this tree, each with its preset and a
#      larger-minibatch variant, 2 seeds each, learner on the CPU (bench/scaling.py
#      --pin 2; the machine's cores are about half as fast as the 2-core CI box's)  ~150 s
#   D. 16 cores + GPU: LunarLander-v3 time to score with 2, 8, 14 actors, learner on
#      cuda (bench/scaling.py --device cuda)                                    ~150 s
#   E. the learner ceiling on cuda at 2 and 14 simulated actors, and on one CPU thread
#      at 2 against the base revision (bench/learner_ceiling.py)                ~90 s
#   F. launch order with spare cores: launch -> first update with the actors started
#      after the learner is built vs while it imports torch (bench/launch.py;
#      on 2 cores the two are equal, docs/benchmarks.md §23)                      ~15 s
# On 2 cores (no GPU) it runs C with 1-2 actors unpinned and E on the CPU only.
#
#   bash bench/device_scaling.sh [OUT_DIR]
# Env: BASE_TREE (a checkout of the revision to compare with; default .base, skipped
# when missing), PYTHON (default python3).
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
    part "A. per-minibatch cost"
    timeout 70 $py bench/gpu_check.py --only-update --updates 3 --out "$out/gpu_update.json"
    part "B. CUDA tests"
    timeout 90 $py -m pytest -q -p no:cacheprovider tests/test_device.py \
        -k "cuda_graph or equals_the_cpu_update or cuda_checkpoints" 2>&1 | tail -15
fi

part "C. 2 cores: time to score"
if [ "$cores" -ge 16 ]; then
    timeout 150 $py bench/scaling.py --pin 2 --actors 2 --seeds 0 1 --cap 120 --env-seconds 2 \
        "${base[@]}" --variant "preset=" --variant "mb512=--minibatch-size 512 --learning-rate 1e-3" \
        --out "$out/scaling_2core.json" -- --device cpu
else
    timeout 900 $py bench/scaling.py --seeds 0 1 2 "${base[@]}" --out "$out/scaling_2core.json" \
        -- --device cpu
fi

if [ "$gpu" = 1 ]; then
    part "D. 16 cores + GPU: time to score by actors"
    timeout 140 $py bench/scaling.py --actors 2 8 14 --seeds 0 --cap 38 --env-seconds 2 \
        --out "$out/scaling_gpu.json" -- --device cuda --num-minibatches 64
    part "E. learner ceiling"
    timeout 60 $py bench/learner_ceiling.py --actors 2 14 --updates 8 --device cuda \
        --out "$out/ceiling_cuda.json" -- --num-minibatches 64
fi
timeout 75 $py bench/learner_ceiling.py --actors 2 --updates 8 "${base[@]}" \
    --out "$out/ceiling_cpu.json"
if [ "$cores" -ge 4 ]; then
    part "F. launch order"
    timeout 40 $py bench/launch.py --rounds 2 --out "$out/launch.json"
fi
echo "=== done ($(date +%T))"
