----------------------------- MODULE MCDurable -----------------------------
(* 2 ranks, 2 engines, 2 layers, one chunk of both layers, at most 2 moves; *)
(* each daemon keeps a durable copy of its record, and every daemon may be *)
(* lost and start again from its copy (auto repair on, repairs do not      *)
(* fail).  See README.md.                                                  *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
