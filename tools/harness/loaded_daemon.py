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

import threading
from collections.abc import Collection, Mapping
from typing import Any

import torch
from sglang.srt.weight_cache.daemon import WeightCacheDaemon
from sglang.srt.weight_cache.protocol import CacheConfig
from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

from daemon_adapter.daemon import LayoutAwareDaemon
from layout_sm.daemon import DaemonView
from layout_sm.reasons import Reason
from layout_sm.repair import RepairPlan


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

    def run(self, plan: RepairPlan, timeout: float = 60.0) -> Any:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._ends), timeout=timeout):
                return (Reason.REPAIR_FAILED, f"the fake reload was not ended within {timeout} s")
            ok = self._ends.pop(0)
        if not ok:
            return (Reason.REPAIR_FAILED, "a read error (the fake reload failed)")
        return {"layers": list(plan.layers), "seconds": 0.0, "bytes_read": 0, "checkpoint_bytes": 0}


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
    stands in for the reload with ``FakeReload`` (``fake_reload``)."""

    def __init__(self, *args: Any, auto_repair: bool = False, fake_reload: FakeReload | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._auto_repair = auto_repair
        self.fake_reload = fake_reload

    def _reload_layers(self, plan: RepairPlan) -> Any:
        if self.fake_reload is None:
            return super()._reload_layers(plan)
        return self.fake_reload.run(plan)

    def layout_view(self) -> DaemonView:
        """A snapshot of the layout state, read as the daemon's own threads read it."""
        machine, lock = self._machine()
        with lock:
            return machine.view()
