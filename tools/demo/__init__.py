"""The demo: the upstream GPU cases of the expert-layout protocol, on CPU.

- ``real``: ``make demo``, on real ``python -m sglang.launch_server`` servers;
- ``harness``: ``make demo-harness``, the same cases on the in-process harness (``tools.harness``: daemon
  processes and 2-rank engine processes over gloo, no HTTP);
- ``results``, ``picture``, ``procmon``, ``memory_probe``: what both share (the table, the picture, the
  limits meter, and what a daemon's memory holds).
"""
