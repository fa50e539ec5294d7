"""The plugin is really installed: sglang's own load_plugins() finds the entry point and applies
every hook, in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json
from importlib.metadata import entry_points
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
from engine_adapter import plugin
eps = [(ep.name, ep.value, ep.dist.name if ep.dist else None) for ep in entry_points(group="sglang.srt.plugins")]
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.weight_cache import ipc_loader, protocol, daemon
print(json.dumps({
    "eps": eps,
    "patched": sorted(HookRegistry._patched),
    "targets": [plugin.STARTUP_TARGET, plugin.FETCH_TARGET, plugin.SEND_TARGET, plugin.RECV_TARGET,
                plugin.REBALANCE_TARGET, plugin.CHUNK_TARGET],
    "startup_wrapped": hasattr(ModelRunner.maybe_init_expert_location_metadata, "__wrapped__"),
    "send_rebound": ipc_loader.send_msg is protocol.send_msg and hasattr(protocol.send_msg, "__wrapped__"),
    "daemon_class": daemon.WeightCacheDaemon.__name__,
    "plugin_name": __import__("engine_adapter.state").state.PLUGIN_NAME,
}))
"""


def test_load_plugins_installs_every_hook():
    env = dict(os.environ)
    env.pop("SGLANG_PLUGINS", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=240, check=True
    )
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert ["expert_layout", "engine_adapter.plugin:register", "sglang-expert-layout"] in info["eps"]
    assert set(info["targets"]) <= set(info["patched"])
    assert info["startup_wrapped"] and info["send_rebound"]
    assert info["daemon_class"] == "LayoutAwareDaemon"  # daemon mode: spawned daemons are layout-aware
    assert [info["plugin_name"], "engine_adapter.plugin:register", "sglang-expert-layout"] in info["eps"]


def test_the_hooks_pass_through_while_sglang_plugins_does_not_select_the_plugin(monkeypatch):
    from engine_adapter import state

    for selected, on in (("", True), ("other, expert_layout", True), ("other", False), ("expert_layout_x", False)):
        monkeypatch.setenv("SGLANG_PLUGINS", selected)
        assert state.enabled() is on, selected


STANDBY_PROBE = r"""
import json
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
from engine_adapter import plugin
print(json.dumps({
    "patched": sorted(HookRegistry._patched),
    "standby": [target for target, _ in plugin.hooks(True)],
    "primary": [target for target, _ in plugin.hooks(False)],
}))
"""


def _probe(role: str | None) -> dict[str, list[str]]:
    env = dict(os.environ)
    env.pop("SGLANG_PLUGINS", None)
    env.pop("SGLANG_EXPERT_LAYOUT_ROLE", None)
    if role is not None:
        env["SGLANG_EXPERT_LAYOUT_ROLE"] = role
    out = subprocess.run(
        [sys.executable, "-c", STANDBY_PROBE], capture_output=True, text=True, env=env, timeout=240, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_standby_carries_the_parking_hooks_and_a_primary_none_of_them():
    """sglang applies every standby hook (its pause, continue, paused loop, local inputs, server status and
    result dispatcher) in a standby's processes; a primary, and a role that is not one, carry none."""
    standby = _probe("standby")
    parking = set(standby["standby"]) - set(standby["primary"])
    assert len(parking) == 6, parking
    assert parking <= set(standby["patched"])
    for role in (None, "stand-by"):  # the default, and a role that is not one
        assert not parking & set(_probe(role)["patched"]), role


def test_a_role_that_is_not_one_is_refused_with_the_valid_ones(monkeypatch):
    from engine_adapter import roles

    monkeypatch.setenv(roles.ROLE_ENV, "stand-by")
    try:
        roles.role()
    except roles.RoleError as error:
        assert "'stand-by' is not a role" in str(error) and "primary, standby" in str(error)
    else:
        raise AssertionError("a bad role was accepted")
    monkeypatch.setenv(roles.ROLE_ENV, "standby")
    assert roles.is_standby()
    monkeypatch.delenv(roles.ROLE_ENV)
    assert roles.role() == roles.PRIMARY


PROCESS_PROBE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
# sglang's own call, made from the module of the process (sglang names none of them to the plugin)
exec(compile("load_plugins()", "<sglang's caller>", "exec"), {"__name__": sys.argv[1], "load_plugins": load_plugins})
imported = sorted(m for m in ("sglang.srt.model_executor.model_runner", "sglang.srt.eplb.eplb_manager",
                             "layout_sm", "statemachine", "engine_adapter.install_check") if m in sys.modules)
from engine_adapter import plugin
print(json.dumps({
    "patched": sorted(HookRegistry._patched),
    "engine": [target for target, _ in plugin.hooks(True)],
    "imported": imported,
}))
"""


def _process_probe(caller: str, role: str) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SGLANG_EXPERT_LAYOUT_ROLE")}
    env["SGLANG_EXPERT_LAYOUT_ROLE"] = role
    out = subprocess.run(
        [sys.executable, "-c", PROCESS_PROBE, caller],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_sglang_process_applies_the_hooks_it_can_run_and_imports_nothing_for_the_others():
    """HookRegistry imports each registered target's module: the HTTP server's process (launch_server) would
    import the model runner, the scheduler and EPLB for hooks it never runs (2.4 s of a server's start here),
    the detokenizer the same. A scheduler applies the engine's hooks; any process sglang does not name
    applies every hook (test_load_plugins_installs_every_hook)."""
    from engine_adapter.targets import HTTP_SERVER_TARGETS

    http = _process_probe("sglang.launch_server", "standby")
    # the daemons it spawns are layout-aware: they install the daemon's class themselves
    assert set(http["patched"]) == {*HTTP_SERVER_TARGETS, "sglang.srt.weight_cache.daemon.spawn_weight_cache_daemon"}
    # a standby's two hooks there are the light standby_server: not the scheduler side's protocol and EPLB
    assert http["imported"] == [], http["imported"]
    primary_http = _process_probe("sglang.srt.entrypoints.engine", "primary")
    assert primary_http["patched"] == ["sglang.srt.weight_cache.daemon.spawn_weight_cache_daemon"], primary_http
    assert primary_http["imported"] == [], primary_http["imported"]  # no model runner, EPLB, nor protocol
    detokenizer = _process_probe("sglang.srt.managers.detokenizer_manager", "standby")
    assert detokenizer["patched"] == [] and detokenizer["imported"] == [], detokenizer
    scheduler = _process_probe("sglang.srt.managers.scheduler", "standby")
    # every engine hook, and neither the HTTP server's nor a daemon's: a scheduler builds and spawns none
    assert set(scheduler["patched"]) == set(scheduler["engine"]) - HTTP_SERVER_TARGETS, scheduler["patched"]
