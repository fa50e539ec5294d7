"""``expert-layout export --out FILE`` against real layout-aware daemon processes: the file is the layout the
daemons hold, sglang's own ``--init-expert-location`` reader builds that very ``physical_to_logical_map``
from it, and every state that leaves the cluster's layout in doubt refuses with its reason and the way out,
writing nothing. Where the test can follow that way out (a commit, a repair, a reload's end, a rejoin),
it does, and the export then succeeds."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tools.harness.daemon_proc import DaemonProcess, request

from daemon_adapter import client
from daemon_adapter.status_cli import EXIT_EXPORT_NOT_WRITTEN, EXIT_EXPORT_REFUSED, EXIT_OK, main
from layout_sm.messages import rejoin_request
from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP, NUM_LOGICAL
from .helpers import Engine, query, status_reason, wait_for

MOVED_LAYERS = [0, 2]
MOVED_ROWS = [[3, 2, 1, 0, 3, 2], [2, 3, 0, 1, 2, 2]]
MOVED_MAP = [MOVED_ROWS[0], INITIAL_MAP[1], MOVED_ROWS[1]]  # layer 1 stays where it was
OLD_FILE = '{"physical_to_logical_map": "an earlier export"}\n'


def export(out: Path, *sockets: str, json_output: bool = False) -> tuple[int, str, str]:
    """``expert-layout export`` in this process: its exit code, stdout and stderr."""
    argv = ["export", "--out", str(out), *(a for path in sockets for a in ("--socket", path))]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([*argv, *(["--json"] if json_output else [])])
    return code, stdout.getvalue(), stderr.getvalue()


def move(paths: Sequence[str], layers: list[int], rows: list[list[int]], base_version: int = 0) -> None:
    """One engine's committed move on every daemon, as a rebalance's chunk commits it."""
    for path in paths:
        engine = Engine(path, "mover")
        engine.attach()
        assert status_reason(engine.begin(layers, base_version)) == ("ok", "begun")
        assert status_reason(engine.commit(layers, rows)) == ("ok", "committed")
        engine.detach()


def torn(path: str) -> None:
    """A mover that goes away mid-move (its attach connection's EOF), as a SIGKILLed engine does."""
    engine = Engine(path, "mover")
    engine.attach()
    assert status_reason(engine.begin([1])) == ("ok", "begun")
    engine.detach()


def refused(out: Path, *sockets: str) -> str:
    """The export refuses: exit 7, the old file byte for byte, no temporary left; its message."""
    out.write_text(OLD_FILE)
    code, stdout, stderr = export(out, *sockets)
    assert code == EXIT_EXPORT_REFUSED, (code, stdout, stderr)
    assert stdout == "" and f"refused, nothing written to {out}" in stderr, stderr
    assert out.read_text() == OLD_FILE
    assert [p for p in os.listdir(out.parent) if p.endswith(".tmp")] == []
    return stderr


def written(out: Path, *sockets: str) -> dict[str, Any]:
    """The export succeeds; the file's content (one key) and what it printed."""
    code, stdout, stderr = export(out, *sockets, json_output=True)
    assert code == EXIT_OK, (code, stdout, stderr)
    report = json.loads(stdout)
    data = json.loads(out.read_text())
    assert list(data) == ["physical_to_logical_map"], data  # sglang passes every key to init_by_mapping
    return {"map": data["physical_to_logical_map"], **report["written"]}


def sglang_reads(path: Path, model_dir: str, moe_ep_rank: int) -> list[list[int]]:
    """What sglang's own reader of ``--init-expert-location`` builds from the file, on CPU (real server args,
    ModelConfig and ExpertLocationMetadata)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.eplb.expert_location import compute_initial_expert_location_metadata
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import prepare_server_args

    argv = ["--model-path", model_dir, "--device", "cpu", "--skip-tokenizer-init", "--tp-size", "2", "--ep-size", "2"]
    flags = ["--enable-eplb", "--ep-num-redundant-experts", "2", "--init-expert-location", str(path)]
    server_args = prepare_server_args([*argv, *flags])
    reset_context()
    try:
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=moe_ep_rank, gpu_id=moe_ep_rank))
        metadata = compute_initial_expert_location_metadata(ModelConfig(model_path=model_dir), moe_ep_rank)
        return metadata.physical_to_logical_map_cpu.tolist()
    finally:
        reset_context()


def test_an_export_after_a_committed_move_is_the_daemons_map_as_sglang_reads_it(
    make_daemon: Callable[..., DaemonProcess], model_dir: str, short_tmp: str
) -> None:
    d0, d1 = make_daemon("d0"), make_daemon("d1")
    move([d0.socket_path, d1.socket_path], MOVED_LAYERS, MOVED_ROWS)
    held = query(d0.socket_path, include_map=True)
    assert (held["version"], held["map"]) == (1, MOVED_MAP)

    out = Path(short_tmp) / "layout.json"
    out.write_text(OLD_FILE)  # an earlier export is replaced whole
    code, stdout, stderr = export(out, d0.socket_path, d1.socket_path)
    assert code == EXIT_OK, stderr
    assert f"wrote {out}: version 1, digest {held['digest']}, 3 layers x 6 physical slots" in stdout, stdout
    assert f"--ep-num-redundant-experts 2 --init-expert-location {out}" in stdout, stdout
    assert json.loads(out.read_text()) == {"physical_to_logical_map": MOVED_MAP}
    assert [p for p in os.listdir(short_tmp) if p.endswith(".tmp")] == []

    # sglang builds, on each EP rank, the map the daemons hold: a plain server routes as they do.
    for rank in (0, 1):
        routed = sglang_reads(out, model_dir, rank)
        assert routed == held["map"] and layout_digest(routed) == held["digest"], (rank, routed)


def test_each_state_that_leaves_the_layout_in_doubt_refuses_with_its_reason(
    make_daemon: Callable[..., DaemonProcess], short_tmp: str
) -> None:
    out = Path(short_tmp) / "layout.json"
    template = f"{short_tmp}/none_{{device_uuid}}.sock"
    env = dict(os.environ, SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=template)
    cli = [os.path.join(os.path.dirname(sys.executable), "expert-layout"), "export", "--out", str(out)]
    out.write_text(OLD_FILE)
    nothing = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)  # the installed command
    assert nothing.returncode == EXIT_EXPORT_REFUSED, nothing
    assert "no weight cache daemon found" in nothing.stderr and out.read_text() == OLD_FILE

    clean = make_daemon("clean")
    dead = make_daemon("dead")
    dead.kill()  # its socket file stays, as after a crash
    assert "did not answer" in refused(out, clean.socket_path, dead.socket_path)
    older = make_daemon("older", plain_sglang=True)
    assert "an older daemon" in refused(out, clean.socket_path, older.socket_path)
    bare = make_daemon("bare", physical_to_logical_map=None, num_logical=None)
    message = refused(out, clean.socket_path, bare.socket_path)
    assert f"{bare.socket_path}: keeps no layout record" in message and "--enable-eplb" in message
    assert f"{clean.socket_path}:" not in message  # a daemon that is fine is not blamed

    # A move pending: wait for it to end; once it is committed, the export is the moved map.
    mover = Engine(clean.socket_path, "mover")
    mover.attach()
    assert status_reason(mover.begin(MOVED_LAYERS)) == ("ok", "begun")
    message = refused(out, clean.socket_path)
    assert "a move is pending: engine 'mover' is moving layers [0, 2] from version 0" in message, message
    assert "wait for the move to end" in message
    assert status_reason(mover.commit(MOVED_LAYERS, MOVED_ROWS)) == ("ok", "committed")
    mover.detach()
    assert written(out, clean.socket_path)["map"] == MOVED_MAP


def test_a_dirty_daemon_refuses_until_expert_layout_repair(
    make_daemon: Callable[..., DaemonProcess], short_tmp: str
) -> None:
    from tools.harness import toy_moe

    cfg = toy_moe.ToyMoEConfig(num_layers=3, num_logical=NUM_LOGICAL, num_redundant=2)
    daemon = make_daemon("torn", tensors=toy_moe.rank_state(cfg, 0, INITIAL_MAP), checkpoint=(cfg, 0))
    torn(daemon.socket_path)
    wait_for(lambda: query(daemon.socket_path)["phase"] == "dirty", what="dirty")
    out = Path(short_tmp) / "layout.json"
    message = refused(out, daemon.socket_path)
    assert "dirty, its layout unknown: engine 'mover' went away while moving layers [1]" in message, message
    advice = f"`expert-layout repair --socket {daemon.socket_path}`"
    assert advice in message, message

    assert main(["repair", "--socket", daemon.socket_path]) == EXIT_OK  # the advice, followed
    result = written(out, daemon.socket_path)
    assert (result["map"], result["version"], result["digest"]) == (INITIAL_MAP, 0, layout_digest(INITIAL_MAP))


def test_a_repairing_daemon_refuses_until_its_reload_ends(short_tmp: str) -> None:
    """With auto repair the daemon reloads by itself on the mover's EOF; the reload is a ``FakeReload`` the
    test ends (``tests/model_based/daemon_hosts.py``): everything else is the daemon adapter's."""
    from tests.model_based.daemon_hosts import InProcessHost

    handle = InProcessHost(Path(short_tmp), repairs=True).start("rep", INITIAL_MAP, NUM_LOGICAL)
    try:
        torn(handle.socket_path)
        wait_for(lambda: query(handle.socket_path)["phase"] == "repairing", what="repairing")
        out = Path(short_tmp) / "layout.json"
        message = refused(out, handle.socket_path)
        assert "reloading: the daemon is repairing layers [1] back to version 0" in message, message
        assert "wait for the reload to end" in message
        handle.end_repair(True)
        wait_for(lambda: query(handle.socket_path)["phase"] == "clean", what="clean")
        assert written(out, handle.socket_path)["map"] == INITIAL_MAP
    finally:
        handle.stop()


def test_daemons_at_different_versions_refuse_until_the_one_behind_rejoins(
    make_daemon: Callable[..., DaemonProcess], short_tmp: str
) -> None:
    from tools.harness import toy_moe

    cfg = toy_moe.ToyMoEConfig(num_layers=3, num_logical=NUM_LOGICAL, num_redundant=2)
    ahead = make_daemon("ahead")
    # Started again from disk beside a daemon that moved: version 0, the initial map.
    behind = make_daemon("behind", tensors=toy_moe.rank_state(cfg, 1, INITIAL_MAP), checkpoint=(cfg, 1))
    move([ahead.socket_path], MOVED_LAYERS, MOVED_ROWS)
    out = Path(short_tmp) / "layout.json"
    message = refused(out, ahead.socket_path, behind.socket_path)
    newest = layout_digest(MOVED_MAP)
    assert f"{behind.socket_path}: its record differs: version 0 (digest {layout_digest(INITIAL_MAP)[:16]})" in message
    assert f"version 1 (digest {newest[:16]})" in message and "rejoin at version 1" in message, message
    assert f"{ahead.socket_path}:" not in message  # the newest record is the one to rejoin at

    # The advice: a server's startup has the daemon behind rejoin (its attach and rejoin request, here).
    conn, reply = client.attach(behind.socket_path, "next-server")
    begun = request(behind.socket_path, rejoin_request("next-server", reply["session"], 1, newest, MOVED_MAP))
    assert status_reason(begun) == ("ok", "rejoin_begun"), begun
    wait_for(lambda: query(behind.socket_path)["phase"] == "clean", what="rejoined")
    conn.close()
    result = written(out, ahead.socket_path, behind.socket_path)
    assert (result["map"], result["version"], result["digest"], result["daemons"]) == (MOVED_MAP, 1, newest, 2)


def test_records_that_differ_at_one_version_refuse_every_daemon(
    make_daemon: Callable[..., DaemonProcess], short_tmp: str
) -> None:
    d0, d1 = make_daemon("d0"), make_daemon("d1")
    move([d0.socket_path], MOVED_LAYERS, MOVED_ROWS)
    move([d1.socket_path], [1], [[3, 3, 2, 1, 0, 0]])
    message = refused(Path(short_tmp) / "layout.json", d0.socket_path, d1.socket_path)
    for daemon in (d0, d1):
        assert f"{daemon.socket_path}: its record differs: version 1" in message, message
    assert "restart the weight cache daemons" in message and "name one set's sockets with --socket" in message


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(
    make_daemon: Callable[..., DaemonProcess], short_tmp: str
) -> None:
    daemon = make_daemon()
    missing = Path(short_tmp) / "no-such-folder" / "layout.json"
    code, stdout, stderr = export(missing, daemon.socket_path)
    assert code == EXIT_EXPORT_NOT_WRITTEN and f"could not write {missing}" in stderr, (code, stdout, stderr)
    assert not missing.parent.exists()
    # The rename itself fails (the target is a folder): the folder stays as it was, the temporary goes.
    folder = Path(short_tmp) / "taken.json"
    folder.mkdir()
    (folder / "kept").write_text("kept")
    code, _, stderr = export(folder, daemon.socket_path)
    assert code == EXIT_EXPORT_NOT_WRITTEN, stderr
    assert os.listdir(folder) == ["kept"]
    assert [p for p in os.listdir(short_tmp) if p.endswith(".tmp")] == []


def test_out_must_be_a_json_file_sglang_reads_as_one(short_tmp: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["export", "--out", f"{short_tmp}/layout.pt", "--socket", f"{short_tmp}/d0.sock"])
    assert usage.value.code == 2 and "does not end in .json" in capsys.readouterr().err
    assert os.listdir(short_tmp) == []
