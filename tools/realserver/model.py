"""A tiny deterministic MoE checkpoint and byte-level BPE tokenizer, built here.

Two families: Qwen3-MoE (the demo's and the tests' model) and Qwen2-MoE (routed experts plus a
shared expert, ``TinyMoeRecipe(family="qwen2_moe")``). sglang 0.5.23 serves the second on CPU
(with the bridge's shared-expert gate), but EPLB cannot rebalance it on any device:
``Qwen2MoeForCausalLM`` has no ``routed_experts_weights_of_layer`` (``eplb_manager.py:242``).
``build_tiny_qwen3_moe(root, recipe)`` writes (once; later calls reuse it) a Hugging Face folder that
``python -m sglang.launch_server --model-path`` serves: 2 layers, 8 routed experts (top 2),
hidden size 64, random weights from ``AutoModelForCausalLM.from_config`` under a fixed seed,
``save_pretrained``; a byte-level BPE tokenizer trained with ``tokenizers`` on a few sentences.
The folder name carries a digest of the recipe, so a changed recipe builds a new folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CORPUS = (
    "The weight cache daemon keeps the model's weights resident on each device.",
    "EPLB moves routed experts between physical slots to balance the load.",
    "Every engine on the same daemon must route tokens with the layout memory holds.",
    "A restart adopts the daemons' layout version instead of the initial one.",
    "The quick brown fox jumps over the lazy dog while the experts rebalance.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 and words like alpha beta gamma delta.",
)
PROMPTS = (
    "The weight cache daemon",
    "EPLB moves routed experts",
    "A restart adopts",
    "The quick brown fox",
    "alpha beta gamma",
    "Every engine on the same",
)


@dataclass(frozen=True)
class TinyMoeRecipe:
    """What the checkpoint is made of; its digest names the folder."""

    family: str = "qwen3_moe"  # or "qwen2_moe" (adds a shared expert of shared_expert_intermediate_size)
    num_hidden_layers: int = 2
    num_experts: int = 8
    num_experts_per_tok: int = 2
    hidden_size: int = 64
    moe_intermediate_size: int = 32
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 384
    max_position_embeddings: int = 512
    shared_expert_intermediate_size: int = 48  # qwen2_moe only
    seed: int = 20261201

    def digest(self) -> str:
        recipe = asdict(self)
        if self.family == "qwen3_moe":  # the folder name the first family always had
            del recipe["family"], recipe["shared_expert_intermediate_size"]
        text = json.dumps({"recipe": recipe, "corpus": CORPUS}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _train_tokenizer(vocab_size: int, out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(str(out_dir))


FAMILIES = ("qwen3_moe", "qwen2_moe")


def _config(recipe: TinyMoeRecipe) -> object:
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    if recipe.family not in FAMILIES:
        raise ValueError(f"unknown MoE family {recipe.family!r}; known: {', '.join(FAMILIES)}")
    common = dict(
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        moe_intermediate_size=recipe.moe_intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        num_experts=recipe.num_experts,
        num_experts_per_tok=recipe.num_experts_per_tok,
        max_position_embeddings=recipe.max_position_embeddings,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
        dtype="float32",
    )
    if recipe.family == "qwen2_moe":
        return Qwen2MoeConfig(**common, shared_expert_intermediate_size=recipe.shared_expert_intermediate_size)
    return Qwen3MoeConfig(**common, head_dim=recipe.head_dim)


def _build(recipe: TinyMoeRecipe, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(recipe)
    _train_tokenizer(recipe.vocab_size, out_dir)
    torch.manual_seed(recipe.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # from_config leaves some weights at exact zeros/ones; a fixed-seed normal init for every
    # parameter makes experts and routing distinct, so a wrong slot changes the outputs.
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" not in name:  # RMSNorm weights stay at one
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    (out_dir / "expert_layout_recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")


def build_tiny_qwen3_moe(root: str | os.PathLike[str] = "build/models", recipe: TinyMoeRecipe | None = None) -> Path:
    """Build the checkpoint under ``root`` (cached by recipe digest) and return its folder."""
    recipe = recipe or TinyMoeRecipe()
    out = Path(root) / f"tiny-{recipe.family.replace('_', '-')}-{recipe.digest()}"
    if (out / "expert_layout_recipe.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _build(recipe, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process built it first
            if not (out / "expert_layout_recipe.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_qwen3_moe(sys.argv[1] if len(sys.argv) > 1 else "build/models"))
