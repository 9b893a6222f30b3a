"""Every counter and reject reason the learner can emit is documented (issue 19, finding 7).

Reads the learner's sources for the literal codes they count -- ``ProtocolError``
reasons, ``FragmentRejected`` reasons and the problems :func:`membership._fit_problem`
returns, refuse codes, and every ``counters[...]`` key (an f-string key by its fixed
prefix) -- and checks that docs/protocol.md §7 names each one. (That every documented
counter can occur is shown by the tests that make each happen: the fuzz of
tests/test_hostile_learner_fuzz.py asserts each reject reason it provokes.)
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEARNER_SOURCES = [
    "zmq_rl/wire/protocol.py",
    "zmq_rl/wire/codec.py",
    "zmq_rl/wire/spaces.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "zmq_rl" / "learner").glob("*.py")),
]
"""Every learner module (a counter a new one adds, e.g. ``discarded/steps/stale`` of the
rows batches, must be in the page too), and the wire's decoders."""


def emitted_codes() -> dict[str, set[str]]:
    """``reasons`` (rejected/<socket>/<reason>) and ``keys`` (whole counter keys or
    their fixed prefixes) found in the learner's sources."""
    reasons: set[str] = set()
    keys: set[str] = set()
    for name in LEARNER_SOURCES:
        if not (ROOT / name).exists():
            continue
        text = (ROOT / name).read_text()
        reasons.update(re.findall(r'(?:ProtocolError|FragmentRejected)\(\s*"([a-z_]+)"', text))
        reasons.update(re.findall(r'_reject\(\s*"[a-z]+",\s*"([a-z_]+)"', text))
        reasons.update(re.findall(r'return "([a-z_]+)", ', text))  # _fit_problem, check_hello
        for key in re.findall(r'counters\[\s*f?"([^"]+)"\s*\]', text):
            keys.add(key.split("{", 1)[0])
    return {"reasons": reasons, "keys": keys}


def test_every_counter_the_learner_emits_is_documented():
    docs = (ROOT / "docs" / "protocol.md").read_text()
    found = emitted_codes()
    assert len(found["reasons"]) >= 20 and len(found["keys"]) >= 10, found  # the scan works
    missing = [r for r in sorted(found["reasons"]) if f"`{r}`" not in docs and f"/{r}`" not in docs]
    assert not missing, f"reject reasons / refuse codes not in docs/protocol.md: {missing}"

    def documented(key: str) -> bool:
        """Named whole, or as ``prefix/<why>`` with ``why`` among the listed ones."""
        prefix, _, last = key.rpartition("/")
        return f"`{key}" in docs or (f"`{prefix}/<" in docs and f"`{last}`" in docs)

    undocumented = [k for k in sorted(found["keys"]) if not documented(k)]
    assert not undocumented, f"counters not in docs/protocol.md: {undocumented}"
