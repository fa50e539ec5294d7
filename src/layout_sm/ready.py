"""What happened to an engine rank (an ``Event``), and what it does next (a ``Ready``): the input and
the output of ``EngineSession.step``, as etcd raft's ``Step`` and ``Ready``.

The adapter (every rank process) and the mirror take every step of the protocol through that one
function. The adapter executes each ``Ready`` in its order and hands the session what came back as
the event the ``Ready`` names (``then``); it decides nothing. The mirror hands the session the
events of the spec's actions (one rank's reply, a gathered list) and executes the daemons' side
itself. An event names the rank it happened on where it is one rank's (``rank``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from layout_sm.engine import RankAnswer, RankFinding, Step
from layout_sm.messages import LayoutRequest
from layout_sm.record import Rows

# -- events: what happened -------------------------------------------------------------------


@dataclass(frozen=True)
class Unanswered:
    """What a send brought back when no reply came: why (``detail``, naming the socket); ``absent``: no
    daemon listens there at all."""

    detail: str
    absent: bool = False


@dataclass(frozen=True)
class Started:
    """Rank ``rank``'s startup begins (before the model loads); ``initial_rows``: the engine's own
    initial map (the map a rejoin reloads at when the record to rejoin is that map)."""

    rank: int
    initial_rows: Rows | None = None


@dataclass(frozen=True)
class Attached:
    """Rank ``rank``'s daemon answered the attach (``reply`` as it came off the wire, or ``Unanswered``),
    at ``now_s`` (monotonic seconds: a wait is timed from there)."""

    rank: int
    reply: object
    now_s: float = 0.0


@dataclass(frozen=True)
class Polled:
    """A waiting rank's poll (``reply``, or ``Unanswered``), at ``now_s`` (monotonic seconds):
    past the session's wait timeout since the wait began, the wait ends (spec: Timeout)."""

    rank: int
    reply: object
    now_s: float = 0.0


@dataclass(frozen=True)
class Failed:
    """Rank ``rank``'s own step broke off (an error in the adapter): it gathers an unreadable finding,
    so that no rank is left waiting in a collective the others reach."""

    rank: int
    detail: str


@dataclass(frozen=True)
class FindingsGathered:
    """Every rank's startup finding, all-gathered in rank order: the ranks agree (spec: Agree)."""

    findings: Sequence[RankFinding]


@dataclass(frozen=True)
class RejoinRowsGathered:
    """The map of the record to rejoin at, from every rank whose daemon holds it (None elsewhere)."""

    rows: Sequence[Rows | None]


@dataclass(frozen=True)
class RejoinAnswered:
    """Rank ``rank``'s daemon answered its rejoin (spec: AskRejoin)."""

    rank: int
    reply: object
    now_s: float = 0.0


@dataclass(frozen=True)
class Fetched:
    """Rank ``rank``'s ``fetch_state`` reply (spec: Fetch)."""

    rank: int
    reply: object


@dataclass(frozen=True)
class LoadsGathered:
    """Whether each rank loaded from its daemon, all-gathered in rank order."""

    loaded: Sequence[bool]


@dataclass(frozen=True)
class RebalanceAsked:
    """sglang's EPLB begins a rebalance on rank ``rank``. ``missing_hooks``: the error naming the hooks
    sglang did not apply (None: every hook is in place); ``elastic_ep``: sglang's elastic EP is on;
    ``source``: where this rank's weights came from, as its loader saw it ("daemon", "disk"; None: unknown)."""

    rank: int
    missing_hooks: str | None = None
    elastic_ep: bool = False
    source: str | None = None


@dataclass(frozen=True)
class SourcesGathered:
    """Where every rank's weights came from ("daemon", "disk"; anything else is unknown), all-gathered."""

    sources: Sequence[str | None]
    elastic_ep: bool = False


@dataclass(frozen=True)
class ChunkAsked:
    """sglang moves the next chunk, these layers (0-based) (spec: BeginChunk)."""

    rank: int
    layers: Sequence[int]


@dataclass(frozen=True)
class BeginAnswered:
    """Rank ``rank``'s daemon answered its begin (None: no reply) (spec: Begin)."""

    rank: int
    reply: object


@dataclass(frozen=True)
class BeginsGathered:
    """Every rank's begin answer and its answer to the last chunk's commit (the check owed), all-gathered
    in rank order; the ranks decide (spec: Decide)."""

    answers: Sequence[tuple[RankAnswer | None, RankAnswer | None]]


@dataclass(frozen=True)
class Decided:
    """The ranks' begin answers, taken one by one, are all in: the one decision (spec: Decide)."""


@dataclass(frozen=True)
class Aborted:
    """Rank ``rank`` aborted its begun move (spec: Abort); abort is idempotent for its owner."""

    rank: int


@dataclass(frozen=True)
class Moved:
    """sglang moved the chunk and the device synchronized; ``rows``: the engine's whole new map."""

    rank: int
    rows: Sequence[Sequence[int]]


@dataclass(frozen=True)
class CommitAnswered:
    """Rank ``rank``'s daemon answered its commit (None: no reply) (spec: Commit)."""

    rank: int
    reply: object


@dataclass(frozen=True)
class ChunkEnded:
    """The chunk ends, with no collective: route with the moved map, the check owed (spec: Committed)."""


@dataclass(frozen=True)
class RebalanceEnded:
    """sglang's rebalance ended (its generator ran out, or the protocol stopped it) on rank ``rank``."""

    rank: int


@dataclass(frozen=True)
class OwedGathered:
    """Every rank's answer to the last chunk's commit, all-gathered: the check is made (spec: Verify)."""

    answers: Sequence[RankAnswer | None]


@dataclass(frozen=True)
class ParkAsked:
    """A warm standby's park reached rank ``rank`` (its warmup ended, the scheduler paused)."""

    rank: int


@dataclass(frozen=True)
class ParkAnswered:
    """Rank ``rank``'s daemon answered its park (spec: Park)."""

    rank: int
    reply: object


@dataclass(frozen=True)
class ParksGathered:
    """The park reply of rank ``parker``, all-gathered (each rank's part: that reply, or None)."""

    parker: int
    replies: Sequence[object]


@dataclass(frozen=True)
class Noticed:
    """Rank ``rank``'s daemon wrote the notice on its attach connection (spec: Notify)."""

    rank: int


@dataclass(frozen=True)
class TakeOverAsked:
    """A notice woke the parked standby (the takeover rides the scheduler's broadcast) on rank ``rank``."""

    rank: int


@dataclass(frozen=True)
class NoticeAwaited:
    """Rank ``rank``'s wait for its notice ended: ``got`` it, or not in time."""

    rank: int
    got: bool


@dataclass(frozen=True)
class NoticesGathered:
    """Whether each rank has its notice, all-gathered: every rank has one (claim) or not (wait)."""

    noticed: Sequence[bool]


@dataclass(frozen=True)
class ClaimAnswered:
    """Rank ``rank``'s daemon answered its claim of the primary role (spec: Claim)."""

    rank: int
    reply: object


@dataclass(frozen=True)
class ClaimsGathered:
    """The claim reply of rank ``claimer``, all-gathered (each rank's part: that reply, or None)."""

    claimer: int
    replies: Sequence[object]


@dataclass(frozen=True)
class ClaimsEnded:
    """The claims, taken one by one, ended: the promotion (spec: Promote)."""


Event = (
    Started
    | Attached
    | Polled
    | Failed
    | FindingsGathered
    | RejoinRowsGathered
    | RejoinAnswered
    | Fetched
    | LoadsGathered
    | RebalanceAsked
    | SourcesGathered
    | ChunkAsked
    | BeginAnswered
    | BeginsGathered
    | Decided
    | Aborted
    | Moved
    | CommitAnswered
    | ChunkEnded
    | RebalanceEnded
    | OwedGathered
    | ParkAsked
    | ParkAnswered
    | ParksGathered
    | Noticed
    | TakeOverAsked
    | NoticeAwaited
    | NoticesGathered
    | ClaimAnswered
    | ClaimsGathered
    | ClaimsEnded
)


# -- ready: what the rank does next ---------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """What one rank does next, in this order:

    1. ``close``: end the attachment (its EOF detaches the engine from its daemon);
    2. ``install``: route with this map (sglang's ``ExpertLocationMetadata.update``, in place);
    3. at most one of, its outcome handed to ``then`` (with the monotonic time it came back) for the
       next event:
       - ``send``: the request to this rank's daemon (after ``after_s`` seconds; ``attach``: over the
         connection that stays open as the attachment); the reply, or ``Unanswered``;
         ``forget_notices``: a notice read before this request answers an older park: forget it;
         ``read_later``: send it and go on, the reply is read and handed over before the rank's next step;
       - ``gather``: this rank's part of an all-gather over every rank; the gathered list;
       - ``move``: sglang moves the chunk, then the device synchronizes; the engine's whole new map;
       - ``await_notice_s``: wait up to that long for this rank's notice; whether it came;
    4. ``next``: the event to step at once, with nothing to do in between;
    5. ``done``: the step this sequence ended with: proceed, pause (poll again, or end this rebalance:
       the next retries) or stop (for good), with the reason and the words for the operator;
       ``repeat``: the rank steps the event that began this sequence again at its next chance (a
       standby's takeover, when some rank's notice has not come yet).

    ``on_error``: where carrying this out (or the next step) raises, the event to step instead, with
    what was raised: a rank's error before an all-gather becomes what it gathers, so that no rank is
    left waiting in a collective the others reach.
    """

    send: LayoutRequest | None = None
    attach: bool = False
    after_s: float = 0.0
    read_later: bool = False
    gather: Any = None
    gathers: bool = False
    move: bool = False
    await_notice_s: float | None = None
    forget_notices: bool = False
    then: Callable[[Any, float], Event] | None = None
    install: Rows | None = None
    close: bool = False
    next: Event | None = None
    done: Step | None = None
    repeat: bool = False
    on_error: Callable[[str], Event] | None = None


NOTHING = Ready()


def sending(request: LayoutRequest, then: Callable[[Any, float], Event], **kwargs: Any) -> Ready:
    return Ready(send=request, then=then, **kwargs)


def gathering(part: Any, then: Callable[[Any, float], Event], **kwargs: Any) -> Ready:
    return Ready(gather=part, gathers=True, then=then, **kwargs)


__all__ = [
    "NOTHING",
    "Aborted",
    "Attached",
    "BeginAnswered",
    "BeginsGathered",
    "ChunkAsked",
    "ChunkEnded",
    "ClaimAnswered",
    "ClaimsEnded",
    "ClaimsGathered",
    "CommitAnswered",
    "Decided",
    "Event",
    "Failed",
    "Fetched",
    "FindingsGathered",
    "LoadsGathered",
    "Moved",
    "NoticeAwaited",
    "Noticed",
    "NoticesGathered",
    "OwedGathered",
    "ParkAnswered",
    "ParkAsked",
    "ParksGathered",
    "Polled",
    "Ready",
    "RebalanceAsked",
    "RebalanceEnded",
    "RejoinAnswered",
    "RejoinRowsGathered",
    "SourcesGathered",
    "Started",
    "TakeOverAsked",
    "Unanswered",
    "gathering",
    "sending",
]
