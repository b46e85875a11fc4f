"""A side-effect tool's function kept in a module of its own, which a tool elsewhere calls
through the module (``audit_tools.write_audit(...)``) rather than by a name it imported."""

from __future__ import annotations

LEDGER: list[str] = []


def write_audit(entry: str) -> str:
    """Write an entry to the audit log (a side effect)."""
    LEDGER.append(entry)
    return "audited"
