# Sourced by bin/train and bin/test: make sure .venv holds zmq_rl and its test extras.
# shellcheck shell=bash

ensure_venv() {
    # Create .venv if missing; install torch 2.13.0 (the CPU wheel pip finds locally) first,
    # so that zmq_rl's torch>=2.2 adds nothing, then zmq_rl itself (editable) with its test
    # extras. Skipped when nothing changed since the last install.
    local py=${PYTHON:-} stamp=.venv/.zmq_rl-installed
    if [ ! -x .venv/bin/python ]; then
        if [ -z "$py" ]; then
            for candidate in python3.11 python3 python; do
                if command -v "$candidate" >/dev/null 2>&1; then py=$candidate; break; fi
            done
        fi
        if [ -z "$py" ] || ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "$0: needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
            exit 1
        fi
        echo "creating .venv with $("$py" --version 2>&1)" >&2
        "$py" -m venv .venv
        rm -f "$stamp"
    fi
    if [ -f "$stamp" ] && [ "$stamp" -nt setup.cfg ] && [ "$stamp" -nt pyproject.toml ] \
        && .venv/bin/python -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in
             ("zmq_rl", "torch", "zmq", "gymnasium", "rich", "pytest", "ruff", "psutil")))'
    then
        return 0
    fi
    echo "installing torch 2.13.0 and zmq_rl[test] into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
    touch "$stamp"
}
