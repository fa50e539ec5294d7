"""Reload the routed experts of some layers from the checkpoint, in place, with sglang's own loading.

A dirty daemon (its mover left mid-move) knows which layers are in an unknown state and the base
version's rows for them (``layout_sm.repair``). ``reload_routed_experts`` puts those layers back:

1. sglang's global ``ExpertLocationMetadata`` is set, in place, to the record's map
   (``ExpertLocationMetadata.init_by_mapping`` then ``.update``, sglang/srt/eplb/expert_location.py),
   so ``FusedMoE.weight_loader`` (layers/moe/fused_moe_triton/layer.py) writes each logical expert
   into the physical slots the record gives (``logical_to_all_physical``), on this rank's EP share.
   It is left there: afterwards the metadata, the record and the memory agree on every layer (the
   daemon loaded with its initial map; moves since then changed memory and record, not the metadata).
2. The checkpoint's tensors of those layers' routed experts, and no other, are read with
   ``safetensors.safe_open`` from the files sglang's own loader picks (``DefaultModelLoader._prepare_weights``),
   and fed to ``DefaultModelLoader.load_weights_only``: the model's ``load_weights``, which maps
   checkpoint names with ``FusedMoE.make_expert_params_mapping`` to the expert ``weight_loader``.
   sglang's ``safetensors_weights_iterator`` would read every tensor of every file: not used.
3. The post-processing sglang applies after loading, for those layers' ``FusedMoE`` modules only:
   ``quant_method.process_weights_after_loading`` (as ``DefaultModelLoader.postprocess_weights`` does
   for every module), inside sglang's ``device_loading_context``.

Engines map the daemon's tensors zero-copy, so every write must land in the tensors the daemon
exported: the data pointer, shape and dtype of every tensor of the model's ``state_dict`` are
compared before and after. A model or quantization whose post-processing repacks or rebinds
the expert weights cannot be reloaded layer by layer: ``ReloadRefused`` says why, before any write.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Models whose load_weights feeds routed-expert tensors (checkpoint names ``...mlp.experts.{e}.
# {gate,up,down}_proj...``) only to FusedMoE.weight_loader, through make_expert_params_mapping, and
# touches no other parameter for them (read in sglang 0.5.23: qwen3_moe.py:1157-1287), and whose
# repair a real test runs (tests/daemon_adapter/test_repair_real.py). Qwen2-MoE's load_weights has
# the same shape (qwen2_moe.py:1324), but EPLB cannot move its experts (no
# routed_experts_weights_of_layer), so none of its daemons turns dirty: left out, untested.
SUPPORTED_MODELS = frozenset({"Qwen3MoeForCausalLM"})
# The checkpoint names of a routed expert's projections in these models (their load_weights).
CKPT_GATE, CKPT_DOWN, CKPT_UP = "gate_proj", "down_proj", "up_proj"


class ReloadRefused(RuntimeError):
    """This model or quantization cannot be repaired layer by layer; nothing was written."""


class ReloadFailed(RuntimeError):
    """The reload failed (a read error, a missing file, a tensor moved); memory may be partly written."""


@dataclass(frozen=True)
class RepairReport:
    """What a reload did."""

    layers: tuple[int, ...]
    seconds: float
    bytes_read: int
    checkpoint_bytes: int
    checkpoint_tensors_read: int
    params_touched: tuple[str, ...]
    files_read: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "seconds": round(self.seconds, 4),
            "bytes_read": self.bytes_read,
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_tensors_read": self.checkpoint_tensors_read,
            "params_touched": list(self.params_touched),
            "files_read": self.files_read,
        }


def routed_expert_modules(model: torch.nn.Module, layers: Sequence[int]) -> dict[int, tuple[str, Any]]:
    """{layer: (module name, FusedMoE)} of the routed experts of ``layers``; ReloadRefused when a
    layer has none, or more than one, or one that loads without the expert location."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    found: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, FusedMoE) and module.layer_id in layers:
            found.setdefault(module.layer_id, []).append((name, module))
    out = {}
    for layer in layers:
        modules = found.get(layer, [])
        if len(modules) != 1:
            raise ReloadRefused(f"layer {layer} has {len(modules)} FusedMoE modules, not one: not a layer EPLB moves")
        name, module = modules[0]
        if not module.uses_expert_location:
            raise ReloadRefused(f"{name} loads without sglang's expert location (uses_expert_location is off)")
        out[layer] = (name, module)
    return out


def check_repairable(model: torch.nn.Module, modules: dict[int, tuple[str, Any]]) -> None:
    """ReloadRefused, with the reason, unless reloading these modules' experts and running their
    post-processing again writes exactly the checkpoint's values into the exported tensors."""
    from sglang.srt.layers.quantization import unquant
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    model_class = type(model).__name__
    if model_class not in SUPPORTED_MODELS:
        raise ReloadRefused(
            f"model {model_class}: its load_weights is not known to feed routed experts only to "
            f"FusedMoE.weight_loader (repairable: {', '.join(sorted(SUPPORTED_MODELS))})"
        )
    for name, module in modules.values():
        method = module.quant_method
        if type(method) is not UnquantizedFusedMoEMethod:
            raise ReloadRefused(
                f"{name}: quantization method {type(method).__name__}: its process_weights_after_loading "
                f"derives the kernel's tensors from the whole loaded layer (requantizing, repacking or "
                f"rebinding them), which is not known to be repeatable in place on exported memory"
            )
        # UnquantizedFusedMoEMethod.process_weights_after_loading (quantization/unquant.py) changes
        # the expert weights in these cases; each makes a second pass wrong or moves the memory.
        if getattr(module, "use_intel_amx_backend", False):
            raise ReloadRefused(
                f"{name}: the expert weights were packed for Intel AMX after loading "
                f"(amx_utils._amx_process_weight_after_loading); sglang cannot undo that packing "
                f"(DefaultModelLoader.restore_weights_before_loading skips it), so the checkpoint's "
                f"layout cannot be written into them"
            )
        if unquant._use_aiter:
            raise ReloadRefused(f"{name}: AITER shuffles the expert weights after loading (copy_or_rebind_param)")
        if unquant._is_npu:
            raise ReloadRefused(f"{name}: the NPU kernels repack the expert weights after loading")
        if method.use_flashinfer_trtllm_moe:
            raise ReloadRefused(f"{name}: flashinfer TRT-LLM keeps the expert weights in a block layout")
        if method.w13_swiglu_interleaved:
            raise ReloadRefused(f"{name}: w13 rows are interleaved for the fused SwiGLU epilogue")


def set_expert_location(model_config: Any, physical_to_logical_map: Sequence[Sequence[int]], ep_rank: int) -> Any:
    """Set sglang's global ExpertLocationMetadata, in place and on every layer, to this map."""
    from sglang.srt.eplb.expert_location import ExpertLocationMetadata, get_global_expert_location_metadata

    metadata = get_global_expert_location_metadata()
    if metadata is None:
        raise ReloadRefused("sglang keeps no expert location here (started without --enable-eplb)")
    target = ExpertLocationMetadata.init_by_mapping(
        model_config, torch.tensor(physical_to_logical_map, dtype=torch.int64), moe_ep_rank=ep_rank
    )
    if target is None or tuple(target.physical_to_logical_map.shape) != tuple(metadata.physical_to_logical_map.shape):
        raise ReloadRefused("the record's map does not fit sglang's expert location of this model")
    metadata.update(target, update_layer_ids=list(range(metadata.num_layers)))
    return metadata


def checkpoint_files(model_config: Any, load_config: Any) -> list[str]:
    """The safetensors files sglang's loader reads for this model (downloaded, deduplicated)."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    _folder, files, use_safetensors = DefaultModelLoader(load_config)._prepare_weights(
        model_config.model_path, model_config.revision, fall_back_to_pt=False
    )
    if not use_safetensors:
        raise ReloadRefused("the checkpoint is not safetensors: its files cannot be read tensor by tensor")
    return list(files)


def experts_held_here(modules: dict[int, tuple[str, Any]], metadata: Any) -> dict[int, set[int]]:
    """{layer: the logical experts with a slot on this rank}: the checkpoint tensors worth reading.

    Asks sglang what its expert weight_loader asks (``_weight_loader_physical``): the expert's
    physical slots (``logical_to_all_physical``), and whether one is this rank's
    (``_map_global_expert_id_to_local_expert_id``). A module whose parameters keep every expert
    (``_sglang_require_global_experts``) reads them all."""
    out: dict[int, set[int]] = {}
    for layer, (_name, module) in modules.items():
        every = range(metadata.num_logical_experts)
        if any(getattr(p, "_sglang_require_global_experts", False) for p in module.parameters()):
            out[layer] = set(every)
            continue
        out[layer] = {
            expert
            for expert in every
            if any(
                0 <= module._map_global_expert_id_to_local_expert_id(physical) < module.num_local_experts
                for physical in metadata.logical_to_all_physical(layer, expert)
            )
        }
    return out


def routed_expert_names(experts: dict[int, set[int]], num_logical_experts: int) -> Any:
    """A predicate on checkpoint names: a projection of routed expert ``e`` of layer ``l``, for
    ``e in experts[l]`` (names as the models' load_weights map them: ``make_expert_params_mapping``)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.utils import get_layer_id

    by_expert: dict[int, list[str]] = {}
    for _param, weight_name, expert, _shard in FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name=CKPT_GATE,
        ckpt_down_proj_name=CKPT_DOWN,
        ckpt_up_proj_name=CKPT_UP,
        num_experts=num_logical_experts,
    ):
        by_expert.setdefault(expert, []).append(f"mlp.{weight_name}")

    def wanted(name: str) -> bool:
        layer = get_layer_id(name)
        return layer in experts and any(w in name for e in experts[layer] for w in by_expert[e])

    return wanted


@dataclass
class RepairProgress:
    """How far a running reload is, for ``expert-layout status``: filled by ``read_tensors`` (one
    writer, the repair's thread; a reader sees ints that only grow, so no lock)."""

    tensors_expected: int = 0  # known once every file's header is read, before any tensor
    bytes_expected: int = 0
    tensors: int = 0  # read and handed to sglang's loader so far
    bytes: int = 0
    files: int = 0

    def to_wire(self) -> dict[str, int]:
        return {
            "tensors": self.tensors,
            "tensors_expected": self.tensors_expected,
            "bytes": self.bytes,
            "bytes_expected": self.bytes_expected,
        }


def read_tensors(files: Sequence[str], wanted: Any, count: RepairProgress) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the wanted tensors only; every file's header is read first (what the
    reload will read, for its progress), then only those tensors' bytes."""
    from safetensors import safe_open

    chosen: list[tuple[str, list[str]]] = []
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = [name for name in f.keys() if wanted(name)]  # noqa: SIM118 (safe_open is not a mapping)
            for name in names:
                piece = f.get_slice(name)
                count.bytes_expected += math.prod(piece.get_shape()) * _DTYPE_BYTES[piece.get_dtype()]
            count.tensors_expected += len(names)
        if names:
            chosen.append((path, names))
    for path, names in chosen:
        count.files += 1
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in names:
                tensor = f.get_tensor(name)
                count.bytes += tensor.nbytes
                count.tensors += 1
                yield name, tensor


# The element sizes of safetensors' dtype names (its header format).
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def _tensor_places(model: torch.nn.Module) -> dict[str, tuple[int, tuple[int, ...], torch.dtype]]:
    return {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}


def reload_routed_experts(
    model: torch.nn.Module,
    model_config: Any,
    load_config: Any,
    layers: Sequence[int],
    physical_to_logical_map: Sequence[Sequence[int]],
    ep_rank: int,
    progress: RepairProgress | None = None,
) -> RepairReport:
    """Reload the routed experts of ``layers`` in place, in the slots ``physical_to_logical_map``
    (the record's whole map) gives. ReloadRefused before any write; ReloadFailed after one.
    ``progress`` is filled as tensors are read, for a status asked meanwhile."""
    from sglang.srt.model_loader.loader import DefaultModelLoader, device_loading_context
    from sglang.srt.platforms import current_platform

    started = time.perf_counter()
    layers = tuple(sorted(layers))
    modules = routed_expert_modules(model, layers)
    check_repairable(model, modules)
    files = checkpoint_files(model_config, load_config)
    metadata = set_expert_location(model_config, physical_to_logical_map, ep_rank)
    wanted = routed_expert_names(experts_held_here(modules, metadata), metadata.num_logical_experts)

    before = _tensor_places(model)
    count = progress if progress is not None else RepairProgress()
    try:
        # One pass feeds every layer; the target device is the experts' own (no offloading here).
        device = next(iter(modules.values()))[1].w13_weight.device
        DefaultModelLoader.load_weights_only(model, read_tensors(files, wanted, count), device)
        for _name, module in modules.values():
            with device_loading_context(module, module.w13_weight.device):
                module.quant_method.process_weights_after_loading(module)
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        raise ReloadFailed(f"reloading layers {list(layers)}: {type(error).__name__}: {error}") from error
    if count.tensors == 0:
        raise ReloadFailed(f"no routed-expert tensor of layers {list(layers)} in {files}")
    after = _tensor_places(model)
    moved = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    if moved:
        raise ReloadFailed(f"tensors moved or changed shape while reloading (engines map the old ones): {moved}")
    # As the daemon does before its export: every write has retired before engines are served.
    current_platform.synchronize()
    touched = tuple(f"{name}.{param}" for name, module in modules.values() for param, _ in module.named_parameters())
    return RepairReport(
        layers=layers,
        seconds=time.perf_counter() - started,
        bytes_read=count.bytes,
        checkpoint_bytes=sum(os.path.getsize(path) for path in files),
        checkpoint_tensors_read=count.tensors,
        params_touched=touched,
        files_read=count.files,
    )
