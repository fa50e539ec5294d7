------------------------------ MODULE MCRejoin -----------------------------
(* 3 ranks, 2 engines, 2 layers, one chunk of both layers, at most 1 move; *)
(* a daemon may be lost and start again from disk, and engines have it     *)
(* rejoin (auto repair on, repairs do not fail).  See README.md.           *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
