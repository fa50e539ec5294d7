"""A line-by-line Python reading of spec/LayoutProtocol.tla's Init and Next: a stand-in for TLC.

Why: TLC cannot run here, and the mirror (``tools.mirror.system``) takes every decision from
``layout_sm``. This oracle takes none from it: each function below transcribes one TLA+ action,
conjunct by conjunct, over the spec's own variables. Exploring it yields the graph TLC would
dump, so ``tools.mirror.compare`` can hold the mirror's graph against the spec's wherever the
tests run. It is a test oracle, not a second implementation: where TLC's graphs are beside the
clone (``../shared/tlc/``), the mirror is held against them too.

State: a tuple of the 15 spec variables in declaration order; engine- and rank-indexed
functions are tuples (index = engine position in the .cfg, rank - 1); a finding is
``(found, fver, fmap)``, a pending move ``(mover, layers, base)`` or None, a rebalance
``(step, chunk, replies, owed)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.mirror.dot import escape
from tools.mirror.explore import fingerprint
from tools.mirror.system import Model, label, load_model, render_projection
from tools.mirror.values import Fn, ModelValue, Record, tlc_intern_order

State = tuple[Any, ...]
(DPHASE, DVER, DMAP, DPEND, DATT, DNF, TRUTH, EPHASE, EFIND, EROUTE, EVER, ESERV, ESHARE, REB, MOVES) = range(15)


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1 :])


class SpecOracle:
    def __init__(self, m: Model) -> None:
        self.m = m
        self.R = m.num_ranks
        self.E = m.engines
        self.initial_map = (0,) * m.num_layers
        self.no_finding = ("nothing", 0, self.initial_map)
        self.idle = ("idle", frozenset(), ("none",) * self.R, "none")

    # -- helpers of the spec --------------------------------------------------------------

    def target(self, s: State, i: int) -> tuple[int, ...]:
        chunk = s[REB][i][1]
        return tuple(1 - p if (k + 1) in chunk else p for k, p in enumerate(s[EROUTE][i]))

    def snapshot(self, s: State, r: int) -> tuple[str, int, tuple[int, ...]]:
        if s[DPHASE][r] == "no_record":
            return ("no_record", 0, self.initial_map)
        if s[DPHASE][r] == "dirty":
            return ("dirty", 0, self.initial_map)
        return ("record", s[DVER][r], s[DMAP][r])

    def foreign_pending(self, s: State, e: str, r: int) -> bool:
        return s[DPHASE][r] == "pending" and s[DPEND][r][0] != e

    @staticmethod
    def gone(s: State, i: int) -> bool:
        return s[EPHASE][i] in ("failed", "dead")

    def forget(self, s: list[Any], i: int, phase: str) -> None:
        s[EPHASE] = _set(s[EPHASE], i, phase)
        s[EFIND] = _set(s[EFIND], i, (self.no_finding,) * self.R)
        s[EROUTE] = _set(s[EROUTE], i, self.initial_map)
        s[EVER] = _set(s[EVER], i, 0)
        s[ESERV] = _set(s[ESERV], i, frozenset())
        s[ESHARE] = _set(s[ESHARE], i, False)
        s[REB] = _set(s[REB], i, self.idle)

    # -- Init -----------------------------------------------------------------------------

    def init(self) -> list[State]:
        out = []
        lack = sorted(self.m.may_lack_record)
        for mask in range(1 << len(lack)):
            without = {lack[k] for k in range(len(lack)) if mask >> k & 1}
            out.append(
                (
                    tuple("no_record" if r + 1 in without else "clean" for r in range(self.R)),
                    (0,) * self.R,
                    (self.initial_map,) * self.R,
                    (None,) * self.R,
                    (frozenset(),) * self.R,
                    (False,) * self.R,
                    (self.initial_map,) * self.R,
                    tuple("load" if e in self.m.older else "start" for e in self.E),
                    ((self.no_finding,) * self.R,) * len(self.E),
                    (self.initial_map,) * len(self.E),
                    (0,) * len(self.E),
                    (frozenset(),) * len(self.E),
                    (False,) * len(self.E),
                    (self.idle,) * len(self.E),
                    0,
                )
            )
        return out

    # -- actions (the spec's, one to one) -------------------------------------------------

    def Attach(self, s: State, i: int, r: int) -> State | None:
        e = self.E[i]
        if e in self.m.older or s[EPHASE][i] != "start" or s[EFIND][i][r][0] != "nothing":
            return None
        if any(s[EFIND][i][q][0] == "nothing" for q in range(r)):
            return None
        t = list(s)
        t[DATT] = _set(s[DATT], r, s[DATT][r] | {e})
        snap = self.snapshot(s, r)
        f = ("wait", snap[1], snap[2]) if self.foreign_pending(s, e, r) else snap
        t[EFIND] = _set(s[EFIND], i, _set(s[EFIND][i], r, f))
        return tuple(t)

    def Poll(self, s: State, i: int, r: int) -> State | None:
        if s[EPHASE][i] != "start" or s[EFIND][i][r][0] != "wait" or self.foreign_pending(s, self.E[i], r):
            return None
        t = list(s)
        t[EFIND] = _set(s[EFIND], i, _set(s[EFIND][i], r, self.snapshot(s, r)))
        return tuple(t)

    def Timeout(self, s: State, i: int, r: int) -> State | None:
        if s[EPHASE][i] != "start" or s[EFIND][i][r][0] != "wait":
            return None
        f = s[EFIND][i][r]
        t = list(s)
        t[EFIND] = _set(s[EFIND], i, _set(s[EFIND][i], r, ("timeout", f[1], f[2])))
        return tuple(t)

    def Agree(self, s: State, i: int) -> State | None:
        if s[EPHASE][i] != "start" or any(f[0] in ("nothing", "wait") for f in s[EFIND][i]):
            return None
        found = set(s[EFIND][i])
        recorded = {f for f in found if f[0] == "record"}
        fails = (
            any(f[0] in ("dirty", "timeout") for f in found)
            or (recorded != found and any(f[1] != 0 or f[2] != self.initial_map for f in recorded))
            or any(f[1] != g[1] or f[2] != g[2] for f in recorded for g in recorded)
        )
        t = list(s)
        if fails:
            self.forget(t, i, "failed")
            return tuple(t)
        adopts = recorded == found
        f = s[EFIND][i][0]
        t[EPHASE] = _set(s[EPHASE], i, "load")
        t[EROUTE] = _set(s[EROUTE], i, f[2] if adopts else self.initial_map)
        t[EVER] = _set(s[EVER], i, f[1] if adopts else 0)
        t[ESHARE] = _set(s[ESHARE], i, adopts)
        return tuple(t)

    def Fetch(self, s: State, i: int, r: int) -> State | None:
        e = self.E[i]
        if s[EPHASE][i] != "load" or (r + 1) in s[ESERV][i] or any(q + 1 not in s[ESERV][i] for q in range(r)):
            return None
        older = e in self.m.older
        serves = s[DPHASE][r] == "no_record" or (
            s[DPHASE][r] == "clean" and (s[DVER][r] == 0 if older else s[EROUTE][i] == s[DMAP][r])
        )
        t = list(s)
        if serves:
            serv = s[ESERV][i] | {r + 1}
            t[ESERV] = _set(s[ESERV], i, serv)
            t[EPHASE] = _set(s[EPHASE], i, "run" if len(serv) == self.R else "load")
            nonfollowing = s[DPHASE][r] == "clean" and (older or e not in s[DATT][r])
            t[DNF] = _set(s[DNF], r, s[DNF][r] or nonfollowing)
        else:
            self.forget(t, i, "failed")
        return tuple(t)

    def BeginChunk(self, s: State, i: int, c: frozenset[int]) -> State | None:
        if s[EPHASE][i] != "run" or not s[ESHARE][i] or s[REB][i][0] != "idle" or s[MOVES] >= self.m.max_moves:
            return None
        t = list(s)
        t[REB] = _set(s[REB], i, ("begin", c, ("none",) * self.R, s[REB][i][3]))
        t[MOVES] = s[MOVES] + 1
        return tuple(t)

    def begin_reply(self, s: State, i: int, r: int) -> str:
        e = self.E[i]
        if e not in s[DATT][r]:
            return "refused"
        if s[DPHASE][r] == "pending" and s[DPEND][r][0] == e:
            return "refused"
        if s[DPHASE][r] in ("no_record", "dirty") or s[DNF][r] or s[EVER][i] != s[DVER][r]:
            return "refused"
        if s[DPHASE][r] == "pending" or s[DATT][r] - {e}:
            return "busy"
        return "ok"

    def Begin(self, s: State, i: int, r: int) -> State | None:
        step, chunk, replies, owed = s[REB][i]
        if s[EPHASE][i] != "run" or step != "begin" or replies[r] != "none" or "none" in replies[:r]:
            return None
        word = self.begin_reply(s, i, r)
        t = list(s)
        t[REB] = _set(s[REB], i, (step, chunk, _set(replies, r, word), owed))
        if word == "ok":
            t[DPHASE] = _set(s[DPHASE], r, "pending")
            t[DPEND] = _set(s[DPEND], r, (self.E[i], chunk, s[DVER][r]))
        return tuple(t)

    def Decide(self, s: State, i: int) -> State | None:
        step, chunk, replies, owed = s[REB][i]
        if s[EPHASE][i] != "run" or step != "begin" or "none" in replies:
            return None
        words = set(replies)
        checked = owed != "bad"
        t = list(s)
        if words == {"ok"} and checked:
            t[REB] = _set(s[REB], i, ("move", chunk, replies, "none"))
        elif "ok" in words:
            t[REB] = _set(s[REB], i, ("abort", chunk, replies, "none"))
        else:
            t[REB] = _set(s[REB], i, self.idle)
        t[ESHARE] = _set(s[ESHARE], i, "refused" not in words and checked)
        return tuple(t)

    def Abort(self, s: State, i: int, r: int) -> State | None:
        step, chunk, replies, owed = s[REB][i]
        if s[EPHASE][i] != "run" or step != "abort" or replies[r] != "ok" or "ok" in replies[:r]:
            return None
        t = list(s)
        t[DPHASE] = _set(s[DPHASE], r, "clean")
        t[DPEND] = _set(s[DPEND], r, None)
        if all(replies[q] != "ok" for q in range(self.R) if q != r):
            t[REB] = _set(s[REB], i, self.idle)
        else:
            t[REB] = _set(s[REB], i, (step, chunk, _set(replies, r, "aborted"), owed))
        return tuple(t)

    def MoveLayer(self, s: State, i: int, r: int, layer: int) -> State | None:
        step, chunk, _, _ = s[REB][i]
        if s[EPHASE][i] != "run" or step != "move" or layer not in chunk:
            return None
        target = self.target(s, i)
        if s[TRUTH][r][layer - 1] == target[layer - 1]:
            return None
        if any(k < layer and s[TRUTH][r][k - 1] != target[k - 1] for k in chunk):
            return None
        t = list(s)
        t[TRUTH] = _set(s[TRUTH], r, _set(s[TRUTH][r], layer - 1, target[layer - 1]))
        return tuple(t)

    def Commit(self, s: State, i: int, r: int) -> State | None:
        step, chunk, replies, owed = s[REB][i]
        if s[EPHASE][i] != "run" or step not in ("move", "commit") or replies[r] != "ok" or "ok" in replies[:r]:
            return None
        target = self.target(s, i)
        if any(s[TRUTH][q][k - 1] != target[k - 1] for q in range(self.R) for k in chunk):
            return None
        e = self.E[i]
        ok = e in s[DATT][r] and s[DPHASE][r] == "pending" and s[DPEND][r][0] == e and s[DPEND][r][1] == chunk
        t = list(s)
        if ok:
            t[DPHASE] = _set(s[DPHASE], r, "clean")
            t[DVER] = _set(s[DVER], r, s[DVER][r] + 1)
            t[DMAP] = _set(s[DMAP], r, target)
            t[DPEND] = _set(s[DPEND], r, None)
        t[REB] = _set(s[REB], i, ("commit", chunk, _set(replies, r, "committed" if ok else "commit_refused"), owed))
        return tuple(t)

    def Committed(self, s: State, i: int) -> State | None:
        step, _, replies, _ = s[REB][i]
        if s[EPHASE][i] != "run" or step != "commit" or any(w not in ("committed", "commit_refused") for w in replies):
            return None
        target = self.target(s, i)
        good = all(w == "committed" for w in replies) and all(
            s[DVER][r] == s[EVER][i] + 1 and s[DMAP][r] == target for r in range(self.R)
        )
        t = list(s)
        t[REB] = _set(s[REB], i, (*self.idle[:3], "good" if good else "bad"))
        t[EROUTE] = _set(s[EROUTE], i, target)
        t[EVER] = _set(s[EVER], i, s[EVER][i] + 1)
        return tuple(t)

    def Verify(self, s: State, i: int) -> State | None:
        step, chunk, replies, owed = s[REB][i]
        if s[EPHASE][i] != "run" or step != "idle" or owed == "none":
            return None
        t = list(s)
        t[ESHARE] = _set(s[ESHARE], i, owed == "good")
        t[REB] = _set(s[REB], i, (step, chunk, replies, "none"))
        return tuple(t)

    def Crash(self, s: State, i: int) -> State | None:
        if self.gone(s, i):
            return None
        t = list(s)
        self.forget(t, i, "dead")
        return tuple(t)

    def Detach(self, s: State, r: int, i: int) -> State | None:
        e = self.E[i]
        if e not in s[DATT][r] or not self.gone(s, i):
            return None
        t = list(s)
        t[DATT] = _set(s[DATT], r, s[DATT][r] - {e})
        if s[DPHASE][r] == "pending" and s[DPEND][r][0] == e:
            t[DPHASE] = _set(s[DPHASE], r, "dirty")
        return tuple(t)

    def Restart(self, s: State, r: int) -> State | None:
        if not self.m.daemon_restarts or s[DPHASE][r] != "dirty" or s[DATT][r]:
            return None
        if any((r + 1) in serv for serv in s[ESERV]):
            return None
        t = list(s)
        t[DPHASE] = _set(s[DPHASE], r, "clean")
        t[DVER] = _set(s[DVER], r, 0)
        t[DMAP] = _set(s[DMAP], r, self.initial_map)
        t[DPEND] = _set(s[DPEND], r, None)
        t[DNF] = _set(s[DNF], r, False)
        t[TRUTH] = _set(s[TRUTH], r, self.initial_map)
        return tuple(t)

    # -- Next -----------------------------------------------------------------------------

    def next(self, s: State) -> Iterator[tuple[str, State]]:
        E = range(len(self.E))
        R = range(self.R)
        chunks = sorted(self.m.chunks, key=lambda c: (len(c), sorted(c)))
        inst: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = []
        for name in ("Attach", "Poll", "Timeout", "Fetch", "Begin", "Abort", "Commit"):
            inst += [(name, (i, r), (self.E[i], r + 1)) for i in E for r in R]
        for name in ("Agree", "Decide", "Committed", "Verify", "Crash"):
            inst += [(name, (i,), (self.E[i],)) for i in E]
        inst += [("BeginChunk", (i, c), (self.E[i], c)) for i in E for c in chunks]
        inst += [("MoveLayer", (i, r, k), (self.E[i], r + 1, k)) for i in E for r in R for k in self.m.layers]
        inst += [("Detach", (r, i), (r + 1, self.E[i])) for r in R for i in E]
        inst += [("Restart", (r,), (r + 1,)) for r in R]
        for name, args, shown in inst:
            t = getattr(self, name)(s, *args)
            if t is not None and t != s:
                yield label(name, shown), t

    # -- the spec's variables as tools.mirror.values values -------------------------------

    def project(self, s: State) -> tuple[Any, ...]:
        engines = tuple(ModelValue(e) for e in self.E)

        def fn(values: tuple[Any, ...]) -> Fn:
            return Fn(tuple(zip(engines, values, strict=True)))

        def pend(p: Any) -> Any:
            if p is None:
                return ModelValue("NONE")
            return Record(mover=ModelValue(p[0]), layers=p[1], base=p[2])

        def finding(f: tuple[str, int, tuple[int, ...]]) -> Record:
            return Record(found=f[0], fver=f[1], fmap=f[2])

        return (
            s[DPHASE], s[DVER], s[DMAP], tuple(pend(p) for p in s[DPEND]),
            tuple(frozenset(ModelValue(e) for e in a) for a in s[DATT]), s[DNF], s[TRUTH],
            fn(s[EPHASE]), fn(tuple(tuple(finding(f) for f in fs) for fs in s[EFIND])), fn(s[EROUTE]),
            fn(s[EVER]), fn(s[ESERV]), fn(s[ESHARE]),
            fn(tuple(Record(step=b[0], chunk=b[1], replies=b[2], owed=b[3]) for b in s[REB])), s[MOVES],
            # dpark, eclaim: the oracle leaves out the warm standbys and runs on models without
            # one, where they keep their initial values.
            tuple(frozenset() for _ in range(self.R)), fn(tuple(("none",) * self.R for _ in self.E)),
        )  # fmt: skip


def dump(spec_dir: str | Path, model_name: str, out: str | Path) -> tuple[int, int]:
    """Explore the oracle breadth first and write its graph in TLC's DOT format."""
    m = load_model(spec_dir, model_name)
    tlc_intern_order([*m.engines, "NONE"])
    o = SpecOracle(m)
    ids: dict[State, int] = {}
    queue: deque[State] = deque()
    lines = ["strict digraph DiskGraph {", "subgraph cluster_graph {"]
    edges = 0

    def visit(s: State) -> tuple[int, str | None]:
        if s in ids:
            return ids[s], None
        text = render_projection(o.project(s))
        ids[s] = fingerprint(text)
        queue.append(s)
        return ids[s], text

    for s in o.init():
        sid, text = visit(s)
        if text is not None:
            lines.append(f'{sid} [label="{escape(text)}",style = filled]')
    while queue:
        s = queue.popleft()
        for action, t in o.next(s):
            tid, text = visit(t)
            edges += 1
            lines.append(f'{ids[s]} -> {tid} [label="{escape(action)}",color="black",fontcolor="black"];')
            if text is not None:
                lines.append(f'{tid} [label="{escape(text)}",tooltip="{escape(text)}"];')
    lines += ["}", "}"]
    Path(out).write_text("\n".join(lines))
    return len(ids), edges
