------------------------------ MODULE MCRepair -----------------------------
(* 2 ranks, 2 engines, 2 layers, one chunk of both layers, at most 2 moves; *)
(* the daemons repair a torn move (auto repair on, repairs do not fail),   *)
(* no daemon restarts.  See README.md.                                      *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
