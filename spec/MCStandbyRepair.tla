--------------------------- MODULE MCStandbyRepair -------------------------
(* 2 ranks, 2 layers, the primary e1 and the warm standby e2, chunks of one *)
(* layer each, at most 2 moves, auto repair on (repairs succeed), no        *)
(* restarts: a primary killed mid-move beside a parked standby, whose       *)
(* daemons repair the torn move and then tell the standby.  See README.md.  *)
EXTENDS LayoutProtocol

MCChunks == {{1}, {2}}
=============================================================================
