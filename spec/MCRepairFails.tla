------------------------------ MODULE MCRepairFails --------------------------
(* 2 ranks, 2 engines, 2 layers, one chunk of both layers, at most 2 moves; *)
(* the daemons repair a torn move (auto repair on); a repair may fail, and *)
(* the operator may repair a dirty daemon again or restart it.  See        *)
(* README.md.                                                               *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
