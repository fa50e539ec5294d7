----------------------------- MODULE Scenarios -----------------------------
(***************************************************************************)
(* The seed's scenarios as reachability witnesses (see README.md).         *)
(*                                                                         *)
(* This module is LayoutProtocol with one history variable, `seen`: the    *)
(* events that the scenarios name, recorded as they happen.  Each action   *)
(* is the protocol's action of the same name (so TLC's traces name the     *)
(* protocol's actions) plus the update of `seen`; `seen` never restricts a *)
(* step, so the other variables reach exactly the protocol's states.       *)
(*                                                                         *)
(* Each scenario S is a state predicate; the invariant No<S> == ~S is       *)
(* expected to be violated, and TLC's counterexample is the witness: the   *)
(* shortest behaviour (breadth-first) that reaches S.  `make check-spec`   *)
(* runs one TLC per witness, on the model named in check_spec.WITNESSES,   *)
(* with a root module that EXTENDS this one and the model's definitions.   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences, TLC

CONSTANTS NumRanks, NumLayers, Engines, Older, MayLackRecord, Chunks, MaxMoves,
          DaemonRestarts, Repairs, OperatorRepairs, RepairMayFail, Standbys, Rejoins, ReplyFaults, Durable, NONE

VARIABLES dphase, dver, dmap, dpend, datt, dnf, truth, ephase, efind, eroute, ever,
          eserv, eshare, reb, moves, dpark, eclaim, dcopy,
          seen    \* events so far: tuples, see Events below

P == INSTANCE LayoutProtocol

Ranks == P!Ranks
Layers == P!Layers
Newer == P!Newer
InitialMap == P!InitialMap
Gone(e) == P!Gone(e)
Partial(m) == (\E l \in Layers : m[l] = 0) /\ (\E l \in Layers : m[l] = 1)

(* The events of one step (primed: after it), as tuples.                   *)
(* <<"started_alone", e>>: e's first rank attached while every other       *)
(*     plugin engine was gone (a restart);                                  *)
(* <<"busy_by_standby", m, s>>: a begin of m answered busy while s, running, *)
(*     is attached to that daemon (a warm standby);                          *)
(* <<"moved_after_standby", m, s>>: after that, with s gone, m committed a  *)
(*     chunk on every daemon;                                                *)
(* <<"killed_mid_move", m>>: m crashed while moving or committing;          *)
(* <<"killed_torn", m>>: m crashed mid-move with some layer of some daemon  *)
(*     already rewritten (the memory differs from the record);              *)
(* <<"killed_between_chunks", m>>: m crashed idle, its last chunk committed,*)
(*     with the daemons' map moved in only some layers;                      *)
(* <<"failed_on_dirty", n>>: n's startup failed on a dirty daemon;          *)
(* <<"older_refused", o>>: an older engine's fetch was refused by a clean   *)
(*     daemon after a move;                                                  *)
(* <<"repaired", r, v>>: daemon r's repair ended clean, at version v;       *)
(* <<"moved_while_parked", m, s, v>>: m committed its move to version v while *)
(*     the standby s was parked on every daemon;                             *)
(* <<"promoted", s>>: the standby s promoted (serves as primary);           *)
(* <<"claim_taken", s>>: a claim of the standby s was taken;                 *)
(* <<"parked_beside", s, m>>: the standby s parked on a daemon where m, a    *)
(*     running primary, is attached;                                         *)
(* <<"standby_failed_dirty", s>>: the standby s failed on a dirty daemon;   *)
(* <<"lost", r, v>>: daemon r was lost while at version v > 0 (it starts    *)
(*     again from disk at version 0);                                        *)
(* <<"rejoin_begun", r, v>>: daemon r began to rejoin at version v;         *)
(* <<"restarted", r, v>>: daemon r started again (Lose, Restart) at version *)
(*     v: its durable copy's, or 0 (recorded by those two actions);         *)
(* <<"commit_unrecorded", r, v>>: daemon r did not record a commit of the   *)
(*     move it holds pending from version v (refused, or never received);  *)
(* <<"begin_uncounted", r>>: daemon r took a begin whose reply was lost (the *)
(*     engine counts it as refused);                                         *)
(* <<"stopped_on_refusal", e>>: e's all-gather of a chunk's begins turned its *)
(*     rebalancing off on a begin counted as refused;                        *)
(* <<"check_failed", e>>: e's failed check turned its rebalancing off.      *)
Events ==
    {<<"started_alone", e>> :
        e \in {n \in Newer : /\ efind[n][1].found = "nothing" /\ efind'[n][1].found # "nothing"
                             /\ \A o \in Newer \ {n} : Gone(o)}}
    \cup
    {<<"busy_by_standby", p[1], p[2]>> :
        p \in {q \in Newer \X Newer :
                 /\ q[1] # q[2]
                 /\ \E r \in Ranks : /\ reb[q[1]].replies[r] = "none"
                                    /\ reb'[q[1]].replies[r] = "busy"
                                    /\ q[2] \in datt[r]
                                    /\ ephase[q[2]] = "run"}}
    \cup
    {<<"moved_after_standby", p[1], p[2]>> :
        p \in {q \in Newer \X Newer :
                 /\ <<"busy_by_standby", q[1], q[2]>> \in seen
                 /\ Gone(q[2])
                 /\ reb[q[1]].step = "commit" /\ reb'[q[1]].step = "idle"
                 /\ ever'[q[1]] = ever[q[1]] + 1}}
    \cup
    {<<"killed_mid_move", m>> :
        m \in {e \in Newer : ephase'[e] = "dead" /\ reb[e].step \in {"move", "commit"}}}
    \cup
    {<<"killed_torn", m>> :
        m \in {e \in Newer : /\ ephase'[e] = "dead" /\ reb[e].step \in {"move", "commit"}
                             /\ \E r \in Ranks : truth[r] # dmap[r]}}
    \cup
    {<<"killed_between_chunks", m>> :
        m \in {e \in Newer : /\ ephase[e] = "run" /\ ephase'[e] = "dead"
                             /\ reb[e].step = "idle" /\ ever[e] > 0
                             /\ \A r \in Ranks : dphase[r] = "clean" /\ Partial(dmap[r])}}
    \cup
    {<<"failed_on_dirty", n>> :
        n \in {e \in Newer : /\ ephase[e] = "start" /\ ephase'[e] = "failed"
                             /\ \E r \in Ranks : efind[e][r].found = "dirty"}}
    \cup
    {<<"older_refused", o>> :
        o \in {e \in Older : /\ ephase[e] = "load" /\ ephase'[e] = "failed"
                             /\ \A r \in Ranks : dphase[r] = "clean" /\ dver[r] > 0}}
    \cup
    {<<"repaired", r, dver[r]>> : r \in {q \in Ranks : dphase[q] = "repairing" /\ dphase'[q] = "clean"}}
    \cup
    {<<"moved_while_parked", p[1], p[2], ever'[p[1]]>> :
        p \in {q \in Newer \X Standbys :
                 /\ q[1] # q[2]
                 /\ ephase[q[2]] = "parked" /\ \A r \in Ranks : q[2] \in dpark[r]
                 /\ reb[q[1]].step = "commit" /\ reb'[q[1]].step = "idle"
                 /\ ever'[q[1]] = ever[q[1]] + 1}}
    \cup
    {<<"promoted", s>> : s \in {t \in Standbys : ephase[t] = "parked" /\ ephase'[t] = "run"}}
    \cup
    {<<"parked_beside", p[1], p[2]>> :
        p \in {q \in Standbys \X (Newer \ Standbys) :
                 /\ ephase[q[2]] = "run"
                 /\ \E r \in Ranks : q[1] \notin dpark[r] /\ q[1] \in dpark'[r] /\ q[2] \in datt[r]}}
    \cup
    {<<"claim_taken", s>> :
        s \in {t \in Standbys : \E r \in Ranks : eclaim[t][r] # "taken" /\ eclaim'[t][r] = "taken"}}
    \cup
    {<<"standby_failed_dirty", s>> :
        s \in {t \in Standbys : /\ ephase[t] = "parked" /\ ephase'[t] = "failed"
                                /\ \E r \in Ranks : eclaim[t][r] = "refused"}}
    \cup
    {<<"lost", r, dver[r]>> : r \in {q \in Ranks : dver[q] > 0 /\ dver'[q] = 0}}
    \cup
    {<<"rejoin_begun", r, dver'[r]>> : r \in {q \in Ranks : dphase[q] = "clean" /\ dphase'[q] = "repairing"}}
    \cup
    {<<"commit_unrecorded", r, dpend[r].base>> :
        r \in {q \in Ranks : /\ dphase[q] = "pending" /\ dphase'[q] = "pending"
                             /\ \E e \in Newer : /\ reb[e].replies[q] = "ok"
                                                /\ reb'[e].replies[q] = "commit_refused"}}
    \cup
    {<<"begin_uncounted", r>> :
        r \in {q \in Ranks : /\ dphase[q] # "pending" /\ dphase'[q] = "pending"
                             /\ \E e \in Newer : /\ reb[e].replies[q] = "none"
                                                /\ reb'[e].replies[q] = "refused"}}
    \cup
    {<<"stopped_on_refusal", e>> :
        e \in {n \in Newer : /\ reb[n].step = "begin" /\ eshare[n] /\ ~eshare'[n]
                             /\ ephase'[n] = "run"
                             /\ \E q \in Ranks : reb[n].replies[q] = "refused"}}
    \cup
    {<<"check_failed", e>> :
        e \in {n \in Newer : reb[n].owed = "bad" /\ reb'[n].owed = "none" /\ eshare[n] /\ ~eshare'[n]}}

Track == seen' = seen \cup Events
(* A daemon's start (Lose, Restart) is an event too where daemons keep     *)
(* durable copies, with the version it started at: no state pair tells it  *)
(* (a start at the record it had may change nothing).  Elsewhere it is not *)
(* recorded: no witness there reads it, and each would multiply `seen`.    *)
TrackStart(r) ==
    seen' = seen \cup Events \cup (IF Durable THEN {<<"restarted", r, dver'[r]>>} ELSE {})

Attach(e, r) == P!Attach(e, r) /\ Track
Poll(e, r) == P!Poll(e, r) /\ Track
Timeout(e, r) == P!Timeout(e, r) /\ Track
Agree(e) == P!Agree(e) /\ Track
Fetch(e, r) == P!Fetch(e, r) /\ Track
BeginChunk(e, c) == P!BeginChunk(e, c) /\ Track
Begin(e, r) == P!Begin(e, r) /\ Track
BeginUnanswered(e, r) == P!BeginUnanswered(e, r) /\ Track
BeginUnreached(e, r) == P!BeginUnreached(e, r) /\ Track
Decide(e) == P!Decide(e) /\ Track
Abort(e, r) == P!Abort(e, r) /\ Track
MoveLayer(e, r, l) == P!MoveLayer(e, r, l) /\ Track
Commit(e, r) == P!Commit(e, r) /\ Track
CommitRefused(e, r) == P!CommitRefused(e, r) /\ Track
CommitUnanswered(e, r) == P!CommitUnanswered(e, r) /\ Track
Committed(e) == P!Committed(e) /\ Track
Verify(e) == P!Verify(e) /\ Track
Crash(e) == P!Crash(e) /\ Track
Detach(r, e) == P!Detach(r, e) /\ Track
Restart(r) == P!Restart(r) /\ TrackStart(r)
RepairDone(r) == P!RepairDone(r) /\ Track
RepairFails(r) == P!RepairFails(r) /\ Track
RepairAgain(r) == P!RepairAgain(r) /\ Track
Park(e, r) == P!Park(e, r) /\ Track
Claim(e, r) == P!Claim(e, r) /\ Track
Promote(e) == P!Promote(e) /\ Track
Lose(r) == P!Lose(r) /\ TrackStart(r)
AskRejoin(e, r) == P!AskRejoin(e, r) /\ Track
Persist(r) == P!Persist(r) /\ Track

(* The same disjuncts, in the same order, as LayoutProtocol's Next.        *)
ScenarioInit == P!Init /\ seen = {}
ScenarioNext ==
    \/ \E e \in Engines, r \in Ranks : Attach(e, r)
    \/ \E e \in Engines, r \in Ranks : Poll(e, r)
    \/ \E e \in Engines, r \in Ranks : Timeout(e, r)
    \/ \E e \in Engines : Agree(e)
    \/ \E e \in Engines, r \in Ranks : Fetch(e, r)
    \/ \E e \in Engines, c \in Chunks : BeginChunk(e, c)
    \/ \E e \in Engines, r \in Ranks : Begin(e, r)
    \/ \E e \in Engines, r \in Ranks : BeginUnanswered(e, r)
    \/ \E e \in Engines, r \in Ranks : BeginUnreached(e, r)
    \/ \E e \in Engines : Decide(e)
    \/ \E e \in Engines, r \in Ranks : Abort(e, r)
    \/ \E e \in Engines, r \in Ranks, l \in Layers : MoveLayer(e, r, l)
    \/ \E e \in Engines, r \in Ranks : Commit(e, r)
    \/ \E e \in Engines, r \in Ranks : CommitRefused(e, r)
    \/ \E e \in Engines, r \in Ranks : CommitUnanswered(e, r)
    \/ \E e \in Engines : Committed(e)
    \/ \E e \in Engines : Verify(e)
    \/ \E e \in Engines : Crash(e)
    \/ \E r \in Ranks, e \in Engines : Detach(r, e)
    \/ \E r \in Ranks : Restart(r)
    \/ \E r \in Ranks : RepairDone(r)
    \/ \E r \in Ranks : RepairFails(r)
    \/ \E r \in Ranks : RepairAgain(r)
    \/ \E e \in Engines, r \in Ranks : Park(e, r)
    \/ \E e \in Engines, r \in Ranks : Claim(e, r)
    \/ \E e \in Engines : Promote(e)
    \/ \E r \in Ranks : Lose(r)
    \/ \E e \in Engines, r \in Ranks : AskRejoin(e, r)
    \/ \E r \in Ranks : Persist(r)

-----------------------------------------------------------------------------
(* The scenarios.                                                           *)

(* A restart adopts a moved layout: the engine that moved is dead, and a   *)
(* new engine, started after it died, runs with the moved map it found on  *)
(* every daemon.                                                            *)
RestartAdoptsMovedLayout ==
    \E e \in Newer :
        /\ <<"started_alone", e>> \in seen
        /\ ephase[e] = "run"
        /\ \A o \in Newer \ {e} : ephase[o] = "dead"
        /\ \A r \in Ranks : efind[e][r].found = "record"
        /\ efind[e][1].fver > 0
        /\ efind[e][1].fmap # InitialMap
        /\ eroute[e] = efind[e][1].fmap
        /\ ever[e] = efind[e][1].fver

(* A warm standby makes a move busy; after the standby leaves, the mover's *)
(* next move commits and verifies.                                          *)
StandbyBusyThenMoverMoves ==
    \E m, s \in Newer : <<"moved_after_standby", m, s>> \in seen

(* A SIGKILL between the chunks of a rebalance leaves the last committed   *)
(* version (a map moved in only some layers), which the next engine,       *)
(* started after the kill, adopts and runs with.                            *)
KillBetweenChunksAdopted ==
    \E m, n \in Newer :
        /\ <<"killed_between_chunks", m>> \in seen
        /\ <<"started_alone", n>> \in seen
        /\ ephase[n] = "run"
        /\ \A r \in Ranks : efind[n][r].found = "record"
        /\ efind[n][1].fver > 0
        /\ Partial(efind[n][1].fmap)
        /\ eroute[n] = efind[n][1].fmap

(* A SIGKILL mid-move leaves the daemons dirty, and the next engine fails  *)
(* at startup.                                                              *)
KillMidMoveNextFails ==
    /\ \A r \in Ranks : dphase[r] = "dirty"
    /\ \E m, n \in Newer : /\ <<"killed_mid_move", m>> \in seen
                           /\ <<"failed_on_dirty", n>> \in seen

(* An older engine (no layout plugin) is refused after a move.             *)
OlderRefusedAfterMove ==
    \E o \in Older : <<"older_refused", o>> \in seen

(* A rebalance of several chunks: an engine that started at version 0      *)
(* moved every layer, one chunk after the other, and runs with it.         *)
SeveralChunksMoved ==
    \E m \in Newer :
        /\ ephase[m] = "run"
        /\ efind[m][1].fver = 0
        /\ ever[m] >= 2
        /\ \A l \in Layers : eroute[m][l] = 1
        /\ \A r \in Ranks : dphase[r] = "clean" /\ dver[r] = ever[m]

(* A SIGKILL mid-move (some layer already rewritten), and the daemons      *)
(* repair the torn move: each is clean again at the base version, and the  *)
(* next engine, started after the kill, adopts that version on every       *)
(* daemon and serves.                                                       *)
KillMidMoveRepairedThenAdopted ==
    \E m, n \in Newer :
        /\ <<"killed_torn", m>> \in seen
        /\ <<"started_alone", n>> \in seen
        /\ ephase[n] = "run"
        /\ eserv[n] = Ranks
        /\ \A r \in Ranks :
              /\ <<"repaired", r, efind[n][r].fver>> \in seen
              /\ efind[n][r].found = "record"
              /\ dphase[r] = "clean"
              /\ dver[r] = efind[n][r].fver
        /\ eroute[n] = efind[n][1].fmap
        /\ ever[n] = efind[n][1].fver

(* A warm standby follows EPLB: the primary commits moves (two versions)   *)
(* while the standby is parked, none of them busy, then dies; the standby   *)
(* promotes and serves the moved layout, the records' latest version.       *)
StandbyFollowsMoves ==
    \E m \in Newer \ Standbys, s \in Standbys :
        /\ <<"moved_while_parked", m, s, 2>> \in seen
        /\ <<"promoted", s>> \in seen
        /\ ephase[m] = "dead"
        /\ ephase[s] = "run"
        /\ \A r \in Ranks : dver[r] = 2 /\ eroute[s] = dmap[r] /\ ever[s] = dver[r]
        /\ eroute[s] # InitialMap

(* The primary dies mid-move: the daemons are dirty, and the standby fails   *)
(* with the dirty reason instead of promoting.                              *)
StandbyAfterDirtyFails ==
    \E m \in Newer \ Standbys, s \in Standbys :
        /\ <<"killed_mid_move", m>> \in seen
        /\ <<"standby_failed_dirty", s>> \in seen

(* A standby waits out a repair: the primary dies mid-move (a torn move)   *)
(* beside the parked standby; the daemons repair it, and only then tell the *)
(* standby, which promotes and serves the repaired base version.            *)
StandbyWaitsOutRepair ==
    \E m \in Newer \ Standbys, s \in Standbys :
        /\ <<"killed_torn", m>> \in seen
        /\ <<"parked_beside", s, m>> \in seen
        /\ <<"promoted", s>> \in seen
        /\ ephase[s] = "run"
        /\ \A r \in Ranks : /\ <<"repaired", r, dver[r]>> \in seen
                            /\ eroute[s] = dmap[r]
                            /\ ever[s] = dver[r]

(* Two standbys parked beside a running primary, which then dies: exactly *)
(* one promotes, the other's claim is taken and it stays parked, the new    *)
(* primary's standby.                                                       *)
TwoStandbysOnePromotes ==
    \E m \in Newer \ Standbys, s, t \in Standbys :
        /\ s # t
        /\ <<"parked_beside", s, m>> \in seen
        /\ <<"parked_beside", t, m>> \in seen
        /\ ephase[m] = "dead"
        /\ <<"promoted", s>> \in seen
        /\ ephase[s] = "run"
        /\ <<"claim_taken", t>> \in seen
        /\ ephase[t] = "parked"
        /\ \A r \in Ranks : t \in dpark[r] /\ s \in datt[r] \ dpark[r]

(* The witness invariants: each expected to be violated.                   *)
(* A daemon is lost at a moved version and starts again from disk; the next *)
(* engine has it rejoin at the version the other daemons hold, and serves  *)
(* that version from every daemon, none of the others reloaded.             *)
DaemonLostAndRejoined ==
    \E r \in Ranks, e \in Newer :
        /\ \E v \in 1..MaxMoves :
              /\ <<"lost", r, v>> \in seen
              /\ <<"rejoin_begun", r, v>> \in seen
              /\ \A q \in Ranks \ {r} : <<"lost", q, v>> \notin seen
              /\ ephase[e] = "run"
              /\ eserv[e] = Ranks
              /\ ever[e] = v
              /\ \A q \in Ranks : dphase[q] = "clean" /\ dver[q] = v /\ eroute[e] = dmap[q]

(* A daemon does not record a commit (refused, or never received): the     *)
(* check fails and rebalancing stops, the engine serving on with the moved  *)
(* layout while that daemon keeps the move pending.                         *)
CommitUnrecordedStopsRebalancing ==
    \E e \in Newer, r \in Ranks :
        /\ <<"commit_unrecorded", r, 0>> \in seen
        /\ <<"check_failed", e>> \in seen
        /\ ephase[e] = "run" /\ ~eshare[e] /\ reb[e].step = "idle"
        /\ dphase[r] = "pending" /\ dpend[r].mover = e
        /\ \A q \in Ranks : eroute[e] = truth[q]

(* A daemon behind at a moved version: it did not record the second       *)
(* chunk's commit, its mover died, and it was repaired at version 1 while  *)
(* the others hold version 2; the next engine has it rejoin at version 2   *)
(* and serves that version from every daemon, none of the others reloaded. *)
DaemonBehindRejoined ==
    \E r \in Ranks, e \in Newer :
        /\ <<"commit_unrecorded", r, 1>> \in seen
        /\ <<"repaired", r, 1>> \in seen
        /\ <<"rejoin_begun", r, 2>> \in seen
        /\ \A q \in Ranks \ {r} : <<"rejoin_begun", q, 2>> \notin seen
        /\ ephase[e] = "run"
        /\ eserv[e] = Ranks
        /\ ever[e] = 2
        /\ \A q \in Ranks : dphase[q] = "clean" /\ dver[q] = 2 /\ eroute[e] = dmap[q]

(* A daemon takes a begin whose reply is lost: the engine counts it as     *)
(* refused and stops rebalancing, and the daemon keeps the move pending     *)
(* until the engine dies; then it is repaired at the base version, and the *)
(* next engine, started alone, adopts that version on every daemon and     *)
(* serves.                                                                  *)
BeginUncountedRepaired ==
    \E m, n \in Newer, r \in Ranks :
        /\ <<"begin_uncounted", r>> \in seen
        /\ <<"stopped_on_refusal", m>> \in seen
        /\ <<"repaired", r, dver[r]>> \in seen
        /\ <<"started_alone", n>> \in seen
        /\ ephase[n] = "run"
        /\ eserv[n] = Ranks
        /\ \A q \in Ranks : dphase[q] = "clean" /\ eroute[n] = dmap[q] /\ ever[n] = dver[q]

(* Every daemon lost and started again from its durable copy, at a moved  *)
(* version v: an engine runs at v, the layout EPLB learned.                 *)
FullRestartServesCopy ==
    \E e \in Newer :
        /\ ephase[e] = "run"
        /\ ever[e] > 0
        /\ \A r \in Ranks : <<"restarted", r, ever[e]>> \in seen

(* Every daemon lost and started again, one of them behind the newest copy *)
(* (its copy lagged, or could not be used): it rejoins at the newest, and  *)
(* an engine runs at that version.                                          *)
FullRestartBehindRejoined ==
    \E e \in Newer :
        /\ ephase[e] = "run"
        /\ ever[e] > 0
        /\ \A r \in Ranks : \E w \in 0..MaxMoves : <<"restarted", r, w>> \in seen
        /\ \E r \in Ranks : <<"restarted", r, ever[e]>> \in seen
        /\ \E r \in Ranks, w \in 0..MaxMoves : w < ever[e] /\ <<"restarted", r, w>> \in seen
        /\ \E r \in Ranks : <<"rejoin_begun", r, ever[e]>> \in seen

NoFullRestartServesCopy == ~FullRestartServesCopy
NoFullRestartBehindRejoined == ~FullRestartBehindRejoined
NoBeginUncountedRepaired == ~BeginUncountedRepaired
NoCommitUnrecordedStopsRebalancing == ~CommitUnrecordedStopsRebalancing
NoDaemonBehindRejoined == ~DaemonBehindRejoined
NoRestartAdoptsMovedLayout == ~RestartAdoptsMovedLayout
NoStandbyBusyThenMoverMoves == ~StandbyBusyThenMoverMoves
NoKillBetweenChunksAdopted == ~KillBetweenChunksAdopted
NoKillMidMoveNextFails == ~KillMidMoveNextFails
NoOlderRefusedAfterMove == ~OlderRefusedAfterMove
NoSeveralChunksMoved == ~SeveralChunksMoved
NoKillMidMoveRepairedThenAdopted == ~KillMidMoveRepairedThenAdopted
NoStandbyFollowsMoves == ~StandbyFollowsMoves
NoStandbyAfterDirtyFails == ~StandbyAfterDirtyFails
NoTwoStandbysOnePromotes == ~TwoStandbysOnePromotes
NoStandbyWaitsOutRepair == ~StandbyWaitsOutRepair
NoDaemonLostAndRejoined == ~DaemonLostAndRejoined
=============================================================================
