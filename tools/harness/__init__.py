"""Test and demo helpers shared by the project's parts (real sglang parts on CPU).

- ``tools.harness.daemon_proc``: a real layout-aware sglang weight cache daemon in its own
  process, without a model (see its docstring for the API).
- ``tools.harness.loaded_daemon``: sglang's daemon classes built without a model or a GPU
  (``FakeLoadedDaemon``, ``FakeLoadedLayoutAwareDaemon``), for daemons in this process or in
  ``daemon_proc``'s; it imports sglang and torch.

The other modules import sglang and torch lazily, so a client process that only speaks the socket
protocol stays cheap.
"""
