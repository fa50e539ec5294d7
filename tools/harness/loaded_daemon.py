"""sglang's weight cache daemons without a model or a GPU, for tests, the demo and the bench.

sglang's ``WeightCacheDaemon.__init__`` reads server args and the GPU's UUID, and its ``load()``
loads a model. ``FakeLoadedDaemon`` replaces both: it sets the fields they would leave, from plain
values, with CPU tensors exported by sglang's real transport. Everything else is
sglang's: ``serve()``, ``_handle_connection``, the transport.

``FakeLoadedLayoutAwareDaemon`` puts it under ``LayoutAwareDaemon``: in its method resolution order
``FakeLoadedDaemon.__init__`` stands where sglang's ``__init__`` was, so ``LayoutAwareDaemon.__init__``
runs unchanged. ``FakeLoadedDaemon`` itself is sglang's own daemon (an older daemon: no layout
requests). Importing this module imports sglang and torch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from sglang.srt.weight_cache.daemon import WeightCacheDaemon
from sglang.srt.weight_cache.protocol import CacheConfig
from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

from daemon_adapter.daemon import LayoutAwareDaemon
from layout_sm.daemon import DaemonView
from layout_sm.daemon_view import RepairDone, RepairFailed
from layout_sm.reasons import Reason
from layout_sm.repair import RepairPlan
from tools.harness import toy_moe


class FakeReload:
    """Stands in for the reload of a torn move (which needs a model): each reload waits until the
    test lets one end (``end``), well or failed, so that the test decides when a repair ends."""

    def __init__(self) -> None:
        self._ends: list[bool] = []
        self._ready = threading.Condition()

    def end(self, ok: bool = True) -> None:
        """Let one reload end: ``ok`` (the layers are back) or failed (a read error)."""
        with self._ready:
            self._ends.append(ok)
            self._ready.notify_all()

    def run(self, plan: RepairPlan, timeout: float = 60.0) -> RepairDone | RepairFailed:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._ends), timeout=timeout):
                return plan.failed(Reason.REPAIR_FAILED, f"the fake reload was not ended within {timeout} s")
            ok = self._ends.pop(0)
        if not ok:
            return plan.failed(Reason.REPAIR_FAILED, "a read error (the fake reload failed)")
        return plan.ended({"seconds": 0.0, "bytes_read": 0, "checkpoint_bytes": 0})


class FakeCheckpointReload:
    """Replaces sglang's reload of a torn move from the checkpoint (it needs the daemon's model): the
    toy's weights are a function of the expert (``toy_moe``), so its checkpoint is computed. Each
    reload writes the plan's layers of this rank's slots, as the record's rows hold them, into the
    daemon's exported tensors in place (what every engine maps).

    ``die_marker``: the daemon process SIGKILLs itself inside its first reload, its first tensor
    written and the rest not (a crash mid-repair), once it has written that file."""

    def __init__(
        self,
        cfg: toy_moe.ToyMoEConfig,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        die_marker: str | None = None,
    ) -> None:
        self.cfg, self.rank, self.tensors, self.die_marker = cfg, rank, tensors, die_marker

    def load_at(self, rows: Any) -> None:
        """Every layer of this rank's slots at ``rows``: what sglang's load from the checkpoint leaves in
        memory where the layout it loads at is ``rows`` (a daemon started from its durable copy)."""
        checkpoint = toy_moe.rank_state(self.cfg, self.rank, rows)
        for name, tensor in checkpoint.items():
            if name in self.tensors:
                self.tensors[name].copy_(tensor)

    def run(self, plan: RepairPlan) -> RepairDone:
        started = time.perf_counter()
        checkpoint = toy_moe.rank_state(self.cfg, self.rank, plan.record.rows)
        names = [name.format(layer=layer) for layer in plan.layers for name in (toy_moe.W13, toy_moe.W2)]
        for n, name in enumerate(names):
            self.tensors[name].copy_(checkpoint[name])
            if n == 0 and self.die_marker is not None:
                Path(self.die_marker).write_text(f"layers {list(plan.layers)} at version {plan.base_version}\n")
                os.kill(os.getpid(), signal.SIGKILL)
        return plan.ended(
            {
                "seconds": time.perf_counter() - started,
                "bytes_read": sum(checkpoint[n].numel() * checkpoint[n].element_size() for n in names),
                "checkpoint_bytes": sum(t.numel() * t.element_size() for t in checkpoint.values()),
            }
        )


class FakeLoadedDaemon(WeightCacheDaemon):
    """sglang's daemon as ``load()`` leaves it, serving ``tensors`` instead of a model's weights
    (replaces ``WeightCacheDaemon.__init__`` and ``load()``, which need server args, a GPU and a model)."""

    def __init__(
        self,
        *,
        socket_path: str,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor] | None = None,
        buffer_names: Collection[str] = (),
        transport_backend: Any = None,
        ready_path: str | None = None,
        gpu_id: int = 0,
    ) -> None:
        tensors = dict(tensors or {})
        self.gpu_id = gpu_id
        self.tp_rank = config["tp_rank"]
        self.socket_path = socket_path
        self.ready_path = ready_path if ready_path is not None else socket_path + ".ready"
        self.model = None
        self.config = CacheConfig.from_dict(dict(config))
        self.transport_backend = transport_backend if transport_backend is not None else TorchIpcTransportBackend()
        self.state_entries = self.transport_backend.prepare_export(
            {name: (tensor, name not in buffer_names) for name, tensor in tensors.items()}
        )
        self.preloaded_weights_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self._served_tensors = tensors  # keeps the exported storages alive


class FakeLoadedLayoutAwareDaemon(LayoutAwareDaemon, FakeLoadedDaemon):
    """``LayoutAwareDaemon`` on ``FakeLoadedDaemon``; ``set_initial_layout`` gives it a record.

    It has no model to reload a torn move from, so auto repair is off unless asked for
    (``auto_repair``), and a repair fails ("the daemon's model is not loaded") unless the test
    stands in for the reload (``fake_reload``): with ``FakeReload`` the test ends each one, with
    ``FakeCheckpointReload`` the toy's layers are written back."""

    def __init__(
        self,
        *args: Any,
        auto_repair: bool = False,
        fake_reload: FakeReload | FakeCheckpointReload | None = None,
        copy_file: Path | None = None,
        **kwargs: Any,
    ):
        """``copy_file``: the durable copy's file, where the host names it (its sockets change per start)."""
        super().__init__(*args, **kwargs)
        self._auto_repair = auto_repair
        self.fake_reload = fake_reload
        self._copy_file = copy_file

    def copy_file(self) -> Path | None:
        return self._copy_file if self._copy_file is not None else super().copy_file()

    def start_layout(self, initial: Any, read: Any) -> None:
        if read is not None and read.record is not None and isinstance(self.fake_reload, FakeCheckpointReload):
            # sglang's daemon loads its weights at the copy's map (the global expert location it sets
            # first); the toy's weights are computed, so the load is this.
            self.fake_reload.load_at(read.record.rows)
        super().start_layout(initial, read)

    def persist(self) -> Any:
        """Write the durable copy now, as the writer thread would (``copy_writes_by_itself`` off): the
        record written, or None (none due)."""
        assert self._copy_writer is not None, "the daemon keeps no durable copy"
        return self._copy_writer.write_due()

    def _reload_layers(self, plan: RepairPlan) -> RepairDone | RepairFailed:
        if self.fake_reload is None:
            return super()._reload_layers(plan)
        return self.fake_reload.run(plan)

    def layout_view(self) -> DaemonView:
        """A snapshot of the layout state, read as the daemon's own threads read it."""
        machine, lock = self._machine()
        with lock:
            return machine.view()
