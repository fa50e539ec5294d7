-------------------------- MODULE LayoutProtocol --------------------------
(***************************************************************************)
(* The expert-layout protocol of the SGLang weight cache                  *)
(* (docs/protocol.md §3-§7).                                              *)
(*                                                                         *)
(* One daemon per rank keeps the layout record of the weights it serves:   *)
(* no record, clean (map + version), pending (a move in flight), dirty    *)
(* (the mover went away mid-move) or repairing (reloading the torn move's *)
(* layers at the base version's rows).  Engines span every rank: they     *)
(* attach, agree at startup on the layout to route with, fetch the       *)
(* weights, and may rebalance experts chunk by chunk (begin, move layer by *)
(* layer, commit or abort).  Any engine may crash at any point; a daemon  *)
(* notices the EOF of the attach connection later, as a separate step.     *)
(*                                                                         *)
(* The map is abstracted: each layer's row is one of two permutations,     *)
(* written 0 (the initial one) and 1.  A rebalance flips the rows of the   *)
(* layers of its chunk.  `truth` is the real content of each daemon's      *)
(* memory, which a move changes one layer at a time.                       *)
(*                                                                         *)
(* Sessions: an engine id attaches at most once per daemon (a restarted    *)
(* engine picks a new id, so it is another element of Engines); the        *)
(* session token is therefore abstracted as the engine id itself, and a    *)
(* stale session cannot arise in this model (see README.md).               *)
(*                                                                         *)
(* The ranks of one engine take each per-rank step (attach, fetch, begin,   *)
(* abort, commit) in rank order, and a move rewrites a chunk's layers in    *)
(* increasing order: the ranks are symmetric, and other engines, crashes    *)
(* and EOFs still interleave between any two steps (see README.md).        *)
(*                                                                         *)
(* Every action here has a Python event of the same name in the mirror,   *)
(* tools/mirror/system.py (its EVENTS), whose decisions all come from the  *)
(* Python machines of src/layout_sm/ (the daemon's and the engine          *)
(* session's that every real rank runs).                                   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences, TLC

CONSTANTS
    NumRanks,        \* ranks per engine = daemons (daemon r serves rank r)
    NumLayers,       \* MoE layers
    Engines,         \* engine ids (model values)
    Older,           \* engines without the layout plugin: fetch without attaching
    MayLackRecord,   \* daemons that, in some runs, start without a record
    Chunks,          \* the layer sets a rebalance moves in one chunk
    MaxMoves,        \* bound on the chunks begun in a behaviour
    DaemonRestarts,  \* whether an operator may restart a dirty daemon
    Repairs,         \* the daemons repair a torn move (started with auto repair on)
    OperatorRepairs, \* an operator may ask a dirty daemon to repair (auto repair on or off)
    RepairMayFail,   \* a repair can fail (a read error, a missing file)
    Standbys,        \* engines started as warm standbys (SGLANG_EXPERT_LAYOUT_ROLE=standby)
    Rejoins,         \* a daemon may be lost and start again from disk; engines have it rejoin
    ReplyFaults,     \* a begin's or a commit's request or reply may be lost, a commit refused for its rows
    Durable,         \* each daemon keeps a durable copy of its record and starts again from it
    NONE             \* model value: no pending move, no durable copy

ASSUME /\ NumRanks \in Nat \ {0}
       /\ NumLayers \in Nat \ {0}
       /\ Older \subseteq Engines
       /\ MayLackRecord \subseteq 1..NumRanks
       /\ Chunks \subseteq (SUBSET (1..NumLayers)) \ {{}}
       /\ MaxMoves \in Nat
       /\ DaemonRestarts \in BOOLEAN
       /\ Repairs \in BOOLEAN
       /\ OperatorRepairs \in BOOLEAN
       /\ RepairMayFail \in BOOLEAN
       /\ Standbys \subseteq Engines \ Older
       /\ Rejoins \in BOOLEAN
       /\ ReplyFaults \in BOOLEAN
       /\ Durable \in BOOLEAN
       /\ Durable => Rejoins   \* copies written at different versions are reconciled by a rejoin
       /\ Rejoins => Repairs \/ OperatorRepairs   \* a rejoin is the repair's reload, for every layer

(* The daemons can repair: by themselves, or when an operator asks.  A     *)
(* constant, so that TLC evaluates it once and takes no branch on it.     *)
CanRepair == Repairs \/ OperatorRepairs

Ranks == 1..NumRanks
Layers == 1..NumLayers
Newer == Engines \ Older

(* The record fields, in the order TLC prints them.                        *)
PendingMoves == [mover : Engines, layers : SUBSET Layers, base : Nat]
Findings == [found : {"nothing", "wait", "timeout", "record", "no_record", "dirty", "rejoin", "refused"},
             fver : Nat, fmap : [Layers -> {0, 1}]]
Rebalances == [step : {"idle", "begin", "abort", "move", "commit"},
               chunk : SUBSET Layers,
               replies : [Ranks -> {"none", "ok", "busy", "refused", "aborted",
                                    "committed", "commit_refused"}],
               owed : {"none", "good", "bad"}]

VARIABLES
    dphase,   \* daemon record phase: "no_record", "clean", "pending", "dirty", "repairing"
    dver,     \* daemon record version
    dmap,     \* daemon record map (per layer: which permutation)
    dpend,    \* the pending move, kept as the dirty information once dirty; or NONE
    datt,     \* engines holding a live attachment (the session is the engine id)
    dnf,      \* sticky flag: an engine fetched without a live attachment
    truth,    \* the real layout of each daemon's weights
    ephase,   \* engine phase: "start", "load", "run", "parked" (a standby), "failed", "dead"
    efind,    \* what each rank found on its daemon at startup
    eroute,   \* the layout the engine routes with (its metadata)
    ever,     \* the record version the engine adopted (0 for its own initial layout)
    eserv,    \* ranks whose daemon weights the engine maps (fetched, not dead)
    eshare,   \* shared-weight rebalancing is on for this engine
    reb,      \* the engine's rebalance in progress
    moves,    \* chunks begun so far (bounded by MaxMoves)
    dpark,    \* the parked standby attachments of each daemon (a subset of datt)
    eclaim,   \* per rank, a standby's role on that rank's daemon (see ClaimStates)
    dcopy     \* each daemon's durable copy of its record (version, map), or NONE

vars == <<dphase, dver, dmap, dpend, datt, dnf, truth, ephase, efind, eroute, ever,
          eserv, eshare, reb, moves, dpark, eclaim, dcopy>>

daemonVars == <<dphase, dver, dmap, dpend, datt, dnf, truth, dpark, dcopy>>
engineVars == <<ephase, efind, eroute, ever, eserv, eshare, reb, eclaim>>

(* A standby's role on one rank's daemon (eclaim[e][r]):                    *)
(*  "none": not parked there (warming up, or promoted: see "granted");      *)
(*  "parked": parked, no notice yet; "notified": parked, and the daemon      *)
(*  said no unparked engine is attached any more (a message on the attach    *)
(*  connection, or the park reply itself);                                  *)
(*  "granted": the claim of the primary role was granted (unparked there);   *)
(*  "taken": the claim was refused, another unparked engine is attached      *)
(*  (still parked); "refused": the daemon is not clean (still parked; the  *)
(*  standby then fails); "release": claimed (granted or taken), but some    *)
(*  claim was taken: the rank parks there again.                            *)
ClaimStates == {"none", "parked", "notified", "granted", "taken", "refused", "release"}
NoClaims == [r \in Ranks |-> "none"]

InitialMap == [l \in Layers |-> 0]
NoFinding == [found |-> "nothing", fver |-> 0, fmap |-> InitialMap]
IdleReb == [step |-> "idle", chunk |-> {}, replies |-> [r \in Ranks |-> "none"], owed |-> "none"]

(* A gone engine (crashed, or its startup or fetch failed: the process      *)
(* exits) has lost its memory: its local variables return to their initial *)
(* values, so states that differ only in a dead engine's memory are one     *)
(* state.  Its attachments live on until each daemon notices the EOF.       *)
Gone(e) == ephase[e] \in {"failed", "dead"}

Forget(e, phase) ==
    /\ ephase' = [ephase EXCEPT ![e] = phase]
    /\ efind' = [efind EXCEPT ![e] = [r \in Ranks |-> NoFinding]]
    /\ eroute' = [eroute EXCEPT ![e] = InitialMap]
    /\ ever' = [ever EXCEPT ![e] = 0]
    /\ eserv' = [eserv EXCEPT ![e] = {}]
    /\ eshare' = [eshare EXCEPT ![e] = FALSE]
    /\ reb' = [reb EXCEPT ![e] = IdleReb]
    /\ eclaim' = [eclaim EXCEPT ![e] = NoClaims]

(* The layout an engine moves to with its current chunk: flip those rows.  *)
Target(e) == [l \in Layers |-> IF l \in reb[e].chunk THEN 1 - eroute[e][l] ELSE eroute[e][l]]

(* The finding of an attach reply or of a poll: the daemon's state as seen  *)
(* (the version and map only where the reply carries a record).             *)
Snapshot(r) ==
    CASE dphase[r] = "no_record" -> [found |-> "no_record", fver |-> 0, fmap |-> InitialMap]
      [] dphase[r] = "dirty"     -> [found |-> "dirty", fver |-> 0, fmap |-> InitialMap]
      [] OTHER                   -> [found |-> "record", fver |-> dver[r], fmap |-> dmap[r]]

ForeignPending(e, r) == dphase[r] = "pending" /\ dpend[r].mover # e

(* A rank that attaches to daemon r waits (and polls) while another        *)
(* engine's move is pending there or while the daemon repairs a torn move. *)
MustWait(e, r) == ForeignPending(e, r) \/ dphase[r] = "repairing"

-----------------------------------------------------------------------------
(* Startup (docs/protocol.md §5).                                          *)

Init ==
    /\ \E S \in SUBSET MayLackRecord :
          dphase = [r \in Ranks |-> IF r \in S THEN "no_record" ELSE "clean"]
    /\ dver = [r \in Ranks |-> 0]
    /\ dmap = [r \in Ranks |-> InitialMap]
    /\ dpend = [r \in Ranks |-> NONE]
    /\ datt = [r \in Ranks |-> {}]
    /\ dnf = [r \in Ranks |-> FALSE]
    /\ truth = [r \in Ranks |-> InitialMap]
    /\ ephase = [e \in Engines |-> IF e \in Older THEN "load" ELSE "start"]
    /\ efind = [e \in Engines |-> [r \in Ranks |-> NoFinding]]
    /\ eroute = [e \in Engines |-> InitialMap]
    /\ ever = [e \in Engines |-> 0]
    /\ eserv = [e \in Engines |-> {}]
    /\ eshare = [e \in Engines |-> FALSE]
    /\ reb = [e \in Engines |-> IdleReb]
    /\ moves = 0
    /\ dpark = [r \in Ranks |-> {}]
    /\ eclaim = [e \in Engines |-> NoClaims]
    /\ dcopy = [r \in Ranks |-> NONE]

(* Rank r of engine e attaches to daemon r; the reply is the finding.       *)
(* Another engine's pending move, or a repair, makes the rank wait (it     *)
(* polls), keeping the record the attach reply carried.                     *)
Attach(e, r) ==
    /\ e \in Newer
    /\ ephase[e] = "start"
    /\ efind[e][r].found = "nothing"
    /\ \A q \in 1..(r - 1) : efind[e][q].found # "nothing"
    /\ datt' = [datt EXCEPT ![r] = @ \cup {e}]
    /\ efind' = [efind EXCEPT ![e][r] = IF MustWait(e, r)
                                         THEN [Snapshot(r) EXCEPT !.found = "wait"]
                                         ELSE Snapshot(r)]
    /\ UNCHANGED <<dphase, dver, dmap, dpend, dnf, dcopy, truth, ephase, eroute, ever, eserv,
                   eshare, reb, moves, dpark, eclaim>>

(* A waiting rank polls its daemon (a query with the map) and sees the     *)
(* move ended: aborted, committed (a new record), dirty, or repaired (the   *)
(* base version's record again).                                            *)
Poll(e, r) ==
    /\ ephase[e] = "start"
    /\ efind[e][r].found = "wait"
    /\ ~MustWait(e, r)
    /\ efind' = [efind EXCEPT ![e][r] = Snapshot(r)]
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, dcopy, truth, ephase, eroute, ever, eserv,
                   eshare, reb, moves, dpark, eclaim>>

(* The wait timed out (300 s by default): the rank fails its startup.       *)
Timeout(e, r) ==
    /\ ephase[e] = "start"
    /\ efind[e][r].found = "wait"
    /\ efind' = [efind EXCEPT ![e][r].found = "timeout"]
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, dcopy, truth, ephase, eroute, ever, eserv,
                   eshare, reb, moves, dpark, eclaim>>

(* The ranks all-gather their findings; one decision, the same on all.      *)
Found(e) == {efind[e][r] : r \in Ranks}
Recorded(e) == {f \in Found(e) : f.found = "record"}
Moved(f) == f.fver # 0 \/ f.fmap # InitialMap
StartupFails(e) ==
    \/ \E f \in Found(e) : f.found \in {"dirty", "timeout", "refused"}
    \/ (Recorded(e) # Found(e) /\ \E f \in Recorded(e) : Moved(f))
    \/ \E f, g \in Recorded(e) : f.fver # g.fver \/ f.fmap # g.fmap
(* Every daemon keeps a record, all the same: route with it (the engine's   *)
(* own layout when that record is the initial one) and rebalance through    *)
(* the daemons.  Otherwise (some daemons keep no record) keep the engine's  *)
(* own initial layout and do not rebalance shared weights.                  *)
Adopts(e) == Recorded(e) = Found(e)

(* A daemon's record can fall behind the others': a daemon lost and        *)
(* started again from disk holds the initial layout at version 0 (Lose),   *)
(* and one whose commit was refused or never reached it is repaired at the *)
(* base version once its mover is gone, while the others recorded the     *)
(* next one.  Versions only grow, and every daemon that holds a version    *)
(* holds its one map (OneMapPerVersion), so the newest record is the one   *)
(* to serve.  Where rejoining is on, an engine whose ranks found daemons    *)
(* behind daemons that all hold one newest record does not fail on the     *)
(* difference: its agreement marks the ranks behind to rejoin at that      *)
(* record ("rejoin", with the record), they ask their daemons (AskRejoin)  *)
(* and wait as for a repair, and the ranks agree again on what they then   *)
(* find.  Only the daemons behind reload; none is rewound.  The engine     *)
(* decides, at its startup's all-gather: only the engine's ranks together  *)
(* see every daemon, across nodes.                                          *)
NewestVersion(e) == CHOOSE v \in {f.fver : f \in Found(e)} : \A f \in Found(e) : f.fver <= v
Behind(e, f) == f.found = "record" /\ f.fver < NewestVersion(e)
RejoinWanted(e) ==
    /\ Rejoins
    /\ Recorded(e) = Found(e)
    /\ \E f \in Found(e) : Behind(e, f)
    /\ \A f, g \in Found(e) : f.fver = NewestVersion(e) /\ g.fver = NewestVersion(e) => f.fmap = g.fmap
RejoinTarget(e) == CHOOSE f \in Found(e) : f.fver = NewestVersion(e)

Agree(e) ==
    /\ ephase[e] = "start"
    /\ \A r \in Ranks : efind[e][r].found \notin {"nothing", "wait", "rejoin"}
    /\ IF RejoinWanted(e)
         THEN /\ efind' = [efind EXCEPT ![e] =
                            [r \in Ranks |-> IF Behind(e, efind[e][r])
                                               THEN [RejoinTarget(e) EXCEPT !.found = "rejoin"]
                                               ELSE efind[e][r]]]
              /\ UNCHANGED <<ephase, eroute, ever, eserv, eshare, reb, eclaim>>
       ELSE IF StartupFails(e)
         THEN Forget(e, "failed")
         ELSE LET f == efind[e][1] IN
              /\ ephase' = [ephase EXCEPT ![e] = "load"]
              /\ eroute' = [eroute EXCEPT ![e] = IF Adopts(e) THEN f.fmap ELSE InitialMap]
              /\ ever' = [ever EXCEPT ![e] = IF Adopts(e) THEN f.fver ELSE 0]
              /\ eshare' = [eshare EXCEPT ![e] = Adopts(e)]
              /\ UNCHANGED <<efind, eserv, reb, eclaim>>
    /\ UNCHANGED <<daemonVars, moves>>

(* fetch_state on daemon r, with the engine's claim (version, digest);      *)
(* older engines send no claim.  The check of docs/protocol.md §4.         *)
FetchServes(e, r) ==
    \/ dphase[r] = "no_record"
    \/ /\ dphase[r] = "clean"
       /\ IF e \in Older THEN dver[r] = 0 ELSE eroute[e] = dmap[r]
FetchNonFollowing(e, r) ==
    dphase[r] = "clean" /\ (e \in Older \/ e \notin datt[r])

Fetch(e, r) ==
    /\ ephase[e] = "load"
    /\ r \notin eserv[e]
    /\ 1..(r - 1) \subseteq eserv[e]
    /\ IF FetchServes(e, r)
         THEN /\ eserv' = [eserv EXCEPT ![e] = @ \cup {r}]
              /\ ephase' = [ephase EXCEPT ![e] = IF eserv'[e] = Ranks THEN "run" ELSE "load"]
              /\ dnf' = [dnf EXCEPT ![r] = @ \/ FetchNonFollowing(e, r)]
              /\ UNCHANGED <<efind, eroute, ever, eshare, reb, eclaim>>
         ELSE /\ Forget(e, "failed")
              /\ UNCHANGED dnf
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, truth, moves, dpark, dcopy>>

-----------------------------------------------------------------------------
(* Rebalance, one chunk at a time (docs/protocol.md §6).                   *)

(* An engine acts as a primary (rebalances) unless it was started as a      *)
(* standby and has not been promoted (granted the role on every daemon).    *)
Primary(e) == e \notin Standbys \/ \A r \in Ranks : eclaim[e][r] = "granted"

(* The engines whose attachment to daemon r counts: every attachment but    *)
(* the parked standbys'.                                                    *)
Unparked(r) == datt[r] \ dpark[r]

BeginChunk(e, c) ==
    /\ ephase[e] = "run"
    /\ Primary(e)
    /\ eshare[e]
    /\ reb[e].step = "idle"
    /\ moves < MaxMoves
    /\ c \in Chunks
    /\ reb' = [reb EXCEPT ![e] = [@ EXCEPT !.step = "begin", !.chunk = c]]
    /\ moves' = moves + 1
    /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, eshare, eclaim>>

(* begin on daemon r: the precedence of docs/protocol.md §4.               *)
BeginReply(e, r) ==
    CASE e \notin datt[r]                                   -> "refused"
      [] dphase[r] = "pending" /\ dpend[r].mover = e        -> "refused"
      [] dphase[r] \in {"no_record", "dirty", "repairing"}  -> "refused"
      [] dnf[r]                                             -> "refused"
      [] ever[e] # dver[r]                                  -> "refused"
      [] dphase[r] = "pending"                              -> "busy"
      [] Unparked(r) \ {e} # {}                             -> "busy"
      [] OTHER                                              -> "ok"

(* Rank r's begin is due: the chunk is begun and the ranks before r have  *)
(* their replies.                                                          *)
BeginDue(e, r) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "begin"
    /\ reb[e].replies[r] = "none"
    /\ \A q \in 1..(r - 1) : reb[e].replies[q] # "none"

(* What daemon r does with a begin: it takes the move where it answers ok. *)
TakeBegin(e, r) ==
    IF BeginReply(e, r) = "ok"
      THEN /\ dphase' = [dphase EXCEPT ![r] = "pending"]
           /\ dpend' = [dpend EXCEPT ![r] = [mover |-> e, layers |-> reb[e].chunk,
                                          base |-> dver[r]]]
      ELSE UNCHANGED <<dphase, dpend>>

Begin(e, r) ==
    /\ BeginDue(e, r)
    /\ reb' = [reb EXCEPT ![e].replies[r] = BeginReply(e, r)]
    /\ TakeBegin(e, r)
    /\ UNCHANGED <<dver, dmap, datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare,
                   moves, dpark, eclaim>>

(* The faults of a real socket (ReplyFaults) on a begin.  The daemon took  *)
(* the step Begin takes and its reply was lost: the rank sees no answer    *)
(* and counts it as refused, so rebalancing stops at Decide.  The rank does *)
(* not abort: an abort names no begin, and where the lost reply was a       *)
(* refusal for an earlier move this daemon did not record, whose weights   *)
(* have moved, an abort would clear that move and leave a record that is   *)
(* not the memory's.  A daemon that took the begin keeps the move pending   *)
(* until its mover is gone (Detach: dirty, then repaired at the base        *)
(* version); no layer of it moved.                                          *)
BeginUnanswered(e, r) ==
    /\ ReplyFaults
    /\ BeginDue(e, r)
    /\ reb' = [reb EXCEPT ![e].replies[r] = "refused"]
    /\ TakeBegin(e, r)
    /\ UNCHANGED <<dver, dmap, datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare,
                   moves, dpark, eclaim>>

(* The begin's request never reached a daemon that would have taken it:    *)
(* the daemon is unchanged and the rank counts the begin as refused.  Where *)
(* the daemon would not have taken it, this is BeginUnanswered.            *)
BeginUnreached(e, r) ==
    /\ ReplyFaults
    /\ BeginDue(e, r)
    /\ BeginReply(e, r) = "ok"
    /\ reb' = [reb EXCEPT ![e].replies[r] = "refused"]
    /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, eshare, moves, eclaim>>

(* All replies gathered, with the check the previous chunk's commits owe    *)
(* (Committed): they travel in the same all-gather.  Proceed, or abort the  *)
(* ok ranks (pause on busy; rebalancing off for good on a refusal or on a   *)
(* failed check).  A daemon whose commit failed still holds that move       *)
(* pending, so it refuses this begin (BeginReply's second rule): no rank    *)
(* moves on a daemon whose record missed the previous chunk.                *)
Decide(e) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "begin"
    /\ \A r \in Ranks : reb[e].replies[r] # "none"
    /\ LET replies == {reb[e].replies[r] : r \in Ranks}
           anyOk == "ok" \in replies
           checked == reb[e].owed # "bad"
       IN /\ reb' = [reb EXCEPT ![e] =
                       IF replies = {"ok"} /\ checked THEN [@ EXCEPT !.step = "move", !.owed = "none"]
                       ELSE IF anyOk THEN [@ EXCEPT !.step = "abort", !.owed = "none"]
                       ELSE IdleReb]
          /\ eshare' = [eshare EXCEPT ![e] = "refused" \notin replies /\ checked]
    /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, moves, eclaim>>

Abort(e, r) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "abort"
    /\ reb[e].replies[r] = "ok"
    /\ \A q \in 1..(r - 1) : reb[e].replies[q] # "ok"
    /\ dphase' = [dphase EXCEPT ![r] = "clean"]
    /\ dpend' = [dpend EXCEPT ![r] = NONE]
    /\ reb' = [reb EXCEPT ![e] =
                 IF \A q \in Ranks \ {r} : reb[e].replies[q] # "ok"
                   THEN IdleReb
                   ELSE [@ EXCEPT !.replies[r] = "aborted"]]
    /\ UNCHANGED <<dver, dmap, datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare,
                   moves, dpark, eclaim>>

(* sglang's update_expert_location rewrites one layer of one rank's         *)
(* weights in the daemon's memory, the chunk's layers in increasing order.  *)
MoveLayer(e, r, l) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "move"
    /\ l \in reb[e].chunk
    /\ truth[r][l] # Target(e)[l]
    /\ \A k \in reb[e].chunk : k < l => truth[r][k] = Target(e)[k]
    /\ truth' = [truth EXCEPT ![r][l] = Target(e)[l]]
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, dcopy, engineVars, moves, dpark>>

MovedEverywhere(e) == \A r \in Ranks : \A l \in reb[e].chunk : truth[r][l] = Target(e)[l]

(* After the device synchronize, each rank commits its new rows.            *)
CommitOk(e, r) ==
    /\ e \in datt[r]
    /\ dphase[r] = "pending"
    /\ dpend[r].mover = e
    /\ dpend[r].layers = reb[e].chunk

(* Rank r may commit: the chunk moved on every rank (the device            *)
(* synchronize), r's begin was ok, and the ranks before r have committed.   *)
CommitReady(e, r) ==
    /\ ephase[e] = "run"
    /\ reb[e].step \in {"move", "commit"}
    /\ MovedEverywhere(e)
    /\ reb[e].replies[r] = "ok"
    /\ \A q \in 1..(r - 1) : reb[e].replies[q] # "ok"

Commit(e, r) ==
    /\ CommitReady(e, r)
    /\ IF CommitOk(e, r)
         THEN /\ dphase' = [dphase EXCEPT ![r] = "clean"]
              /\ dver' = [dver EXCEPT ![r] = @ + 1]
              /\ dmap' = [dmap EXCEPT ![r] = Target(e)]
              /\ dpend' = [dpend EXCEPT ![r] = NONE]
              /\ reb' = [reb EXCEPT ![e].step = "commit", ![e].replies[r] = "committed"]
         ELSE /\ reb' = [reb EXCEPT ![e].step = "commit", ![e].replies[r] = "commit_refused"]
              /\ UNCHANGED <<dphase, dver, dmap, dpend>>
    /\ UNCHANGED <<datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare, moves, dpark, eclaim>>

(* The faults of a real socket (ReplyFaults), where the daemon would take *)
(* the commit.  It refuses rows it cannot take (not a permutation of its   *)
(* experts): the move stays pending, as for any refused commit.  A request *)
(* that never reached the daemon is the same step.  The rank counts either *)
(* as refused; the check the commit owes fails (Committed), and the daemon *)
(* keeps the move pending until its mover is gone (Detach: dirty, then     *)
(* repaired at the base version).                                          *)
CommitRefused(e, r) ==
    /\ ReplyFaults
    /\ CommitReady(e, r)
    /\ CommitOk(e, r)
    /\ reb' = [reb EXCEPT ![e].step = "commit", ![e].replies[r] = "commit_refused"]
    /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, eshare, moves, eclaim>>

(* The daemon recorded the commit and its reply was lost: the rank sees no *)
(* answer and counts it as refused, so the check fails though every daemon *)
(* holds the move.                                                          *)
CommitUnanswered(e, r) ==
    /\ ReplyFaults
    /\ CommitReady(e, r)
    /\ CommitOk(e, r)
    /\ dphase' = [dphase EXCEPT ![r] = "clean"]
    /\ dver' = [dver EXCEPT ![r] = @ + 1]
    /\ dmap' = [dmap EXCEPT ![r] = Target(e)]
    /\ dpend' = [dpend EXCEPT ![r] = NONE]
    /\ reb' = [reb EXCEPT ![e].step = "commit", ![e].replies[r] = "commit_refused"]
    /\ UNCHANGED <<datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare, moves, dpark, eclaim>>

(* Every rank has its commit reply, and no collective follows: each rank   *)
(* routes with the moved layout and claims the next version.  Whether every *)
(* daemon recorded that version with the digest of the engine's whole map  *)
(* is a check owed to the next all-gather: the next chunk's (Decide) or    *)
(* the one that ends the rebalance (Verify).  Each rank's reply carries its *)
(* daemon's new version and digest, read here.                             *)
Committed(e) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "commit"
    /\ \A r \in Ranks : reb[e].replies[r] \in {"committed", "commit_refused"}
    /\ LET good == /\ \A r \in Ranks : reb[e].replies[r] = "committed"
                   /\ \A r \in Ranks : dver[r] = ever[e] + 1 /\ dmap[r] = Target(e)
       IN reb' = [reb EXCEPT ![e] = [IdleReb EXCEPT !.owed = IF good THEN "good" ELSE "bad"]]
    /\ eroute' = [eroute EXCEPT ![e] = Target(e)]
    /\ ever' = [ever EXCEPT ![e] = @ + 1]
    /\ UNCHANGED <<daemonVars, ephase, efind, eserv, eshare, moves, eclaim>>

(* The rebalance ends between chunks with a check owed: its one all-gather *)
(* checks the last chunk's commits.  The engine routes with the moved      *)
(* layout either way; a failed check stops rebalancing.                    *)
Verify(e) ==
    /\ ephase[e] = "run"
    /\ reb[e].step = "idle"
    /\ reb[e].owed # "none"
    /\ eshare' = [eshare EXCEPT ![e] = reb[e].owed = "good"]
    /\ reb' = [reb EXCEPT ![e].owed = "none"]
    /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, moves, eclaim>>

-----------------------------------------------------------------------------
(* Warm standbys (docs/protocol.md §10).  A standby starts as any engine    *)
(* (attach, wait, agree, fetch) and serves forward passes while it warms up *)
(* ("run"): until it parks, its attachment counts as any other.  It then    *)
(* parks, rank by rank: it runs no forward pass any more ("parked") and     *)
(* each daemon keeps its attachment as parked (dpark), which no begin       *)
(* counts.  A daemon whose attachments are all parked tells its parked     *)
(* standbys so (Notify).  Once every rank has that notice (the all-gather  *)
(* of the ranks), the ranks claim the primary role in rank order; a daemon *)
(* grants it only while no unparked engine is attached and it is clean.    *)
(* All granted: the engine adopts the records' map and serves as primary.  *)
(* A dirty daemon: it fails with the dirty reason.  A claim taken by       *)
(* another engine: it parks again where it was granted and waits for the   *)
(* next notice.  The first rank's daemon decides between two standbys: the *)
(* loser's first claim is taken, so it never holds any other daemon.       *)

(* The notice: with only parked attachments left on daemon r (att, park and *)
(* phase are its attachments, parked ones and phase after the step), every *)
(* parked standby there that waits for a notice gets one.  A repairing      *)
(* daemon tells nobody yet: its repair's end does (RepairDone, RepairFails), *)
(* so a standby waits out a repair of its dead primary's torn move instead  *)
(* of failing on it, with no polling.  A gone engine's memory is forgotten  *)
(* ("none"), so a dead process gets nothing.                               *)
Notify(c, r, att, park, phase) ==
    [f \in Engines |->
        IF f \in park /\ c[f][r] = "parked" /\ att \ park = {} /\ phase # "repairing"
          THEN [c[f] EXCEPT ![r] = "notified"]
          ELSE c[f]]

(* Rank r of standby e parks on daemon r: after its warmup (rank 1 stops    *)
(* the forward passes of every rank first: the scheduler pauses), or again *)
(* where it claimed but some claim was taken (parking an attachment that   *)
(* is parked already changes nothing on the daemon).  The reply is the     *)
(* notice when no unparked engine is attached.                              *)
Park(e, r) ==
    /\ e \in Standbys
    /\ ephase[e] \in {"run", "parked"}
    /\ eclaim[e][r] \in {"none", "release"}
    /\ \A q \in 1..(r - 1) : eclaim[e][q] \notin {"none", "release"}
    /\ dpark' = [dpark EXCEPT ![r] = @ \cup {e}]
    /\ ephase' = [ephase EXCEPT ![e] = "parked"]
    /\ eclaim' = Notify([eclaim EXCEPT ![e][r] = "parked"], r, datt[r], dpark'[r], dphase[r])
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, dcopy, truth, efind, eroute, ever, eserv,
                   eshare, reb, moves>>

(* The claim of the primary role on daemon r: the precedence of the daemon. *)
(* A repairing daemon answers busy, as a taken role: the standby parks      *)
(* again and the repair's end tells it (Notify).                            *)
ClaimReply(e, r) ==
    CASE Unparked(r) # {}         -> "taken"
      [] dphase[r] = "repairing"  -> "taken"
      [] dphase[r] # "clean"      -> "refused"
      [] OTHER                    -> "granted"

(* Every rank has its notice (the all-gather), the ranks before r were      *)
(* granted: rank r claims.  A grant unparks the attachment and carries the  *)
(* record (version and map), kept as the rank's finding.                    *)
Claim(e, r) ==
    /\ ephase[e] = "parked"
    /\ \A q \in Ranks : eclaim[e][q] \in {"notified", "granted"}
    /\ eclaim[e][r] = "notified"
    /\ \A q \in 1..(r - 1) : eclaim[e][q] = "granted"
    /\ eclaim' = [eclaim EXCEPT ![e][r] = ClaimReply(e, r)]
    /\ IF ClaimReply(e, r) = "granted"
         THEN /\ dpark' = [dpark EXCEPT ![r] = @ \ {e}]
              /\ efind' = [efind EXCEPT ![e][r] = Snapshot(r)]
         ELSE UNCHANGED <<efind, dpark>>
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, dcopy, truth, ephase, eroute, ever, eserv,
                   eshare, reb, moves>>

(* The claims gathered (the all-gather): every rank granted, with the same  *)
(* record on all (the startup's rule, StartupFails): serve as primary with *)
(* that map and version.  A dirty daemon, or records that differ: fail.    *)
(* A claim taken: every rank that claimed parks again (Park), the taken     *)
(* one included: its park reply is the notice if that daemon has no        *)
(* unparked engine by then, so a notice sent while the claim was answered  *)
(* is never lost.                                                           *)
Granted(e) == \A r \in Ranks : eclaim[e][r] = "granted"
ClaimsEnded(e) == Granted(e) \/ \E r \in Ranks : eclaim[e][r] \in {"taken", "refused"}
PromotionFails(e) ==
    (\E r \in Ranks : eclaim[e][r] = "refused") \/ (Granted(e) /\ StartupFails(e))

Promote(e) ==
    /\ ephase[e] = "parked"
    /\ ClaimsEnded(e)
    /\ IF PromotionFails(e)
         THEN /\ Forget(e, "failed")
              /\ UNCHANGED daemonVars
         ELSE IF Granted(e)
         THEN /\ ephase' = [ephase EXCEPT ![e] = "run"]
              /\ eroute' = [eroute EXCEPT ![e] = efind[e][1].fmap]
              /\ ever' = [ever EXCEPT ![e] = efind[e][1].fver]
              /\ eshare' = [eshare EXCEPT ![e] = TRUE]
              /\ UNCHANGED <<daemonVars, efind, eserv, reb, eclaim>>
         ELSE /\ eclaim' = [eclaim EXCEPT ![e] =
                              [r \in Ranks |-> IF eclaim[e][r] \in {"granted", "taken"}
                                                 THEN "release" ELSE eclaim[e][r]]]
              /\ UNCHANGED <<daemonVars, ephase, efind, eroute, ever, eserv, eshare, reb>>
    /\ UNCHANGED moves

-----------------------------------------------------------------------------
(* Failures and the daemons' side.                                          *)

(* The engine process dies at any point (SIGKILL included).               *)
Crash(e) ==
    /\ ~Gone(e)
    /\ Forget(e, "dead")
    /\ UNCHANGED <<daemonVars, moves>>

(* Daemon r notices the EOF of engine e's attach connection.  A move of     *)
(* that engine still pending makes the daemon dirty; with auto repair on    *)
(* the repair starts at once, in the same step of the daemon's watcher.     *)
(* When that leaves only parked standbys attached, the daemon notifies     *)
(* them (Notify).                                                           *)
Detach(r, e) ==
    /\ e \in datt[r]
    /\ Gone(e)
    /\ datt' = [datt EXCEPT ![r] = @ \ {e}]
    /\ dpark' = [dpark EXCEPT ![r] = @ \ {e}]
    /\ IF dphase[r] = "pending" /\ dpend[r].mover = e
         THEN dphase' = [dphase EXCEPT ![r] = IF Repairs THEN "repairing" ELSE "dirty"]
         ELSE UNCHANGED dphase
    /\ eclaim' = Notify(eclaim, r, datt'[r], dpark'[r], dphase'[r])
    /\ UNCHANGED <<dver, dmap, dpend, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare,
                   reb, moves>>

(* A daemon that starts again (Restart, Lose) reads its durable copy       *)
(* (Durable).  A whole copy of this checkpoint and configuration: it loads *)
(* its experts at the copy's map, and its record is the copy's.  No copy,  *)
(* or one it cannot use (torn, corrupt, of another checkpoint, another      *)
(* format): it loads at the initial layout, version 0, and sets the file    *)
(* aside (no copy now).  Either way its memory holds what its record says.  *)
CopiesAtStart(r) == IF Durable /\ dcopy[r] # NONE THEN {dcopy[r], NONE} ELSE {NONE}
StartVersion(c) == IF c = NONE THEN 0 ELSE c.cver
StartMap(c) == IF c = NONE THEN InitialMap ELSE c.cmap

(* Daemon r starts again with copy c, its memory reloaded from disk.        *)
StartFrom(r, c) ==
    /\ dver' = [dver EXCEPT ![r] = StartVersion(c)]
    /\ dmap' = [dmap EXCEPT ![r] = StartMap(c)]
    /\ truth' = [truth EXCEPT ![r] = StartMap(c)]
    /\ dcopy' = [dcopy EXCEPT ![r] = c]
    /\ dpend' = [dpend EXCEPT ![r] = NONE]
    /\ dnf' = [dnf EXCEPT ![r] = FALSE]

(* The operator restarts a dirty daemon once nothing uses it: the weights   *)
(* reload from disk, at its durable copy's map or the initial layout.       *)
Restart(r) ==
    /\ DaemonRestarts
    /\ dphase[r] = "dirty"
    /\ datt[r] = {}
    /\ \A e \in Engines : r \notin eserv[e]
    /\ \E c \in CopiesAtStart(r) : StartFrom(r, c)
    /\ dphase' = [dphase EXCEPT ![r] = "clean"]
    /\ UNCHANGED <<datt, engineVars, moves, dpark>>

(* Daemon r writes its record to its durable copy: an atomic replace of   *)
(* one file, after the commit was recorded in memory, by the daemon's own  *)
(* writer (a chunk never waits for a disk).  The record is the committed   *)
(* one while clean, and still while a move is pending (the move's base):   *)
(* the writer renames its file in place only while the record is the one   *)
(* it wrote, so the copy is that record.  Not fair: the daemon may die     *)
(* first, so a copy may be any number of versions behind its record.  A    *)
(* write cut short leaves the previous copy in force (the rename is        *)
(* atomic): no step.                                                        *)
Copy(r) == [cver |-> dver[r], cmap |-> dmap[r]]

Persist(r) ==
    /\ Durable
    /\ dphase[r] \in {"clean", "pending"}
    /\ dcopy[r] # Copy(r)
    /\ dcopy' = [dcopy EXCEPT ![r] = Copy(r)]
    /\ UNCHANGED <<dphase, dver, dmap, dpend, datt, dnf, truth, engineVars, moves, dpark>>

(* The repair of a torn move (docs/protocol.md §4): the daemon reloads from *)
(* the checkpoint only the layers of the interrupted move (dpend[r].layers), *)
(* slotted by the rows of the record, which still holds the base version's   *)
(* map (the move never committed).  It then is clean again at that version,  *)
(* with that map: dver and dmap are unchanged.                               *)
(* Going back to the base version is no ABA hazard: a version names a map,   *)
(* and after the repair the memory holds exactly that version's map (the     *)
(* other layers were never touched: the record was their truth throughout), *)
(* whose digest is the record's digest.  Every claim of that version (an     *)
(* engine's adopted version and digest) is true again, so a check that       *)
(* passes on it is right; the torn rows themselves never got a version.      *)
RepairedTruth(r) ==
    [l \in Layers |-> IF l \in dpend[r].layers THEN dmap[r][l] ELSE truth[r][l]]

(* The repair's end tells the parked standbys, when no unparked engine is  *)
(* attached (Notify): they claim, and adopt the repaired version.           *)
RepairDone(r) ==
    /\ CanRepair
    /\ dphase[r] = "repairing"
    /\ truth' = [truth EXCEPT ![r] = RepairedTruth(r)]
    /\ dphase' = [dphase EXCEPT ![r] = "clean"]
    /\ dpend' = [dpend EXCEPT ![r] = NONE]
    /\ eclaim' = Notify(eclaim, r, datt[r], dpark[r], "clean")
    /\ UNCHANGED <<dver, dmap, datt, dnf, dcopy, ephase, efind, eroute, ever, eserv, eshare, reb, moves, dpark>>

(* The repair fails (a read error, a missing file): the daemon is dirty,     *)
(* and keeps the torn move's information for the message.  The parked      *)
(* standbys are told: their claim meets the dirty daemon and they fail.     *)
RepairFails(r) ==
    /\ CanRepair
    /\ RepairMayFail
    /\ dphase[r] = "repairing"
    /\ dphase' = [dphase EXCEPT ![r] = "dirty"]
    /\ eclaim' = Notify(eclaim, r, datt[r], dpark[r], "dirty")
    /\ UNCHANGED <<dver, dmap, dpend, datt, dnf, dcopy, truth, ephase, efind, eroute, ever, eserv, eshare, reb,
                   moves, dpark>>

(* The operator's `expert-layout repair` on a dirty daemon.  The daemon    *)
(* takes it whether it was started with auto repair or not.               *)
RepairAgain(r) ==
    /\ OperatorRepairs
    /\ dphase[r] = "dirty"
    /\ dphase' = [dphase EXCEPT ![r] = "repairing"]
    /\ UNCHANGED <<dver, dmap, dpend, datt, dnf, dcopy, truth, engineVars, moves, dpark>>

-----------------------------------------------------------------------------
(* A daemon lost, and its rejoin (docs/protocol.md §4).                    *)

(* Daemon r's process dies (killed, OOM, its node rebooted) and starts      *)
(* again from disk (StartFrom: its durable copy's layout, or the initial    *)
(* one at version 0), with a fresh record, no attachment and no move.  The  *)
(* loss of every daemon of the set is each one's Lose, in some order: a    *)
(* daemon not yet started again is one whose Lose comes later.  Every engine attached to it or serving from  *)
(* its weights dies with it: on a GPU the weights it maps are that daemon's *)
(* memory, and a node that reboots takes its engine ranks along.  Other     *)
(* daemons notice those engines' EOFs later (Detach).                       *)
Lose(r) ==
    /\ Rejoins
    /\ LET lost == {e \in Engines : ~Gone(e) /\ (e \in datt[r] \/ r \in eserv[e])}
       IN /\ ephase' = [e \in Engines |-> IF e \in lost THEN "dead" ELSE ephase[e]]
          /\ efind' = [e \in Engines |-> IF e \in lost THEN [q \in Ranks |-> NoFinding] ELSE efind[e]]
          /\ eroute' = [e \in Engines |-> IF e \in lost THEN InitialMap ELSE eroute[e]]
          /\ ever' = [e \in Engines |-> IF e \in lost THEN 0 ELSE ever[e]]
          /\ eserv' = [e \in Engines |-> IF e \in lost THEN {} ELSE eserv[e]]
          /\ eshare' = [e \in Engines |-> IF e \in lost THEN FALSE ELSE eshare[e]]
          /\ reb' = [e \in Engines |-> IF e \in lost THEN IdleReb ELSE reb[e]]
          /\ eclaim' = [e \in Engines |-> IF e \in lost THEN NoClaims ELSE eclaim[e]]
    /\ dphase' = [dphase EXCEPT ![r] = IF @ = "no_record" THEN "no_record" ELSE "clean"]
    /\ \E c \in CopiesAtStart(r) : StartFrom(r, c)
    /\ datt' = [datt EXCEPT ![r] = {}]
    /\ dpark' = [dpark EXCEPT ![r] = {}]
    /\ UNCHANGED moves

(* The daemon's rule for a rejoin at version v: its clean record is older  *)
(* (it is never rewound), no engine but the asker is attached, and no      *)
(* engine fetched without attaching: nobody maps the weights it will       *)
(* rewrite.                                                                 *)
RejoinAllowed(e, r, v) ==
    /\ dphase[r] = "clean"
    /\ dver[r] < v
    /\ datt[r] \subseteq {e}
    /\ ~dnf[r]

(* Rank r of engine e asks its daemon, behind, to rejoin at the newest      *)
(* record, which its finding carries since the agreement                    *)
(* (the ranks in rank order).  Granted, the daemon takes that record and    *)
(* reloads every layer at its rows: the repair's reload, with the whole map *)
(* as the torn move (RepairDone ends it; RepairFails leaves the daemon      *)
(* dirty, as a failed repair does).  Until then it serves nothing, refuses  *)
(* every begin and claim, and the rank waits as for a repair.  Refused      *)
(* (another engine attached, or the daemon no longer behind): the engine's  *)
(* startup fails with the reason.                                           *)
AskRejoin(e, r) ==
    /\ ephase[e] = "start"
    /\ efind[e][r].found = "rejoin"
    /\ \A q \in 1..(r - 1) : efind[e][q].found # "rejoin"
    /\ LET t == efind[e][r] IN
       IF RejoinAllowed(e, r, t.fver)
         THEN /\ dphase' = [dphase EXCEPT ![r] = "repairing"]
              /\ dver' = [dver EXCEPT ![r] = t.fver]
              /\ dmap' = [dmap EXCEPT ![r] = t.fmap]
              /\ dpend' = [dpend EXCEPT ![r] = [mover |-> e, layers |-> Layers, base |-> t.fver]]
              /\ efind' = [efind EXCEPT ![e][r] = [t EXCEPT !.found = "wait"]]
         ELSE /\ efind' = [efind EXCEPT ![e][r] = [NoFinding EXCEPT !.found = "refused"]]
              /\ UNCHANGED <<dphase, dver, dmap, dpend>>
    /\ UNCHANGED <<datt, dnf, dcopy, truth, ephase, eroute, ever, eserv, eshare, reb, moves, dpark, eclaim>>

Next ==
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

Spec == Init /\ [][Next]_vars

(* An engine's own steps: what its processes do by themselves once started  *)
(* (BeginChunk, the decision to rebalance, is not one of them).             *)
EngineSteps(e) ==
    \/ \E r \in Ranks : \/ Attach(e, r) \/ Poll(e, r) \/ Timeout(e, r) \/ Fetch(e, r)
                       \/ Begin(e, r) \/ Abort(e, r) \/ Commit(e, r)
                       \/ Park(e, r) \/ Claim(e, r) \/ AskRejoin(e, r)
    \/ Agree(e) \/ Decide(e) \/ Committed(e) \/ Verify(e) \/ Promote(e)
    \/ \E r \in Ranks, l \in Layers : MoveLayer(e, r, l)

(* Fairness: exactly what the real system guarantees, no more.              *)
(*  - A daemon notices the EOF of a gone engine's attach connection: its    *)
(*    watcher thread blocks reading that connection, and the kernel closes  *)
(*    it when the process exits or is killed (SIGKILL included): weak       *)
(*    fairness on each Detach(r, e).                                        *)
(*  - An engine process keeps running its own code unless it crashes: its   *)
(*    startup (attach, a wait that ends by a poll or by the timeout, the    *)
(*    agreement, the fetches) and a rebalance it has begun (the begin       *)
(*    replies, the decision, the aborts, the layer moves, the commits, the  *)
(*    verification) run to their end: weak fairness on EngineSteps(e).  The *)
(*    ranks of an engine step in rank order in this spec, so one condition  *)
(*    per engine is the guarantee of all its rank processes.  A standby's   *)
(*    own steps are its engine steps too: it parks after its warmup, each   *)
(*    rank's reader blocks on its attach connection, so a notice is read    *)
(*    as soon as it is sent, and the claims and their all-gather run to     *)
(*    their end (Park, Claim, Promote).  The notice itself is sent by the   *)
(*    daemon in the step that leaves only parked attachments (Detach,       *)
(*    Park): no polling, and no fairness of its own.                        *)
(*  - A repair that has started runs to its end on the daemon's own        *)
(*    thread (reading the checkpoint's files of a few layers): weak         *)
(*    fairness on each RepairDone(r).  Where a repair may fail it ends      *)
(*    clean or dirty: RepairDone stays enabled as long as the daemon        *)
(*    repairs, so a fair behaviour cannot stay repairing.                   *)
(*  - Nothing else is fair: an engine may never start a rebalance (EPLB     *)
(*    decides; BeginChunk), may crash at any time or never (Crash), a       *)
(*    daemon may be lost at any time or never (Lose), and an                *)
(*    operator may never restart a dirty daemon (Restart) nor ask for a     *)
(*    repair again (RepairAgain): a person acts, or does not.  RepairFails *)
(*    is not fair either: nothing in the system makes a read error happen,  *)
(*    and RepairDone's fairness alone already ends every repair.            *)
(*  - The spec has no clock: a waiting rank's Timeout stays enabled after   *)
(*    the move it waits for has ended (in the code the timeout and the poll *)
(*    race at the 300 s mark).  The properties about waiting therefore      *)
(*    start where the waits have ended (FindingsAgreedServes), and WaitEnds *)
(*    says only that a wait ends.                                           *)
Fairness ==
    /\ \A r \in Ranks, e \in Engines : WF_vars(Detach(r, e))
    /\ \A e \in Engines : WF_vars(EngineSteps(e))
    /\ \A r \in Ranks : WF_vars(RepairDone(r))

FairSpec == Spec /\ Fairness

-----------------------------------------------------------------------------
(* Properties (docs/protocol.md §7).                                       *)

Moving(e) == reb[e].step \in {"move", "commit"}

(* Daemon r holds a move pending that it did not record (its commit was    *)
(* refused or never reached it), while its live mover routes with the      *)
(* version past it: the move stays pending until the mover is gone.        *)
Unrecorded(r) ==
    /\ dphase[r] = "pending"
    /\ ~Gone(dpend[r].mover)
    /\ ever[dpend[r].mover] = dpend[r].base + 1

(* Daemon r holds a move pending whose begin its live mover did not count  *)
(* (the reply was lost): the mover has stopped rebalancing at the version   *)
(* the move started from, so the move stays pending until the mover is gone.*)
UncountedBegin(r) ==
    /\ dphase[r] = "pending"
    /\ ~Gone(dpend[r].mover)
    /\ ever[dpend[r].mover] = dpend[r].base
    /\ reb[dpend[r].mover].step = "idle"
    /\ ~eshare[dpend[r].mover]

(* A move its live mover will not end: it stays pending until the mover is *)
(* gone.                                                                    *)
KeptPending(r) == Unrecorded(r) \/ UncountedBegin(r)

TypeOK ==
    /\ dphase \in [Ranks -> {"no_record", "clean", "pending", "dirty", "repairing"}]
    /\ dver \in [Ranks -> 0..MaxMoves]
    /\ dmap \in [Ranks -> [Layers -> {0, 1}]]
    /\ dpend \in [Ranks -> PendingMoves \cup {NONE}]
    /\ datt \in [Ranks -> SUBSET Newer]
    /\ dnf \in [Ranks -> BOOLEAN]
    /\ truth \in [Ranks -> [Layers -> {0, 1}]]
    /\ ephase \in [Engines -> {"start", "load", "run", "parked", "failed", "dead"}]
    /\ efind \in [Engines -> [Ranks -> Findings]]
    /\ eroute \in [Engines -> [Layers -> {0, 1}]]
    /\ ever \in [Engines -> 0..MaxMoves]
    /\ eserv \in [Engines -> SUBSET Ranks]
    /\ eshare \in [Engines -> BOOLEAN]
    /\ reb \in [Engines -> Rebalances]
    /\ moves \in 0..MaxMoves
    /\ dpark \in [Ranks -> SUBSET Standbys]
    /\ \A r \in Ranks : dpark[r] \subseteq datt[r]
    /\ eclaim \in [Engines -> [Ranks -> ClaimStates]]
    /\ dcopy \in [Ranks -> [cver : 0..MaxMoves, cmap : [Layers -> {0, 1}]] \cup {NONE}]

(* Every engine that serves from a daemon's weights, and is not itself      *)
(* mid-move, routes with exactly that daemon's real layout.  A parked       *)
(* standby runs no forward pass: its layout may be stale until it promotes. *)
SafeRouting ==
    \A e \in Engines, r \in Ranks :
        (r \in eserv[e] /\ ~Moving(e) /\ ephase[e] # "parked") => eroute[e] = truth[r]

(* A clean record equals the real layout.                                   *)
CleanRecordIsTruth ==
    \A r \in Ranks : dphase[r] = "clean" => dmap[r] = truth[r]

(* At most one move pending per daemon (one dpend), and nobody else maps    *)
(* those weights while it is pending but a parked standby (which runs no    *)
(* forward pass).  That its engine was alone when it began is the action    *)
(* property BeginsAlone below.                                              *)
OneMover ==
    \A r \in Ranks : dphase[r] = "pending" =>
        /\ dpend[r] # NONE
        /\ \A e \in Engines \ {dpend[r].mover} : r \in eserv[e] => e \in dpark[r]

(* An engine serving from several daemons adopted the same version (and     *)
(* map) from all of them.                                                   *)
(* (A parked standby's findings mix its startup's and its grants'.)         *)
AgreedVersions ==
    \A e \in Newer : eserv[e] # {} /\ ephase[e] # "parked" =>
        \A r, q \in Ranks :
            (efind[e][r].found = "record" /\ efind[e][q].found = "record") =>
                /\ efind[e][r].fver = efind[e][q].fver
                /\ efind[e][r].fmap = efind[e][q].fmap

(* A pending move belongs to its mover, mid-rebalance on that chunk with   *)
(* this daemon's begin answered ok, or to a gone mover (whose EOF makes the *)
(* daemon dirty), or to a mover whose commit this daemon did not record:   *)
(* that mover routes with the next version already, its check fails and   *)
(* its rebalancing is off, so the move stays pending until the mover is    *)
(* gone.  Or the begin's reply was lost: the mover counts it as refused and *)
(* stops rebalancing at the move's base version.  A live engine that        *)
(* rebalances on never leaves a move pending.                               *)
PendingHasMover ==
    \A r \in Ranks : dphase[r] = "pending" =>
        LET m == dpend[r].mover IN
        \/ Gone(m)
        \/ /\ reb[m].step \in {"begin", "abort", "move", "commit"}
           /\ reb[m].chunk = dpend[r].layers
           /\ reb[m].replies[r] = "ok"
        \/ /\ reb[m].step = "commit"
           /\ reb[m].chunk = dpend[r].layers
           /\ reb[m].replies[r] = "commit_refused"
        \/ /\ ever[m] = dpend[r].base + 1
           /\ reb[m].owed = "bad" \/ ~eshare[m]
        \/ /\ reb[m].step \in {"begin", "abort"}
           /\ reb[m].chunk = dpend[r].layers
           /\ reb[m].replies[r] = "refused"
        \/ /\ ever[m] = dpend[r].base
           /\ reb[m].step = "idle"
           /\ ~eshare[m]

(* An engine that loads (or runs) found every daemon readable: no dirty    *)
(* daemon, no wait that timed out, no wait still going on.                  *)
LoadsOnCleanFindings ==
    \A e \in Newer : ephase[e] \in {"load", "run"} =>
        \A r \in Ranks : efind[e][r].found \in {"record", "no_record"}

(* An engine rebalances shared weights only from the records it adopted.   *)
SharesOnlyAdopted ==
    \A e \in Newer : eshare[e] => \A r \in Ranks : efind[e][r].found = "record"

(* No engine is primary on some ranks and a standby on others: the daemons' *)
(* parked attachments agree with each live standby's role ("release" is     *)
(* either: granted or taken, parking again), an engine that is not parked   *)
(* is parked on no daemon, and one                                          *)
(* that serves forward passes is either warming up (parked nowhere yet) or  *)
(* promoted on every rank.                                                  *)
OneRole ==
    \A e \in Engines : ~Gone(e) =>
        /\ \A r \in Ranks : eclaim[e][r] \in {"parked", "notified", "taken", "refused"} => e \in dpark[r]
        /\ \A r \in Ranks : eclaim[e][r] \in {"none", "granted"} => e \notin dpark[r]
        /\ ephase[e] # "parked" => \A r \in Ranks : eclaim[e][r] \in {"none", "granted"}
        /\ ephase[e] = "run" => \/ \A r \in Ranks : eclaim[e][r] = "none"
                               \/ Granted(e)

(* No two primaries per daemon: at most one live standby holds the primary  *)
(* role on a daemon.  That a grant comes only while no other unparked       *)
(* engine is attached is the action property ClaimsAlone.                   *)
OnePromoted ==
    \A r \in Ranks : \A e, f \in Standbys :
        (e # f /\ ~Gone(e) /\ ~Gone(f)) => ~(eclaim[e][r] = "granted" /\ eclaim[f][r] = "granted")

(* The commit check covers every chunk: a primary that still rebalances    *)
(* shared weights, between chunks and with no failed check owed, claims     *)
(* exactly what every daemon recorded (its version, its map: the digest).   *)
(* The next begin carries that claim; a daemon it does not match refuses.  *)
RebalancesOnTheRecords ==
    \A e \in Newer :
        (/\ ephase[e] = "run" /\ eshare[e] /\ Primary(e)
         /\ reb[e].step = "idle" /\ reb[e].owed # "bad")
            => \A r \in Ranks : dver[r] = ever[e] /\ dmap[r] = eroute[e]

(* A repairing daemon (a torn move's repair, or a rejoin) serves nothing:   *)
(* no engine maps its weights but a parked standby, which runs no forward   *)
(* pass; it refuses every begin and fetch (BeginReply, FetchServes).        *)
RepairingServesNothing ==
    \A r \in Ranks : dphase[r] = "repairing" =>
        \A e \in Engines : r \in eserv[e] => e \in dpark[r]

(* A version names one layout: daemons whose records are at the same       *)
(* version hold the same map.  Versions only grow, by one commit at a time *)
(* of the one mover, and a daemon started again from disk is at version 0, *)
(* the initial layout; so the newest record is the one a daemon behind     *)
(* catches up with (RejoinWanted).                                          *)
OneMapPerVersion ==
    \A r, q \in Ranks :
        (dphase[r] # "no_record" /\ dphase[q] # "no_record" /\ dver[r] = dver[q]) => dmap[r] = dmap[q]

(* A durable copy never names a layout its daemon's weights would not be   *)
(* loaded at: it is a version its daemon recorded, never ahead of the       *)
(* record (a daemon that starts again from it loads exactly that map), and *)
(* a version names one map in every copy and every record.  So a daemon     *)
(* started from its copy is behind the others or equal to them, never      *)
(* beside them with another map at the same version.                       *)
CopiesRecorded ==
    \A r \in Ranks : dcopy[r] # NONE =>
        /\ dphase[r] # "no_record"
        /\ dcopy[r].cver <= dver[r]
        /\ \A q \in Ranks :
              /\ (dphase[q] # "no_record" /\ dver[q] = dcopy[r].cver) => dmap[q] = dcopy[r].cmap
              /\ (dcopy[q] # NONE /\ dcopy[q].cver = dcopy[r].cver) => dcopy[q].cmap = dcopy[r].cmap

Invariants == TypeOK /\ SafeRouting /\ CleanRecordIsTruth /\ OneMover /\ AgreedVersions
              /\ PendingHasMover /\ LoadsOnCleanFindings /\ SharesOnlyAdopted
              /\ OneRole /\ OnePromoted /\ RebalancesOnTheRecords /\ RepairingServesNothing
              /\ OneMapPerVersion /\ CopiesRecorded

(* Dirty is sticky until the daemon restarts (or is lost: it starts again   *)
(* from disk) or the operator asks for a repair again.                      *)
DirtySticky ==
    [][\A r \in Ranks : dphase[r] = "dirty" =>
         (dphase'[r] = "dirty" \/ Restart(r) \/ RepairAgain(r) \/ Lose(r))]_vars

(* Versions never decrease, except by a restart or a loss (and a gone       *)
(* engine's memory, which is lost).                                         *)
VersionMonotonic ==
    [][/\ \A r \in Ranks : dver'[r] >= dver[r] \/ Restart(r) \/ Lose(r)
       /\ \A e \in Engines : ephase'[e] \notin {"failed", "dead"} => ever'[e] >= ever[e]]_vars

(* A move begins only while its engine is alone on the daemon: no other     *)
(* engine attached, none serving from it (docs/protocol.md §4, begin      *)
(* rule 3).                                                                *)
(* Parked standbys do not count (they run no forward pass).                 *)
BeginsAlone ==
    [][\A r \in Ranks :
         (dphase[r] # "pending" /\ dphase'[r] = "pending") =>
             /\ Unparked(r) = {dpend'[r].mover}
             /\ \A e \in Engines : r \in eserv[e] => e = dpend'[r].mover \/ e \in dpark[r]]_vars

(* A claim is granted only while no unparked engine is attached to that     *)
(* daemon and the daemon is clean.                                          *)
ClaimsAlone ==
    [][\A r \in Ranks, e \in Engines :
         (eclaim[e][r] # "granted" /\ eclaim'[e][r] = "granted") =>
             /\ Unparked(r) = {}
             /\ dphase[r] = "clean"]_vars

(* A standby waits out a repair: a claim is refused (the standby then      *)
(* fails) only by a dirty daemon, never by one that repairs, and no daemon  *)
(* tells a standby that the primary role is free while it repairs.          *)
ClaimWaitsOutRepair ==
    [][\A r \in Ranks, e \in Engines :
         /\ (eclaim[e][r] # "refused" /\ eclaim'[e][r] = "refused") => dphase[r] = "dirty"
         /\ (eclaim[e][r] = "parked" /\ eclaim'[e][r] = "notified") => dphase'[r] # "repairing"]_vars

(* What a notice means: the daemon tells a parked standby that the primary *)
(* role is free only when no unparked engine is attached to it and it does *)
(* not repair, after the step that sends it.  A spurious notice would be    *)
(* safe (the claim checks again) but costs every rank of every parked       *)
(* standby a claim round and an all-gather.                                 *)
NoticeOnlyWhenFree ==
    [][\A r \in Ranks, e \in Engines :
         (eclaim[e][r] # "notified" /\ eclaim'[e][r] = "notified") =>
             /\ datt'[r] \ dpark'[r] = {}
             /\ dphase'[r] # "repairing"]_vars

(* A rejoin (a clean daemon that starts to repair: AskRejoin) starts only    *)
(* on a daemon whose record is older than the one it rejoins at (never     *)
(* rewound), that no engine maps and no engine but the asker is attached    *)
(* to, and only at a record that some other daemon holds, the newest: every *)
(* other daemon keeps a record, and holds that one or an older one (a node *)
(* lost with several daemons).                                              *)
RejoinsOnlyBehind ==
    [][\A r \in Ranks :
         (dphase[r] = "clean" /\ dphase'[r] = "repairing") =>
             /\ dver[r] < dver'[r]
             /\ Cardinality(datt[r]) <= 1
             /\ ~dnf[r]
             /\ \A e \in Engines : r \notin eserv[e]
             /\ \E q \in Ranks \ {r} : dver[q] = dver'[r] /\ dmap[q] = dmap'[r]
             /\ \A q \in Ranks \ {r} : /\ dphase[q] # "no_record"
                                      /\ \/ dver[q] = dver'[r] /\ dmap[q] = dmap'[r]
                                         \/ dver[q] < dver'[r]]_vars

(* A failed check stops rebalancing: the all-gather that makes it (the next *)
(* chunk's Decide, or Verify) leaves the engine with rebalancing off, and   *)
(* the next chunk, begun before the check was made, aborts on every rank    *)
(* that began it.                                                           *)
FailedCheckStops ==
    [][\A e \in Engines :
         (reb[e].owed = "bad" /\ reb'[e].owed = "none" /\ ephase'[e] = "run") =>
             /\ ~eshare'[e]
             /\ reb'[e].step \in {"idle", "abort"}]_vars

(* A check fails only where a commit was refused or its reply lost: every *)
(* daemon that took the engine's commit records the version and map the   *)
(* engine claims.                                                           *)
CheckFailsOnlyOnFault ==
    [][\A e \in Engines :
         (reb[e].owed # "bad" /\ reb'[e].owed = "bad") =>
             \E r \in Ranks : reb[e].replies[r] = "commit_refused"]_vars

(* A claim is answered only after a notice: a parked standby claims the    *)
(* primary role only on the daemons that told it the role is free, so it   *)
(* never loops claim, taken, park while the primary lives.                  *)
ClaimsFollowNotices ==
    [][\A e \in Engines, r \in Ranks :
         (eclaim[e][r] # eclaim'[e][r] /\ eclaim'[e][r] \in {"granted", "taken", "refused"}) =>
             eclaim[e][r] = "notified"]_vars

(* A begin is busy only for a pending move or another unparked engine.     *)
BusyOnlyByUnparked ==
    [][\A e \in Engines, r \in Ranks :
         (reb[e].replies[r] = "none" /\ reb'[e].replies[r] = "busy") =>
             dphase[r] = "pending" \/ Unparked(r) \ {e} # {}]_vars

(* Liveness: a move whose engine died ends with the daemon dirty (with      *)
(* auto repair on: repairing, the dirty daemon's first step).               *)
DeadMoverEndsDirty ==
    \A r \in Ranks :
        (dphase[r] = "pending" /\ Gone(dpend[r].mover)) ~> (dphase[r] \in {"dirty", "repairing"})

(* Liveness: a repair ends, clean (repaired) or dirty (it failed).          *)
RepairEnds ==
    \A r \in Ranks : (dphase[r] = "repairing") ~> (dphase[r] \in {"clean", "dirty"})

(* Liveness, the purpose of the repair: with auto repair on and repairs     *)
(* that do not fail, a move whose mover is gone ends clean at its base      *)
(* version: no operator, no restart.  Holds only where Repairs /\           *)
(* ~RepairMayFail (MCRepair.cfg).                                           *)
TornMoveRepaired ==
    \A r \in Ranks, v \in 0..MaxMoves :
        (dphase[r] = "pending" /\ Gone(dpend[r].mover) /\ dpend[r].base = v)
            ~> (dphase[r] = "clean" /\ dver[r] = v)

(* Liveness: a chunk that moves is committed: the engine routes with the  *)
(* next version (whatever the daemons answered: sglang moved its experts), *)
(* unless it is gone first.                                                 *)
ChunkCommits ==
    \A e \in Engines, v \in 0..MaxMoves :
        (reb[e].step = "move" /\ ever[e] = v) ~> (ever[e] = v + 1 \/ Gone(e))

(* Liveness: the commit check a chunk owes is made, by the next chunk's    *)
(* all-gather or by the one that ends the rebalance (or the engine is gone, *)
(* its memory with it): no chunk's commit goes unchecked.                   *)
CheckEnds ==
    \A e \in Engines : (reb[e].owed # "none") ~> (reb[e].owed = "none")

(* Liveness: a waiting engine ends started or failed.                       *)
WaitEnds ==
    \A e \in Engines :
        (ephase[e] = "start" /\ \E r \in Ranks : efind[e][r].found = "wait")
            ~> (ephase[e] # "start")

-----------------------------------------------------------------------------
(* Purpose (docs/protocol.md §7): safety alone is met by a protocol that  *)
(* refuses every startup.  These say that the protocol does its job,      *)
(* under the fairness above.                                              *)
(* A crash is always allowed, so an engine's property ends *)
(* "or dead" (crashed), never "or failed": a failed startup or fetch is    *)
(* what they rule out.                                                      *)

(* An engine that starts while every daemon is clean and holds the same    *)
(* record, and no other plugin engine lives, ends up running with the       *)
(* daemons' layout (the initial one, or the moved one: a restart after a    *)
(* move adopts it).  Nobody else can change the daemons meanwhile, so the   *)
(* layout it runs with is the daemons' then.                                *)
StartsAlone ==
    \A e \in Newer :
        (/\ ephase[e] = "start"
         /\ \A r \in Ranks : efind[e][r].found = "nothing"
         /\ \A r \in Ranks : /\ dphase[r] = "clean"
                             /\ dver[r] = dver[1]
                             /\ dmap[r] = dmap[1]
         /\ \A o \in Newer \ {e} : Gone(o))
        ~> ((ephase[e] = "run" /\ eroute[e] = dmap[1]) \/ ephase[e] = "dead")

(* The rejoin's purpose, stated over the daemons, not over the engine's    *)
(* own rule: an engine that starts alone while every daemon is clean, its  *)
(* ranks' findings being the daemons' records, ends up serving the newest  *)
(* record's layout, which every daemon then holds: daemons behind (lost,   *)
(* or repaired at an older version) rejoin, and nothing reloads but them.   *)
(* No permanent disagreement: the records never differ in a way a startup  *)
(* cannot settle.  The spec has no clock: the wait for the rejoin may time  *)
(* out, as any wait (WaitEnds).                                             *)
RejoinServes ==
    \A e \in Newer :
        (/\ Rejoins
         /\ ephase[e] = "start"
         /\ \A r \in Ranks : dphase[r] = "clean" /\ efind[e][r] = Snapshot(r)
         /\ \A r \in Ranks : datt[r] \subseteq {e} /\ ~dnf[r]
         /\ \A o \in Newer \ {e} : Gone(o))
        ~> (\/ /\ ephase[e] = "run"
               /\ \A r \in Ranks : eroute[e] = dmap[r] /\ ever[e] = dver[r] /\ dphase[r] = "clean"
            \/ ephase[e] = "dead"
            \/ \E r \in Ranks : efind[e][r].found = "timeout")

(* The durable copy's purpose: once the daemons have started again (every  *)
(* one clean, no engine left), the next engine that starts alone ends up   *)
(* serving at a version no older than any durable copy: the layout EPLB    *)
(* learned outlives the loss of every daemon.  A daemon whose copy was      *)
(* behind, or unusable, rejoins at the newest record; none is rewound.     *)
FullRestartServesNewestCopy ==
    \A e \in Newer :
        (/\ Durable
         /\ ephase[e] = "start"
         /\ \A r \in Ranks : dphase[r] = "clean" /\ efind[e][r] = Snapshot(r)
         /\ \A r \in Ranks : datt[r] \subseteq {e} /\ ~dnf[r]
         /\ \A o \in Newer \ {e} : Gone(o))
        ~> (\/ /\ ephase[e] = "run"
               /\ \A r \in Ranks : dcopy[r] # NONE => dcopy[r].cver <= ever[e]
            \/ ephase[e] = "dead"
            \/ \E r \in Ranks : efind[e][r].found = "timeout")

(* An engine whose ranks all found the same record (at attach, or by the   *)
(* poll that saw the move it waited for end) ends up serving that layout:  *)
(* being attached, it keeps every other engine from moving experts.        *)
FindingsAgreedServes ==
    \A e \in Newer :
        (/\ ephase[e] = "start"
         /\ \A r \in Ranks : /\ efind[e][r].found = "record"
                             /\ efind[e][r].fver = efind[e][1].fver
                             /\ efind[e][r].fmap = efind[e][1].fmap)
        ~> ((ephase[e] = "run" /\ eroute[e] = efind[e][1].fmap) \/ ephase[e] = "dead")

(* A pending move ends: committed or aborted (the daemon is free again),   *)
(* or dirty once its gone mover's EOF is noticed, or it is kept pending by  *)
(* a live mover that will not end it (KeptPending: a commit this daemon did *)
(* not record, or a begin whose reply was lost).                            *)
PendingEnds ==
    \A r \in Ranks : (dphase[r] = "pending") ~> (dphase[r] \in {"clean", "dirty"} \/ KeptPending(r))

(* A live mover's move frees the daemon: it ends clean (committed or       *)
(* aborted), unless its mover goes away first or the mover will not end it *)
(* (KeptPending: PendingHasMover keeps the move pending until the mover is  *)
(* gone, DeadMoverEndsDirty).                                               *)
LiveMoveFreesDaemon ==
    \A r \in Ranks :
        (dphase[r] = "pending" /\ ~Gone(dpend[r].mover))
            ~> (\/ dphase[r] = "clean"
                \/ dphase[r] = "pending" /\ Gone(dpend[r].mover)
                \/ KeptPending(r))

(* Liveness, the standby's purpose: once every engine but the standbys is  *)
(* gone and every daemon is clean, with a standby parked, some standby ends *)
(* up primary serving the records' layout, unless every standby is gone:   *)
(* crashed, or (the spec has no clock) a standby still starting whose wait *)
(* timed out.                                                               *)
StandbyTakesOver ==
    (/\ \E s \in Standbys : ephase[s] = "parked"
     /\ \A o \in Engines \ Standbys : Gone(o)
     /\ \A r \in Ranks : dphase[r] = "clean")
    ~> (\/ \E s \in Standbys : /\ ephase[s] = "run" /\ Granted(s)
                               /\ \A r \in Ranks : eroute[s] = dmap[r] /\ ever[s] = dver[r]
        \/ \A s \in Standbys : Gone(s))

(* Liveness: a standby never stays primary on some ranks and parked on     *)
(* others: a claim granted on some daemons ends, promoted or parked again   *)
(* on every one (or the standby is gone).                                   *)
PartialGrantEnds ==
    \A e \in Standbys :
        (ephase[e] = "parked" /\ \E r \in Ranks : eclaim[e][r] = "granted")
            ~> (ephase[e] # "parked" \/ \A r \in Ranks : eclaim[e][r] # "granted")

(* Rank r's begin counted as refused by a fault of the socket: its request *)
(* never reached the daemon, which would still take it, or the daemon took *)
(* it (this engine's move of this chunk is pending) and its reply was lost. *)
LostBegin(e, r) ==
    /\ reb[e].step = "begin"
    /\ reb[e].replies[r] = "refused"
    /\ \/ BeginReply(e, r) = "ok"
       \/ dphase[r] = "pending" /\ dpend[r].mover = e /\ dpend[r].layers = reb[e].chunk

(* Liveness: a primary's begin, with only parked standbys attached besides  *)
(* it (every other engine parked everywhere, or gone with its attachments   *)
(* parked), the claims it makes true and no failed check owed, is not busy: *)
(* its move starts, unless a begin is lost on the way (LostBegin).          *)
ParkedStandbysDoNotBlock ==
    \A e \in Engines \ Standbys :
        (/\ reb[e].step = "begin"
         /\ reb[e].owed # "bad"
         /\ \A r \in Ranks : /\ reb[e].replies[r] = "none"
                             /\ Unparked(r) = {e}
                             /\ dphase[r] = "clean"
                             /\ dver[r] = ever[e]
                             /\ ~dnf[r]
         /\ \A o \in Engines \ {e} : ephase[o] \in {"parked", "failed", "dead"})
        ~> (reb[e].step = "move" \/ Gone(e) \/ \E r \in Ranks : LostBegin(e, r))

=============================================================================
