"""A warm standby's side in sglang's HTTP server process (``engine_adapter.standby``: the whole standby).

Two hooks on sglang's ``TokenizerManager``: the server status is held at ``Starting`` once the warmup is
over and the park is sent to the scheduler instead (sglang's own in-place pause, marked by its ``rid``);
the promotion the entry rank sends back (a health-check output, marked) turns the server ``Up``.

A module of its own, light to import: sglang imports each hooked target's module in the process that
registers the hook, and the HTTP server's process runs neither a scheduler nor EPLB; with the
scheduler side's module (sglang's EPLB metadata, the protocol, python-statemachine) its ``load_plugins()``
took 0.120 s and 57 modules here once sglang's tokenizer manager was imported, against 0.066 s and 13.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sglang.srt.managers.io_struct import HealthCheckOutput, PauseGenerationReqInput

from engine_adapter import roles

logger = logging.getLogger("engine_adapter")

# The rids that mark the plugin's own uses of sglang's pause and health-check messages.
PARK_RID = "expert-layout-park"
PROMOTED_RID = "expert-layout-promoted"
# The standby's own one-token warmup when sglang skipped its warmup (sglang's default warmup timeout).
WARMUP_TIMEOUT_S = 600.0


@dataclass
class _ServerSide:
    park_sent: bool = False
    promoted: bool = False


_SERVER = _ServerSide()


def around_set_engine_state_field(original: Any, manager: Any, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    if name != "_server_status" or value != ServerStatus.Up or _SERVER.promoted or not roles.is_standby():
        return original(manager, name, value, *args, **kwargs)
    if not _SERVER.park_sent:  # the warmup is over: park instead of going up
        _SERVER.park_sent = True
        if getattr(manager, "event_loop", None) is None:
            _warm_up(manager)
        request = PauseGenerationReqInput(mode="in_place", rid=PARK_RID)
        # The server's event loop owns the zmq socket to the scheduler (this is sglang's warmup thread).
        manager.event_loop.call_soon_threadsafe(manager._dispatch_to_scheduler, request)
        logger.info("[expert-layout] warm standby: warmed up, parking (health answers 503 until promoted)")
    return None


def _warm_up(manager: Any) -> None:
    """sglang skipped its warmup (``--skip-server-warmup``): the standby runs one one-token request on the
    shared weights before it parks. It also starts the server's loop that reads what the scheduler
    sends back (sglang starts it at the first request), which is where the promotion arrives."""
    import requests
    from sglang.srt.runtime_context import get_serving

    key = get_serving().api_key
    deadline = time.monotonic() + WARMUP_TIMEOUT_S
    while True:  # with its warmup skipped, sglang declares the server up before its HTTP socket listens
        try:
            response = requests.post(
                manager.server_args.url() + "/generate",
                json={"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
                headers={"Authorization": f"Bearer {key}"} if key else {},
                timeout=WARMUP_TIMEOUT_S,
                verify=False,
            )
            break
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    response.raise_for_status()


def around_init_request_dispatcher(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    result = original(manager, *args, **kwargs)
    dispatcher = manager._result_dispatcher
    passed_on = dispatcher._mapping.get(HealthCheckOutput)

    def health_check_output(obj: Any) -> Any:
        if getattr(obj, "rid", None) == PROMOTED_RID:
            from sglang.srt.managers.tokenizer_manager import ServerStatus

            _SERVER.promoted = True
            manager.server_status = ServerStatus.Up
            logger.info("[expert-layout] warm standby promoted: the server is up")
            return None
        return None if passed_on is None else passed_on(obj)

    dispatcher._mapping[HealthCheckOutput] = health_check_output
    return result
