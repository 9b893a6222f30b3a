"""The small hostile soak (issue 19): ``bench/hostile_soak.py --small --no-baseline``.

A real zmq-learner process trains CartPole-v1 with two real zmq-actor processes
while the soak sends every kind of hostile input (experience and control fuzz, a
hello storm, oversized frames and 8 MB hellos, forged fragments under protocol v2).
The soak checks, and this test asserts: the run was alive through the fuzz and spent
its budget, nothing hostile was trained on, the good actors lost nothing, every
fuzz message reaching the learner was counted once, the longest update gap after the
storm stayed under 1 s, and the learner's RSS after the fuzz is within +100 MB of
before. The full size is documented in docs/security.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 420.0


def test_small_hostile_soak(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "hostile_soak.py"),
            "--small",
            "--no-baseline",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    print(proc.stdout[-6000:])
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    failed = [name for name, ok in data["checks"].items() if not ok]
    assert not failed, f"soak checks failed: {failed}\n{proc.stdout[-4000:]}"
    sent = data["ledger"]["sent"]
    assert sum(sent["experience"].values()) >= 1000 and sum(sent["control"].values()) >= 1000
    assert sent["storm"]["hello"] >= 300 and sent["dropped_by_libzmq"]
    assert proc.returncode == 0
