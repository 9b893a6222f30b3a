# Sourced by bin/train and bin/test: make sure .venv holds zmq_rl, with the test extras
# for bin/test.
# shellcheck shell=bash

ensure_venv() {
    # ensure_venv train|test. Create .venv if missing; install torch 2.13.0 (the CPU wheel
    # pip finds locally) first, so that the learner extra's torch>=2.2 adds nothing, then
    # zmq_rl itself (editable) with its learner extra: for "train" only the learner's
    # runtime (what `zmq-rl run --env CartPole-v1` imports: pyzmq, msgpack, numpy,
    # gymnasium, torch, matplotlib, rich), for "test" with the test extras (every env,
    # export, tracking and cluster package the suite uses).
    # Skipped when nothing changed since the last install of that level or above: the
    # stamp file holds the level installed ("test" serves train; "train" does not serve
    # test; an empty stamp, written before levels existed, was a test install).
    local level=${1:?ensure_venv needs train or test} py=${PYTHON:-} stamp=.venv/.zmq_rl-installed
    local target='.[learner]' installed=""
    local modules='"zmq_rl", "torch", "zmq", "gymnasium", "rich", "matplotlib"'
    case "$level" in
        train) ;;
        test) target='.[learner,test]'; modules+=', "pytest", "ruff", "psutil"' ;;
        *) echo "ensure_venv: unknown level '$level' (train or test)" >&2; exit 2 ;;
    esac
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
    if [ -f "$stamp" ]; then
        installed=$(head -n 1 "$stamp")
        installed=${installed:-test}
    fi
    if [ -n "$installed" ] && { [ "$level" = train ] || [ "$installed" = test ]; } \
        && [ "$stamp" -nt setup.cfg ] && [ "$stamp" -nt pyproject.toml ] \
        && .venv/bin/python -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ($modules)))"
    then
        return 0
    fi
    # A test install keeps serving train after setup.cfg changes: reinstall what it had.
    if [ "$installed" = test ]; then
        level=test target='.[learner,test]'
    fi
    echo "installing torch 2.13.0 and zmq_rl${target#.} ($level) into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target"
    echo "$level" >"$stamp"
}

extra_name() {
    # extra_name NAME: NAME normalised as PEP 685 says (multi_agent and Multi.Agent are
    # multi-agent; Python 3.11's bundled pip (23.x) compares the name as given with the
    # normalised one setuptools writes into the metadata, and installs nothing when they
    # differ). A name that is not an extra of setup.cfg stops here, before any install,
    # listing them.
    local name=${1:?extra_name needs the name of an extra} known
    name=$(printf '%s' "$name" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/-/g')
    known=$(awk '/^\[options\.extras_require\]/ {on = 1; next} /^\[/ {on = 0}
        on && /^[A-Za-z0-9][A-Za-z0-9._-]* *=/ {sub(/ *=.*/, ""); print tolower($0)}' setup.cfg \
        | sed -E 's/[-_.]+/-/g')
    if ! printf '%s\n' $known | grep -qx -- "$name"; then
        echo "$0: --extra ${1}: not an extra of zmq_rl (setup.cfg has: $(echo $known))" >&2
        exit 2
    fi
    printf '%s\n' "$name"
}

ensure_extra() {
    # ensure_extra NAME: `pip install -e '.[NAME]'` into .venv unless done since setup.cfg
    # last changed (a stamp per extra; NAME as extra_name gives it). The stamp is written
    # only after pip installed the extra.
    local name=${1:?ensure_extra needs the name of an extra} stamp output
    stamp=.venv/.zmq_rl-extra-$name
    if [ -f "$stamp" ] && [ "$stamp" -nt setup.cfg ]; then
        return 0
    fi
    echo "installing zmq_rl[$name] into .venv" >&2
    if ! output=$(.venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -e ".[$name]" 2>&1); then
        printf '%s\n' "$output" >&2
        echo "$0: installing zmq_rl[$name] failed (see pip's output above)" >&2
        exit 1
    fi
    [ -z "$output" ] || printf '%s\n' "$output" >&2
    if printf '%s\n' "$output" | grep -q "does not provide the extra"; then
        echo "$0: pip installed nothing for zmq_rl[$name] (see its warning above)" >&2
        exit 1
    fi
    touch "$stamp"
}
