"""Whether one daemon's reply lets ``expert-layout export`` write the layout it holds, and if not, why
and what to do. The reply is classified as an engine's startup classifies its poll
(``RankFinding.from_query_reply``): only a clean daemon with a record is exported."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from layout_sm.engine import RankFinding
from layout_sm.reasons import RESTART_DAEMONS
from layout_sm.record import LayoutRecord


def exportable_record(
    index: int, state: Mapping[str, Any], socket_path: str, then_export: str
) -> LayoutRecord | tuple[str, str]:
    """Daemon ``index``'s record, or (what keeps it from being exported, what to do: ``then_export``
    says how the operator goes on once it is done)."""
    finding = RankFinding.from_query_reply(index, state)
    if finding.kind == "record" and isinstance(finding.record, LayoutRecord):
        return finding.record
    if finding.kind == "dirty":
        return (
            f"dirty, its layout unknown: {finding.detail}",
            f"run `expert-layout repair --socket {socket_path}`, {then_export}; or {RESTART_DAEMONS}",
        )
    if finding.kind == "pending" and state.get("repairing"):
        return (
            f"reloading: {finding.detail}",
            f"wait for the reload to end (`expert-layout status` shows its progress), {then_export}",
        )
    if finding.kind == "pending":
        return (
            f"a move is pending: {finding.detail}",
            f"wait for the move to end (its engine commits or aborts it), {then_export}",
        )
    if finding.kind == "no_record":
        return (
            "keeps no layout record (started without --enable-eplb): it never records a move",
            "start the daemons with the servers' --enable-eplb",
        )
    return finding.detail, RESTART_DAEMONS
