"""``make bench``'s scaling part: how the chunk protocol and startup grow with ranks and with the map.

Protocol-only processes, no sglang server: one layout-aware daemon process per rank and one engine rank
process per rank over gloo (``protocol.bench_ranks``), each point a ratio to its floor measured in the
same processes (chunk: 2 bare round trips + 1 bare all-gather, beside each chunk, and the shape with
the commit's check in an all-gather of its own beside its floor of 2 of each; startup: a bare
``query_config`` and a bare all-gather, after the same pause as each startup).
``python -m tools.bench --only-scaling`` runs this part alone. Two curves:

- ranks 1, 2, 4, 8, 16 on the DeepSeek-V3-sized map (61 x 288), on one node, and 2 to 16 split
  over two nodes (``tools.bench.two_nodes``: node 1's ranks in a network namespace, the nodes
  joined by one veth link), each rank beside its own daemon;
- map size 2 x 10 up to 61 x 288 and 61 x 512, on 2 ranks.

On a 2-core machine 16 ranks means 32 processes on 2 cores: the absolute figures there are the
scheduler's, the ratios to the floor measured beside them are the protocol's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RANKS = (1, 2, 4, 8, 16)
TWO_NODE_RANKS = (2, 4, 8, 16)
SHAPES: tuple[tuple[int, int, int], ...] = ((2, 10, 8), (8, 64, 56), (24, 160, 128), (61, 288, 256), (61, 512, 480))


def repetitions(n: int, world: int) -> int:
    """Fewer repetitions where a step costs many processes (medians stay stable)."""
    return max(20, n // max(1, world // 2))


Measure = Callable[..., dict[str, Any]]  # protocol.bench_ranks(world, workdir, n[, shape])


def _point(bench_ranks: Measure, step: Callable[[str], None], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One point; tried once more if a rank process died (on 2 cores a gloo port picked free can be
    taken by another process before the rank binds it), so one lost race does not end the bench."""
    try:
        return bench_ranks(*args, **kwargs)
    except RuntimeError as error:
        step(f"  {error}; that point again")
        return bench_ranks(*args, **kwargs)


def _ranks_step(step: Callable[[str], None], point: dict[str, Any]) -> None:
    step(
        f"  {point['ranks']:2d} ranks on {point['nodes']} node(s), {point['map']}: chunk {point['chunk_us']:.0f} us "
        f"({point['chunk_ratio']}x its floor; two all-gathers {point['two_collectives_us']:.0f} us), "
        f"startup {point['startup_us']:.0f} us ({point['startup_ratio']}x)"
    )


def bench_scaling(
    bench_ranks: Measure,
    workdir: str,
    n: int,
    step: Callable[[str], None],
    ranks: tuple[int, ...] = RANKS,
    two_node_ranks: tuple[int, ...] = TWO_NODE_RANKS,
) -> dict[str, Any]:
    """The curves, each point measured by ``bench_ranks`` (``tools.bench.protocol``'s, which calls
    this part: passed in, so the two modules do not import each other)."""
    from tools.bench.two_nodes import TwoNodeLink

    by_ranks = []
    for world in ranks:
        by_ranks.append(_point(bench_ranks, step, world, workdir, repetitions(n, world)))
        _ranks_step(step, by_ranks[-1])
    by_ranks_two_nodes: list[dict[str, Any]] = []
    two_nodes_missing = None
    try:
        link = TwoNodeLink.create()
    except RuntimeError as error:
        two_nodes_missing = f"no second node here: {error}"
        step(f"  two nodes skipped, {two_nodes_missing}")
    else:
        try:
            for world in two_node_ranks:
                by_ranks_two_nodes.append(_point(bench_ranks, step, world, workdir, repetitions(n, world), link=link))
                _ranks_step(step, by_ranks_two_nodes[-1])
        finally:
            link.close()
    by_map = []
    for shape in SHAPES:
        point = _point(bench_ranks, step, 2, workdir, n, shape)
        by_map.append(point)
        step(
            f"   2 ranks, {shape[0]}x{shape[1]}: chunk {point['chunk_us']:.0f} us ({point['chunk_ratio']}x), "
            f"startup {point['startup_us']:.0f} us ({point['startup_ratio']}x)"
        )
    return {
        "by_ranks": by_ranks,
        "by_ranks_two_nodes": by_ranks_two_nodes,
        "two_nodes_missing": two_nodes_missing,
        "by_map": by_map,
    }


def plot(data: dict[str, Any], png: str) -> bool:
    """Both curves with their floors, as one PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, points, xkey, xlabel in (
        (axes[0], data["by_ranks"], "ranks", "ranks (daemons and engine rank processes)"),
        (axes[1], data["by_map"], "map", "map (layers x physical experts), 2 ranks"),
    ):
        xs = list(range(len(points)))
        curves = (
            ("chunk_us", "chunk_floor_us", "chunk"),
            ("two_collectives_us", "two_collectives_floor_us", "chunk, two all-gathers"),
            ("startup_us", "startup_floor_us", "startup"),
        )
        for key, floor, label in curves:
            (line,) = ax.plot(xs, [p[key] / 1000 for p in points], marker="o", label=f"{label}: protocol")
            ax.plot(
                xs, [p[floor] / 1000 for p in points], linestyle="--", color=line.get_color(), label=f"{label}: floor"
            )
        if xkey == "ranks":
            two = {p["ranks"]: p for p in data.get("by_ranks_two_nodes") or []}
            at = [(i, two[p["ranks"]]) for i, p in enumerate(points) if p["ranks"] in two]
            curves_two = (("chunk_us", {"marker": "s"}, "protocol"), ("chunk_floor_us", {"linestyle": ":"}, "floor"))
            for key, style, what in curves_two if at else ():
                ys = [p[key] / 1000 for _, p in at]
                ax.plot([i for i, _ in at], ys, color="black", label=f"chunk: {what}, two nodes", **style)
        ax.set_xticks(xs, [str(p[xkey]) for p in points])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms (median)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(f"growth with ranks ({data['by_ranks'][0]['map']} map)")
    axes[1].set_title("growth with the map (2 ranks)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def markdown_rows(data: dict[str, Any]) -> list[str]:
    rows = [
        "| ranks | nodes | map | chunk | chunk floor | ratio | chunk, two all-gathers | its floor | ratio | startup "
        "| startup floor | ratio |",
        "| --- " * 12 + "|",
    ]
    for p in [*data["by_ranks"], *data.get("by_ranks_two_nodes", []), *data["by_map"]]:
        rows.append(
            f"| {p['ranks']} | {p.get('nodes', 1)} | {p['map']} | {p['chunk_us']:.0f} us | "
            f"{p['chunk_floor_us']:.0f} us | "
            f"{p['chunk_ratio']}x | {p['two_collectives_us']:.0f} us | {p['two_collectives_floor_us']:.0f} us | "
            f"{p['two_collectives_ratio']}x | {p['startup_us']:.0f} us | {p['startup_floor_us']:.0f} us | "
            f"{p['startup_ratio']}x |"
        )
    if data.get("two_nodes_missing"):
        rows += ["", f"Two nodes were not measured: {data['two_nodes_missing']}."]
    return rows
