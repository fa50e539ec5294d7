"""The words a daemon's request declarations are written in (``layout_sm.ladders``).

A request is declared once, as a ``Ladder``: its conjuncts (``DaemonView`` methods) in the
precedence of docs/protocol.md §4, each a ``Rung`` with the ``Outcome`` the daemon gives when that
conjunct is the first to fail, and the outcome when all of them hold. An outcome is the answer,
made from the view before the step, and the change to the view, if any.

Most answers are declared as data with ``Say``: the kind of reply (``ok``, ``refused``, ``busy``,
or one of the makers below that say what kind of refusal it is), the reason, a text written with
``str.format`` over ``Words`` (``{req.engine_id!r}``, ``{version}``, ``{layout_unknown}``), and the
reply's data fields, each named after the word it carries. Every reply text is made this one way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from operator import attrgetter
from typing import Any

from layout_sm.daemon_view import MAX_ATTACHMENTS, Answer, DaemonView, DirtyInfo, Move, Request, invalid_layers
from layout_sm.messages import (
    STARTUP_HOOK_MISSING,
    AbortRequest,
    ClaimRequest,
    CommitRequest,
    ParkRequest,
    RejoinRequest,
)
from layout_sm.reasons import (
    REPAIR_OR_RESTART,
    RESTART_DAEMONS,
    Reason,
    Reply,
    layout_refused,
    ok,
    refused,
    repair_failed,
)
from layout_sm.record import LayoutError, LayoutRecord


@dataclass(frozen=True)
class Conjunct:
    """One conjunct as a guard names it: a ``DaemonView`` method, or ``not`` one, asked with the
    request's fields named by the method's parameters.

    The method is looked up by name when asked, so that a patched conjunct (a mutant, a test)
    reaches every guard and every ladder that names it."""

    method: str
    negated: bool
    params: tuple[str, ...]

    @classmethod
    def named(cls, spec: str) -> Conjunct:
        """``spec`` is a python-statemachine guard of the simple kind: ``name`` or ``not name``."""
        words = spec.split()
        negated = words[:1] == ["not"]
        if negated:
            words = words[1:]
        if len(words) != 1 or not callable(getattr(DaemonView, words[0], None)):
            raise ValueError(f"{spec!r} is not a DaemonView conjunct (or 'not' one)")
        params = tuple(inspect.signature(getattr(DaemonView, words[0])).parameters)[1:]
        return cls(words[0], negated, params)

    def __call__(self, view: DaemonView, request: Request) -> bool:
        truth = bool(getattr(view, self.method)(*[getattr(request, p) for p in self.params]))
        return truth is not self.negated

    def __str__(self) -> str:
        return f"not {self.method}" if self.negated else self.method


@dataclass(frozen=True)
class Outcome:
    """What the daemon does: the answer, made from the view before the step, and the view after."""

    answer: Callable[[DaemonView, Any], Answer]
    change: Callable[[DaemonView, Any], DaemonView] | None = None


@dataclass(frozen=True)
class Rung:
    """A conjunct of a request's ladder, and the outcome the daemon gives on it: for one of the
    ladder's rungs, when it is the first to fail; for one of its branches, when it holds once all
    rungs do."""

    conjunct: Conjunct
    outcome: Outcome


def rung(
    conjunct: str,
    answer: Callable[[DaemonView, Any], Answer],
    change: Callable[[DaemonView, Any], DaemonView] | None = None,
) -> Rung:
    return Rung(Conjunct.named(conjunct), Outcome(answer, change))


@dataclass(frozen=True)
class Ladder:
    """One request, declared once: its conjuncts in precedence order, each with its refusal, and
    the outcome when all of them hold."""

    rungs: tuple[Rung, ...]
    accepted: Outcome
    # Once every rung holds, the first branch whose conjunct holds is taken instead of ``accepted``
    # (a detach of the mover: repairing with auto repair, else dirty). Each branch is its own
    # accepting transition, declared before the plain one.
    branches: tuple[Rung, ...] = ()

    @property
    def guards(self) -> list[str]:
        """The accepting transition's guards: every conjunct, in precedence order."""
        return [str(r.conjunct) for r in self.rungs]

    def branch_guards(self, index: int) -> list[str]:
        """The guards of the accepting transition of branch ``index``: the rungs, then its conjunct."""
        return [*self.guards, str(self.branches[index].conjunct)]

    def accepting(self, view: DaemonView, request: Request) -> Outcome:
        """The outcome once every rung holds: the first branch that holds, else ``accepted``."""
        for branch in self.branches:
            if branch.conjunct(view, request):
                return branch.outcome
        return self.accepted

    def first_failing(self, view: DaemonView, request: Request) -> Rung | None:
        for r in self.rungs:
            if not r.conjunct(view, request):
                return r
        return None

    def outcome(self, view: DaemonView, request: Request) -> Outcome:
        """The outcome the daemon gives in ``view``: the first failing rung's, else the accepting one."""
        failing = self.first_failing(view, request)
        return self.accepting(view, request) if failing is None else failing.outcome

    def reply(self, view: DaemonView, request: Request) -> Answer:
        """The answer alone, as a pure function of the view (what the machine answers there)."""
        return self.outcome(view, request).answer(view, request)


def the_record(view: DaemonView) -> LayoutRecord:
    assert view.record is not None, "asked only once the ladder has found a record"
    return view.record


def the_move(view: DaemonView) -> Move:
    assert view.pending is not None, "asked only once the ladder has found a pending move"
    return view.pending


def the_torn_move(view: DaemonView) -> DirtyInfo:
    assert view.dirty is not None, "asked only once the ladder has found a torn move"
    return view.dirty


def successor(view: DaemonView, req: CommitRequest) -> LayoutRecord:
    """The record after ``req``'s rows; asked only once ``rows_fit`` holds."""
    new_record = the_record(view).successor(req.layers, req.rows)
    assert isinstance(new_record, LayoutRecord), "asked only once rows_fit holds"
    return new_record


_REQUEST_NAMES: dict[type, str] = {
    CommitRequest: "commit",
    AbortRequest: "abort",
    ParkRequest: "park",
    ClaimRequest: "claim",
    RejoinRequest: "rejoin",
}


@cache
def _getter(word: str) -> attrgetter[Any]:
    return attrgetter(word)


class Words:
    """What a declared reply's text may name: the request (``req``), the view, and what is read off
    them, each computed when a text names it. The text of a reply that names the record (or the
    pending move, or the torn move) is only ever made once its ladder has found one."""

    def __init__(self, view: DaemonView, req: Any) -> None:
        self.view, self.req = view, req

    def __getitem__(self, word: str) -> Any:
        """``str.format_map`` asks a text's words; a reply's data field may name a path (``successor.version``)."""
        return _getter(word)(self)

    restart = RESTART_DAEMONS
    repair_or_restart = REPAIR_OR_RESTART
    limit = MAX_ATTACHMENTS

    @property
    def record(self) -> LayoutRecord:
        return the_record(self.view)

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def digest(self) -> str:
        return self.record.digest

    @property
    def layers(self) -> list[int]:
        """The request's layers."""
        return list(self.req.layers)

    @property
    def move(self) -> Move:
        return the_move(self.view)

    @property
    def moving(self) -> list[int]:
        """The pending move's layers."""
        return list(self.move.layers)

    @property
    def pending(self) -> dict[str, Any]:
        return self.move.to_wire()

    @property
    def torn(self) -> DirtyInfo:
        return the_torn_move(self.view)

    @property
    def torn_layers(self) -> list[int]:
        return list(self.torn.layers)

    @property
    def attachments(self) -> int:
        return len(self.view.attachments)

    @property
    def others(self) -> list[str]:
        """The unparked engines attached besides the requester."""
        return sorted(e for e in self.view.unparked() if e != self.req.engine_id)

    @property
    def other_attachments(self) -> list[str]:
        """The engines attached besides the requester, parked or not."""
        return sorted(e for e in self.view.attachments if e != self.req.engine_id)

    @property
    def layout_unknown(self) -> str:
        return f"the layout is unknown: {self.torn.describe()}{self.failure}; {REPAIR_OR_RESTART}"

    @property
    def failure(self) -> str:
        return repair_failed(self.view.repair_failed)

    @property
    def being_repaired(self) -> str:
        info = self.torn
        return (
            f"the daemon is being repaired: it reloads layers {list(info.layers)} from the checkpoint, back to "
            f"version {info.base_version} ({info.describe()}); retry when the repair ends (`expert-layout status` "
            f"shows it), usually within seconds"
        )

    @property
    def invalid_layers(self) -> str | None:
        return invalid_layers(self.req.layers, self.view.record)

    @property
    def rows_error(self) -> LayoutRecord | LayoutError:
        return self.record.successor(self.req.layers, self.req.rows)

    @cached_property
    def successor(self) -> LayoutRecord:
        return successor(self.view, self.req)  # named by a commit's text and two of its data fields

    @property
    def request(self) -> str:
        """The request's name, as an operator reads it in a refusal."""
        return _REQUEST_NAMES[type(self.req)]

    @property
    def missing(self) -> str:
        """What of the engine's layout plugin is missing (``Fetch.gap``), in words."""
        if self.req.gap == STARTUP_HOOK_MISSING:
            return (
                "this engine has the expert-layout plugin but its startup hook never ran (sglang did not apply "
                "it), so it did not attach and does not know the daemons' layout"
            )
        return (
            "this engine attached to the daemon (it has the expert-layout plugin) but sends no expert layout "
            "with fetch_state (sglang did not apply the plugin's fetch hooks), so the daemon cannot check "
            "the layout it would route with"
        )


class Say:
    """A reply declared as data: the maker, the reason, the text (``str.format`` over ``Words``) and
    the reply's data fields, each named after the word it carries (``version="version"``)."""

    __slots__ = ("data", "make", "reason", "text")

    def __init__(self, make: Callable[..., Reply], reason: Reason, text: str, **data: str) -> None:
        self.make, self.reason, self.text, self.data = make, reason, text, data

    def __call__(self, view: DaemonView, req: Any) -> Reply:
        words = Words(view, req)
        return self.make(self.reason, self.text.format_map(words), **{f: words[w] for f, w in self.data.items()})


# -- the kinds of reply a ladder gives, besides ok, refused and busy ---------------------------------


def fetch_refused(reason: Reason, why: str, **data: Any) -> Reply:
    """A refusal of fetch_state (the one request refused as ``layout_refused``), saying so first."""
    return layout_refused(reason, f"fetch_state refused: {why}", **data)


def served_turning_off(reason: Reason, served: str) -> Reply:
    """Served an engine that will not follow moves: the reply says what that turned off."""
    return ok(reason, f"{served}rebalancing of these shared weights is now off until the daemons restart")


def not_retryable(reason: Reason, why: str, **data: Any) -> Reply:
    """A begin refused for the request itself: sending it again is refused again."""
    return refused(reason, f"{why}. Not retryable.", **data)


def move_stays_pending(reason: Reason, why: str) -> Reply:
    """A commit refused with its move pending: the engine may still commit it right, or abort it."""
    return refused(reason, f"{why}; the move stays pending.")


__all__ = [
    "Conjunct",
    "Ladder",
    "Outcome",
    "Rung",
    "Say",
    "Words",
    "fetch_refused",
    "move_stays_pending",
    "not_retryable",
    "rung",
    "served_turning_off",
    "successor",
    "the_move",
    "the_record",
    "the_torn_move",
]
