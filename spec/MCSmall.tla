------------------------------ MODULE MCSmall ------------------------------
(* 2 ranks, 2 engines (both with the layout plugin), 2 layers, at most 2    *)
(* chunks begun; every daemon keeps a record.  See README.md.               *)
EXTENDS LayoutProtocol

MCChunks == {{1, 2}}
=============================================================================
