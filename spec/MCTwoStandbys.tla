---------------------------- MODULE MCTwoStandbys --------------------------
(* 2 ranks, 1 layer, the primary e1 and two warm standbys e2 e3, no moves  *)
(* (MCStandby has them), no repairs, no restarts: the race to promote.    *)
(* See README.md.                                                           *)
EXTENDS LayoutProtocol

MCChunks == {{1}}
=============================================================================
