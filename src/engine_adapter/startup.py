"""Engine startup (docs/protocol.md §5): attach, wait out another engine's move, agree over all ranks, adopt.

Runs AROUND sglang's ``ModelRunner.maybe_init_expert_location_metadata``, after it, before the
model loads. sglang has then built the engine's own initial metadata (``--init-expert-location``
or trivial); this hook only acts when there is such metadata (dense models are untouched) and the
weight cache is on. Every rank asks its ``EngineSession`` (``layout_sm.session``) what to do and
only does the I/O:

1. sends the session's attach request to its own daemon (the socket path sglang's
   ``IpcModelLoader`` uses);
2. while the session's step says pause, polls with its query up to the timeout
   (``SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT``, 300 s by default);
3. all-gathers its finding over the world CPU group (whatever went wrong locally is a finding,
   never an exception before the collective: no rank is left waiting in it);
4. hands the gathered findings to the session, whose ``agree`` says proceed or stop on every rank
   alike; on move, the layout the session adopted (if any) is installed with sglang's
   ``ExpertLocationMetadata.init_by_mapping``, copied into the live metadata with sglang's own
   ``update``. When ``agree`` says pause, some daemons started again from disk beside daemons that
   hold one moved record: the ranks gather that record's map, each fresh rank asks its daemon to
   rejoin at it and waits for the reload (steps 2 and 3 again), and the ranks agree again.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from sglang.srt.eplb.expert_location import ExpertLocationMetadata, get_global_expert_location_metadata
from sglang.srt.runtime_context import get_exec, get_model, get_parallel

from daemon_adapter import client
from daemon_adapter.trace import trace_engine
from engine_adapter import install_check, metrics, roles, state
from engine_adapter.collective import all_gather_small
from layout_sm.engine import EngineLayout, Go, RankFinding, Step
from layout_sm.messages import FETCH_CLAIMS_FIELD, request_wire
from layout_sm.record import LayoutRecord, Rows, layout_digest, rows_of
from layout_sm.session import EngineSession

logger = logging.getLogger("engine_adapter")

WAIT_TIMEOUT_ENV = "SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT"
POLL_INTERVAL_ENV = "SGLANG_EXPERT_LAYOUT_POLL_INTERVAL"
DEFAULT_WAIT_TIMEOUT_S = 300.0
DEFAULT_POLL_INTERVAL_S = 0.5


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


def world_cpu_group() -> Any:
    return get_parallel().world_group.cpu_group


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, over the world's CPU group, in one collective where it fits
    (``collective.all_gather_small``). An engine of one rank has nothing to exchange: no collective."""
    group = world_cpu_group()
    world = dist.get_world_size(group)
    if world == 1:
        return [obj]
    return all_gather_small(obj, group)


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


def find(session: EngineSession, rank: int, path: str, timeout_s: float, poll_s: float) -> Any:
    """Attach, and poll while the session's step says pause; returns the attachment (None if none)."""
    try:
        # fetch_claims: this process sends its claim with every fetch_state (the daemon refuses one without)
        attachment = client.Attachment(path, {**request_wire(session.attach_request()), FETCH_CLAIMS_FIELD: True})
    except client.DaemonAbsent as error:
        # sglang's loader treats a missing socket as "no daemon" (disk load): no record either.
        session.found(rank, RankFinding.no_daemon(rank, str(error)))
        return None
    except Exception as error:
        session.found(rank, RankFinding.unreachable(rank, f"{path}: {error!r}"))
        return None
    _wait(session, rank, path, session.attached(rank, attachment.reply), timeout_s, poll_s)
    return attachment


def _wait(session: EngineSession, rank: int, path: str, step: Step, timeout_s: float, poll_s: float) -> None:
    """Poll while the session's step says pause (another engine's move, a repair, a rejoin), up to the timeout."""
    started = time.monotonic()
    while step.go is Go.PAUSE:
        waited = time.monotonic() - started
        if waited >= timeout_s:
            session.timed_out(rank, waited)
            break
        logger.info("[expert-layout] %s", step.message)
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
        try:
            reply = client.request(path, request_wire(session.poll_request))
        except Exception as error:
            logger.warning("[expert-layout] rank %d: poll of %s failed: %r", rank, path, error)
            reply = None
        step = session.polled(rank, reply)


def rejoin(session: EngineSession, rank: int, path: str, initial: Rows, timeout_s: float, poll_s: float) -> None:
    """The fresh daemons' ranks ask their daemons to rejoin at the moved record and wait for the reload;
    then every rank's finding is gathered again. The record's map comes from a rank whose daemon holds
    it (the all-gathered findings carry only its digest): one more collective, on this rare path. A
    daemon leaves the map out of its reply when it is the engine's own initial one (``initial``)."""
    target = session.rejoin_target()
    own = session.finding(rank).record
    held = isinstance(own, LayoutRecord) and target is not None and own.digest == target.digest
    mine = own.rows if held else None
    rows = next((r for r in all_gather(mine) if r is not None), None)
    if rows is None and target is not None and session.layout is not None:
        rows = initial if target.digest == session.layout.initial_digest else None
    try:
        if session.rejoins(rank):
            try:
                reply = client.request(path, request_wire(session.rejoin_request(rank, rows)))
            except Exception as error:
                reply = {"status": "refused", "message": f"the rejoin request to {path} failed: {error!r}"}
            step = session.rejoined(rank, reply)
            logger.warning("[expert-layout] rank %d: %s", rank, step.message)
            _wait(session, rank, path, step, timeout_s, poll_s)
        finding = session.finding(rank)
    except Exception as error:  # a bug here must still reach the all-gather
        finding = RankFinding.unreachable(rank, f"engine-side error: {error!r}")
    session.gathered([RankFinding.from_wire(w) for w in all_gather(finding.to_wire())])


def agree(model_config: Any, gpu_id: int, metadata: ExpertLocationMetadata) -> Step:
    """Steps 1-4 above; raises ExpertLayoutStartupError on every rank when the step is stop."""
    t0 = time.perf_counter()
    st = state.get()
    group = world_cpu_group()
    rank = dist.get_rank(group)
    standby = roles.is_standby()
    session = EngineSession(_engine_id(group), dist.get_world_size(group), _engine_layout(metadata), standby=standby)
    path = daemon_socket_path(gpu_id)
    st.session, st.rank, st.socket_path, st.model_config = session, rank, path, model_config
    st.trace = trace_engine(session, rank, path, standby, metadata.physical_to_logical_map_cpu.tolist)
    attachment = None
    timeout_s, poll_s = DEFAULT_WAIT_TIMEOUT_S, DEFAULT_POLL_INTERVAL_S
    try:
        timeout_s = _env_seconds(WAIT_TIMEOUT_ENV, DEFAULT_WAIT_TIMEOUT_S)
        poll_s = _env_seconds(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S)
        attachment = find(session, rank, path, timeout_s, poll_s)
        finding = session.finding(rank)
    except Exception as error:  # a bug here must still reach the all-gather
        finding = RankFinding.unreachable(rank, f"engine-side error: {error!r}")
    session.gathered([RankFinding.from_wire(w) for w in all_gather(finding.to_wire())])
    step = session.agree()
    if step.go is Go.PAUSE:  # some daemons started again from disk: they rejoin, then the ranks agree again
        logger.warning("[expert-layout] rank %d: %s", rank, step.message)
        initial = rows_of(metadata.physical_to_logical_map_cpu.tolist())
        rejoin(session, rank, path, initial, timeout_s, poll_s)
        step = session.agree()
    outcome = session.view().outcome
    missing = 0 if st.install is None else len(st.install.missing)
    if outcome is not None:
        metrics.startup(outcome.kind, outcome.reason.value, session.view().version, finding.kind, missing)
    if step.go is Go.STOP:
        if attachment is not None:
            attachment.close()
        logger.log(int(step.severity), "[expert-layout] %s", step.message)
        raise ExpertLayoutStartupError(step.message)
    rows = session.layout_to_install()
    if rows is not None:  # adopt: route with the daemons' map before the model loads
        adopted = ExpertLocationMetadata.init_by_mapping(
            model_config,
            torch.tensor(rows, dtype=torch.int64),
            moe_ep_rank=get_parallel().moe_ep_rank,
        )
        # In place, as EPLB's updater does: the recorder and dispatch hold this very object.
        metadata.update(adopted, update_layer_ids=list(range(metadata.num_layers)))
    st.attachment = attachment
    st.counters.record_time("startup_s", time.perf_counter() - t0)
    logger.log(int(step.severity), "[expert-layout] rank %d startup: %s", rank, step.message)
    if outcome is not None and outcome.warning:  # its own line at WARNING, for log scrapers and alerts
        logger.warning("[expert-layout] rank %d: WARNING: %s", rank, outcome.warning)
    return step
