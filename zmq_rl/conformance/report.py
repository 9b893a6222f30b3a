"""The clauses a conformance run checks and the report it prints (docs/protocol.md 11.2).

Each result is one line: ``PASS``/``FAIL``/``SKIP``, the clause's level (MUST or
SHOULD), its id, the section of docs/protocol.md, and what was seen. A run passes
when no MUST clause failed; SHOULD clauses and skipped ones are reported only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Clause", "Report", "Result"]


@dataclass(frozen=True)
class Clause:
    """One rule of docs/protocol.md that a conformance run checks."""

    id: str
    section: str
    level: str  # "MUST" or "SHOULD"
    rule: str


@dataclass
class Result:
    """What a run found for one clause."""

    clause: Clause
    status: str  # "PASS", "FAIL" or "SKIP"
    seen: str

    def line(self) -> str:
        """``PASS MUST  registration  §5.1  what was seen``."""
        c = self.clause
        return f"{self.status:4} {c.level:6} {c.id:24} §{c.section:6} {self.seen}"


@dataclass
class Report:
    """The results of one run, in clause order (a clause is reported once)."""

    subject: str
    results: dict[str, Result] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def record(self, clause: Clause, ok: bool | None, seen: str) -> None:
        """Record ``clause`` as passed (True), failed (False) or skipped (None); a
        clause already failed stays failed."""
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        old = self.results.get(clause.id)
        if old is not None and old.status == "FAIL" and status != "FAIL":
            return
        self.results[clause.id] = Result(clause, status, seen)

    def status(self, clause_id: str) -> str | None:
        """The status recorded for a clause, or None."""
        result = self.results.get(clause_id)
        return None if result is None else result.status

    def passed(self) -> bool:
        """Whether every MUST clause that was checked passed."""
        return not any(
            r.status == "FAIL" and r.clause.level == "MUST" for r in self.results.values()
        )

    def failed(self) -> list[str]:
        """The ids of the failed clauses (MUST and SHOULD)."""
        return [cid for cid, r in self.results.items() if r.status == "FAIL"]

    def lines(self) -> list[str]:
        """The report as printed: one line per clause, then the verdict."""
        out = [r.line() for r in self.results.values()]
        musts = [r for r in self.results.values() if r.clause.level == "MUST"]
        bad = [r.clause.id for r in musts if r.status == "FAIL"]
        verdict = "CONFORMS" if not bad else f"DOES NOT CONFORM (MUST failed: {', '.join(bad)})"
        out.append(f"{self.subject}: {verdict}")
        return out

    def to_json(self) -> dict[str, Any]:
        """The report for CI (``--json FILE``)."""
        return {
            "subject": self.subject,
            "passed": self.passed(),
            "clauses": [
                {**asdict(r.clause), "status": r.status, "seen": r.seen}
                for r in self.results.values()
            ],
            "notes": self.notes,
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
