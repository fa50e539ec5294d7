"""The durable copy on real layout-aware daemon processes (``daemon_adapter.durable``): each commit is
copied to a file beside the socket, off the commit's path; a daemon SIGKILLed and started again starts
from its copy; a writer killed between its write and its rename leaves the previous copy in force; and a
file the daemon cannot use (truncated, corrupt, of another checkpoint, configuration or format) is set
aside with its reason in ``expert-layout status``, while the daemon starts at the initial layout, serves,
and keeps a fresh copy from its next commit.

The harness's daemons hold no weights this adapter loads (``durable`` in ``tools.harness.daemon_proc``):
what is checked here is the record and the file; tests/realserver checks the weights."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tools.harness.daemon_proc import DaemonProcess

from daemon_adapter.durable import DEFAULT_FOLDER, copy_path
from daemon_adapter.status_cli import EXIT_OK, main
from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, query, status_reason, wait_for

MOVED_ROWS = [[3, 2, 1, 0, 3, 2]]


def commit_one_move(path: str, base_version: int = 0) -> None:
    engine = Engine(path, "mover")
    engine.attach()
    assert status_reason(engine.begin([0], base_version)) == ("ok", "begun")
    assert status_reason(engine.commit([0], MOVED_ROWS)) == ("ok", "committed")
    engine.detach()


def copied(daemon: DaemonProcess, version: int) -> dict[str, Any]:
    """Wait until the daemon's copy holds ``version``; its status's ``durable`` part."""

    def at_version() -> dict[str, Any] | None:
        durable = query(daemon.socket_path)["durable"]
        return durable if durable.get("version") == version else None

    return wait_for(at_version, what=f"the copy at version {version}")


def moved_and_copied(make_daemon: Callable[..., DaemonProcess]) -> tuple[DaemonProcess, Path]:
    """A daemon that keeps its copy, one move committed and copied: the daemon and its copy's file."""
    daemon = make_daemon(durable=True)
    commit_one_move(daemon.socket_path)
    copied(daemon, 1)
    file = copy_path(daemon.socket_path)
    assert file is not None
    return daemon, file


def status_table(socket_path: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", "--socket", socket_path]) == EXIT_OK
    return out.getvalue()


def test_a_commit_is_copied_and_the_daemon_killed_starts_again_from_it(
    make_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon = make_daemon(durable=True)
    file = copy_path(daemon.socket_path)
    assert file is not None and file.parent.name == DEFAULT_FOLDER
    copied(daemon, 0)  # the initial record, written at the start
    commit_one_move(daemon.socket_path)
    durable = copied(daemon, 1)
    assert durable["path"] == str(file) and durable["at_start"]["kind"] == "missing"
    body = json.loads(file.read_bytes())
    assert body["record"]["version"] == 1 and body["record"]["map"][0] == MOVED_ROWS[0]

    daemon.kill()  # SIGKILL: no shutdown code runs
    daemon.restart()
    state = query(daemon.socket_path, include_map=True)
    assert (state["phase"], state["version"]) == ("clean", 1)
    assert state["map"] == [MOVED_ROWS[0], *INITIAL_MAP[1:]]
    assert state["digest"] == layout_digest(state["map"]) == body["record"]["digest"]
    assert state["durable"]["at_start"]["kind"] == "whole" and state["durable"]["version"] == 1
    assert " v1 " in status_table(daemon.socket_path)  # DURABLE beside VERSION
    commit_one_move(daemon.socket_path, base_version=1)  # it serves on from there
    copied(daemon, 2)


KILLED_WRITER = """
import os, signal, sys
from daemon_adapter.layout_file import write_temporary
write_temporary(sys.argv[1], b'{"format": "a newer copy, never renamed in place"}')
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_between_its_write_and_its_rename_leaves_the_previous_copy(
    make_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon, file = moved_and_copied(make_daemon)
    before = file.read_bytes()
    daemon.kill()
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(file)], env=dict(os.environ), timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert file.read_bytes() == before and list(file.parent.glob(f".{file.name}.*.tmp"))  # the half-done write
    daemon.restart()
    state = query(daemon.socket_path)
    assert (state["version"], state["durable"]["at_start"]["kind"]) == (1, "whole")
    assert not list(file.parent.glob(f".{file.name}.*.tmp"))  # its leftover removed at the start


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt(data: bytes) -> bytes:
    body = json.loads(data)
    body["record"]["map"][0][0] = 1  # a map its digest does not name
    return json.dumps(body).encode()


def _other_checkpoint(data: bytes) -> bytes:
    body = json.loads(data)
    body["owner"]["checkpoint"] = "/models/another-model@"
    return json.dumps(body).encode()


def _other_format(data: bytes) -> bytes:
    body = json.loads(data)
    body["format_version"] = 99
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("spoil", "kind", "said"),
    [
        (_truncate, "torn", "not whole JSON"),
        (_corrupt, "corrupt", "digest"),
        (_other_checkpoint, "other_checkpoint", "/models/another-model@"),
        (_other_format, "other_format", "version 99"),
    ],
    ids=["truncated", "corrupt", "other-checkpoint", "other-format"],
)
def test_a_bad_copy_is_set_aside_with_its_reason_and_the_daemon_serves_from_the_initial_layout(
    make_daemon: Callable[..., DaemonProcess], spoil: Callable[[bytes], bytes], kind: str, said: str
) -> None:
    daemon, file = moved_and_copied(make_daemon)
    daemon.kill()
    bad = spoil(file.read_bytes())
    file.write_bytes(bad)
    daemon.restart()

    state = query(daemon.socket_path, include_map=True)
    assert (state["phase"], state["version"], state["map"]) == ("clean", 0, INITIAL_MAP)
    at_start = state["durable"]["at_start"]
    assert at_start["kind"] == kind and said in at_start["why"], at_start
    aside = [p for p in file.parent.iterdir() if p.name.startswith(f"{file.name}.set-aside-{kind}-")]
    assert len(aside) == 1 and aside[0].read_bytes() == bad, "the file is kept aside, byte for byte"
    assert str(aside[0]) in at_start["why"]
    table = status_table(daemon.socket_path)
    assert f"copy not used at start ({kind})" in table, table

    # The daemon serves: an engine attaches and moves, and the copy starts again from it.
    copied(daemon, 0)
    commit_one_move(daemon.socket_path)
    assert copied(daemon, 1)["at_start"]["kind"] == kind
    assert json.loads(file.read_bytes())["record"]["version"] == 1


def test_a_daemon_without_the_copy_reads_and_writes_none(make_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = make_daemon()  # durable=False: as a daemon started with --expert-layout-no-copy
    commit_one_move(daemon.socket_path)
    assert "durable" not in query(daemon.socket_path)
    file = copy_path(daemon.socket_path)
    assert file is not None and not file.parent.exists()
    assert " off " in status_table(daemon.socket_path)


def test_a_copy_from_another_initial_layout_is_set_aside_for_the_one_the_operator_named(
    make_daemon: Callable[..., DaemonProcess],
) -> None:
    """Daemons started again with another ``--init-expert-location`` start a new record at that layout:
    the copy of the old record is another configuration's, set aside with the reason."""
    daemon, _ = moved_and_copied(make_daemon)
    daemon.kill()
    other = [list(reversed(row)) for row in INITIAL_MAP]
    daemon.spec = dataclasses.replace(daemon.spec, physical_to_logical_map=other)
    daemon.restart()
    state = query(daemon.socket_path, include_map=True)
    assert (state["version"], state["map"]) == (0, other)
    at_start = state["durable"]["at_start"]
    assert at_start["kind"] == "other_config" and "--init-expert-location" in at_start["why"], at_start
