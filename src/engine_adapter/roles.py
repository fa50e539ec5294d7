"""The engine's role (docs/protocol.md §10): ``primary`` (the default) or a warm ``standby``.

An sglang plugin cannot add command-line flags, so the role is an environment variable, read in every
process of the engine (the HTTP server's and each scheduler's), which inherit it from the launcher.
"""

from __future__ import annotations

import os

ROLE_ENV = "SGLANG_EXPERT_LAYOUT_ROLE"
PRIMARY = "primary"
STANDBY = "standby"
ROLES = (PRIMARY, STANDBY)


class RoleError(ValueError):
    """``SGLANG_EXPERT_LAYOUT_ROLE`` holds no known role."""


def role() -> str:
    """The role this engine was started with; a value that is not a role is refused, naming the valid ones."""
    raw = os.environ.get(ROLE_ENV, "").strip()
    if raw == "":
        return PRIMARY
    if raw not in ROLES:
        raise RoleError(f"{ROLE_ENV}={raw!r} is not a role: use one of {', '.join(ROLES)} (unset: {PRIMARY})")
    return raw


def is_standby() -> bool:
    return role() == STANDBY
