"""The mirror of spec/LayoutProtocol.tla and the tooling around TLC's outputs.

- ``system``: ``layout_sm``'s machines composed into the spec's system (one event per action);
- ``explore``: breadth-first explorer with the spec's invariants, writing TLC's DOT format;
- ``render``: TLA+ values and states printed exactly as TLC prints them;
- ``dot``: the loader of TLC DOT dumps; ``compare``: graph equality, state and edge;
- ``check_spec``: runs TLC on every model and every witness of spec/Scenarios.tla when a
  tla2tools.jar is available;
- ``spec_mutants``: each named rule of the spec broken in a temporary copy, judged by TLC.
"""
