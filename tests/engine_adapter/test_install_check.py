"""Fail closed when sglang did not apply one of the plugin's hooks (engine_adapter.install_check).

For each of the six targets ``engine_adapter.plugin`` registers, fresh engine rank processes make
sglang's ``HookRegistry`` fail to apply that one target before ``load_plugins()`` (what a renamed
or moved target does: sglang logs it and goes on), then start, load and rebalance with sglang's
real ``EPLBManager`` on layout-aware daemons. Whatever the engine did, no expert moved unprotected:
a new engine with the whole plugin on the same daemons finds every slot holding the expert the
daemons' record names.
"""

from __future__ import annotations

import re
from pathlib import Path

import ea_scripts
from tools.harness import toy_moe
from tools.harness.engine_ranks import EngineRanks

STARTUP = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_init_expert_location_metadata"
FETCH = "sglang.srt.weight_cache.ipc_loader.IpcModelLoader._fetch_from_cache"
SEND = "sglang.srt.weight_cache.protocol.send_msg"
RECV = "sglang.srt.weight_cache.protocol.recv_msg"
REBALANCE = "sglang.srt.eplb.eplb_manager.EPLBManager.rebalance"
CHUNK = "sglang.srt.eplb.eplb_manager.update_expert_location_with_recovery"
ROOT = Path(__file__).resolve().parents[2]


def _ok(results):
    assert all(r.ok for r in results), [r.trace or r.error for r in results]
    return [r.value for r in results]


def _half_installed(ranks: EngineRanks, d, target: str) -> list[dict]:
    """One engine whose plugin lacks ``target``'s hook, in a pool of its own (hooks stay for a process)."""
    with EngineRanks(world_size=2, workdir=ranks._workdir) as pool:
        assert all(_ok(pool.run(ea_scripts.fail_to_apply, target, timeout=180)))
        out = _ok(pool.run(ea_scripts.half_installed_run, ea_scripts.spec(d.sockets), timeout=180))
    assert not any(o["plugins_loaded_before"] for o in out)
    return out


def _record_and_memory_agree(ranks: EngineRanks, d) -> list[dict]:
    """A new engine with the whole plugin maps the daemons' memory with the record's map: every slot
    must hold the expert that map names (a move the record never learned of shows up here)."""
    nxt = _ok(ranks.run(ea_scripts.start_load_slots, ea_scripts.spec(d.sockets)))
    for rank, n in enumerate(nxt):
        record = d.query(rank, include_map=True)
        assert n["map"] == record["map"]
        assert n["slots"] == n["believed"], f"rank {rank}: memory holds other experts than the record names"
    ranks.run(ea_scripts.stop)
    return nxt


def _moved_nothing(out: list[dict], d) -> None:
    for o in out:
        assert o["stage"] == "rebalance" and o["error"] is None
        assert o["map"] == o["before"] == toy_moe.trivial_map(d.cfg)
        assert o["slots"] == o["believed"]
        assert o["chunks_committed"] == 0


def _reported(out: list[dict], target: str) -> None:
    for o in out:
        assert o["install"] is not None and o["install"]["missing"] == [target]
        error = o["install"]["error"]
        assert target in error and "0.5.23" in error and "Rebalancing of shared weights is off" in error
        assert "install:hooks-missing" in o["logged"]


def test_missing_rebalance_hook_moves_nothing(ranks, daemons):
    # Before: the chunk hook saw no active manager and let sglang move the shared memory.
    d = daemons()
    out = _half_installed(ranks, d, REBALANCE)
    _moved_nothing(out, d)
    _reported(out, REBALANCE)
    assert all("install:move-skipped" in o["logged"] for o in out)
    assert d.query(0)["version"] == 0
    _record_and_memory_agree(ranks, d)


def test_missing_chunk_hook_moves_nothing(ranks, daemons):
    # Before: the rebalance hook ran sglang's rebalance, which moved every chunk unprotected.
    d = daemons()
    out = _half_installed(ranks, d, CHUNK)
    _moved_nothing(out, d)
    _reported(out, CHUNK)
    assert all("expert-layout" in (o["disabled"] or "") for o in out)  # sglang's own switch is off
    _record_and_memory_agree(ranks, d)


def test_missing_fetch_hook_is_refused_by_the_daemon(ranks, daemons):
    # Before: served without a claim, the loader hook never saw the fetch, so the engine took its
    # weights for disk ones and let sglang rebalance them locally: in the shared memory.
    d = daemons()
    out = _half_installed(ranks, d, FETCH)
    for o in out:
        assert o["stage"] == "load" and "Daemon config mismatch" in o["error"]
        assert "sends no expert layout" in o["error"] and "attached" in o["error"]
        assert "install the" not in o["error"].lower()
    _reported(out, FETCH)
    _record_and_memory_agree(ranks, d)


def test_missing_send_hook_is_refused_by_the_daemon(ranks, daemons):
    # Before: served as an older engine at version 0 (and after a move told to install the plugin).
    d = daemons()
    out = _half_installed(ranks, d, SEND)
    for o in out:
        assert o["stage"] == "load" and "sends no expert layout" in o["error"]
    _reported(out, SEND)
    assert "plugin_incomplete" in d.log(0)
    _record_and_memory_agree(ranks, d)


def test_missing_recv_hook_turns_shared_rebalancing_off(ranks, daemons):
    # Before: the claim still went out, so the protocol ran; only a refusal's text was sglang's.
    d = daemons()
    out = _half_installed(ranks, d, RECV)
    _moved_nothing(out, d)
    _reported(out, RECV)
    _record_and_memory_agree(ranks, d)


def test_missing_startup_hook_is_refused_by_the_daemon(ranks, daemons):
    # Before: never attached, served as an older engine at version 0; after a move the daemon told
    # an engine that has the plugin to install it.
    d = daemons()
    out = _half_installed(ranks, d, STARTUP)
    for o in out:
        assert o["stage"] == "load" and o["install"] is None  # the check is what the startup hook runs
        assert "startup hook never ran" in o["error"] and "plugin_incomplete" in o["error"]
    assert all(not d.query(rank)["non_following_seen"] for rank in (0, 1))
    _record_and_memory_agree(ranks, d)


def test_untested_sglang_version_warns_and_checks_still_run(ranks, daemons):
    d = daemons()
    out = _ok(ranks.run(ea_scripts.untested_version_start, ea_scripts.spec(d.sockets)))
    for o in out:
        assert "install:untested-version" in o["logged"]
        assert "runs on sglang 0.5.23, but was tested with sglang 0.0.0-never" in o["install"]["warning"]
        assert o["install"]["missing"] == [] and o["kind"] == "keep_own"
    ranks.run(ea_scripts.stop)


# -- in-process: the pieces of the check --------------------------------------------------------


def test_untested_versions_get_a_warning_naming_them():
    from engine_adapter import compat

    assert compat.untested_warning("0.5.23", "3.11") is None
    warning = compat.untested_warning("0.6.0", "3.12")
    assert warning is not None and "sglang 0.6.0 and Python 3.12" in warning and "sglang 0.5.23" in warning


def test_an_incomplete_install_on_an_untested_version_still_blocks():
    from engine_adapter import compat
    from engine_adapter.compat import InstallCheck

    result = InstallCheck((CHUNK,), "0.6.0", "3.11")
    assert result.warning is not None and result.error is not None and CHUNK in result.error
    assert compat.TESTED_SGLANG_VERSIONS[0] in result.error


def test_the_verdict_blocks_shared_moves_and_refuses_a_start_only_when_no_hook_could_stop_a_move():
    from layout_sm.engine import hooks_verdict

    error = "hooks missing"
    assert hooks_verdict(None, False, False, True, True) == hooks_verdict(error, True, True, False, True)
    assert not hooks_verdict(None, False, False, True, True).moves_blocked  # complete, or no weight cache
    one = hooks_verdict(error, False, True, True, True)
    assert one.moves_blocked and one.refuse_start is None  # the rebalance hook still refuses the move
    both = hooks_verdict(error, True, True, True, True)
    assert both.moves_blocked and both.refuse_start is not None and both.refuse_start.startswith(error)
    assert hooks_verdict(error, True, True, True, False).refuse_start is None  # EPLB off: nothing moves


def test_the_installed_pins_are_the_tested_versions():
    from engine_adapter import compat

    pinned = re.search(r'"sglang==([^"]+)"', (ROOT / "Makefile").read_text())
    assert pinned is not None and pinned.group(1) in compat.TESTED_SGLANG_VERSIONS
    assert compat.installed_python_version() in compat.TESTED_PYTHON_VERSIONS  # these machines' Python
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject  # every Python sglang 0.5.23 accepts


def test_identity_not_names():
    from engine_adapter.install_check import calls_hook

    def hook(original, *args):
        return original(*args)

    def same_name_other_function(original, *args):
        return original(*args)

    def wrap(original, around):
        def wrapper(*args):
            return around(original, *args)

        wrapper.__wrapped__ = original
        return wrapper

    assert calls_hook(wrap(len, hook), hook)
    assert calls_hook(wrap(wrap(len, hook), same_name_other_function), hook)  # another plugin on top
    assert not calls_hook(wrap(len, same_name_other_function), hook)
    assert not calls_hook(len, hook)


def test_both_eplb_hooks_missing_the_engine_does_not_start(ranks, daemons):
    # Nothing in the engine could stop sglang moving the shared memory: fail at startup instead.
    d = daemons()
    with EngineRanks(world_size=2, workdir=ranks._workdir) as pool:
        assert all(_ok(pool.run(ea_scripts.fail_to_apply, REBALANCE, timeout=180)))
        assert all(_ok(pool.run(ea_scripts.fail_to_apply, CHUNK, timeout=180)))
        out = _ok(pool.run(ea_scripts.half_installed_run, ea_scripts.spec(d.sockets), timeout=180))
    for o in out:
        assert o["stage"] == "start" and o["error"].startswith("HooksMissingError")
        assert REBALANCE in o["error"] and CHUNK in o["error"] and "does not start" in o["error"]
    _record_and_memory_agree(ranks, d)
