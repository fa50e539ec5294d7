"""As a new user would run them: ``python -m daemon_adapter`` and ``expert-layout status`` as
subprocesses, against real daemon processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, status_reason
from .test_engine_killed import REPO

EXPERT_LAYOUT = os.path.join(os.path.dirname(sys.executable), "expert-layout")


def run_status(*args: str, template: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=template)
    return subprocess.run([EXPERT_LAYOUT, "status", *args], capture_output=True, text=True, env=env, timeout=60)


def test_expert_layout_status_finds_answers_and_exit_codes(make_daemon, short_tmp):
    template = f"{short_tmp}/wc_{{device_uuid}}.sock"
    aware = make_daemon("wc_aware")
    plain = make_daemon("wc_plain", plain_sglang=True)
    dead = make_daemon("wc_dead")
    dead.kill()  # its socket file stays, as after a crash
    mover = Engine(aware.socket_path, "engine-7")
    mover.attach()
    assert status_reason(mover.begin([1, 2])) == ("ok", "begun")

    everything = run_status(template=template)
    assert everything.returncode == 4, everything
    lines = everything.stdout.splitlines()
    assert lines[0].split()[:5] == ["SOCKET", "STATE", "VERSION", "DURABLE", "DIGEST"]
    by_socket = {line.split()[0]: line for line in lines[1:]}
    assert set(by_socket) == {aware.socket_path, plain.socket_path, dead.socket_path}
    assert (
        "pending" in by_socket[aware.socket_path] and "engine-7 layers [1, 2] from v0" in by_socket[aware.socket_path]
    )
    assert layout_digest(INITIAL_MAP)[:16] in by_socket[aware.socket_path]
    assert "older_daemon" in by_socket[plain.socket_path]
    assert "not_answering" in by_socket[dead.socket_path]

    answered = run_status("--json", "--socket", aware.socket_path, template=template)
    assert answered.returncode == 0, answered
    report = json.loads(answered.stdout)
    state = report["daemons"][0]["state"]
    assert (state["version"], state["digest"], state["phase"]) == (0, layout_digest(INITIAL_MAP), "pending")
    assert state["pending"] == {"engine_id": "engine-7", "layers": [1, 2], "base_version": 0}
    assert state["attached"] == ["engine-7"] and state["non_following_seen"] is False and state["dirty"] is None

    assert run_status("--socket", plain.socket_path, template=template).returncode == 5
    assert run_status("--socket", dead.socket_path, template=template).returncode == 4
    nothing = run_status(template=f"{short_tmp}/none_{{device_uuid}}.sock")
    assert nothing.returncode == 3 and "no weight cache daemon found" in nothing.stderr

    # the mover dies mid-move: status shows the daemon dirty, with the reason
    mover.detach()
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        dirty = run_status("--socket", aware.socket_path, template=template)
        if "dirty" in dirty.stdout:
            break
    assert "yes: engine-7 layers [1, 2] from v0 left mid-move" in dirty.stdout, dirty.stdout


def test_status_cli_default_template_is_sglangs():
    from sglang.srt.environ import envs

    from daemon_adapter.status_cli import SGLANG_DEFAULT_SOCKET_TEMPLATE

    assert envs.SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE.default == SGLANG_DEFAULT_SOCKET_TEMPLATE


@pytest.mark.parametrize("launch", ["single-rank", "all-local-ranks"])
def test_python_m_daemon_adapter_runs_the_layout_aware_daemon(model_dir, short_tmp, launch):
    """sglang's arguments, both launch modes (all local ranks: sglang's launcher spawns each
    daemon in a fresh interpreter). On a CPU-only machine sglang's daemon stops at its model
    load (it needs CUDA): the launcher got that far with the layout-aware daemon."""
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(REPO, "src"),
        SGLANG_USE_CPU_ENGINE="1",  # sglang's CPU platform, so that the daemon can be built
        SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=f"{short_tmp}/wc_{{device_uuid}}.sock",
        SGLANG_WEIGHT_CACHE_READY_TEMPLATE=f"{short_tmp}/wc_{{device_uuid}}.ready",
    )
    args = ["--model-path", model_dir, "--enable-eplb", "--skip-tokenizer-init", "--timeout", "200"]
    if launch == "single-rank":
        args += ["--gpu-id", "0", "--tp-rank", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "daemon_adapter", *args], capture_output=True, text=True, env=env, timeout=280
    )
    output = proc.stdout + proc.stderr
    assert "building an expert-layout aware weight cache daemon" in output, output[-3000:]
    assert "requires a CUDA-alike platform" in output, output[-3000:]  # sglang's own load() check
    if launch == "all-local-ranks":
        assert "spawned layout-aware weight cache daemon" in output, output[-3000:]
        assert "exited prematurely" in output, output[-3000:]  # sglang's launcher saw the child fail
    assert proc.returncode != 0


def test_expert_layout_status_prometheus_for_the_textfile_collector(make_daemon, short_tmp):
    from prometheus_client.parser import text_string_to_metric_families

    template = f"{short_tmp}/wp_{{device_uuid}}.sock"
    aware = make_daemon("wp_aware")
    plain = make_daemon("wp_plain", plain_sglang=True)
    mover = Engine(aware.socket_path, "engine-9")
    mover.attach()
    assert status_reason(mover.begin([1])) == ("ok", "begun")

    done = run_status("--prometheus", template=template)
    assert done.returncode == 5, done  # the older daemon: the exit codes are the table's
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(done.stdout)
        for s in family.samples
    }
    p = "sglang:expert_layout_daemon_"

    def at(name: str, path: str, **labels: str) -> float:
        return values[(p + name, tuple(sorted({"socket": path, **labels}.items())))]

    assert values[(p + "found", ())] == 2
    assert at("up", aware.socket_path) == 1 and at("up", plain.socket_path) == 0
    assert at("phase", aware.socket_path, phase="pending") == 1
    assert at("record_version", aware.socket_path) == 0
    assert at("attached_engines", aware.socket_path) == 1 and at("pending", aware.socket_path) == 1
    assert at("dirty", aware.socket_path) == 0 and at("non_following_seen", aware.socket_path) == 0
    assert not any(labels == (("socket", plain.socket_path),) for name, labels in values if name != p + "up")
    mover.detach()
