"""What a dirty daemon repairs (docs/protocol.md §9): a pure decision from the daemon's view, no I/O.

A daemon turns dirty when its mover leaves mid-move (the machine's ``detach``; repairing at once
with auto repair). The record is then still the base version's: only ``store_rows`` (a commit)
changes it, commit is refused while dirty, and the detach changes the attachments, the pending move
and the dirty info, never the record. So the layers of the interrupted move are the only unknown
ones, and the record's rows for them are the base version's rows: reloading those layers' routed
experts from the checkpoint into the slots those rows give makes memory equal the record again,
every layer of it.

Going back to the base version is no ABA hazard: the map after the repair *is* that version's map
(the same digest), so whatever an engine was told about that version is true again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from layout_sm.daemon_view import DaemonView, RepairDone, RepairFailed
from layout_sm.ladders import NO_RECORD_TO_REPAIR, NOTHING_TO_REPAIR
from layout_sm.messages import RepairRequest
from layout_sm.reasons import Reason, Reply, refused
from layout_sm.record import LayoutRecord, Rows


@dataclass(frozen=True)
class RepairPlan:
    """Reload the routed experts of ``layers`` so that layer ``layers[i]`` holds ``rows[i]``; the
    daemon is then clean at ``base_version`` (``record``, unchanged). ``rejoin``: the daemon started
    again from disk reloads every layer at the record the other daemons hold."""

    layers: tuple[int, ...]
    rows: Rows
    base_version: int
    record: LayoutRecord
    rejoin: bool = False

    def to_wire(self) -> dict[str, object]:
        return {"layers": list(self.layers), "base_version": self.base_version, "digest": self.record.digest}

    def ended(self, report: Mapping[str, Any]) -> RepairDone:
        """The reload of every layer of the plan ended well; ``report``: what it read (seconds,
        ``bytes_read`` of ``checkpoint_bytes``)."""
        message = (
            f"layers {list(self.layers)} reloaded from the checkpoint in {report.get('seconds', 0):.3f} s "
            f"({report.get('bytes_read')} of {report.get('checkpoint_bytes')} checkpoint bytes); clean at "
            f"version {self.base_version}"
        )
        return RepairDone(self.layers, message, {k: v for k, v in report.items() if k != "layers"})

    def failed(self, reason: Reason, why: str) -> RepairFailed:
        """The reload failed (``Reason.REPAIR_FAILED``: a read error, a missing file) or was refused
        before it wrote anything (``Reason.REPAIR_UNSUPPORTED``); ``why``: what happened."""
        return RepairFailed(reason, why)


def repair_plan(view: DaemonView) -> RepairPlan | Reply:
    """The layers to reload and their rows for the torn move of a repairing (or dirty) daemon, or
    the refusal. Whether a repair may start is the machine's (``DaemonMachine.begin_repair``, the
    mover's detach with auto repair); this reads only what to reload."""
    record, dirty = view.record, view.dirty
    if record is None:
        return NO_RECORD_TO_REPAIR(view, RepairRequest())
    if dirty is None:
        return NOTHING_TO_REPAIR(view, RepairRequest())
    if dirty.base_version != record.version:
        # Cannot happen by the machine (see the module docstring); refused rather than trusted.
        return refused(
            Reason.REPAIR_UNSAFE,
            f"the interrupted move started from version {dirty.base_version} but the record is at "
            f"version {record.version}: the base rows are not known, so the daemon stays dirty.",
        )
    out = [layer for layer in dirty.layers if not 0 <= layer < record.num_layers]
    if not dirty.layers or out:
        return refused(
            Reason.REPAIR_UNSAFE,
            f"the interrupted move's layers {list(dirty.layers)} are not layers of the record "
            f"(0..{record.num_layers - 1}), so the daemon stays dirty.",
        )
    layers = tuple(sorted(dirty.layers))
    return RepairPlan(layers, tuple(record.rows[layer] for layer in layers), record.version, record, dirty.rejoin)
