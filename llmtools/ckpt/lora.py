"""LoRA's checkpoint half: the adapters and merged weights of our checkpoints, and peft's adapter folder.

A checkpoint says itself whether it holds adapters: its meta.json holds the run's config, ``lora``
section included (:func:`lora_settings`; the client state in DeepSpeed's model-states file keeps the
same section, read only for a checkpoint whose meta.json has no config). :func:`checkpoint_lora` reads
the adapters back (ZeRO 0-3),
:func:`checkpoint_weights` gives any checkpoint's weights with the adapters merged in (what
``init_from`` loads), and :func:`write_adapter` writes ``adapter_model.safetensors`` +
``adapter_config.json`` under the names ``peft`` saves (``base_model.model.<target>.lora_A.weight``),
which ``peft.PeftModel`` loads. The maths (adapters, merging) is :mod:`llmtools.model.lora`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmtools.ckpt import layout, safeload
from llmtools.ckpt.verify import read_meta
from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.model.lora import LoraSection, is_adapter_name, merge_state

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


def peft_adapter_state(state: dict) -> dict:
    """The adapter tensors under ``peft``'s saved names (``base_model.model.<path>.lora_A.weight``)."""
    return {
        f"{PEFT_PREFIX}{k}.weight": v.detach().contiguous() for k, v in state.items() if is_adapter_name(k)
    }


def peft_adapter_config(section: LoraSection, base_model: str | None = None) -> dict[str, Any]:
    """``adapter_config.json`` as ``peft.LoraConfig.save_pretrained`` writes it (the keys it reads)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": section.r,
        "lora_alpha": section.alpha,
        "lora_dropout": section.dropout,
        "target_modules": sorted(section.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def lora_settings(checkpoint: Path) -> LoraSection | None:
    """The ``lora`` section a checkpoint was trained with (None: none), from its meta.json's config;
    from the model-states file only when meta.json has no config (nothing else of it is loaded then)."""
    try:
        config = read_meta(checkpoint).get("config")
    except InputError:
        config = None  # not one of ours (a bare DeepSpeed folder): its model-states file says
    if isinstance(config, dict):
        raw = config.get("lora")
    else:
        raw = safeload.load(layout.model_states_file(checkpoint), mmap=True).get("lora")
    return LoraSection(**raw) if raw else None


def checkpoint_lora(checkpoint: Path) -> tuple[LoraSection, dict] | None:
    """(LoRA config, HF-named module state) of a LoRA checkpoint; None for a checkpoint without LoRA.

    The module state in DeepSpeed's model-states file is complete for ZeRO 0-2 (each rank holds every
    parameter); ZeRO-3 partitions it, so its partitions are gathered (into memory: fine for the models
    LoRA is used on here).
    """
    section = lora_settings(checkpoint)
    if section is None:
        return None
    blob = safeload.load(layout.model_states_file(checkpoint), mmap=True)
    return section, _module_state(Path(checkpoint), blob)


def checkpoint_weights(checkpoint: Path) -> dict:
    """HF-named weights of any of our checkpoints (ZeRO 0-3), LoRA adapters merged in (``init_from``)."""
    return merged_checkpoint_weights(checkpoint)[0]


def merged_checkpoint_weights(checkpoint: Path) -> tuple[dict, LoraSection | None]:
    """:func:`checkpoint_weights`, and the LoRA settings whose adapters were merged (None: no adapters)."""
    blob = safeload.load(layout.model_states_file(checkpoint), mmap=True)
    state = _module_state(Path(checkpoint), blob)
    raw = blob.get("lora")
    if not raw:
        return state, None
    section = LoraSection(**raw)
    return merge_state(state, section), section


def _module_state(checkpoint: Path, blob: dict) -> dict:
    module = blob.get("module") or {}
    if any(v.numel() == 0 for v in module.values()):  # ZeRO-3: placeholders; gather the partitions
        module = _gather_zero3(checkpoint)
    prefix = "module." if module and all(k.startswith("module.") for k in module) else ""
    return {k.removeprefix(prefix): v for k, v in module.items()}


def _gather_zero3(checkpoint: Path) -> dict:
    """The full fp32 state (frozen base included) of a ZeRO-3 checkpoint, through DeepSpeed's own
    zero_to_fp32 (it prints to stdout, which is for results: sent to stderr)."""
    import contextlib
    import sys

    from llmtools.thirdparty import import_deepspeed

    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(sys.stderr), safeload.routed_torch_load():
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(checkpoint.parent), tag=checkpoint.name))


def trained_from(checkpoint: Path) -> str | None:
    """The run's ``model.init_from`` (recorded in meta.json), the base peft loads the adapter onto: an
    absolute path when it is a folder here (peft resolves a relative one against the loader's folder)."""

    try:
        meta = jsonfile.loads((Path(checkpoint) / layout.META).read_text(encoding="utf-8"), ours=True)
        init_from = meta["config"]["model"]["init_from"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(init_from, str):
        return None
    return str(Path(init_from).resolve()) if Path(init_from).is_dir() else init_from


def write_adapter(checkpoint: Path, output: Path, force: bool = False, base_model: str | None = None) -> Path:
    """``adapter_model.safetensors`` + ``adapter_config.json``, the folder ``peft.PeftModel`` loads."""
    from safetensors.torch import save_file

    from llmtools.fsutil import atomic_dir

    found = checkpoint_lora(checkpoint)
    if found is None:
        raise UsageError(f"--adapter-only: {checkpoint} was not trained with lora (no adapter to write)")
    section, state = found
    if base_model is None:
        base_model = trained_from(checkpoint)
    adapter = {k: v.float().clone() for k, v in peft_adapter_state(state).items()}
    with atomic_dir(Path(output), force=force) as tmp:
        save_file(adapter, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(
            jsonfile.dumps(peft_adapter_config(section, base_model), indent=2) + "\n", encoding="utf-8"
        )
        marker = {"format": "llmtools.lora-adapter", "source": str(checkpoint)}  # what --force may replace
        (tmp / "llmtools.json").write_text(jsonfile.dumps(marker, indent=1) + "\n", encoding="utf-8")
    return Path(output)
