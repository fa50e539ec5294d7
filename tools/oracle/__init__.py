"""An oracle of the protocol that shares no code with ``layout_sm``, the code under test.

- ``spec``: spec/LayoutProtocol.tla transcribed operator by operator; its breadth-first graph, in
  TLC's DOT format, equals TLC's own;
- ``traces``: spec/TraceLayoutProtocol.tla's search for a behaviour that takes a run's logged steps,
  with the first logged step no behaviour takes when there is none.

It imports the standard library and the pure value and format modules of ``tools.mirror``
(``values``, ``render``, ``dot``, ``model``, ``trace_logs``) and ``tools.trace_files`` only: none imports ``layout_sm``
(``tests/spec/test_oracle.py`` checks it in a fresh interpreter).
"""
