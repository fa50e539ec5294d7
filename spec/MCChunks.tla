------------------------------ MODULE MCChunks -----------------------------
(* 2 ranks, 2 engines, 2 layers moved one layer per chunk: a rebalance of   *)
(* several chunks, a kill between its chunks, maps that differ in only     *)
(* some layers.  See README.md.                                             *)
EXTENDS LayoutProtocol

MCChunks == {{1}, {2}}
=============================================================================
