"""The expert-layout protocol core: pure, deterministic, no I/O, no torch, no sglang.

Every protocol decision of the project is made here; the adapters translate sockets, tensors and
collectives into these modules' calls and dispatch on what they return. Each module's docstring
is its contract:

- ``record``: the layout record and its digest (``layout_digest``, the one definition of it);
- ``reasons``: every reply's status, reason code and message (``Reply``), and the shared advice;
- ``messages``: the wire schema, every request built and parsed, and who answers what;
- ``daemon``: each daemon request declared once (its ladder of conjuncts and replies) and the daemon's machine;
- ``engine``: what the engine knows (findings, answers, ``EngineView``) and ``Step``, the one
  output of an engine step;
- ``engine_machines``: the engine's startup and rebalance machines and their model,
  ``EngineState`` (the guards and the actions);
- ``session``: ``EngineSession``, the engine side as one object (what every rank runs);
- ``declared``: a machine class's declared transitions as a table, fired without
  python-statemachine's event loop;
- ``repair``: what a dirty daemon reloads to return to its base version;
- ``diagrams``: the machines drawn from their classes (``make diagrams``).
"""

from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutError, LayoutRecord, layout_digest

__all__ = ["LayoutError", "LayoutRecord", "Reason", "Reply", "Status", "layout_digest"]
