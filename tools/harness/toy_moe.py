"""A toy MoE whose expert weights say which logical expert they are.

Built for the CPU demo and tests: every routed-expert slot holds a fixed random matrix that
belongs to exactly one logical expert (seeded per layer and expert), so "which expert does
this slot hold" is read from the memory itself, after any number of EPLB moves by any engine.
The forward pass is deterministic and routes with the engine's ``ExpertLocationMetadata``
(only its CPU maps are read), so two engines give equal outputs exactly when they route every
token to a slot whose memory holds the expert they meant.

Pure torch: no sglang import, so daemons, engines and checkers can all use it cheaply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Names follow sglang's fused-MoE checkpoints, so the state dict reads like a real model's.
W13 = "model.layers.{layer}.mlp.experts.w13_weight"
W2 = "model.layers.{layer}.mlp.experts.w2_weight"
GATE = "model.layers.{layer}.mlp.gate.weight"
EMBED = "model.embed_tokens.weight"
UNEMBED = "lm_head.weight"

UNKNOWN = -1  # a slot whose memory matches no logical expert (torn or foreign)


@dataclass(frozen=True)
class ToyMoEConfig:
    """Shape of the toy model. ``num_physical`` = logical + redundant, split evenly over ranks."""

    num_layers: int = 4
    num_logical: int = 8
    num_redundant: int = 2
    ep_size: int = 2
    hidden: int = 16
    vocab: int = 64
    seed: int = 20260601

    @property
    def num_physical(self) -> int:
        return self.num_logical + self.num_redundant

    @property
    def num_local(self) -> int:
        local, rem = divmod(self.num_physical, self.ep_size)
        if rem:
            raise ValueError(f"num_physical={self.num_physical} is not divisible by ep_size={self.ep_size}")
        return local

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _generator(cfg: ToyMoEConfig, *tag: object) -> torch.Generator:
    # A seed derived from the tag alone, so any process rebuilds the same matrix.
    digest = hashlib.sha256(repr((cfg.seed, cfg.hidden, *tag)).encode()).digest()
    gen = torch.Generator()
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def expert_weights(cfg: ToyMoEConfig, layer: int, logical: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed (w13, w2) of one logical expert: shapes [2H, H] and [H, H]."""
    h = cfg.hidden
    gen = _generator(cfg, "expert", layer, logical)
    w13 = torch.randn(2 * h, h, generator=gen) / h**0.5
    w2 = torch.randn(h, h, generator=gen) / h**0.5
    return w13, w2


def trivial_map(cfg: ToyMoEConfig) -> list[list[int]]:
    """sglang's initial layout (``init_trivial``): physical slot p holds logical p % N."""
    return [[p % cfg.num_logical for p in range(cfg.num_physical)] for _ in range(cfg.num_layers)]


def rank_state(cfg: ToyMoEConfig, rank: int, physical_to_logical: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """The state dict a daemon (or a disk load) holds for one EP rank under the given map.

    Routed experts are this rank's slice of slots; gate, embedding and head are replicated.
    """
    h = cfg.hidden
    lo, hi = rank * cfg.num_local, (rank + 1) * cfg.num_local
    state: dict[str, torch.Tensor] = {}
    state[EMBED] = torch.randn(cfg.vocab, h, generator=_generator(cfg, "embed"))
    state[UNEMBED] = torch.randn(cfg.vocab, h, generator=_generator(cfg, "unembed")) / h**0.5
    for layer in range(cfg.num_layers):
        row = list(physical_to_logical[layer])
        if len(row) != cfg.num_physical:
            raise ValueError(f"layer {layer}: map row has {len(row)} slots, expected {cfg.num_physical}")
        pairs = [expert_weights(cfg, layer, row[p]) for p in range(lo, hi)]
        state[W13.format(layer=layer)] = torch.stack([a for a, _ in pairs]).contiguous()
        state[W2.format(layer=layer)] = torch.stack([b for _, b in pairs]).contiguous()
        # A skewed router: a per-layer bias toward a few experts keeps routing uneven, as in real MoEs.
        gate = torch.randn(cfg.num_logical, h, generator=_generator(cfg, "gate", layer))
        state[GATE.format(layer=layer)] = gate
    return state


def routed_experts_weights_of_layer(
    cfg: ToyMoEConfig, state: Mapping[str, torch.Tensor]
) -> dict[int, list[torch.Tensor]]:
    """The ``model.routed_experts_weights_of_layer`` view ExpertLocationUpdater moves in place."""
    return {layer: [state[W13.format(layer=layer)], state[W2.format(layer=layer)]] for layer in range(cfg.num_layers)}


class ExpertIdentifier:
    """Reads which logical expert each slot's memory holds (exact match on both tensors)."""

    def __init__(self, cfg: ToyMoEConfig):
        self.cfg = cfg
        # [L, N, 2H, H] and [L, N, H, H]: small for the toy sizes.
        self._w13 = torch.stack(
            [
                torch.stack([expert_weights(cfg, la, e)[0] for e in range(cfg.num_logical)])
                for la in range(cfg.num_layers)
            ]
        )
        self._w2 = torch.stack(
            [
                torch.stack([expert_weights(cfg, la, e)[1] for e in range(cfg.num_logical)])
                for la in range(cfg.num_layers)
            ]
        )

    def slot(self, layer: int, w13: torch.Tensor, w2: torch.Tensor) -> int:
        """The logical expert whose weights this slot holds, or UNKNOWN."""
        hit13 = (self._w13[layer] == w13.unsqueeze(0)).flatten(1).all(dim=1)
        hit2 = (self._w2[layer] == w2.unsqueeze(0)).flatten(1).all(dim=1)
        both = torch.nonzero(hit13 & hit2).flatten().tolist()
        return int(both[0]) if len(both) == 1 else UNKNOWN

    def rank_slots(self, state: Mapping[str, torch.Tensor]) -> list[list[int]]:
        """[L][num_local]: what this rank's memory holds, slot by slot."""
        out = []
        for layer in range(self.cfg.num_layers):
            w13, w2 = state[W13.format(layer=layer)], state[W2.format(layer=layer)]
            out.append([self.slot(layer, w13[i], w2[i]) for i in range(w13.shape[0])])
        return out


def join_rank_slots(per_rank: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """Concatenate per-rank [L][num_local] slot lists into the global [L][P] layout."""
    num_layers = len(per_rank[0])
    return [[e for r in per_rank for e in r[layer]] for layer in range(num_layers)]


def count_mismatches(believed: Sequence[Sequence[int]], held: Sequence[Sequence[int]]) -> int:
    """Slots whose memory holds another expert than the map says."""
    return sum(int(b != h) for rb, rh in zip(believed, held, strict=True) for b, h in zip(rb, rh, strict=True))


def prompts(cfg: ToyMoEConfig, num_tokens: int = 64, seed: int = 7) -> torch.Tensor:
    """Fixed token ids: the 'requests' every engine answers."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.randint(0, cfg.vocab, (num_tokens,), generator=gen)


def _dispatch(metadata: Any, layer: int, logical: torch.Tensor) -> torch.Tensor:
    """Pick a physical slot per token: replica (token index mod replica count), from the engine's map.

    Deterministic and independent of rank, so engines with equal maps route identically.
    """
    table = metadata.logical_to_all_physical_map_cpu[layer]  # [N, X], padded with -1
    num_valid = (table != -1).sum(dim=1)  # [N]
    idx = torch.arange(logical.numel()) % num_valid[logical]
    return table[logical, idx]


def forward(
    cfg: ToyMoEConfig,
    state: Mapping[str, torch.Tensor],
    metadata: Any,
    token_ids: torch.Tensor,
    rank: int,
    group: Any = None,
) -> list[int]:
    """Greedy next tokens for every prompt token, computed with EP over the ranks.

    Each rank runs only the tokens routed to its own slots, reading its mapped memory; a sum
    all-reduce (gloo, over ``group``) joins the ranks, as an EP MoE layer does. Top-1 routing
    keeps the arithmetic order identical whichever rank holds an expert.
    """
    lo, hi = rank * cfg.num_local, (rank + 1) * cfg.num_local
    x = state[EMBED][token_ids].clone()
    for layer in range(cfg.num_layers):
        logits = x @ state[GATE.format(layer=layer)].T
        prob, logical = torch.softmax(logits, dim=-1).max(dim=-1)
        physical = _dispatch(metadata, layer, logical)
        w13, w2 = state[W13.format(layer=layer)], state[W2.format(layer=layer)]
        y = torch.zeros_like(x)
        for slot in range(lo, hi):
            rows = torch.nonzero(physical == slot).flatten()
            if rows.numel() == 0:
                continue
            gate_up = x[rows] @ w13[slot - lo].T
            g, u = gate_up.chunk(2, dim=-1)
            y[rows] = (torch.nn.functional.silu(g) * u) @ w2[slot - lo].T * prob[rows, None]
        if group is not None or (dist.is_available() and dist.is_initialized()):
            dist.all_reduce(y, group=group)
        x = x + y
    return (x @ state[UNEMBED].T).argmax(dim=-1).tolist()


def skewed_logical_count(cfg: ToyMoEConfig, phase: int, tokens: int = 4096) -> torch.Tensor:
    """Routing statistics [L, N] with a hot set that shifts with ``phase``.

    Each rebalance sees a different hot set, so EPLB's new layout differs from the last one and
    every rebalance really moves experts.
    """
    counts = torch.ones(cfg.num_layers, cfg.num_logical, dtype=torch.int64)
    for layer in range(cfg.num_layers):
        gen = _generator(cfg, "load", layer, phase)
        base = torch.randint(1, 16, (cfg.num_logical,), generator=gen)
        hot = [(layer + 3 * phase + k) % cfg.num_logical for k in range(2)]
        base[hot[0]] += tokens // 2
        base[hot[1]] += tokens // 4
        counts[layer] = base
    return counts
