"""``layout_sm.durable``: what a daemon's writer writes (``copy_due``, the spec's ``Persist``) and what a
starting daemon makes of the file it finds (``read_copy``): a whole copy of its own checkpoint and
configuration is its record; every other file gets its kind and a reason, and the initial layout."""

from __future__ import annotations

import json

import pytest

from layout_sm.daemon_view import DaemonView, DirtyInfo, Move
from layout_sm.durable import COPY_FORMAT_VERSION, CopyOwner, copy_bytes, copy_due, owner_digest, read_copy
from layout_sm.record import LayoutRecord

INITIAL = LayoutRecord.initial([[0, 1, 2, 3], [0, 1, 2, 3]], 4)
MOVED = INITIAL.with_rows([1], [[3, 2, 1, 0]])
OWNER = CopyOwner("/models/tiny@", owner_digest({"tp_rank": 0, "tp_size": 2}))


def test_the_owner_digest_changes_with_any_field_and_not_with_their_order() -> None:
    a = owner_digest({"tp_rank": 0, "tp_size": 2})
    assert a == owner_digest({"tp_size": 2, "tp_rank": 0})
    assert a != owner_digest({"tp_rank": 1, "tp_size": 2}) != owner_digest({"tp_rank": 0, "tp_size": 2, "dtype": "x"})


def test_a_whole_copy_is_the_record_it_was_written_from() -> None:
    read = read_copy(copy_bytes(MOVED, OWNER), OWNER, INITIAL)
    assert (read.kind, read.record, read.set_aside) == ("whole", MOVED, False)
    assert read.record is not None and read.record.version == 1 and read.record.digest == MOVED.digest


def test_no_file_starts_at_the_initial_layout_and_sets_nothing_aside() -> None:
    read = read_copy(None, OWNER, INITIAL)
    assert (read.kind, read.record, read.set_aside) == ("missing", None, False)


def _edited(edit: object) -> bytes:
    body = json.loads(copy_bytes(MOVED, OWNER))
    edit(body)  # type: ignore[operator]
    return json.dumps(body).encode()


def _corrupt(body: dict) -> None:
    body["record"]["map"][1][0] = 2  # a map the digest does not name (a flipped bit on disk)


@pytest.mark.parametrize(
    ("data", "kind", "said"),
    [
        (copy_bytes(MOVED, OWNER)[:40], "torn", "not whole JSON"),
        (b"", "torn", "not whole JSON"),
        (b"[1, 2]", "torn", "not a JSON object"),
        (_edited(_corrupt), "corrupt", "digest"),
        (_edited(lambda b: b.update(format_version=COPY_FORMAT_VERSION + 1)), "other_format", "this daemon reads"),
        (_edited(lambda b: b["owner"].update(checkpoint="/models/other@")), "other_checkpoint", "/models/other@"),
        (_edited(lambda b: b["owner"].update(config="0" * 32)), "other_config", "another rank"),
        (
            copy_bytes(LayoutRecord.initial([[0, 1, 2, 3]], 4), OWNER),
            "other_config",
            "shape [1, 4]",
        ),
    ],
    ids=["truncated", "empty", "not-an-object", "corrupt", "format", "checkpoint", "config", "shape"],
)
def test_a_file_the_daemon_cannot_use_is_set_aside_with_its_reason(data: bytes, kind: str, said: str) -> None:
    read = read_copy(data, OWNER, INITIAL)
    assert (read.kind, read.record, read.set_aside) == (kind, None, True), read
    assert said in read.why, read.why


def test_the_writer_writes_the_committed_record_once() -> None:
    clean = DaemonView(MOVED)
    assert copy_due(clean, None) == MOVED
    assert copy_due(clean, INITIAL) == MOVED  # behind: due
    assert copy_due(clean, MOVED) is None  # written: nothing due
    # A move pending: its base is the committed record, and still due where the copy is older.
    pending = DaemonView(MOVED, attachments={"e": "s"}, pending=Move("e", "s", (0,), 1))
    assert copy_due(pending, INITIAL) == MOVED


@pytest.mark.parametrize("repairing", [False, True])
def test_a_dirty_or_repairing_daemon_writes_nothing(repairing: bool) -> None:
    torn = DaemonView(MOVED, dirty=DirtyInfo("e", (0,), 1), repairing=repairing)
    assert torn.phase == ("repairing" if repairing else "dirty")
    assert copy_due(torn, INITIAL) is None
    assert copy_due(DaemonView(None), None) is None  # no record, nothing to keep
