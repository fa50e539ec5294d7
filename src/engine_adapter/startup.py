"""Engine startup (docs/protocol.md §5): attach, wait out another engine's move, agree over all ranks, adopt.

Runs AROUND sglang's ``ModelRunner.maybe_init_expert_location_metadata``, after it, before the
model loads. sglang has then built the engine's own initial metadata (``--init-expert-location``
or trivial); this hook only acts when there is such metadata (dense models are untouched) and the
weight cache is on. Every rank makes its ``EngineSession`` (``layout_sm.session``) and carries out
what it says (``engine_adapter.runner``): the attach to its own daemon (the socket path sglang's
``IpcModelLoader`` uses), polls while another engine's move or a repair is under way (up to
``SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT`` seconds, 300 by default), the all-gather of every rank's
finding over the world CPU group, the rejoin of daemons started again from disk, and the map to
install (sglang's ``ExpertLocationMetadata.init_by_mapping``, copied into the live metadata with its
own ``update``). The agreement is the session's: proceed or stop on every rank alike. Whatever goes
wrong locally before the all-gather becomes this rank's finding, never an exception before the
collective: no rank is left waiting in it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import torch.distributed as dist
from sglang.srt.eplb.expert_location import ExpertLocationMetadata, get_global_expert_location_metadata
from sglang.srt.runtime_context import get_exec, get_model

from engine_adapter import install_check, metrics, roles, runner, state
from engine_adapter.collective import world_cpu_group
from engine_adapter.trace import trace_engine
from layout_sm.engine import EngineLayout, Go, Step
from layout_sm.ready import Started
from layout_sm.record import layout_digest, rows_of
from layout_sm.session import DEFAULT_POLL_INTERVAL_S, DEFAULT_WAIT_TIMEOUT_S, EngineSession

logger = logging.getLogger("engine_adapter")

WAIT_TIMEOUT_ENV = "SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT"
POLL_INTERVAL_ENV = "SGLANG_EXPERT_LAYOUT_POLL_INTERVAL"


class ExpertLayoutStartupError(RuntimeError):
    """The engine must not start: the daemons' expert layout cannot be trusted or adopted."""


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def daemon_socket_path(gpu_id: int) -> str:
    """The path sglang's IpcModelLoader connects to (``--weight-cache-socket`` or the template)."""
    configured = get_model().weight_cache_socket
    if configured:
        return configured
    from sglang.srt.platforms import current_platform
    from sglang.srt.weight_cache.protocol import get_socket_path

    return get_socket_path(current_platform.get_device_uuid(int(gpu_id)))


def around_maybe_init_expert_location_metadata(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    result = original(runner, *args, **kwargs)
    if not state.enabled() or runner.is_draft_worker:
        return result
    state.get().startup_hook_ran = True
    metrics.setup()
    install_check.at_startup(state.get(), get_model().weight_cache_mode != "off", bool(get_exec().moe.enable_eplb))
    if get_model().weight_cache_mode == "off":
        # sglang's own loader, never the daemons': this engine's weights are its own (a fact for
        # the rebalance mode, which treats a rank that cannot say where its weights came from as shared).
        state.get().weights_source = "disk"
        return result
    metadata = get_global_expert_location_metadata()
    if metadata is None:  # a dense model: no experts to place
        return result
    agree(runner.model_config, runner.gpu_id, metadata)
    return result


def _engine_layout(metadata: ExpertLocationMetadata) -> EngineLayout:
    moe = get_exec().moe
    return EngineLayout(
        num_layers=metadata.num_layers,
        num_physical=metadata.num_physical_experts,
        num_logical=metadata.num_logical_experts,
        initial_digest=layout_digest(metadata.physical_to_logical_map_cpu.tolist()),
        routes_by_metadata=bool(moe.enable_eplb) or moe.init_expert_location != "trivial",
    )


def _engine_id(group: Any) -> str:
    # One id for the whole engine, chosen by rank 0, so every daemon names the same engine.
    ids = [f"engine-{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(ids, src=dist.get_global_rank(group, 0), group=group)
    return str(ids[0])


def agree(model_config: Any, gpu_id: int, metadata: ExpertLocationMetadata) -> Step:
    """The startup above; raises ExpertLayoutStartupError on every rank when the session says stop."""
    t0 = time.perf_counter()
    st = state.get()
    group = world_cpu_group()
    rank = dist.get_rank(group)
    standby = roles.is_standby()
    path = daemon_socket_path(gpu_id)
    session = EngineSession(
        _engine_id(group),
        dist.get_world_size(group),
        _engine_layout(metadata),
        standby=standby,
        wait_timeout_s=_env_seconds(WAIT_TIMEOUT_ENV, DEFAULT_WAIT_TIMEOUT_S),
        poll_interval_s=_env_seconds(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S),
        socket=path,
    )
    st.session, st.rank, st.socket_path, st.model_config = session, rank, path, model_config
    st.trace = trace_engine(session, rank, path, standby, metadata.physical_to_logical_map_cpu.tolist)
    metrics.watch(session, rank)
    st.counters.watch(session, rank)
    step = runner.run(session.step(Started(rank, rows_of(metadata.physical_to_logical_map_cpu.tolist())))).done
    outcome = session.view().outcome
    metrics.startup(session.view(), rank, 0 if st.install is None else len(st.install.missing))
    assert step is not None, "startup ends with the agreement's step"
    if step.go is Go.STOP:
        logger.log(int(step.severity), "[expert-layout] %s", step.message)
        raise ExpertLayoutStartupError(step.message)
    st.counters.record_time("startup_s", time.perf_counter() - t0)
    logger.log(int(step.severity), "[expert-layout] rank %d startup: %s", rank, step.message)
    if outcome is not None and outcome.warning:  # its own line at WARNING, for log scrapers and alerts
        logger.warning("[expert-layout] rank %d: WARNING: %s", rank, outcome.warning)
    return step
