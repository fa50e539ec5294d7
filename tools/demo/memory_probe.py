"""What a weight cache daemon's memory holds: the logical expert in each physical slot.

The demo compares what each engine believes (its ``physical_to_logical_map``) with what the
daemons' memory really holds. The second half is read from the memory itself, the way an engine
maps it: sglang's own ``fetch_state`` request on the daemon's socket, and sglang's client-side
transport (``get_client_transport_backend``) to import the exported tensors, zero-copy. Each
slot of a layer's fused ``w13_weight`` is then matched against the experts of the checkpoint
on disk (its ``gate_proj`` rows), so no engine's word is taken for it.

A layout-aware daemon serves a fetch without the layout field only while its record is at
version 0 (an older engine). After a move the probe does what a following engine does: it
attaches, names the version and digest it was told, fetches, and detaches. Run it only while no
engine is mid-move on those daemons, or it would be told to wait like any other engine.
"""

from __future__ import annotations

import glob
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon_adapter import client
from daemon_adapter.trace import TraceFile

PROBE_ENGINE_ID = "demo-memory-probe"
UNKNOWN = -1  # a slot whose weights match no expert of the checkpoint


class ProbeRefused(RuntimeError):
    """The daemon would not serve its memory (dirty, a move pending, another config)."""


def checkpoint_gates(model_dir: str) -> dict[int, list[Any]]:
    """{layer: [gate_proj weight of logical expert e, ...]} from the checkpoint's safetensors."""
    from safetensors import safe_open

    gates: dict[int, dict[int, Any]] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                parts = name.split(".")
                # model.layers.{l}.mlp.experts.{e}.gate_proj.weight
                if len(parts) == 8 and parts[3:5] == ["mlp", "experts"] and parts[6] == "gate_proj":
                    gates.setdefault(int(parts[2]), {})[int(parts[5])] = f.get_tensor(name).float()
    if not gates:
        raise ValueError(f"no routed experts' gate_proj weights in {model_dir}/*.safetensors")
    return {layer: [by_expert[e] for e in sorted(by_expert)] for layer, by_expert in sorted(gates.items())}


def identify_slots(w13: Any, gates: Sequence[Any]) -> list[int]:
    """The logical expert of each slot of one layer's ``w13_weight`` ([slots, 2*inter(+pad), hidden]).

    The first ``inter`` rows of a slot are that expert's ``gate_proj`` whatever padding sglang
    added after them; a slot is the expert whose gate rows it equals (UNKNOWN if none).
    """
    inter, hidden = gates[0].shape
    out = []
    for slot in range(w13.shape[0]):
        rows = w13[slot, :inter, :hidden].float()
        errors = [float((rows - g).abs().max()) for g in gates]
        best = min(range(len(gates)), key=errors.__getitem__)
        scale = float(gates[best].abs().max()) or 1.0
        out.append(best if errors[best] <= 1e-2 * scale else UNKNOWN)
    return out


def _fetch_request(socket_path: str, config: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The fetch_state request an engine would send now, and the attach connection it needs (or None)."""
    from layout_sm.messages import fetch_layout_field, query_request

    state = client.request(socket_path, query_request(), plain=True)
    has_record = state.get("status") == "ok" and state.get("version") is not None
    if not has_record or state.get("version") == 0:
        return {"type": "fetch_state", "config": config}, None  # what an older engine sends
    conn, reply = client.attach(socket_path, PROBE_ENGINE_ID)
    if reply.get("status") != "ok" or not reply.get("record"):
        conn.close()
        raise ProbeRefused(f"{socket_path}: attach refused: {reply.get('message') or reply}")
    record = reply["record"]
    field = fetch_layout_field(PROBE_ENGINE_ID, reply["session"], record["version"], record["digest"])
    return {"type": "fetch_state", "config": config, "expert_layout": field}, conn


def rank_slots(socket_path: str, gates: dict[int, list[Any]], truth: tuple[Path, int] | None = None) -> list[list[int]]:
    """[layer][local slot] -> logical expert, read from one daemon's memory.

    ``truth``: (a run's trace folder, the rank's first global slot): the reading is written there as the
    spec's truth (``ProbeTrace``), which ``tools.trace_check`` compares with the daemon's record."""
    import torch
    from sglang.srt.weight_cache.transport import get_client_transport_backend

    # Standalone daemons export CPU tensors with torch's file_system strategy: import likewise.
    torch.multiprocessing.set_sharing_strategy("file_system")
    config = client.request(socket_path, {"type": "query_config"}, plain=True)["config"]
    msg, attachment = _fetch_request(socket_path, config)
    try:
        reply = client.request(socket_path, msg, timeout=60.0, plain=True)
        if reply.get("status") != "ok":
            raise ProbeRefused(f"{socket_path}: fetch_state {reply.get('status')}: {reply.get('message') or reply}")
        # The reading starts once the fetch is answered and ends before the detach: the daemon takes no step
        # of the probe's own while it runs.
        read_ns = time.monotonic_ns()
        transport = get_client_transport_backend(reply.get("transport_backend"))
        entries = reply["entries"]
        out = []
        for layer in sorted(gates):
            w13 = transport.import_tensor(entries[f"model.layers.{layer}.mlp.experts.w13_weight"])
            out.append(identify_slots(w13, gates[layer]))
            _KEPT_MAPPINGS.append(w13)
        if truth is not None:
            ProbeTrace(truth[0], socket_path).truth(read_ns, truth[1], out)
    finally:
        if attachment is not None:
            attachment.close()
    return out


class ProbeTrace(TraceFile):
    """A probe's reading of one daemon's memory, as the spec's truth: a start line naming the daemon's
    socket and the probe's engine id (its steps on the daemon are an instrument's, not the protocol's),
    then ``truth`` lines as an engine rank's trace writes them."""

    _made = itertools.count()  # a file of its own for each reading, however many a process takes

    def __init__(self, directory: Path, socket_path: str) -> None:
        super().__init__(directory, f"probe-{next(self._made)}")
        self._write("start", socket=socket_path, engine_id=PROBE_ENGINE_ID)

    def truth(self, read_ns: int, first_slot: int, slots: Any) -> None:
        self._write("truth", read_ns=read_ns, done_ns=time.monotonic_ns(), first_slot=first_slot, slots=slots)


# Every mapping a probe made, kept for the life of the process, as an engine keeps its own. With
# torch's file_system strategy a CPU tensor's shared-memory file is unlinked when its refcount
# (in the file) reaches 0. sglang's daemon serializes each handle once, at export (one +1), and
# torch's rebuild decrements once per import (``rebuild_storage_filename``: ``_shared_decref``):
# so each importer that frees its mapping while the daemon lives takes one reference for good, and
# the second one unlinks the daemon's files under it (the next engine's import then fails: seen
# in make demo, case 3b, after two probes). Engines keep their mappings until they exit.
_KEPT_MAPPINGS: list[Any] = []


def held_map(socket_paths: Sequence[str], model_dir: str | Path, traces: Path | None = None) -> list[list[int]]:
    """[layer][physical slot] -> logical expert held in memory, ranks' slots side by side (EP order);
    ``traces``: each rank's reading is written there as the spec's truth (``rank_slots``)."""
    gates = checkpoint_gates(str(model_dir))
    per_rank: list[list[list[int]]] = []
    for path in socket_paths:
        first_slot = sum(len(slots[0]) for slots in per_rank)
        per_rank.append(rank_slots(path, gates, None if traces is None else (traces, first_slot)))
    return [[e for rank in per_rank for e in rank[layer]] for layer in range(len(gates))]


def trivial_map(num_layers: int, num_physical: int, num_logical: int) -> list[list[int]]:
    """sglang's initial layout without ``--init-expert-location`` (``ExpertLocationMetadata.init_trivial``:
    physical slot p holds logical expert p mod num_logical)."""
    return [[p % num_logical for p in range(num_physical)] for _ in range(num_layers)]


def wrong_slots(believed: Sequence[Sequence[int]], held: Sequence[Sequence[int]]) -> int:
    """Slots whose memory holds another expert than the map says."""
    return sum(b != h for brow, hrow in zip(believed, held, strict=True) for b, h in zip(brow, hrow, strict=True))
