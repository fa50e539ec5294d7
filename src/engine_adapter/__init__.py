"""The engine side of the expert-layout protocol (docs/protocol.md §5, §6), as an sglang plugin.

Installing the distribution registers ``engine_adapter.plugin:register`` in sglang's
``sglang.srt.plugins`` entry-point group; sglang's ``load_plugins()`` runs it in every engine
process. The hooks only translate (sockets, tensors, collectives); every step and decision is
the rank's ``layout_sm.session.EngineSession``'s.

Modules:

- ``plugin``: ``register()``, the entry point; the hook targets.
- ``startup``: attach, wait, all-gather, the session's ``agree``, adopt (``ExpertLayoutStartupError``;
  ``SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT``, ``SGLANG_EXPERT_LAYOUT_POLL_INTERVAL``).
- ``loader``: the ``expert_layout`` field of ``fetch_state``; ``LayoutRefusedError``.
- ``rebalance``: the chunk protocol around sglang's EPLB.
- ``collective``: every rank's small object in one collective (a chunk's begin and commit replies).
- ``install_check``: at startup, that sglang applied every hook (by identity); otherwise shared
  rebalancing off with one error. ``compat``: the tested sglang and Python versions, the warning.
- ``metrics``: the protocol's series on sglang's ``/metrics`` (``--enable-metrics``).
- ``state``: what one rank process holds: its session, socket, attachment (``state.get()``,
  ``state.reset()``), counters; ``state.enabled()``: sglang's ``SGLANG_PLUGINS`` selects the plugin.

Sockets to the daemons go through ``daemon_adapter.client``, the client ``expert-layout status``
uses too (one request per connection; the attachment, closed in forked children).

Nothing is imported here: importing sglang costs seconds.
"""
