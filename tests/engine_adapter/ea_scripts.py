"""Scripts the engine rank processes run (``EngineRanks.run(script, ...)``): module-level, so they
pickle by name into the spawned ranks."""

from __future__ import annotations

import dataclasses
from typing import Any

from layout_testkit.engine_ranks import EngineRank, EngineSpec


def spec(sockets: tuple[str | None, ...], **kwargs: Any) -> EngineSpec:
    return EngineSpec(sockets=tuple(sockets), **kwargs)


def _adapter_state() -> Any:
    from engine_adapter import state

    return state.get()


def summary(rank: EngineRank) -> dict[str, Any]:
    st = _adapter_state()
    return {
        "map": rank.map(),
        "kind": None if st.startup is None else st.startup.kind,
        "reason": None if st.startup is None else st.startup.reason,
        "version": st.version,
        "digest": st.digest,
        "shared": st.shared_rebalance,
        "attached": st.attachment is not None and st.attachment.open,
        "engine_id": st.engine_id,
        "source": st.weights_source,
        "timings": dict(st.timings),
        "chunks_committed": st.chunks_committed,
    }


def cache_config(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(dataclasses.replace(engine, plugin=False))
    config = rank.cache_config()
    rank.stop()
    return config


def start(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(engine)
    return summary(rank)


def start_load(rank: EngineRank, engine: EngineSpec) -> dict[str, Any]:
    rank.start(engine)
    rank.load()
    return summary(rank)


def stop(rank: EngineRank) -> None:
    rank.stop()
