"""Scripts the engine rank processes run (``EngineRanks.run(script, ...)``): module-level, so they
pickle by name into the spawned ranks."""

from __future__ import annotations

import dataclasses
from typing import Any

from tools.harness.engine_ranks import EngineRank, EngineSpec


def spec(sockets: tuple[str | None, ...], **kwargs: Any) -> EngineSpec:
    """An engine of these sockets; it writes its protocol trace where this test process says
    (``TRACE_ENV``): the ranks are processes of the whole session, each engine is a test's."""
    import os

    from layout_sm.trace_codec import TRACE_ENV

    env = tuple(kwargs.pop("env", ()))
    if os.environ.get(TRACE_ENV):
        env += ((TRACE_ENV, os.environ[TRACE_ENV]),)
    return EngineSpec(sockets=tuple(sockets), env=env, **kwargs)


def _adapter_state() -> Any:
    from engine_adapter import state

    return state.get()


def summary(rank: EngineRank) -> dict[str, Any]:
    st = _adapter_state()
    view = None if st.session is None else st.session.view()
    outcome = None if view is None else view.outcome
    return {
        "map": rank.map(),
        "kind": None if outcome is None else outcome.kind,
        "reason": None if outcome is None else outcome.reason,
        "version": None if outcome is None else view.version,
        "digest": None if view is None else view.digest,
        "shared": outcome is not None and outcome.shared_rebalance,
        "attached": st.attachment is not None and st.attachment.open,
        "engine_id": None if view is None else view.engine_id,
        "source": st.weights_source,  # what the plugin's loader hook recorded
        "loaded": rank.source,  # what the harness loaded (also without the plugin)
        "timings": dict(st.counters.timings),
        "chunks_committed": st.counters.chunks_committed,
    }


def cache_config(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(dataclasses.replace(engine, plugin=False))
    config = rank.cache_config()
    rank.stop()
    return config


def start(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(engine)
    return summary(rank)


def start_installing_all_but_layer_0(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    """Start as a build whose install leaves layer 0 as it was: sglang then routes with another map than
    the one the session adopted (what the trace's ``routes`` lines must show)."""
    from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

    from engine_adapter import runner

    original = runner.install

    def install_all_but_layer_0(rows: Any) -> None:
        kept = get_global_expert_location_metadata().physical_to_logical_map_cpu.tolist()[0]
        original([kept, *rows[1:]])

    runner.install = install_all_but_layer_0
    try:
        rank.start(engine)
    finally:
        runner.install = original
    return summary(rank)


def start_load(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(engine)
    rank.load()
    return summary(rank)


def stop(rank: EngineRank) -> None:
    rank.stop()


METADATA_FIELDS = (
    "physical_to_logical_map",
    "physical_to_logical_map_cpu",
    "logical_to_all_physical_map",
    "logical_to_all_physical_map_cpu",
    "logical_to_all_physical_map_num_valid",
    "logical_to_rank_dispatch_physical_map",
)


def _tensors(meta: Any) -> dict[str, Any]:
    return {f: getattr(meta, f).clone() for f in METADATA_FIELDS if getattr(meta, f) is not None}


def compare_metadata(
    rank: EngineRank, sockets: tuple[str, ...], cfg: Any, init_json: str, cases: list[tuple[str, str]]
) -> dict[Any, Any]:
    """For each (dispatch, a2a backend): engine A adopts the daemons' map, engine B is started with
    --init-expert-location set to it (no daemons); every metadata tensor must be equal."""
    import torch

    out: dict[Any, Any] = {}
    for dispatch, backend in cases:
        adopted = rank.start(EngineSpec(sockets=sockets, cfg=cfg, dispatch=dispatch, a2a_backend=backend))
        kind = _adapter_state().session.view().outcome.kind
        a = _tensors(rank.metadata())
        rank.stop()
        rank.start(
            EngineSpec(
                sockets=(None,) * len(sockets),
                cfg=cfg,
                dispatch=dispatch,
                a2a_backend=backend,
                init_expert_location=init_json,
                plugin=False,
            )
        )
        b = _tensors(rank.metadata())
        rank.stop()
        differ = [
            f
            for f in METADATA_FIELDS
            if (f in a) != (f in b) or (f in a and (a[f].dtype != b[f].dtype or not torch.equal(a[f], b[f])))
        ]
        out[(dispatch, backend)] = {
            "adopted_kind": kind,
            "map": adopted,
            "differ": differ,
            "compared": [f for f in METADATA_FIELDS if f in a],
            "fingerprint": [a[f].tolist() for f in sorted(a)],
        }
    return out


def rebalance(rank: EngineRank, phase: int, kill_daemon_pid: int | None = None) -> dict[str, Any]:
    """One real EPLBManager.rebalance() with skewed statistics of ``phase``.

    ``kill_daemon_pid``: this rank SIGKILLs that daemon when sglang's updater is about to move,
    i.e. between begin and commit (a daemon crash mid-move).
    """
    import os
    import signal
    import time

    from tools.harness import toy_moe

    assert rank.spec is not None
    restore = None
    if kill_daemon_pid is not None:
        from sglang.srt.eplb.expert_location_updater import ExpertLocationUpdater

        original = ExpertLocationUpdater.update

        def update(self: Any, *args: Any, **kwargs: Any) -> Any:
            os.kill(kill_daemon_pid, signal.SIGKILL)
            return original(self, *args, **kwargs)

        ExpertLocationUpdater.update = update

        def restore() -> None:
            ExpertLocationUpdater.update = original

    before = rank.map()
    try:
        steps = rank.rebalance(toy_moe.skewed_logical_count(rank.spec.cfg, phase))
    finally:
        if restore is not None:
            restore()
    st = _adapter_state()
    out = summary(rank)
    lo = rank.rank * rank.spec.cfg.num_local
    read_ns = time.monotonic_ns()
    slots = rank.slots()
    if st.trace is not None and st.socket_path is not None:  # the spec's truth: its daemon's memory, slot by slot
        from tools.demo.memory_probe import ProbeTrace

        ProbeTrace(st.trace.path.parent, st.socket_path).truth(read_ns, lo, slots)
    out.update(
        before=before,
        steps=steps,
        slots=slots,
        believed=[row[lo : lo + rank.spec.cfg.num_local] for row in rank.map()],
        disabled=rank.manager._rebalance_disabled_reason,
        phase=None if st.session is None or st.session.view().mode is None else st.session.view().rebalance,
        logged=sorted(st.logged),
        mode=None if st.session is None or st.session.view().mode is None else st.session.view().mode.reason,
    )
    return out


def load(rank: EngineRank) -> dict[str, Any]:
    rank.load()
    return summary(rank)


def current(rank: EngineRank) -> dict[str, Any]:
    return summary(rank)


def start_load_fork(
    rank: EngineRank, engine: EngineSpec, child_seconds: float, control_rank: int | None = None
) -> dict[str, Any]:
    """Start and load, then fork a child that outlives this engine (a helper process would).

    On ``control_rank``, also start a process that is handed the attach socket on purpose
    (``pass_fds``): the control that shows a live holder does keep the engine attached.
    """
    import os
    import subprocess
    import time

    rank.start(engine)
    rank.load()
    pid = os.fork()
    if pid == 0:
        time.sleep(child_seconds)
        os._exit(0)
    out = summary(rank)
    out["child"] = pid
    out["pid"] = os.getpid()
    out["control"] = None
    if rank.rank == control_rank:
        fd = _adapter_state().attachment._sock.fileno()
        holder = subprocess.Popen(["sleep", str(child_seconds)], pass_fds=[fd])
        out["control"] = holder.pid
    return out


def fail_to_apply(rank: EngineRank, target: str) -> bool:
    """Make sglang's HookRegistry fail to apply the hooks on ``target`` in this rank process, as a
    renamed or moved target of a newer sglang does: ``apply_hooks`` logs it and goes on. Before the
    plugin is loaded (a fresh pool); returns whether the target was still unpatched."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    apply = HookRegistry._apply_target.__func__

    def failing(cls: Any, name: str, hooks: Any) -> Any:
        if name == target:
            raise AttributeError(f"{name} cannot be resolved (made to fail by the test)")
        return apply(cls, name, hooks)

    HookRegistry._apply_target = classmethod(failing)
    return target not in HookRegistry._patched


def half_installed_run(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    """Start, load and rebalance once; the first step that raises ends the run (reported, not raised)."""
    import sglang.srt.plugins as sglang_plugins

    out: dict[str, Any] = {"stage": "start", "error": None, "plugins_loaded_before": sglang_plugins._plugins_loaded}
    try:
        rank.start(engine)
        out["stage"] = "load"
        rank.load()
    except Exception as error:
        st = _adapter_state()
        out.update(error=f"{type(error).__name__}: {error}", logged=sorted(st.logged))
        out["install"] = _install(st)
        return out
    out["stage"] = "rebalance"
    out.update(rebalance(rank, 1))
    out["install"] = _install(_adapter_state())
    return out


def _install(st: Any) -> dict[str, Any] | None:
    install = getattr(st, "install", None)  # None before install_check existed (the original code)
    if install is None:
        return None
    return {"missing": list(install.missing), "error": install.error, "warning": install.warning}


def start_load_slots(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    """A new engine with the whole plugin: what it believes each of its slots holds, and what they hold."""
    rank.start(engine)
    rank.load()
    out = summary(rank)
    lo = rank.rank * engine.cfg.num_local
    out.update(slots=rank.slots(), believed=[row[lo : lo + engine.cfg.num_local] for row in rank.map()])
    return out


def untested_version_start(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    """Start as if the installed sglang were not a tested one: the warning, and the checks still run."""
    from engine_adapter import compat

    tested = compat.TESTED_SGLANG_VERSIONS
    compat.TESTED_SGLANG_VERSIONS = ("0.0.0-never",)
    try:
        rank.start(engine)
        install = _install(_adapter_state())
    finally:
        compat.TESTED_SGLANG_VERSIONS = tested
    out = summary(rank)
    out.update(logged=sorted(_adapter_state().logged), install=install)
    return out


def metrics_text() -> str:
    """This rank process's series in the text exposition format (what sglang's /metrics merges)."""
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


def start_load_metrics(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    out = start_load(rank, engine)
    out["metrics"] = metrics_text()
    return out


def rebalance_with_a_broken_move(rank: EngineRank, phase: int) -> dict[str, Any]:
    """A rebalance whose first move raises, as sglang's does when a peer rank dies mid-chunk (its
    collective breaks): the error, and the session's rebalance phase after it."""
    from sglang.srt.eplb.expert_location_updater import ExpertLocationUpdater
    from tools.harness import toy_moe

    assert rank.spec is not None
    original = ExpertLocationUpdater.update

    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the move's collective broke: a peer rank died")

    ExpertLocationUpdater.update = update
    try:
        rank.rebalance(toy_moe.skewed_logical_count(rank.spec.cfg, phase))
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    finally:
        ExpertLocationUpdater.update = original
    return {"error": error, "phase": _adapter_state().session.view().rebalance}


def rebalance_metrics(rank: EngineRank, phase: int) -> dict[str, Any]:
    out = rebalance(rank, phase)
    out["metrics"] = metrics_text()
    return out


def start_failing_metrics(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    try:
        rank.start(engine)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "metrics": metrics_text()}


def metrics_active(rank: EngineRank) -> bool:
    from engine_adapter import metrics

    return metrics.active() is not None


def gather_small_and_large(rank: EngineRank) -> dict[str, Any]:
    """``collective.all_gather_small`` on small objects (one collective), then with rank 1's too large
    for the slot (every rank gathers again): what was gathered, and the collectives each took."""
    import torch.distributed as dist

    from engine_adapter import collective

    calls: list[str] = []
    real_gather, real_object = dist.all_gather, dist.all_gather_object

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return fn(*args, **kwargs)

        return call

    dist.all_gather = counted("all_gather", real_gather)
    dist.all_gather_object = counted("all_gather_object", real_object)
    try:
        small = collective.all_gather_small({"rank": rank.rank, "reply": "ok" * rank.rank})
        small_calls = list(calls)
        calls.clear()
        big = "x" * (collective.INLINE_BYTES + 1) if rank.rank == 1 else "y"
        large = collective.all_gather_small({"rank": rank.rank, "payload": big})
        large_calls = list(calls)
    finally:
        dist.all_gather, dist.all_gather_object = real_gather, real_object
    return {"small": small, "small_calls": small_calls, "large": large, "large_calls": large_calls}
