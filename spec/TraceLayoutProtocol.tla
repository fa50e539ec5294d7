------------------------- MODULE TraceLayoutProtocol -------------------------
(***************************************************************************)
(* Trace validation: are the traces of a real run (its daemons' steps,    *)
(* its engines' decisions) a behaviour of LayoutProtocol?  In the style  *)
(* of etcd's Traceetcdraft.tla, after Cirstea, Kuppe, Loillier and Merz, *)
(* "Validating Traces of Distributed Programs Against TLA+              *)
(* Specifications" (2024).                                                *)
(*                                                                         *)
(* Log[r] is daemon r's steps in the order it took them, written by        *)
(* tools.mirror.trace_tla as a generated module (standard modules only).  *)
(* Each logged step is the spec's action of the same name on that daemon, *)
(* with the engine the trace names, and every variable of that daemon the *)
(* trace logs must equal the spec's after it: phase, version, pending      *)
(* move, attachments, parked standbys and the non-following flag.         *)
(*                                                                         *)
(* ELog[k] is one traced engine's decisions, each taken on an all-gather   *)
(* of its ranks, so every rank takes the same ones: its agreements, its    *)
(* chunks' decisions, its rebalances' final checks and a standby's         *)
(* promotion.  Each is the spec's action of that name, and the engine's    *)
(* variables it logs must equal the spec's after it.  The end of each      *)
(* rebalance is logged too, a stuttering step: no chunk is under way and   *)
(* no commit's check is owed there (the check's liveness, on the real      *)
(* engine; "abort": a rank may end before its peer's abort is sent).  An   *)
(* engine's per-rank steps are its requests, in the daemons' logs; its     *)
(* moves and crashes, and the engines that write no trace (older engines), *)
(* are left to the spec.  The logs interleave as TLC finds: no clock.      *)
(*                                                                         *)
(* Why no clock: the spec takes an engine's per-rank steps in rank order, *)
(* a reduction (the ranks are symmetric), while real ranks send them at    *)
(* once and rank 2's may land first.  Requests to different daemons with   *)
(* no collective between them commute, so the check asks for some order   *)
(* of the logged steps, each log's own order kept.                         *)
(*                                                                         *)
(* A commit's reply may be lost (CommitUnanswered): the daemon logged it   *)
(* committed while the engine counted it as refused; which of the two it   *)
(* was, the engine's decisions tell.  A commit whose request never reached  *)
(* its daemon is logged nowhere (CommitRefused, not logged).  A begin's     *)
(* alike: BeginUnanswered is logged with the daemon's answer, and          *)
(* BeginUnreached nowhere.                                                  *)
(*                                                                         *)
(* Two more steps than the spec's.  A rank lost before its request of a   *)
(* chunk's step (RankLost), after which the engine can only crash.  And a  *)
(* request from an engine that the spec has already ended, which changes   *)
(* none of the daemon's variables (a refusal, or a fetch served to an      *)
(* attached engine).  The spec ends an engine at once (its other rank      *)
(* refused first, or the daemon it maps lost), while its other real ranks  *)
(* may still send what they had begun: a stuttering step of the spec.      *)
(*                                                                         *)
(* What is not logged here: the map (the spec's two permutations per       *)
(* layer are not a real EPLB map; tools.trace_check holds the digests),   *)
(* and the notices, fetches served and memory readings, which are not     *)
(* steps of the spec (a notice is part of the step that decided it).       *)
(*                                                                         *)
(* TraceAccepted is an invariant that fails exactly when every log was     *)
(* matched: TLC's "violated" is the verdict "a behaviour".                *)
(***************************************************************************)
EXTENDS LayoutProtocol

CONSTANT Log,  \* Log[r]: daemon r's steps, a sequence of records (see Logged)
         ELog  \* ELog[k]: [eng |-> engine, steps |-> its decisions] (see Decided)

VARIABLE pos,  \* pos[r]: how many steps of Log[r] the behaviour has taken
         epos  \* epos[k]: how many steps of ELog[k].steps

traceVars == <<vars, pos, epos>>

EIndex == 1..Len(ELog)
Traced == {ELog[k].eng : k \in EIndex}

(* A logged step's record: ev, the event; eng, the engine it names;       *)
(* cands, the engines that may have sent a fetch without a claim (an older *)
(* engine, or an engine whose fetch hook is missing); ans, the answer in   *)
(* the spec's words; then the daemon's variables after the step.          *)
Matches(r, l) ==
    /\ dphase'[r] = l.ph
    /\ dver'[r] = l.ver
    /\ dpend'[r] = l.pend
    /\ datt'[r] = l.att
    /\ dpark'[r] = l.park
    /\ dnf'[r] = l.nf

Logged(r, l) ==
    CASE l.ev = "attach"      -> Attach(l.eng, r)
      [] l.ev = "fetch"       -> \E e \in l.cands :
                                    /\ Fetch(e, r)
                                    /\ (r \in eserv'[e]) = (l.ans = "served")
      [] l.ev = "begin"       -> \/ Begin(l.eng, r) /\ reb'[l.eng].replies[r] = l.ans
                                 \/ BeginUnanswered(l.eng, r) /\ BeginReply(l.eng, r) = l.ans
      [] l.ev = "abort"       -> Abort(l.eng, r)
      [] l.ev = "commit"      -> \/ Commit(l.eng, r) /\ reb'[l.eng].replies[r] = l.ans
                                 \/ CommitRefused(l.eng, r) /\ l.ans = "commit_refused"
                                 \/ CommitUnanswered(l.eng, r) /\ l.ans = "committed"
      [] l.ev = "detach"      -> Detach(r, l.eng)
      [] l.ev = "park"        -> Park(l.eng, r)
      [] l.ev = "claim"       -> Claim(l.eng, r) /\ eclaim'[l.eng][r] = l.ans
      [] l.ev = "rejoin"      -> /\ AskRejoin(l.eng, r)
                                 /\ efind'[l.eng][r].found = IF l.ans = "granted" THEN "wait" ELSE "refused"
      [] l.ev = "repair"      -> RepairAgain(r)
      [] l.ev = "repair_done" -> RepairDone(r)
      [] l.ev = "repair_failed" -> RepairFails(r)
      [] l.ev = "restart"     -> Lose(r) \/ Restart(r)
      [] l.ev = "persist"     -> Persist(r)

(* A request of an engine the spec has ended, changing nothing.           *)
LateRequest(l) ==
    /\ l.ev \in {"fetch", "begin", "commit", "claim"}
    /\ \E e \in l.cands : Gone(e)
    /\ UNCHANGED vars

(* A rank of engine e whose process died before it sent its request of the *)
(* chunk's step under way (a begin, a commit), or its startup's attach.     *)
(* The spec takes an engine's per-rank requests in rank order, while a      *)
(* higher real rank sends its own at the same moment: without this step its *)
(* granted request could not follow.  The rank's reply (or finding) is      *)
(* "lost": the engine decides nothing more (Agree, Decide, Committed and    *)
(* Verify wait on every rank) and can only crash.                           *)
RankLost(e, q) ==
    \/ /\ ephase[e] = "run"
       /\ \/ reb[e].step = "begin" /\ reb[e].replies[q] = "none"
          \/ reb[e].step \in {"move", "commit"} /\ MovedEverywhere(e) /\ reb[e].replies[q] = "ok"
       /\ reb' = [reb EXCEPT ![e].replies[q] = "lost"]
       /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, eshare, moves, eclaim>>
    \/ /\ ephase[e] = "start"
       /\ efind[e][q].found = "nothing"
       /\ efind' = [efind EXCEPT ![e][q].found = "lost"]
       /\ UNCHANGED <<daemonVars, ephase, eroute, ever, eserv, eshare, reb, moves, eclaim>>

NoRankLost(e) == /\ \A r \in Ranks : reb[e].replies[r] # "lost"
                 /\ \A r \in Ranks : efind[e][r].found # "lost"

(* An engine's logged decision: ev, the event; then what it left: ph, the *)
(* engine's phase; ver, its version; share, whether it rebalances through *)
(* the daemons; step, its chunk's step.                                    *)
Decided(e, l) ==
    CASE l.ev = "agree"   -> /\ Agree(e) /\ NoRankLost(e)
                             /\ ephase'[e] = l.ph
                             /\ l.ph = "load" => ever'[e] = l.ver /\ eshare'[e] = l.share
      [] l.ev = "decide"  -> /\ Decide(e) /\ NoRankLost(e)
                             /\ reb'[e].step = l.step /\ eshare'[e] = l.share
      [] l.ev = "verify"  -> Verify(e) /\ NoRankLost(e) /\ eshare'[e] = l.share
      [] l.ev = "promote" -> /\ Promote(e)
                             /\ ephase'[e] = l.ph
                             /\ l.ph = "run" => ever'[e] = l.ver
      [] l.ev = "rebalance_end" -> /\ ~Gone(e)
                                   /\ reb[e].step \in {"idle", "abort"}
                                   /\ reb[e].owed = "none"
                                   /\ UNCHANGED vars

(* Every step of the protocol that is not a daemon's request.  A poll is a *)
(* read of the daemon and changes none of its variables.                   *)
Unlogged ==
    \/ \E e \in Engines, r \in Ranks : Poll(e, r) \/ Timeout(e, r) \/ RankLost(e, r)
    \/ \E e \in Engines : Crash(e) \/ (Committed(e) /\ NoRankLost(e))
    \/ \E e \in Engines \ Traced :
          \/ Agree(e) /\ NoRankLost(e)
          \/ Promote(e)
          \/ (Decide(e) \/ Verify(e)) /\ NoRankLost(e)
    \/ \E e \in Engines, c \in Chunks : BeginChunk(e, c)
    \/ \E e \in Engines, r \in Ranks, l \in Layers : MoveLayer(e, r, l)
    \/ \E e \in Engines, r \in Ranks : CommitRefused(e, r) \/ BeginUnreached(e, r)

TraceInit ==
    /\ Init
    /\ pos = [r \in Ranks |-> 0]
    /\ epos = [k \in EIndex |-> 0]

TraceNext ==
    \/ \E r \in Ranks :
          /\ pos[r] < Len(Log[r])
          /\ LET l == Log[r][pos[r] + 1] IN
                /\ Logged(r, l) \/ LateRequest(l)
                /\ Matches(r, l)
          /\ pos' = [pos EXCEPT ![r] = @ + 1]
          /\ UNCHANGED epos
    \/ \E k \in EIndex :
          /\ epos[k] < Len(ELog[k].steps)
          /\ Decided(ELog[k].eng, ELog[k].steps[epos[k] + 1])
          /\ epos' = [epos EXCEPT ![k] = @ + 1]
          /\ UNCHANGED pos
    \/ /\ Unlogged
       /\ UNCHANGED <<pos, epos>>

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

(* Violated exactly when every log was taken: the verdict "a behaviour".   *)
TraceAccepted ==
    \/ \E r \in Ranks : pos[r] < Len(Log[r])
    \/ \E k \in EIndex : epos[k] < Len(ELog[k].steps)
=============================================================================
