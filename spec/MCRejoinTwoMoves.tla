--------------------------- MODULE MCRejoinTwoMoves ---------------------------
(* MCRejoin at two moves, safety only: 3 ranks, 2 engines, 2 layers, one   *)
(* chunk of both layers; a daemon may be lost and start again from disk,   *)
(* and engines have it rejoin.  See README.md.                             *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
