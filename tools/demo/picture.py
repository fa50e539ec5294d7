"""The picture: per layer, the expert in each slot as the engine believes it against memory.

Four strips per layer: protocol off (engine B's map, then B's memory) and protocol on (the
adopting engine's map, then its memory). A slot whose memory disagrees with the map is framed
in red. Needs matplotlib (``make demo`` installs it); without it the demo skips the picture.
"""

from __future__ import annotations

from collections.abc import Sequence

Grid = Sequence[Sequence[int]]  # [L][P]


def draw(path: str, before_believed: Grid, before_held: Grid, after_believed: Grid, after_held: Grid) -> bool:
    """Write the PNG; returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: render to a file only
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        return False

    num_layers = len(before_believed)
    num_physical = len(before_believed[0])
    num_logical = 1 + max(max(max(r) for r in g) for g in (before_believed, before_held, after_believed, after_held))
    strips = [
        ("protocol off: B believes", before_believed),
        ("protocol off: memory", before_held),
        ("protocol on: B believes", after_believed),
        ("protocol on: memory", after_held),
    ]
    fig, axes = plt.subplots(num_layers, 1, figsize=(1.0 + 0.55 * num_physical, 1.45 * num_layers + 0.8), squeeze=False)
    cmap = plt.get_cmap("tab10" if num_logical <= 10 else "tab20")
    for layer in range(num_layers):
        ax = axes[layer][0]
        grid = [list(g[layer]) for _, g in strips]
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=num_logical - 0.5, aspect="auto")
        for i, row in enumerate(grid):
            for p, expert in enumerate(row):
                ax.text(p, i, str(expert), ha="center", va="center", fontsize=8, color="white", weight="bold")
        for pair in ((0, 1), (2, 3)):
            believed, held = grid[pair[0]], grid[pair[1]]
            for p in range(num_physical):
                if believed[p] != held[p]:
                    for i in pair:
                        ax.add_patch(Rectangle((p - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.2))
        wrong_off = sum(a != b for a, b in zip(grid[0], grid[1], strict=True))
        wrong_on = sum(a != b for a, b in zip(grid[2], grid[3], strict=True))
        ax.set_yticks(range(len(strips)), [s for s, _ in strips], fontsize=8)
        ax.set_xticks(range(num_physical), [str(p) for p in range(num_physical)], fontsize=7)
        ax.axhline(1.5, color="black", linewidth=1.5)
        half = num_physical / 2 - 0.5
        ax.axvline(half, color="grey", linewidth=1, linestyle="--")  # rank 0 | rank 1
        ax.set_title(
            f"layer {layer}: wrong slots {wrong_off}/{num_physical} without the protocol, "
            f"{wrong_on}/{num_physical} with it",
            fontsize=9,
        )
    axes[-1][0].set_xlabel("physical slot (rank 0 | rank 1); number = logical expert")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
