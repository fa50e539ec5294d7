------------------------------ MODULE MCStandby ----------------------------
(* 2 ranks, 2 layers, the primary e1 and the warm standby e2, chunks of one *)
(* layer each (two moves give a map other than the initial one), at most 2 *)
(* moves, no repairs, no restarts.  See README.md.                          *)
EXTENDS LayoutProtocol

MCChunks == {{1}, {2}}
=============================================================================
