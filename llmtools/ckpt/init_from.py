"""``model.init_from``: the weights (and model config) a run starts from, read from a Hugging Face folder
or from one of our checkpoints (a checkpoint folder, or a run folder: its newest verified checkpoint).

Every task uses it; it lives with the other checkpoint readers so that reading a checkpoint happens in
one package.
"""

from __future__ import annotations

from pathlib import Path

from llmtools.errors import InputError


def init_checkpoint(spec: str | None) -> Path | None:
    """The checkpoint ``model.init_from`` names (a checkpoint folder, or a run folder: its newest verified
    checkpoint); None when it is a Hugging Face folder (config.json) or not given."""
    if not spec or (Path(spec) / "config.json").is_file():
        return None
    from llmtools.ckpt import layout

    path = Path(spec)
    if not (layout.model_states_file(path).is_file() or (path / layout.CHECKPOINTS).is_dir()):
        return None
    from llmtools.ckpt.convert import resolve_checkpoint

    return resolve_checkpoint(path)


def init_model_source(spec: str):
    """What ``load_model_config`` should read for ``init_from``: a checkpoint's recorded model, else ``spec``."""
    path = init_checkpoint(spec)
    if path is None:
        return spec
    from llmtools.ckpt.verify import read_meta

    model = read_meta(path).get("model")
    if not model:
        raise InputError(f"{path}/meta.json[model]: no model config recorded; give model.preset")
    return model


def load_init_weights(model, spec: str) -> str | None:
    """Copy ``init_from``'s weights into ``model``: a Hugging Face folder, or one of our checkpoints
    (any ZeRO stage; a LoRA checkpoint with its adapters merged into the base). Returns the line that
    says so when adapters were merged (the run starts from weights no file holds as such), else None."""
    path = init_checkpoint(spec)
    if path is None:
        from llmtools.ckpt.safeload import load
        from llmtools.model.hf import load_hf_weights

        load_hf_weights(model, spec, load_pt=lambda path: load(path, mmap=True))
        return None
    import torch

    from llmtools.ckpt.expert_parallel import is_expert_parallel
    from llmtools.ckpt.lora import merged_checkpoint_weights
    from llmtools.ckpt.verify import read_meta
    from llmtools.model.hf import load_state_dict_into

    meta = read_meta(path)
    if is_expert_parallel(meta):  # DeepSpeed's expert-parallel layout: gathered under the model's names
        from llmtools.ckpt.convert import checkpoint_sources

        with checkpoint_sources(path, meta, path) as sources:
            state = {name: source.load() for name, source in sources.items()}
        lora = None  # expert parallelism is refused with LoRA
    else:
        state, lora = merged_checkpoint_weights(path)
    with torch.no_grad():
        load_state_dict_into(model, state, str(path))
    if lora is None:
        return None
    return (
        f"init_from: {path} is a LoRA run: its adapters (r={lora.r}, alpha={lora.alpha:g}, on "
        f"{', '.join(lora.target_modules)}) are merged into its base weights, and this run starts from them"
    )
