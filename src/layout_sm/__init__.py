"""The expert-layout protocol core: pure, deterministic, no I/O, no torch, no sglang.

Every protocol decision of the project is made here, once; the adapters translate.
Each module's docstring is its contract; the adapters build on these and never restate a rule:

- ``record``: the layout record and its digest (``layout_digest``, the one definition of it);
- ``reasons``: every reply's status, reason code and message (``Reply``), and the shared advice;
- ``messages``: the wire schema, every request built and parsed, and who answers what;
- ``daemon``: each daemon request declared once (its ladder of conjuncts and replies) and the daemon's machine;
- ``engine``: the engine's startup and rebalance decisions and machines;
- ``diagrams``: the machines drawn from their classes (``make diagrams``).
"""

from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutError, LayoutRecord, layout_digest

__all__ = ["LayoutError", "LayoutRecord", "Reason", "Reply", "Status", "layout_digest"]
