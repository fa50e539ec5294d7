---- MODULE MCSmall_TTrace_1796640095 ----
EXTENDS MCSmall_TEConstants, Sequences, TLCExt, Toolbox, MCSmall, Naturals, TLC

_expression ==
    LET MCSmall_TEExpression == INSTANCE MCSmall_TEExpression
    IN MCSmall_TEExpression!expression
----

_trace ==
    LET MCSmall_TETrace == INSTANCE MCSmall_TETrace
    IN MCSmall_TETrace!trace
----

_prop ==
    ~<>[](
        efind = ((e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>))
        /\
        ephase = ((e1 :> "run" @@ e2 :> "dead"))
        /\
        eshare = ((e1 :> FALSE @@ e2 :> FALSE))
        /\
        dphase = (<<"pending", "pending">>)
        /\
        eclaim = ((e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>))
        /\
        reb = ((e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]))
        /\
        eroute = ((e1 :> <<1, 1>> @@ e2 :> <<0, 0>>))
        /\
        dver = (<<0, 0>>)
        /\
        ever = ((e1 :> 1 @@ e2 :> 0))
        /\
        truth = (<<<<1, 1>>, <<1, 1>>>>)
        /\
        datt = (<<{e1}, {e1}>>)
        /\
        moves = (1)
        /\
        dmap = (<<<<0, 0>>, <<0, 0>>>>)
        /\
        dpend = (<<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>)
        /\
        dpark = (<<{}, {}>>)
        /\
        dnf = (<<FALSE, FALSE>>)
        /\
        eserv = ((e1 :> {1, 2} @@ e2 :> {}))
    )
----

_init ==
    /\ efind = _TETrace[1].efind
    /\ dnf = _TETrace[1].dnf
    /\ truth = _TETrace[1].truth
    /\ moves = _TETrace[1].moves
    /\ dphase = _TETrace[1].dphase
    /\ eroute = _TETrace[1].eroute
    /\ datt = _TETrace[1].datt
    /\ reb = _TETrace[1].reb
    /\ dpend = _TETrace[1].dpend
    /\ eserv = _TETrace[1].eserv
    /\ eclaim = _TETrace[1].eclaim
    /\ ever = _TETrace[1].ever
    /\ eshare = _TETrace[1].eshare
    /\ dpark = _TETrace[1].dpark
    /\ dver = _TETrace[1].dver
    /\ dmap = _TETrace[1].dmap
    /\ ephase = _TETrace[1].ephase
----

_next ==
    /\ \E i,j \in DOMAIN _TETrace:
        /\ \/ /\ j = i + 1
              /\ i = TLCGet("level")
        /\ efind  = _TETrace[i].efind
        /\ efind' = _TETrace[j].efind
        /\ dnf  = _TETrace[i].dnf
        /\ dnf' = _TETrace[j].dnf
        /\ truth  = _TETrace[i].truth
        /\ truth' = _TETrace[j].truth
        /\ moves  = _TETrace[i].moves
        /\ moves' = _TETrace[j].moves
        /\ dphase  = _TETrace[i].dphase
        /\ dphase' = _TETrace[j].dphase
        /\ eroute  = _TETrace[i].eroute
        /\ eroute' = _TETrace[j].eroute
        /\ datt  = _TETrace[i].datt
        /\ datt' = _TETrace[j].datt
        /\ reb  = _TETrace[i].reb
        /\ reb' = _TETrace[j].reb
        /\ dpend  = _TETrace[i].dpend
        /\ dpend' = _TETrace[j].dpend
        /\ eserv  = _TETrace[i].eserv
        /\ eserv' = _TETrace[j].eserv
        /\ eclaim  = _TETrace[i].eclaim
        /\ eclaim' = _TETrace[j].eclaim
        /\ ever  = _TETrace[i].ever
        /\ ever' = _TETrace[j].ever
        /\ eshare  = _TETrace[i].eshare
        /\ eshare' = _TETrace[j].eshare
        /\ dpark  = _TETrace[i].dpark
        /\ dpark' = _TETrace[j].dpark
        /\ dver  = _TETrace[i].dver
        /\ dver' = _TETrace[j].dver
        /\ dmap  = _TETrace[i].dmap
        /\ dmap' = _TETrace[j].dmap
        /\ ephase  = _TETrace[i].ephase
        /\ ephase' = _TETrace[j].ephase

\* Uncomment the ASSUME below to write the states of the error trace
\* to the given file in Json format. Note that you can pass any tuple
\* to `JsonSerialize`. For example, a sub-sequence of _TETrace.
    \* ASSUME
    \*     LET J == INSTANCE Json
    \*         IN J!JsonSerialize("MCSmall_TTrace_1796640095.json", _TETrace)

=============================================================================

 Note that you can extract this module `MCSmall_TEExpression`
  to a dedicated file to reuse `expression` (the module in the 
  dedicated `MCSmall_TEExpression.tla` file takes precedence 
  over the module `MCSmall_TEExpression` below).

---- MODULE MCSmall_TEExpression ----
EXTENDS MCSmall_TEConstants, Sequences, TLCExt, Toolbox, MCSmall, Naturals, TLC

expression == 
    [
        \* To hide variables of the `MCSmall` spec from the error trace,
        \* remove the variables below.  The trace will be written in the order
        \* of the fields of this record.
        efind |-> efind
        ,dnf |-> dnf
        ,truth |-> truth
        ,moves |-> moves
        ,dphase |-> dphase
        ,eroute |-> eroute
        ,datt |-> datt
        ,reb |-> reb
        ,dpend |-> dpend
        ,eserv |-> eserv
        ,eclaim |-> eclaim
        ,ever |-> ever
        ,eshare |-> eshare
        ,dpark |-> dpark
        ,dver |-> dver
        ,dmap |-> dmap
        ,ephase |-> ephase
        
        \* Put additional constant-, state-, and action-level expressions here:
        \* ,_stateNumber |-> _TEPosition
        \* ,_efindUnchanged |-> efind = efind'
        
        \* Format the `efind` variable as Json value.
        \* ,_efindJson |->
        \*     LET J == INSTANCE Json
        \*     IN J!ToJson(efind)
        
        \* Lastly, you may build expressions over arbitrary sets of states by
        \* leveraging the _TETrace operator.  For example, this is how to
        \* count the number of times a spec variable changed up to the current
        \* state in the trace.
        \* ,_efindModCount |->
        \*     LET F[s \in DOMAIN _TETrace] ==
        \*         IF s = 1 THEN 0
        \*         ELSE IF _TETrace[s].efind # _TETrace[s-1].efind
        \*             THEN 1 + F[s-1] ELSE F[s-1]
        \*     IN F[_TEPosition - 1]
    ]

=============================================================================



Parsing and semantic processing can take forever if the trace below is long.
 In this case, it is advised to uncomment the module below to deserialize the
 trace from a generated binary file.

\*
\*---- MODULE MCSmall_TETrace ----
\*EXTENDS MCSmall_TEConstants, IOUtils, MCSmall, TLC
\*
\*trace == IODeserialize("MCSmall_TTrace_1796640095.bin", TRUE)
\*
\*=============================================================================
\*

---- MODULE MCSmall_TETrace ----
EXTENDS MCSmall_TEConstants, MCSmall, TLC

trace == 
    <<
    ([efind |-> (e1 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "start" @@ e2 :> "start"),eshare |-> (e1 :> FALSE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{}, {}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "start" @@ e2 :> "start"),eshare |-> (e1 :> FALSE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "start" @@ e2 :> "start"),eshare |-> (e1 :> FALSE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "load" @@ e2 :> "start"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "load" @@ e2 :> "start"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "load" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 0,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"clean", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "begin", chunk |-> {1, 2}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<NONE, NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "clean">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "begin", chunk |-> {1, 2}, replies |-> <<"ok", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], NONE>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "begin", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "move", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<0, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "move", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<1, 0>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "move", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<0, 0>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "move", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<1, 0>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "move", chunk |-> {1, 2}, replies |-> <<"ok", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<1, 1>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "commit", chunk |-> {1, 2}, replies |-> <<"commit_refused", "ok">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<1, 1>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "commit", chunk |-> {1, 2}, replies |-> <<"commit_refused", "commit_refused">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<0, 0>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 0 @@ e2 :> 0),truth |-> <<<<1, 1>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> TRUE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "bad"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<1, 1>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 1 @@ e2 :> 0),truth |-> <<<<1, 1>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})]),
    ([efind |-> (e1 :> <<[found |-> "record", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "record", fver |-> 0, fmap |-> <<0, 0>>]>> @@ e2 :> <<[found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>], [found |-> "nothing", fver |-> 0, fmap |-> <<0, 0>>]>>),ephase |-> (e1 :> "run" @@ e2 :> "dead"),eshare |-> (e1 :> FALSE @@ e2 :> FALSE),dphase |-> <<"pending", "pending">>,eclaim |-> (e1 :> <<"none", "none">> @@ e2 :> <<"none", "none">>),reb |-> (e1 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"] @@ e2 :> [step |-> "idle", chunk |-> {}, replies |-> <<"none", "none">>, owed |-> "none"]),eroute |-> (e1 :> <<1, 1>> @@ e2 :> <<0, 0>>),dver |-> <<0, 0>>,ever |-> (e1 :> 1 @@ e2 :> 0),truth |-> <<<<1, 1>>, <<1, 1>>>>,datt |-> <<{e1}, {e1}>>,moves |-> 1,dmap |-> <<<<0, 0>>, <<0, 0>>>>,dpend |-> <<[mover |-> e1, layers |-> {1, 2}, base |-> 0], [mover |-> e1, layers |-> {1, 2}, base |-> 0]>>,dpark |-> <<{}, {}>>,dnf |-> <<FALSE, FALSE>>,eserv |-> (e1 :> {1, 2} @@ e2 :> {})])
    >>
----


=============================================================================

---- MODULE MCSmall_TEConstants ----
EXTENDS MCSmall

CONSTANTS e1, e2

=============================================================================

---- CONFIG MCSmall_TTrace_1796640095 ----
CONSTANTS
    NumRanks = 2
    NumLayers = 2
    Engines = { e1 , e2 }
    Older = { }
    MayLackRecord = { }
    Chunks <- MCChunks
    MaxMoves = 2
    DaemonRestarts = TRUE
    Repairs = FALSE
    OperatorRepairs = FALSE
    RepairMayFail = FALSE
    Standbys = { }
    Rejoins = FALSE
    CommitFaults = TRUE
    NONE = NONE
    e1 = e1
    e2 = e2
    NONE = NONE

PROPERTY
    _prop

CHECK_DEADLOCK
    \* CHECK_DEADLOCK off because of PROPERTY or INVARIANT above.
    FALSE

INIT
    _init

NEXT
    _next

CONSTANT
    _TETrace <- _trace

ALIAS
    _expression
=============================================================================
\* Generated on Mon Dec 07 10:42:39 UTC 2026