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

from collections.abc import Collection, Mapping
from typing import Any

import torch
from sglang.srt.weight_cache.daemon import WeightCacheDaemon
from sglang.srt.weight_cache.protocol import CacheConfig
from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

from daemon_adapter.daemon import LayoutAwareDaemon
from layout_sm.daemon import DaemonView


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
    """``LayoutAwareDaemon`` on ``FakeLoadedDaemon``; ``set_initial_layout`` gives it a record."""

    def layout_view(self) -> DaemonView:
        """A snapshot of the layout state, read as the daemon's own threads read it."""
        machine, lock = self._machine()
        with lock:
            return machine.view()
