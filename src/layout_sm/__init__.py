"""The expert-layout protocol core: pure, deterministic, no I/O, no torch, no sglang.

Every protocol decision of the project is made here, once; the adapters translate.
"""

from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutError, LayoutRecord, layout_digest

__all__ = ["LayoutError", "LayoutRecord", "Reason", "Reply", "Status", "layout_digest"]
