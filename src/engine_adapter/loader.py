"""The loader's side: ``fetch_state`` carries the engine's layout, and a refusal stops the engine.

sglang's ``IpcModelLoader._fetch_from_cache`` builds and sends the request itself, so the field is
added by hooks on sglang's ``send_msg``/``recv_msg`` that act only inside that call (a context
variable marks it; everywhere else, the daemon included, they pass through):

- the ``fetch_state`` request gets ``expert_layout: {engine_id, session, version, digest}`` when
  this rank is attached;
- a ``layout_refused`` reply raises ``LayoutRefusedError`` with the daemon's reason. It is a
  ``RuntimeError``, which the loader re-raises as it is: no fallback to disk;
- whether the weights came from the daemon or from disk is recorded for the rebalance mode;
- when the plugin's startup hook never ran in this process (sglang did not apply it), the request
  says so (``PLUGIN_GAP_FIELD``), and the daemon refuses with a reason naming that case.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from engine_adapter import state
from layout_sm.engine import Go
from layout_sm.messages import FETCH_FIELD, PLUGIN_GAP_FIELD, STARTUP_HOOK_MISSING
from layout_sm.ready import Fetched
from layout_sm.session import EngineSession

FETCH_STATE = "fetch_state"  # sglang's request type


class LayoutRefusedError(RuntimeError):
    """The daemon refused to serve weights for this engine's expert layout."""


@dataclass
class _FetchScope:
    field: dict[str, Any] | None
    gap: str | None = None  # what of the plugin is missing, told to the daemon (PLUGIN_GAP_FIELD)
    awaiting_reply: bool = False
    peer: str = ""


_SCOPE: contextvars.ContextVar[_FetchScope | None] = contextvars.ContextVar("expert_layout_fetch", default=None)


def around_fetch_from_cache(original: Any, loader: Any, *args: Any, **kwargs: Any) -> Any:
    if not state.enabled():
        return original(loader, *args, **kwargs)
    st = state.get()
    gap = None if st.startup_hook_ran else STARTUP_HOOK_MISSING
    token = _SCOPE.set(_FetchScope(field=st.fetch_field(), gap=gap))
    try:
        result = original(loader, *args, **kwargs)
    finally:
        _SCOPE.reset(token)
    # None is sglang's "no daemon socket": the loader then loads from disk.
    st.weights_source = "daemon" if result is not None else "disk"
    return result


def around_send_msg(original: Any, sock: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    scope = _SCOPE.get()
    if scope is not None and isinstance(obj, dict) and obj.get("type") == FETCH_STATE:
        if scope.field is not None:
            obj = {**obj, FETCH_FIELD: dict(scope.field)}
        if scope.gap is not None:
            obj = {**obj, PLUGIN_GAP_FIELD: scope.gap}
        scope.awaiting_reply = True
        try:
            scope.peer = str(sock.getpeername())
        except OSError:
            scope.peer = "?"
    return original(sock, obj, *args, **kwargs)


def around_recv_msg(original: Any, sock: Any, *args: Any, **kwargs: Any) -> Any:
    reply = original(sock, *args, **kwargs)
    scope = _SCOPE.get()
    if scope is not None and scope.awaiting_reply:
        scope.awaiting_reply = False
        st = state.get()
        if st.session is not None and st.rank is not None:
            step = st.session.step(Fetched(st.rank, reply)).done
        else:  # no startup ran (a dense model): the daemon may still refuse an engine without a claim
            step = EngineSession.never_attached(1).step(Fetched(0, reply)).done
        if step is not None and step.go is Go.STOP:
            raise LayoutRefusedError(
                f"[expert-layout] the weight cache daemon at {scope.peer} said: {step.message} "
                f"(not loading from disk instead: the daemon holds this GPU's weights)"
            )
    return reply
