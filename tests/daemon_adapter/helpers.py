"""A socket client for the tests (sglang's framing, no sglang import) and small asserts."""

from __future__ import annotations

import socket
import time
from typing import Any

from tools.harness.daemon_proc import attach, default_cache_config, request

from layout_sm.messages import (
    abort_request,
    begin_request,
    commit_request,
    fetch_layout_field,
    query_request,
)


class Engine:
    """One engine's side of the protocol on one daemon: an attachment and its session."""

    def __init__(self, socket_path: str, engine_id: str) -> None:
        self.socket_path = socket_path
        self.engine_id = engine_id
        self.conn: socket.socket | None = None
        self.session = ""
        self.attach_reply: dict[str, Any] = {}

    def attach(self) -> dict[str, Any]:
        self.conn, self.attach_reply = attach(self.socket_path, self.engine_id)
        self.session = self.attach_reply.get("session", "")
        return self.attach_reply

    def detach(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def begin(self, layers: list[int], base_version: int = 0, session: str | None = None) -> dict[str, Any]:
        msg = begin_request(self.engine_id, self.session if session is None else session, base_version, layers)
        return request(self.socket_path, msg)

    def commit(self, layers: list[int], rows: list[list[int]], session: str | None = None) -> dict[str, Any]:
        msg = commit_request(self.engine_id, self.session if session is None else session, layers, rows)
        return request(self.socket_path, msg)

    def abort(self, session: str | None = None) -> dict[str, Any]:
        return request(self.socket_path, abort_request(self.engine_id, self.session if session is None else session))

    def fetch(self, version: int, digest: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
        return fetch_state(self.socket_path, fetch_layout_field(self.engine_id, self.session, version, digest), config)


def fetch_state(socket_path: str, layout_field: Any = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """sglang's ``fetch_state`` request, with the optional ``expert_layout`` field."""
    msg: dict[str, Any] = {"type": "fetch_state", "config": config or default_cache_config()}
    if layout_field is not None:
        msg["expert_layout"] = layout_field
    return request(socket_path, msg)


def query(socket_path: str, include_map: bool = False) -> dict[str, Any]:
    return request(socket_path, query_request(include_map))


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status_reason(reply: dict[str, Any]) -> tuple[str, str]:
    return reply.get("status", ""), reply.get("reason", "")
