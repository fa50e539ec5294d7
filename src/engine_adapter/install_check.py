"""Fail closed when sglang did not apply every hook of the plugin (sglang moved under it).

sglang's ``HookRegistry.apply_hooks`` logs "Failed to apply hooks to %s" and goes on
(``plugins/hook_registry.py:159-166``), so a renamed or moved target leaves the protocol partly
installed, and some of those installs move shared experts with no begin and no commit. The
startup hook, which runs in every engine rank before EPLB can rebalance, calls ``at_startup``:

- each target the plugin registers (``plugin.hooks()``), and each name sglang calls it through
  (``CALL_SITES``), must be a function that calls the plugin's own hook: checked by
  identity (the hook object is in the closure of the function sglang calls, or of one it wraps),
  never by name;
- if one is missing and the weight cache is on, rebalancing of shared weights is off (the rebalance
  hook hands the error to the session, ``EngineSession.install_checked``: one of its off reasons;
  ``skip_unprotected_move``), with one error naming the missing targets, the
  installed sglang version and the tested ones (``engine_adapter.compat``); if both the rebalance
  and the chunk hook are missing nothing in the engine can stop a move, so the engine fails at
  startup instead;
- an sglang or Python version that is not tested gets a warning; the checks above still apply.

If the startup hook itself is missing none of this runs; the daemons catch that case: the loader
hook says so in ``fetch_state`` (``layout_sm.messages.PLUGIN_GAP_FIELD``), and a daemon that sees a
fetch without a claim from an attached engine process refuses it too (``Reason.PLUGIN_INCOMPLETE``).
"""

from __future__ import annotations

import functools
import logging
import pkgutil
from collections.abc import Callable
from typing import Any

from engine_adapter import compat, state
from engine_adapter.compat import InstallCheck
from engine_adapter.targets import CALL_SITES, CHUNK_TARGET, REBALANCE_TARGET
from layout_sm.engine import HooksVerdict, hooks_verdict

logger = logging.getLogger("engine_adapter")

# How deep a chain of wrappers (other plugins' hooks around ours) is followed.
MAX_WRAPPERS = 32


class HooksMissingError(RuntimeError):
    """The engine must not start: sglang would move shared experts and no hook can stop it."""


def calls_hook(function: object, hook: Callable[..., Any]) -> bool:
    """Whether calling ``function`` runs ``hook``: ``hook`` is held by the closure of ``function``
    or of a function it wraps (sglang's wrappers set ``__wrapped__``, as ``functools.wraps`` does)."""
    for _ in range(MAX_WRAPPERS):
        if function is None:
            return False
        for cell in getattr(function, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # an empty cell
                continue
        function = getattr(function, "__wrapped__", None)
    return False


def _in_place(name: str, hook: Callable[..., Any]) -> bool:
    try:
        function = pkgutil.resolve_name(name)
    except Exception:  # moved or renamed: nothing there calls the hook
        return False
    return calls_hook(function, hook)


# (target, hook) as ``engine_adapter.plugin.register()`` registered them in this process.
_expected: tuple[tuple[str, Callable[..., Any]], ...] = ()


def expect(registered: tuple[tuple[str, Callable[..., Any]], ...]) -> None:
    """Called by the plugin's ``register()`` with every hook it registered, before sglang applies them."""
    global _expected
    _expected = tuple(registered)
    check.cache_clear()


@functools.cache
def check() -> InstallCheck:
    """Which hooks are not in place; once per process (sglang applies hooks once, at plugin load)."""
    missing = []
    for target, hook in _expected:
        names = (target, *CALL_SITES.get(target, ()))
        if not all(_in_place(name, hook) for name in names):
            missing.append(target)
    return InstallCheck(tuple(missing), compat.installed_sglang_version(), compat.installed_python_version())


def at_startup(st: state.EngineLayoutState, weight_cache_on: bool, eplb_on: bool) -> InstallCheck:
    """The check, its warning and its error, and what ``layout_sm`` says the engine does about them;
    raises ``HooksMissingError`` when it must not start."""
    result = check()
    st.install = result
    if result.warning:
        st.log_once(logging.WARNING, "install:untested-version", f"[expert-layout] WARNING: {result.warning}")
    if result.complete:
        return result
    st.log_once(logging.ERROR, "install:hooks-missing", f"[expert-layout] {result.error}")
    verdict = hooks_verdict(
        result.error, REBALANCE_TARGET in result.missing, CHUNK_TARGET in result.missing, weight_cache_on, eplb_on
    )
    if verdict.moves_blocked:
        st.shared_moves_blocked = result.error
    if verdict.refuse_start is not None:
        raise HooksMissingError(f"[expert-layout] {verdict.refuse_start}")
    return result


def skip_unprotected_move(st: state.EngineLayoutState) -> bool:
    """In the chunk hook, for a move outside the plugin's rebalance hook: skipped while the install
    check blocks moves (sglang's rebalance without its hook would move shared experts unprotected)."""
    if st.shared_moves_blocked is None:
        return False
    st.log_once(logging.ERROR, "install:move-skipped", f"[expert-layout] {HooksVerdict.SKIPPED_MOVE}")
    return True
