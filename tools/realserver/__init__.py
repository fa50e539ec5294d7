"""Real sglang servers on CPU for the tests, the demo and the bench: a library.

Everything here runs ``python -m sglang.launch_server`` and ``python -m daemon_adapter`` as real
processes, with the CPU bridge (``tools.cpu_bridge``, tests only). Run every server
command under ``flock /tmp/realserver.lock`` (a TP2 server is ~6 GB over 9 processes).

API (import from the submodules; this package imports nothing heavy, the bridge's sitecustomize
imports ``engine_probes`` in every server process):

- ``model.build_tiny_qwen3_moe(root="build/models") -> Path``: the tiny deterministic Qwen3-MoE
  checkpoint + byte-level BPE tokenizer, cached by recipe digest; ``model.PROMPTS``.
- ``server.RunDir(root)``: one folder per run: ``logs/<name>.log`` (sglang's output),
  ``sockets/`` (this run's daemon socket and ready templates), ``probes/<server>/``.
  ``run.socket_path(rank)``; ``run.env(tp_size, plugins=None, extra=None)``.
- ``server.Topology(model_path, tp_size=2, ep_size=2, redundant_experts=2, enable_eplb=True)``:
  the flags servers and daemons share.
- ``server.StandaloneDaemons(run, topology, name="daemons", extra_args=(), layout_aware=True)
  .start()`` (``layout_aware=False``: sglang's own daemons, ``plain_daemons``);
  ``.wait_ready(timeout_s) -> seconds``; ``.kill()`` (SIGKILL tree); ``.stop()``; ``.tree``.
- ``server.ServerSpec(name, weight_cache_mode="client"|"daemon", rebalance_iterations=20,
  layers_per_chunk=None, init_expert_location=None, plugins=None | server.PROTOCOL_OFF,
  stop_at=None | engine_probes.StopPoint("after_commit"|"mid_move", n), extra_args, extra_env)``.
- ``server.RealServer(run, topology, spec, port=None).start()``; ``.wait_ready(timeout_s) ->
  seconds`` (``ServerFailed`` with the log tail if it exits first or times out);
  ``.generate(prompts, max_new_tokens=16) -> list[list[int]]`` (greedy, over HTTP);
  ``.beliefs() -> {rank: {"map", "version", "startup", "pid"}}`` (what each engine routes with);
  ``.wait_stopped(timeout_s)`` (every rank at ``spec.stop_at``); ``.kill()`` (SIGKILL of the
  whole process tree); ``.stop()``; ``.wait_exit(timeout_s)``; ``.log_text()``;
  ``.tree.rss_bytes()``; ``.tree.log_tail()``.
- ``server.daemon_status(run, include_map=False) -> dict`` (``expert-layout status --json``);
  ``server.daemon_status_table(run) -> str`` (the operator's table).
- ``server.write_expert_location(path, map) -> str``: a ``--init-expert-location`` JSON file.
- ``engine_probes``: the test-only probes in the server's engine processes (beliefs files, the
  stop at a protocol point); see its docstring.
"""
