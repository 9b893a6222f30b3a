#!/usr/bin/env bash
# Run every benchmark in full, one after the other (never two at once: they would
# measure each other), then profile the throughput configuration with py-spy.
# Results: bench/results/*.json; logs: bench/results/logs/*.log. Takes ~35 minutes.
# Usage: bench/run_all.sh [NAME ...]   (names: transport throughput time_to_solve
#        fan_in broadcast actor_loop launch profile; default all)
# KEEP_RAW=1 keeps py-spy's raw stacks (bench/results/profile-*.raw, for flame graphs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
LOGS=bench/results/logs
mkdir -p "$LOGS"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(transport throughput time_to_solve fan_in broadcast actor_loop
                                  launch profile)
for name in "${names[@]}"; do
    echo "== $name ($(date '+%H:%M:%S'), load $(cut -d' ' -f1-3 /proc/loadavg))"
    if [ "$name" = profile ]; then
        # py-spy (PyPI; in .venv-bench or on PATH) attached for 10 s to a throughput run
        # after its warm-up: the learner and its actor processes, 100 Hz, idle included.
        SPY=$(command -v py-spy || echo .venv-bench/bin/py-spy)
        for cfg in "2 32" "2 8" "4 32"; do
            set -- $cfg
            out=bench/results/profile-$1x$2
            "$PY" bench/throughput.py --actors "$1" --envs "$2" --warmup 8 --window 14 \
                --rounds 0 --no-baselines --out "$out.json" \
                >"$LOGS/profile-$1x$2.log" 2>&1 &
            pid=$!
            sleep 12
            "$SPY" record --idle --subprocesses -r 100 -f raw --pid "$pid" --duration 10 \
                -o "$out.raw" >>"$LOGS/profile-$1x$2.log" 2>&1 || true
            wait "$pid"
            "$PY" bench/pyspy_summary.py "$out.raw" --top 25 --json "$out.summary.json" \
                >"$out.summary.txt"
            [ "${KEEP_RAW:-0}" = 1 ] || rm -f "$out.raw"
        done
        continue
    fi
    "$PY" "bench/$name.py" 2>&1 | tee "$LOGS/$name.log"
done
