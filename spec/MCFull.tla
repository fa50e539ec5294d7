------------------------------ MODULE MCFull -------------------------------
(* 2 ranks, 3 engines (e3 is an older engine without the layout plugin),   *)
(* 2 layers, at most 3 chunks begun; daemon 2 starts without a record in    *)
(* some runs.  See README.md.                                               *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
