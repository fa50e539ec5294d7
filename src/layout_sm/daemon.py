"""The daemon side of the protocol (docs/protocol.md §4): one declaration per request, and the
daemon machine that takes it.

Every reply the daemon gives is decided here, once:

- ``DaemonView`` is what a daemon knows (an immutable snapshot). Its methods are the conjuncts of
  the spec's daemon actions (spec/LayoutProtocol.tla: Attach, Fetch, Begin, Commit, Abort,
  Detach): ``holds``, ``alone``, ``base_is_current``, ``moved_by``, ``pending_layers_are``, ...
- ``LADDERS`` declares each request once, as a ``Ladder``: its conjuncts in the precedence of
  docs/protocol.md §4, each with the step the daemon takes when that conjunct is the first to fail
  (the reply, and for a detach or a fetch the change it makes), and the step taken when all hold.
  The reply texts are made by the small functions beside each ladder, nowhere else.
- ``DaemonMachine`` is a python-statemachine ``StateMachine`` whose states are the record's
  phases (no record, clean, pending, dirty). Its transitions declare from which phase each request
  may be accepted and where that leads; the accepting transition's guards are its ladder's
  conjuncts, and every other case is answered by a self-loop whose action takes the ladder's
  first failing step.

The machine decides without python-statemachine's event loop (about 0.5 ms an event): a table
derived once per class from its declared transitions (phase -> event -> the transitions in their
declared order, each with its guards, target and action) is run by ``DaemonMachine._take``, which
asks the declared guards in order and runs the action of the first transition whose guards all
hold, as python-statemachine would. The diagrams (``layout_sm.diagrams``) draw the same
declarations, and tests/layout_sm/test_daemon_machine.py checks the table against them and
python-statemachine's own ``send`` against the table.

An adapter calls ``DaemonMachine`` methods and writes the reply back; it decides nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache, wraps
from operator import attrgetter
from typing import Any, ClassVar, cast

from statemachine import State, StateMachine
from statemachine.exceptions import TransitionNotAllowed

from layout_sm.declared import all_hold, call_source, text_maker
from layout_sm.messages import (
    STARTUP_HOOK_MISSING,
    AbortRequest,
    AttachRequest,
    BeginRequest,
    ClaimRequest,
    CommitRequest,
    FetchLayoutField,
    LayoutRequest,
    ParkRequest,
    QueryRequest,
    RepairRequest,
    SessionRequest,
)
from layout_sm.reasons import REPAIR_OR_RESTART, RESTART_DAEMONS, Reason, Reply, busy, layout_refused, ok, refused
from layout_sm.record import LayoutError, LayoutRecord

LOADING = "loading"
NO_RECORD = "no_record"
CLEAN = "clean"
PENDING = "pending"
DIRTY = "dirty"
REPAIRING = "repairing"
# Live attachments a daemon keeps at once. Each costs the daemon a thread and a descriptor; an
# engine has one per daemon, so 64 is far beyond any deployment (the protocol lets only an engine
# alone on its daemons move experts) and far below the descriptor limit (1,024 by default).
MAX_ATTACHMENTS = 64


@dataclass(frozen=True)
class Move:
    """A move begun by ``engine_id`` in ``session`` and neither committed nor aborted yet."""

    engine_id: str
    session: str
    layers: tuple[int, ...]
    base_version: int

    def to_wire(self) -> dict[str, Any]:
        # The session stays private to its owner: it is the capability to commit or abort.
        return {"engine_id": self.engine_id, "layers": list(self.layers), "base_version": self.base_version}


@dataclass(frozen=True)
class DirtyInfo:
    """Why the layout is unknown: the mover left mid-move; kept for every refusal message."""

    engine_id: str
    layers: tuple[int, ...]
    base_version: int

    def to_wire(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "layers": list(self.layers), "base_version": self.base_version}

    def describe(self) -> str:
        return (
            f"engine {self.engine_id!r} went away while moving layers {list(self.layers)} "
            f"from version {self.base_version}, so the experts in those layers are in an unknown mix "
            f"of the old and new places"
        )


# -- the requests that have no wire form of their own -----------------------------------------


@dataclass(frozen=True)
class Attach(SessionRequest):
    """An attach with the fresh session token the adapter made for it."""

    known_digest: str | None = None  # the engine holds that map already (``AttachRequest.known_digest``)


@dataclass(frozen=True)
class Detach(SessionRequest):
    """The EOF of the attach connection of ``engine_id``, which held ``session``."""


@dataclass(frozen=True)
class Fetch:
    """sglang's ``fetch_state`` with the engine's claim (None: an engine without the plugin).

    The claim's fields are read only by the conjuncts after ``claims``, which holds only with a claim."""

    claim: FetchLayoutField | None
    # The engine's layout plugin is only partly installed (``layout_sm.messages.PLUGIN_GAPS``): sglang did
    # not apply some of its hooks. Outside the spec's model (its engines have the whole plugin or none).
    gap: str | None = None

    @property
    def engine_id(self) -> str:
        return cast(FetchLayoutField, self.claim).engine_id

    @property
    def session(self) -> str:
        return cast(FetchLayoutField, self.claim).session

    @property
    def digest(self) -> str:
        return cast(FetchLayoutField, self.claim).digest


@dataclass(frozen=True)
class RepairEnded:
    """The adapter's reload of the torn move's ``layers`` ended well; ``message`` and ``data`` say
    what it did (seconds, bytes read), for the operator's reply."""

    layers: tuple[int, ...]
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RepairFailed:
    """The adapter's reload failed (a read error, a missing file) or was refused (a model or
    quantization it cannot repair layer by layer): ``reason`` and ``why``."""

    reason: Reason
    why: str


def _invalid_layers(layers: tuple[int, ...], record: LayoutRecord | None) -> str | None:
    if not layers:
        return "the layer list is empty"
    if len(set(layers)) != len(layers):
        return f"layer list {list(layers)} has duplicates"
    if record is not None:
        out = [layer for layer in layers if not 0 <= layer < record.num_layers]
        if out:
            return f"layers {out} are not in 0..{record.num_layers - 1}"
    return None


@dataclass(frozen=True)
class DaemonView:
    """Everything the daemon knows about the layout, as one immutable value."""

    record: LayoutRecord | None
    attachments: Mapping[str, str] = field(default_factory=dict)  # engine_id -> session
    pending: Move | None = None
    # The torn move: the mover left mid-move. Kept while the daemon repairs it (``repairing``), and
    # after a failed repair (``repair_failure``, why), until a repair ends clean or the daemon restarts.
    dirty: DirtyInfo | None = None
    non_following_seen: bool = False
    repairing: bool = False  # the daemon reloads the torn move's layers (spec: dphase = "repairing")
    repair_failure: str | None = None  # why the last repair failed (the daemon is dirty)
    # Started with auto repair (spec: the constant Repairs): the mover's EOF starts the repair at once.
    auto_repair: bool = True
    # The parked warm standbys' attachments (spec: dpark[r]), a subset of ``attachments``: no begin counts them.
    parked: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attachments", dict(sorted(self.attachments.items())))
        object.__setattr__(self, "parked", frozenset(self.parked))

    def evolve(self, **changes: Any) -> DaemonView:
        """This view with ``changes``, as ``dataclasses.replace`` makes it, without running ``__init__``
        again for the fields kept (a step changes one or two of them, once or twice a request)."""
        if not _VIEW_FIELDS.issuperset(changes):
            raise TypeError(f"DaemonView has no field {sorted(set(changes) - _VIEW_FIELDS)}")
        new = object.__new__(DaemonView)
        values = new.__dict__
        values.update(self.__dict__)
        values.update(changes)
        if "attachments" in changes or "parked" in changes:
            new.__post_init__()
        return new

    @property
    def phase(self) -> str:
        if self.record is None:
            return NO_RECORD
        if self.dirty is not None:
            return REPAIRING if self.repairing else DIRTY
        if self.pending is not None:
            return PENDING
        return CLEAN

    # -- the conjuncts (spec/LayoutProtocol.tla), asked by the machine's guards and the ladders alike.
    # A conjunct's parameters are named after the fields of the request it is asked about.

    def holds(self, engine_id: str, session: str) -> bool:
        """A live attachment of ``engine_id`` holds ``session`` (spec: ``e \\in datt[r]``)."""
        return self.attachments.get(engine_id) == session

    def unparked(self) -> list[str]:
        """The attached engines that are not parked standbys (spec: ``Unparked(r)``), in attach order."""
        return [e for e in self.attachments if e not in self.parked]

    def alone(self, engine_id: str) -> bool:
        """No other unparked engine is attached (spec: ``Unparked(r) \\ {e} = {}``): a parked standby
        runs no forward pass, so it does not count."""
        return all(e == engine_id for e in self.unparked())

    def is_parked(self, engine_id: str) -> bool:
        """The engine's attachment is a parked standby's (spec: ``e \\in dpark[r]``)."""
        return engine_id in self.parked

    def none_unparked(self) -> bool:
        """Every attachment is a parked standby's (spec: ``Unparked(r) = {}``)."""
        return not self.unparked()

    def notified(self, leaving: str | None = None) -> tuple[str, ...]:
        """The parked standbys the daemon notifies once ``leaving``'s attachment is gone (spec:
        ``Notify``): all of them when no unparked engine is left, else none; none while it repairs
        (the repair's end tells them)."""
        if not all(e == leaving for e in self.unparked()) or self.is_repairing():
            return ()
        return tuple(sorted(e for e in self.attachments if e != leaving and e in self.parked))

    def base_is_current(self, base_version: int) -> bool:
        """The engine's version is the record's (spec: ``ever[e] = dver[r]``)."""
        return self.record is not None and base_version == self.record.version

    def moved_by(self, engine_id: str, session: str) -> bool:
        """The pending move is this engine's, begun in this session (spec: ``dpend[r].mover = e``)."""
        move = self.pending
        return move is not None and move.engine_id == engine_id and move.session == session

    def pending_layers_are(self, layers: tuple[int, ...]) -> bool:
        """The pending move is of these layers (spec: ``dpend[r].layers = reb[e].chunk``)."""
        return self.pending is not None and self.pending.layers == layers

    def has_record(self) -> bool:
        """The daemon keeps a record (spec: ``dphase[r] # "no_record"``)."""
        return self.record is not None

    def is_dirty(self) -> bool:
        """A mover left mid-move and no repair runs (spec: ``dphase[r] = "dirty"``)."""
        return self.dirty is not None and not self.repairing

    def is_repairing(self) -> bool:
        """The daemon reloads the torn move's layers (spec: ``dphase[r] = "repairing"``)."""
        return self.dirty is not None and self.repairing

    def repairs_automatically(self) -> bool:
        """The daemon was started with auto repair (spec: the constant ``Repairs``)."""
        return self.auto_repair

    def repair_is_of(self, layers: tuple[int, ...]) -> bool:
        """The repair that ended is of the torn move's layers (outside the spec: its repair is one step)."""
        return self.dirty is not None and tuple(sorted(self.dirty.layers)) == tuple(sorted(layers))

    def move_pending(self) -> bool:
        """Some engine's move is pending (spec: ``dphase[r] = "pending"``)."""
        return self.pending is not None

    def own_move_pending(self, engine_id: str) -> bool:
        """This engine's move is pending (spec: ``dphase[r] = "pending" /\\ dpend[r].mover = e``)."""
        return self.pending is not None and self.pending.engine_id == engine_id

    def foreign_pending(self, engine_id: str) -> bool:
        """Another engine's move is pending (spec: ``ForeignPending(e, r)``)."""
        return self.pending is not None and self.pending.engine_id != engine_id

    def saw_non_following(self) -> bool:
        """An engine that does not follow moves was served (spec: ``dnf[r]``)."""
        return self.non_following_seen

    def layers_valid(self, layers: tuple[int, ...]) -> bool:
        """The layer list is a set of the record's layers (the spec's chunks are, by construction)."""
        return _invalid_layers(layers, self.record) is None

    def rows_fit(self, layers: tuple[int, ...], rows: tuple[tuple[int, ...], ...]) -> bool:
        """The rows are ``[len(layers)][P]`` experts of the record (the spec's maps are, by construction)."""
        return self.record is not None and not isinstance(self.record.successor(layers, rows), LayoutError)

    def engine_id_free(self, engine_id: str) -> bool:
        """No live attachment has this engine id (spec: a new engine attaches, ``e \\notin datt[r]``)."""
        return engine_id not in self.attachments

    def has_room(self) -> bool:
        """Fewer than ``MAX_ATTACHMENTS`` engines are attached (the spec's engines are few)."""
        return len(self.attachments) < MAX_ATTACHMENTS

    def claims_or_initial(self, claim: FetchLayoutField | None) -> bool:
        """The engine says what it routes with, or the record is the initial one (spec: FetchServes
        for ``e \\in Older``: ``dver[r] = 0``)."""
        return claim is not None or (self.record is not None and self.record.version == 0)

    def plugin_complete(self, gap: str | None) -> bool:
        """The engine did not say that part of its layout plugin is missing (outside the spec)."""
        return gap is None

    def claims(self, claim: FetchLayoutField | None) -> bool:
        """The engine has the layout plugin (spec: ``e \\notin Older``)."""
        return claim is not None

    def digest_is_current(self, digest: str) -> bool:
        """The engine routes with the record's map (spec: ``eroute[e] = dmap[r]``)."""
        return self.record is not None and digest == self.record.digest

    def __hash__(self) -> int:
        return hash(
            (
                self.record,
                tuple(self.attachments.items()),
                self.pending,
                self.dirty,
                self.non_following_seen,
                self.repairing,
                self.repair_failure,
                self.auto_repair,
                self.parked,
            )
        )

    def state_wire(self, include_map: bool = False) -> dict[str, Any]:
        """The daemon's state as ``expert_layout_query`` reports it."""
        record = self.record
        return {
            "phase": self.phase,
            "has_record": record is not None,
            "version": None if record is None else record.version,
            "digest": None if record is None else record.digest,
            "shape": None if record is None else list(record.shape),
            "num_logical": None if record is None else record.num_logical,
            "map": [list(r) for r in record.rows] if (record is not None and include_map) else None,
            "pending": None if self.pending is None else self.pending.to_wire(),
            # A repairing daemon's torn move is under "repairing", not "dirty": an engine waits on it.
            "dirty": None if self.dirty is None or self.repairing else self.dirty.to_wire(),
            "repairing": self.dirty.to_wire() if self.dirty is not None and self.repairing else None,
            "repair_failure": self.repair_failure,
            "auto_repair": self.auto_repair,
            "attached": sorted(self.attachments),
            "parked": sorted(self.parked),
            "non_following_seen": self.non_following_seen,
        }


_VIEW_FIELDS = frozenset(f.name for f in fields(DaemonView))


@dataclass(frozen=True)
class DetachEffect:
    """What the daemon did when an attachment's connection reached EOF."""

    dropped: bool
    dirty: DirtyInfo | None
    message: str
    # The parked standbys to notify on their attach connections (no unparked engine is left).
    notified: tuple[str, ...] = ()


# -- the declaration scheme --------------------------------------------------------------------

Request = Any  # BeginRequest, CommitRequest, AbortRequest, Attach, Detach or Fetch
Answer = Any  # a Reply, or a DetachEffect for a detach


@dataclass(frozen=True)
class Conjunct:
    """One conjunct as a guard names it: a ``DaemonView`` method, or ``not`` one.

    The method is looked up by name when asked, so that a patched conjunct (a mutant, a test)
    reaches every guard and every ladder that names it."""

    method: str
    negated: bool
    # ``ask(view, request)``: the conjunct's truth, made once for the method's parameters (the
    # machine asks a conjunct several times a request: no argument tuple is built per call).
    ask: Callable[[DaemonView, Request], bool] = field(repr=False, compare=False)
    # The request's fields the method takes, in its order (``named`` reads them off its signature).
    params: tuple[str, ...] = field(repr=False, compare=False)

    @classmethod
    def named(cls, spec: str, negated: bool = False) -> Conjunct:
        """``spec`` is a python-statemachine guard of the simple kind: ``name`` or ``not name``."""
        words = spec.split()
        if words[:1] == ["not"]:
            words, negated = words[1:], not negated
        if len(words) != 1 or not callable(getattr(DaemonView, words[0], None)):
            raise ValueError(f"{spec!r} is not a DaemonView conjunct (or 'not' one)")
        name = words[0]
        params = tuple(inspect.signature(getattr(DaemonView, name)).parameters)[1:]
        return cls(name, negated, _asker(name, params, negated), params)

    def source(self) -> str:
        """The conjunct's call as a Python expression over ``view`` and ``request`` (``all_hold``)."""
        return call_source("view", self.method, [f"request.{p}" for p in self.params])

    def __call__(self, view: DaemonView, request: Request) -> bool:
        return self.ask(view, request)

    def __str__(self) -> str:
        return f"not {self.method}" if self.negated else self.method


def _asker(method: str, params: tuple[str, ...], negated: bool) -> Callable[[DaemonView, Request], bool]:
    """``method`` of the view on the request's fields named ``params``, negated or not."""
    if not params:
        if negated:
            return lambda view, request: not getattr(view, method)()
        return lambda view, request: bool(getattr(view, method)())
    if len(params) == 1:
        (one,) = params
        if negated:
            return lambda view, request: not getattr(view, method)(getattr(request, one))
        return lambda view, request: bool(getattr(view, method)(getattr(request, one)))
    getter = attrgetter(*params)
    if negated:
        return lambda view, request: not getattr(view, method)(*getter(request))
    return lambda view, request: bool(getattr(view, method)(*getter(request)))


@dataclass(frozen=True)
class Step:
    """What the daemon does: the answer, made from the view before the step, and the view after."""

    answer: Callable[[DaemonView, Request], Answer]
    change: Callable[[DaemonView, Request], DaemonView] | None = None


@dataclass(frozen=True)
class Rung:
    """A conjunct of a request's ladder, and the step the daemon takes on it: for one of the ladder's
    rungs, when it is the first to fail; for one of its branches, when it holds once all rungs do."""

    conjunct: Conjunct
    step: Step


def rung(
    conjunct: str,
    answer: Callable[[DaemonView, Request], Answer],
    change: Callable[[DaemonView, Request], DaemonView] | None = None,
) -> Rung:
    return Rung(Conjunct.named(conjunct), Step(answer, change))


@dataclass(frozen=True)
class Ladder:
    """One request, declared once: its conjuncts in precedence order, each with its refusal, and
    the step taken when all of them hold."""

    rungs: tuple[Rung, ...]
    accepted: Step
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

    def accepting(self, view: DaemonView, request: Request) -> Step:
        """The step taken once every rung holds: the first branch that holds, else ``accepted``."""
        for branch in self.branches:
            if branch.conjunct.ask(view, request):
                return branch.step
        return self.accepted

    def first_failing(self, view: DaemonView, request: Request) -> Rung | None:
        for r in self.rungs:
            if not r.conjunct.ask(view, request):
                return r
        return None

    def reply(self, view: DaemonView, request: Request) -> Answer:
        """The answer alone, as a pure function of the view (what the machine answers there)."""
        failing = self.first_failing(view, request)
        return (self.accepting(view, request) if failing is None else failing.step).answer(view, request)


def _without(view: DaemonView, engine_id: str) -> dict[str, str]:
    return {e: s for e, s in view.attachments.items() if e != engine_id}


def _detach(view: DaemonView, engine_id: str) -> DaemonView:
    """The view without ``engine_id``'s attachment, parked or not."""
    return view.evolve(attachments=_without(view, engine_id), parked=view.parked - {engine_id})


def _record(view: DaemonView) -> LayoutRecord:
    assert view.record is not None, "asked only once the ladder has found a record"
    return view.record


def _move(view: DaemonView) -> Move:
    assert view.pending is not None, "asked only once the ladder has found a pending move"
    return view.pending


# -- the replies, declared as data -------------------------------------------------------------


# One getter per word (a path of attributes), made the first time a text names it.
_word_getter = cache(attrgetter)


class Words:
    """What a declared reply's text may name (``Say``): the request, the view, and what is read off
    them, each computed when a text names it. The text of a reply that names the record (or the
    pending move, or the torn move) is only ever made once its ladder has found one."""

    def __init__(self, view: DaemonView, req: Any) -> None:
        self.view, self.req = view, req

    def __getitem__(self, word: str) -> Any:
        """str.format_map asks a text's words; a reply's data field may name a path (``successor.version``)."""
        return _word_getter(word)(self)

    restart = RESTART_DAEMONS
    repair_or_restart = REPAIR_OR_RESTART
    limit = MAX_ATTACHMENTS

    @property
    def record(self) -> LayoutRecord:
        return _record(self.view)

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
        return _move(self.view)

    @property
    def moving(self) -> list[int]:
        """The pending move's layers."""
        return list(self.move.layers)

    @property
    def pending(self) -> dict[str, Any]:
        return self.move.to_wire()

    @property
    def torn(self) -> DirtyInfo:
        return cast(DirtyInfo, self.view.dirty)

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
    def layout_unknown(self) -> str:
        return f"the layout is unknown: {self.torn.describe()}{self.failure}; {REPAIR_OR_RESTART}"

    @property
    def failure(self) -> str:
        return "" if self.view.repair_failure is None else f"; its repair failed: {self.view.repair_failure}"

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
        return _invalid_layers(self.req.layers, self.view.record)

    @property
    def rows_error(self) -> LayoutRecord | LayoutError:
        return self.record.successor(self.req.layers, self.req.rows)

    @property
    def successor(self) -> LayoutRecord:
        return _successor(self.view, self.req)

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
    """A reply declared as data: the maker (``ok``, ``refused``, ``busy``, or one of the makers below
    that say what kind of refusal it is), the reason, the text (``str.format`` over ``Words``:
    ``{req.engine_id!r}``, ``{version}``...) and the reply's data fields, each named after the word
    it carries (``version="version"``)."""

    __slots__ = ("_make_text", "data", "make", "reason", "text")

    def __init__(self, make: Callable[..., Reply], reason: Reason, text: str, **data: str) -> None:
        self.make, self.reason, self.text, self.data = make, reason, text, data
        # The text and the data compiled once (a reply is made on every request: a fetch_state, each
        # chunk's begin and commit); None for a text that names more than paths of words.
        self._make_text = text_maker(text, data)

    def __call__(self, view: DaemonView, req: Any) -> Reply:
        words = Words(view, req)
        if self._make_text is not None:
            text, data = self._make_text(words)
            return self.make(self.reason, text, **data)
        return self.make(self.reason, self.text.format_map(words), **{f: words[w] for f, w in self.data.items()})


def _fetch_refused(reason: Reason, why: str, **data: Any) -> Reply:
    """A refusal of fetch_state (the one request refused as ``layout_refused``), saying so first."""
    return layout_refused(reason, f"fetch_state refused: {why}", **data)


def _served_turning_off(reason: Reason, served: str) -> Reply:
    """Served an engine that will not follow moves: the reply says what that turned off (``_flag_non_following``)."""
    return ok(reason, f"{served}rebalancing of these shared weights is now off until the daemons restart")


def _not_retryable(reason: Reason, why: str, **data: Any) -> Reply:
    """A begin refused for the request itself: sending it again is refused again."""
    return refused(reason, f"{why}. Not retryable.", **data)


def _move_stays_pending(reason: Reason, why: str) -> Reply:
    """A commit refused with its move pending: the engine may still commit it right, or abort it."""
    return refused(reason, f"{why}; the move stays pending.")


_REQUEST_NAMES: dict[type, str] = {
    CommitRequest: "commit",
    AbortRequest: "abort",
    ParkRequest: "park",
    ClaimRequest: "claim",
}
# Refusals that more than one ladder gives.
_NOT_ATTACHED = Say(
    refused,
    Reason.NOT_ATTACHED,
    "engine {req.engine_id!r} holds no live attachment with this session; {request} refused.",
)
_STANDBY_NOT_ATTACHED = Say(
    refused,
    Reason.NOT_ATTACHED,
    "{request} by {req.engine_id!r}: no live attachment with this session; only an attached standby {request}s "
    "(attach first).",
)
_DIRTY = Say(refused, Reason.DIRTY, "{layout_unknown}.")


# -- attach ------------------------------------------------------------------------------------


def _attached(view: DaemonView, req: Attach) -> Reply:
    """What the engine must know: the record (with its map, unless the engine holds a map of that
    digest already), any move pending, any dirty state."""
    state = view.state_wire(include_map=False)
    record = view.record
    return ok(
        Reason.ATTACHED,
        f"engine {req.engine_id!r} attached",
        session=req.session,
        record=None if record is None else record.to_wire(include_map=record.digest != req.known_digest),
        pending=state["pending"],
        dirty=state["dirty"],
        repairing=state["repairing"],
        phase=state["phase"],
        non_following_seen=view.non_following_seen,
    )


# An attach succeeds for a fresh engine id while fewer than MAX_ATTACHMENTS are attached.
ATTACH = Ladder(
    (
        rung(
            "engine_id_free",
            Say(
                refused,
                Reason.ENGINE_ID_IN_USE,
                "engine id {req.engine_id!r} is already attached to this daemon; each engine instance needs its "
                "own id (a restarted engine picks a new one).",
            ),
        ),
        rung(
            "has_room",
            Say(
                busy,
                Reason.TOO_MANY_ATTACHMENTS,
                "engine {req.engine_id!r} not attached: {attachments} engines are attached to this daemon, its "
                "limit of {limit}. Retry after some stop (an attachment ends when its engine process exits); "
                "`expert-layout status` lists the attached engine ids.",
                limit="limit",
            ),
        ),
    ),
    Step(_attached, lambda view, req: view.evolve(attachments={**view.attachments, req.engine_id: req.session})),
)


# -- fetch_state ---------------------------------------------------------------------------------


def _flag_non_following(view: DaemonView, req: Fetch) -> DaemonView:
    """Serving an engine that will not follow moves turns rebalancing off (the sticky flag)."""
    return view.evolve(non_following_seen=True)


# The layout check of fetch_state (spec: Fetch, FetchServes, FetchNonFollowing): serve only an
# engine that will route correctly; a daemon without a record serves as sglang does.
FETCH = Ladder(
    (
        rung("has_record", Say(ok, Reason.SERVED_NO_RECORD, "daemon keeps no layout record; served as sglang does")),
        rung("not is_dirty", Say(_fetch_refused, Reason.DIRTY, "{layout_unknown}.")),
        rung("not is_repairing", Say(_fetch_refused, Reason.REPAIRING, "{being_repaired}.")),
        rung(
            "not move_pending",
            Say(
                _fetch_refused,
                Reason.MOVE_PENDING,
                "engine {move.engine_id!r} is moving layers {moving} right now, so the weights are mid-move; "
                "retry after it ends.",
                pending="pending",
            ),
        ),
        rung(
            "plugin_complete",  # sglang did not apply some of the engine's layout plugin's hooks
            Say(
                _fetch_refused,
                Reason.PLUGIN_INCOMPLETE,
                "{missing}. The plugin is only partly installed: the engine's log names the hook sglang failed to "
                "apply ('Failed to apply hooks to ...'); run an sglang version the plugin was tested with. Nothing "
                "changed on the daemon (layout version {version}).",
                version="version",
                gap="req.gap",
            ),
        ),
        rung(
            "claims_or_initial",
            Say(
                _fetch_refused,
                Reason.OLDER_ENGINE_AFTER_MOVE,
                "experts have moved (layout version {version}) and this engine does not send its expert layout, "
                "so it would route tokens to the wrong experts. Install the expert-layout plugin in the engine, "
                "or {restart}.",
                version="version",
            ),
        ),
        rung(
            "claims",
            Say(
                _served_turning_off,
                Reason.SERVED_OLDER_ENGINE,
                "served an engine without the layout plugin at the initial layout (version 0); ",
            ),
            _flag_non_following,
        ),
        rung(
            "digest_is_current",
            Say(
                _fetch_refused,
                Reason.DIGEST_MISMATCH,
                "the engine routes with layout version {req.claim.version} but the daemon's weights are at version "
                "{version} (digests differ); the engine must start from the daemon's record (its layout plugin "
                "does this at startup), or {restart}.",
                version="version",
                digest="digest",
            ),
        ),
        rung(
            "holds",
            Say(
                _served_turning_off,
                Reason.SERVED_NON_FOLLOWING,
                "served engine {req.engine_id!r} at version {version} without a live attachment; it will not "
                "follow moves, so ",
            ),
            _flag_non_following,
        ),
    ),
    Step(Say(ok, Reason.SERVED_FOLLOWING, "served engine {req.engine_id!r} at version {version}")),
)


# -- begin -------------------------------------------------------------------------------------


def _take_move(view: DaemonView, req: BeginRequest) -> DaemonView:
    return view.evolve(pending=Move(req.engine_id, req.session, req.layers, req.base_version))


# The begin precedence of docs/protocol.md §4 (spec: BeginReply): the request itself, then the
# daemon's state (both permanent: refused), then someone else is here (transient: busy).
BEGIN = Ladder(
    (
        rung(
            "holds",
            Say(
                _not_retryable,
                Reason.NOT_ATTACHED,
                "engine {req.engine_id!r} holds no live attachment with this session on this daemon; only the "
                "attached engine that owns the session may move experts",
            ),
        ),
        rung("layers_valid", Say(_not_retryable, Reason.INVALID_LAYERS, "invalid layer list: {invalid_layers}")),
        rung(
            "not own_move_pending",
            Say(
                _not_retryable,
                Reason.OWN_MOVE_PENDING,
                "engine {req.engine_id!r} already has a move of layers {moving} pending; commit or abort it first",
            ),
        ),
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb, or an older daemon), "
                "so shared weights cannot be rebalanced; start the daemons with --enable-eplb.",
            ),
        ),
        rung("not is_dirty", _DIRTY),
        rung("not is_repairing", Say(refused, Reason.REPAIRING, "begin refused: {being_repaired}.")),
        rung(
            "not saw_non_following",
            Say(
                refused,
                Reason.NON_FOLLOWING_SEEN,
                "an engine that does not follow layout moves (an older engine, or one without a live attachment) "
                "maps these weights; moving experts would corrupt its outputs. Rebalancing of shared weights "
                "stays off until the daemons restart; to rebalance, {restart}.",
            ),
        ),
        rung(
            "base_is_current",
            Say(
                _not_retryable,
                Reason.STALE_BASE_VERSION,
                "begin names base version {req.base_version} but the daemon is at version {version}; this "
                "engine's layout is not the daemon's",
                version="version",
            ),
        ),
        rung(
            "not foreign_pending",
            Say(
                busy,
                Reason.MOVE_PENDING,
                "engine {move.engine_id!r} is moving layers {moving}; retry later.",
                pending="pending",
            ),
        ),
        rung(
            "alone",
            Say(
                busy,
                Reason.OTHER_ENGINE_ATTACHED,
                "engines {others} also map these weights; experts move only while one engine is alone on its "
                "daemons. Rebalancing resumes when they detach.",
                attached="others",
            ),
        ),
    ),
    Step(
        Say(
            ok,
            Reason.BEGUN,
            "move of layers {layers} by {req.engine_id!r} pending from version {version}",
            version="version",
        ),
        _take_move,
    ),
)


# -- commit ------------------------------------------------------------------------------------


def _successor(view: DaemonView, req: CommitRequest) -> LayoutRecord:
    new_record = _record(view).successor(req.layers, req.rows)
    assert isinstance(new_record, LayoutRecord), "asked only once rows_fit holds"
    return new_record


def _store_rows(view: DaemonView, req: CommitRequest) -> DaemonView:
    return view.evolve(record=_successor(view, req), pending=None)


# Commit (spec: CommitOk) needs this session's pending move, the same layers, and rows of the
# record's shape; anything else is refused and the move stays pending.
COMMIT = Ladder(
    (
        rung("holds", _NOT_ATTACHED),
        rung("not is_dirty", _DIRTY),
        rung(
            "moved_by",
            Say(
                refused,
                Reason.NO_PENDING_MOVE,
                "engine {req.engine_id!r} has no move pending on this daemon; begin comes before commit.",
            ),
        ),
        rung(
            "pending_layers_are",
            Say(
                _move_stays_pending,
                Reason.LAYERS_MISMATCH,
                "commit names layers {layers} but the pending move is of layers {moving}",
            ),
        ),
        rung("rows_fit", Say(_move_stays_pending, Reason.BAD_ROWS, "commit rows rejected: {rows_error}")),
    ),
    Step(
        Say(
            ok,
            Reason.COMMITTED,
            "layers {layers} committed by {req.engine_id!r}: version {successor.version}",
            version="successor.version",
            digest="successor.digest",
        ),
        _store_rows,
    ),
)


# -- abort -------------------------------------------------------------------------------------


# Abort (spec: Abort) clears this session's move; it is idempotent for the session's owner and
# refused for anyone else.
ABORT = Ladder(
    (
        rung("holds", _NOT_ATTACHED),
        rung(
            "moved_by",
            Say(ok, Reason.NOTHING_TO_ABORT, "engine {req.engine_id!r} has no move pending; nothing to abort"),
        ),
    ),
    Step(
        Say(ok, Reason.ABORTED, "move of layers {moving} by {req.engine_id!r} aborted"),
        lambda view, req: view.evolve(pending=None),
    ),
)


# -- detach ------------------------------------------------------------------------------------


def _stale_detach(view: DaemonView, req: Detach) -> DetachEffect:
    return DetachEffect(False, None, f"stale detach of {req.engine_id!r} ignored (session not live)")


def _detached(view: DaemonView, req: Detach) -> DetachEffect:
    return DetachEffect(True, None, f"engine {req.engine_id!r} detached", view.notified(req.engine_id))


def _dirty_info(view: DaemonView) -> DirtyInfo:
    move = _move(view)
    return DirtyInfo(move.engine_id, move.layers, move.base_version)


def _went_dirty(view: DaemonView, req: Detach) -> DetachEffect:
    info = _dirty_info(view)
    return DetachEffect(
        True, info, f"daemon is now DIRTY: {info.describe()}; {REPAIR_OR_RESTART}", view.notified(req.engine_id)
    )


def _mark_dirty(view: DaemonView, req: Detach) -> DaemonView:
    return _detach(view, req.engine_id).evolve(pending=None, dirty=_dirty_info(view))


def _went_repairing(view: DaemonView, req: Detach) -> DetachEffect:
    info = _dirty_info(view)
    return DetachEffect(
        True,
        info,
        f"daemon is now REPAIRING: {info.describe()}; it reloads layers {list(info.layers)} from the checkpoint, "
        f"back to version {info.base_version}",
        _mark_repairing(view, req).notified(),
    )


def _mark_repairing(view: DaemonView, req: Detach) -> DaemonView:
    return _mark_dirty(view, req).evolve(repairing=True, repair_failure=None)


# Detach (spec: Detach), the EOF of an attach connection: a mover that leaves makes the daemon
# dirty, or with auto repair starts the repair at once (repairing); any other live attachment is
# dropped, and the EOF of a stale session changes nothing.
DETACH = Ladder(
    (
        rung("holds", _stale_detach),
        rung("moved_by", _detached, lambda view, req: _detach(view, req.engine_id)),
    ),
    Step(_went_dirty, _mark_dirty),
    branches=(rung("repairs_automatically", _went_repairing, _mark_repairing),),
)


# -- repair (issue 19; spec: RepairAgain, RepairDone, RepairFails) -------------------------------


# The operator's `expert-layout repair` (spec: RepairAgain): a dirty daemon repairs again.
REPAIR = Ladder(
    (
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb), so it never moves "
                "experts and has nothing to repair.",
            ),
        ),
        rung(
            "not is_repairing",
            Say(
                busy,
                Reason.REPAIR_RUNNING,
                "a repair of layers {torn_layers} is already under way; wait for it to end (`expert-layout "
                "status` shows it).",
            ),
        ),
        rung(
            "is_dirty",
            Say(
                refused,
                Reason.NOT_DIRTY,
                "the daemon is {view.phase} at version {version}: its memory is its record, nothing to repair.",
                version="version",
            ),
        ),
    ),
    Step(
        Say(
            ok,
            Reason.REPAIR_BEGUN,
            "repairing layers {torn_layers} back to version {torn.base_version}",
            layers="torn_layers",
            base_version="torn.base_version",
        ),
        lambda view, req: view.evolve(repairing=True, repair_failure=None),
    ),
)
_NO_REPAIR_RUNNING = Say(
    refused, Reason.NOT_DIRTY, "no repair of this daemon is under way (it is {view.phase}); nothing changed."
)


def _repaired_view(view: DaemonView, req: RepairEnded) -> DaemonView:
    return view.evolve(dirty=None, repairing=False, repair_failure=None)


def _repaired(view: DaemonView, req: RepairEnded) -> Reply:
    record = _record(view)
    data = {**req.data, "layers": list(req.layers), "version": record.version, "digest": record.digest}
    return ok(Reason.REPAIRED, req.message, **data, **_notice_data(_repaired_view(view, req).notified()))


# The repair ended well (spec: RepairDone): memory holds the record again, so the daemon is clean
# at the base version (the record never changed while dirty: only a commit changes it).
REPAIR_DONE = Ladder(
    (
        rung("is_repairing", _NO_REPAIR_RUNNING),
        rung(
            "repair_is_of",
            Say(
                refused,
                Reason.REPAIR_UNSAFE,
                "the repair reloaded layers {layers} but the torn move is of layers {torn_layers}; the daemon "
                "stays repairing.",
            ),
        ),
    ),
    Step(_repaired, _repaired_view),
)


def _repair_failed_view(view: DaemonView, req: RepairFailed) -> DaemonView:
    return view.evolve(repairing=False, repair_failure=req.why)


def _repair_failed(view: DaemonView, req: RepairFailed) -> Reply:
    info = cast(DirtyInfo, view.dirty)
    return refused(
        req.reason,
        f"repair of layers {list(info.layers)} failed: {req.why}. The daemon stays dirty; {REPAIR_OR_RESTART}.",
        **_notice_data(_repair_failed_view(view, req).notified()),
    )


# The repair failed (spec: RepairFails): dirty, with the reason kept for every refusal.
REPAIR_FAILED = Ladder(
    (rung("is_repairing", _NO_REPAIR_RUNNING),),
    Step(_repair_failed, _repair_failed_view),
)


# -- warm standbys (issue 18; spec: Park, Claim) ---------------------------------------------------


def _notice_data(notified: tuple[str, ...]) -> dict[str, Any]:
    return {"notified": list(notified)}


def _parked(view: DaemonView, req: ParkRequest) -> Reply:
    # The view after the park: the parker is parked, so it is among the notified when no unparked engine is left.
    after = view.evolve(parked=view.parked | {req.engine_id})
    notified = after.notified()
    if notified:
        primary = "no unparked engine is attached: claim the primary role"
    elif after.is_repairing():
        primary = "the daemon repairs a torn move; the repair's end tells the parked standbys"
    else:
        primary = "a primary is attached"
    return ok(Reason.PARKED, f"{req.engine_id!r} parked; {primary}", **_notice_data(notified))


# Park (spec: Park): an attached standby's attachment becomes parked (again: no change); the reply
# names the parked standbys the daemon notifies now, the parker included, when no unparked engine is left.
PARK = Ladder(
    (rung("holds", _STANDBY_NOT_ATTACHED),),
    Step(_parked, lambda view, req: view.evolve(parked=view.parked | {req.engine_id})),
)


def _promoted(view: DaemonView, req: ClaimRequest) -> Reply:
    record = _record(view)
    return ok(
        Reason.PROMOTED,
        f"{req.engine_id!r} is the primary at version {record.version}",
        version=record.version,
        record=record.to_wire(),
    )


# Claim (spec: ClaimReply): granted only to a parked standby, while no unparked engine is attached
# (busy: the role is taken), on a clean daemon (refused: no record, dirty; busy while it repairs); the
# grant unparks the attachment and carries the record.
CLAIM = Ladder(
    (
        rung("holds", _STANDBY_NOT_ATTACHED),
        rung(
            "is_parked",
            Say(
                refused,
                Reason.NOT_PARKED,
                "claim by {req.engine_id!r}: its attachment is not parked; only a parked standby claims the "
                "primary role.",
            ),
        ),
        rung(
            "none_unparked",
            Say(
                busy,
                Reason.PRIMARY_ATTACHED,
                "engines {others} are attached and not parked: the primary role is taken; stay parked (the "
                "daemon tells the parked standbys when they leave).",
                attached="others",
            ),
        ),
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb): a standby cannot "
                "adopt its layout; start the engine as a primary.",
            ),
        ),
        rung("not is_dirty", _DIRTY),
        rung(
            "not is_repairing",  # busy, as a taken role: the standby parks again, the repair's end tells it
            Say(
                busy,
                Reason.REPAIRING,
                "{being_repaired}; stay parked (the daemon tells the parked standbys when the repair ends).",
            ),
        ),
    ),
    Step(_promoted, lambda view, req: view.evolve(parked=view.parked - {req.engine_id})),
)


# Each of the machine's request events and its one declaration; the machine's actions look a
# ladder up here when they run, so a ladder replaced here (a mutant) is what runs.
LADDERS: dict[str, Ladder] = {
    "attach": ATTACH,
    "fetch": FETCH,
    "begin": BEGIN,
    "commit": COMMIT,
    "abort": ABORT,
    "detach": DETACH,
    "repair": REPAIR,
    "repair_done": REPAIR_DONE,
    "repair_failed": REPAIR_FAILED,
    "park": PARK,
    "claim": CLAIM,
}


def query_reply(view: DaemonView, req: QueryRequest) -> Reply:
    """A query reads the view and changes nothing (it is no step: no declaration)."""
    return ok(Reason.QUERIED, "expert layout state", **view.state_wire(include_map=req.include_map))


# -- the machine ---------------------------------------------------------------------------------


class DaemonState:
    """python-statemachine's model of a ``DaemonMachine``: the daemon's view, the one place its
    state is kept. The phase is the view's; the machine's guards (the conjuncts) are asked of it."""

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: DaemonView | None = None  # None while the daemon loads its weights

    @property
    def phase(self) -> str:
        return LOADING if self.view is None else self.view.phase

    @phase.setter
    def phase(self, target: str) -> None:
        """python-statemachine writes the target phase after a transition; the phase is the view's,
        which the transition's action made (every declared transition is checked to land in its
        target by tests/layout_sm/test_daemon_machine.py)."""


def _asked_of_the_view(name: str) -> Callable[..., bool]:
    """The conjunct ``name`` asked of the model's current view, with the conjunct's own signature
    (python-statemachine passes a guard the event arguments its parameters name)."""
    conjunct = getattr(DaemonView, name)

    @wraps(conjunct)
    def asked(model: DaemonState, *args: Any, **kwargs: Any) -> bool:
        return bool(getattr(model.view, name)(*args, **kwargs))

    return asked


for _name in sorted({r.conjunct.method for ladder in LADDERS.values() for r in (*ladder.rungs, *ladder.branches)}):
    setattr(DaemonState, _name, _asked_of_the_view(_name))


def _answered(*phases: State) -> Any:
    """The request is answered in each of ``phases`` without a phase change: the action takes
    the step of its ladder's first failing conjunct."""
    transitions = phases[0].to.itself(internal=True, on="answer")
    for phase in phases[1:]:
        transitions |= phase.to.itself(internal=True, on="answer")
    return transitions


def _kept(*phases: State, cond: list[str]) -> Any:
    """The request is accepted in each of ``phases`` without a phase change."""
    transitions = phases[0].to.itself(internal=True, cond=cond, on="accept")
    for phase in phases[1:]:
        transitions |= phase.to.itself(internal=True, cond=cond, on="accept")
    return transitions


@dataclass(frozen=True)
class DeclaredTransition:
    """One of the machine's declared transitions, as ``DaemonMachine._take`` runs it."""

    guards: tuple[Conjunct, ...]
    target: str
    action: str

    # Whether every guard holds, asked in order, compiled once (``declared.all_hold``).
    all_hold: Callable[[DaemonView, Request], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        terms = [(guard.source(), not guard.negated) for guard in self.guards]
        object.__setattr__(self, "all_hold", all_hold(("view", "request"), terms))


def transition_table(machine_class: type[StateMachine]) -> dict[tuple[str, str], tuple[DeclaredTransition, ...]]:
    """(phase, event) -> that phase's transitions of that event, in their declared order, read
    from the class's python-statemachine declarations (the request events only: loading is
    python-statemachine's own, once per machine)."""
    table: dict[tuple[str, str], list[DeclaredTransition]] = {}
    for state in machine_class.states:
        for transition in state.transitions:
            events = [str(event) for event in transition.events]
            if not set(events) <= set(LADDERS):
                continue
            guards = tuple(
                Conjunct.named(str(spec.func), negated=spec.expected_value is False) for spec in transition.cond
            )
            actions = [str(spec.func) for spec in transition.on if not spec.is_convention]
            if len(actions) != 1 or transition.target is None:
                raise ValueError(f"{state.id} --{events}--> needs one target and one action, got {actions}")
            for event in events:
                declared = DeclaredTransition(guards, transition.target.value, actions[0])
                table.setdefault((state.value, event), []).append(declared)
    return {key: tuple(transitions) for key, transitions in table.items()}


class DaemonMachine(StateMachine):
    """The daemon's layout record as a state machine; its request events are named after the
    spec's daemon actions (Attach, Fetch, Begin, Commit, Abort, Detach).

    The transitions declare from which phase each request may be accepted and where that leads;
    the accepting transition's guards are the request's ladder (``LADDERS``), and in every phase of
    a loaded daemon a self-loop answers the request otherwise, with the step of the first
    conjunct that fails. A request before the weights are loaded, or a second load, has no
    transition and raises ``TransitionNotAllowed``.

    A query reads the view and changes nothing, so it is no event.
    """

    # A daemon loads its weights, then keeps a record (--enable-eplb) or none for its whole life.
    loading = State(LOADING, initial=True)
    no_record = State(NO_RECORD)
    clean = State(CLEAN)
    pending = State(PENDING)
    dirty = State(DIRTY)
    repairing = State(REPAIRING)

    _LOADED = (no_record, clean, pending, dirty, repairing)

    loaded_with_record = loading.to(clean, cond="record_loaded", on="load")
    loaded_without_record = loading.to(no_record, unless="record_loaded", on="load")

    # Attach and the fetch check never change the phase (the spec's Attach and Fetch leave dphase).
    attach = _kept(*_LOADED, cond=ATTACH.guards) | _answered(*_LOADED)
    fetch = clean.to.itself(internal=True, cond=FETCH.guards, on="accept") | _answered(*_LOADED)
    # Begin: only a clean daemon takes a move (the ladder's conjuncts about the phase hold nowhere
    # else); refused or busy otherwise, in every phase.
    begin = clean.to(pending, cond=BEGIN.guards, on="accept") | _answered(*_LOADED)
    # Commit: the pending move's rows are stored; refused otherwise, and a pending move stays pending.
    commit = pending.to(clean, cond=COMMIT.guards, on="accept") | _answered(*_LOADED)
    # Abort: the mover's own session clears its move; otherwise nothing to abort, or refused.
    abort = pending.to(clean, cond=ABORT.guards, on="accept") | _answered(*_LOADED)
    # Detach: the mover leaving mid-move makes the daemon dirty; otherwise the attachment is
    # dropped, or a stale EOF ignored.
    detach = (
        pending.to(repairing, cond=DETACH.branch_guards(0), on="accept")
        | pending.to(dirty, cond=DETACH.guards, on="accept")
        | _answered(*_LOADED)
    )
    # The repair of a torn move: the operator's (dirty -> repairing), its end (clean at the base
    # version), its failure (dirty again, the reason kept).
    repair = dirty.to(repairing, cond=REPAIR.guards, on="accept") | _answered(*_LOADED)
    repair_done = repairing.to(clean, cond=REPAIR_DONE.guards, on="accept") | _answered(*_LOADED)
    repair_failed = repairing.to(dirty, cond=REPAIR_FAILED.guards, on="accept") | _answered(*_LOADED)
    # A warm standby (issue 18): a park never changes the phase; a claim is granted only on a clean
    # daemon (a pending move's mover is attached and unparked: taken), answered in every phase.
    park = _kept(*_LOADED, cond=PARK.guards) | _answered(*_LOADED)
    claim = clean.to.itself(internal=True, cond=CLAIM.guards, on="accept") | _answered(*_LOADED)

    _tables: ClassVar[dict[type, dict[tuple[str, str], tuple[DeclaredTransition, ...]]]] = {}

    def __init__(self, record: LayoutRecord | None, auto_repair: bool = True) -> None:
        super().__init__(model=DaemonState(), state_field="phase")
        event = "loaded_with_record" if record is not None else "loaded_without_record"
        self.send(event, record=record, auto_repair=auto_repair)

    @classmethod
    def table(cls) -> dict[tuple[str, str], tuple[DeclaredTransition, ...]]:
        """This class's transition table, derived from its declarations on first use."""
        table = DaemonMachine._tables.get(cls)
        if table is None:
            table = DaemonMachine._tables[cls] = transition_table(cls)
        return table

    # -- loading (python-statemachine's own event, once per machine) ----------------------

    def record_loaded(self, record: LayoutRecord | None) -> bool:
        return record is not None

    def load(self, record: LayoutRecord | None, auto_repair: bool) -> None:
        self.model.view = DaemonView(record, auto_repair=auto_repair)

    # -- taking a step: the declared transitions, run without python-statemachine's event loop --

    def _take(self, event: str, request: Request) -> Answer:
        """Run ``event`` as python-statemachine would: the first of the current phase's declared
        transitions whose guards all hold; its action changes the view and makes the answer."""
        model = self.model
        transitions = self.table().get((model.phase, event), ())
        view = model.view
        for transition in transitions:
            if transition.all_hold(view, request):
                return getattr(self, transition.action)(event, request)
        raise TransitionNotAllowed(getattr(type(self), event), self.configuration)

    def accept(self, event: Any, request: Request) -> Answer:
        """The accepting transition's action: the ladder's accepted step."""
        return self._apply(LADDERS[str(event)].accepting(self._view, request), request)

    def answer(self, event: Any, request: Request) -> Answer:
        """The answering self-loop's action: the step of the ladder's first failing conjunct."""
        failing = LADDERS[str(event)].first_failing(self._view, request)
        if failing is None:
            raise RuntimeError(
                f"{event} in phase {self.phase!r}: every conjunct of its ladder holds, but the machine declares "
                f"no transition accepting it from this phase; the declaration of {event} is inconsistent"
            )
        return self._apply(failing.step, request)

    def _apply(self, step: Step, request: Request) -> Answer:
        view = self._view
        answer = step.answer(view, request)
        if step.change is not None:
            self.model.view = step.change(view, request)
        return answer

    # -- reading and loading ------------------------------------------------------------

    @property
    def _view(self) -> DaemonView:
        view = self.model.view
        assert view is not None, "the daemon's weights are not loaded yet"
        return view

    @_view.setter
    def _view(self, view: DaemonView) -> None:
        self.model.view = view

    def view(self) -> DaemonView:
        return self._view

    def restore(self, view: DaemonView) -> None:
        """Put the machine in ``view``'s state (the explorer reuses one machine per daemon)."""
        self.model.view = view

    @property
    def phase(self) -> str:
        return self.model.phase

    # -- requests -----------------------------------------------------------------------

    def handle(self, request: LayoutRequest, session: str | None = None) -> Reply:
        """Answer a parsed layout request (``session`` is the fresh token for an attach)."""
        if isinstance(request, AttachRequest):
            if session is None:
                raise ValueError("attach needs the fresh session token made by the adapter")
            return self.attach_engine(request, session)
        if isinstance(request, QueryRequest):
            return query_reply(self._view, request)
        if isinstance(request, BeginRequest):
            return self.begin_move(request)
        if isinstance(request, CommitRequest):
            return self.commit_move(request)
        if isinstance(request, AbortRequest):
            return self.abort_move(request)
        if isinstance(request, RepairRequest):
            return self.begin_repair()
        if isinstance(request, ParkRequest):
            return self.park_engine(request)
        if isinstance(request, ClaimRequest):
            return self.claim_primary(request)
        raise TypeError(f"not a layout request: {type(request).__name__}")

    def attach_engine(self, request: AttachRequest, session: str) -> Reply:
        return cast(Reply, self._take("attach", Attach(request.engine_id, session, request.known_digest)))

    def fetch_check(self, claim: FetchLayoutField | None, gap: str | None = None) -> Reply:
        """The layout check of sglang's ``fetch_state``; sets the sticky non-following flag. ``gap``: the
        engine says part of its layout plugin is missing (``Fetch.gap``)."""
        return cast(Reply, self._take("fetch", Fetch(claim, gap)))

    def begin_move(self, request: BeginRequest) -> Reply:
        return cast(Reply, self._take("begin", request))

    def commit_move(self, request: CommitRequest) -> Reply:
        return cast(Reply, self._take("commit", request))

    def abort_move(self, request: AbortRequest) -> Reply:
        return cast(Reply, self._take("abort", request))

    def detach_engine(self, engine_id: str, session: str) -> DetachEffect:
        """The attach connection of ``engine_id`` reached EOF (however the engine died)."""
        return cast(DetachEffect, self._take("detach", Detach(engine_id, session)))

    def begin_repair(self) -> Reply:
        """The operator's ``expert-layout repair``: a dirty daemon turns repairing (the adapter then reloads)."""
        return cast(Reply, self._take("repair", RepairRequest()))

    def repair_ended(self, layers: tuple[int, ...], message: str, **data: Any) -> Reply:
        """The adapter's reload of ``layers`` ended well: clean at the base version."""
        return cast(Reply, self._take("repair_done", RepairEnded(layers, message, data)))

    def repair_fails(self, reason: Reason, why: str) -> Reply:
        """The adapter's reload failed or was refused: dirty, ``why`` kept."""
        return cast(Reply, self._take("repair_failed", RepairFailed(reason, why)))

    def park_engine(self, request: ParkRequest) -> Reply:
        """A warm standby parks its attachment; ``data["notified"]`` names the parked standbys to tell now."""
        return cast(Reply, self._take("park", request))

    def claim_primary(self, request: ClaimRequest) -> Reply:
        """A parked standby claims the primary role; granted with the record, or busy (taken), or refused."""
        return cast(Reply, self._take("claim", request))

    def query_state(self, include_map: bool = False) -> Reply:
        return self.handle(QueryRequest(include_map))
