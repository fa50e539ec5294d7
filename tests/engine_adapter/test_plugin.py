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
