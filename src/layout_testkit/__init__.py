"""Test and demo helpers shared by the project's parts (real sglang parts on CPU).

- ``layout_testkit.daemon_proc``: a real layout-aware sglang weight cache daemon in its own
  process, without a model (see its docstring for the API).

Modules import sglang and torch lazily, so a client process that only speaks the socket
protocol stays cheap.
"""
