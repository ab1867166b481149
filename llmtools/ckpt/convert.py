"""Convert checkpoints: to consolidated safetensors, to a Hugging Face folder, to a universal checkpoint;
and bring a Hugging Face folder in as a checkpoint.

Conversion streams: the fp32 master weights are read parameter by parameter straight from DeepSpeed's
files (:mod:`llmtools.ckpt.reader`) and written as they arrive (the model team's
:func:`llmtools.model.hf.save_hf_folder`), so peak memory is about one tensor, not the model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtools.ckpt import layout, safeload
from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_dir, atomic_path, check_writable

TARGETS = ("hf", "safetensors", "universal")
DTYPES = ("fp32", "bf16", "fp16")
# Files of a tokenizer worth carrying into a model folder (transformers' AutoTokenizer reads them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


@dataclass
class ConvertConfig:
    """What ``llm-ckpt convert`` was asked to do (validated here, flags named in the messages)."""

    checkpoint: Path
    to: str
    output: Path
    dtype: str = "fp32"
    shard_size: str = "5GB"
    tokenizer: Path | None = None
    model: str | None = None
    world_size: int | None = None
    force: bool = False
    adapter_only: bool = False  # the LoRA adapter alone, in peft's format (not the merged model)

    def __post_init__(self) -> None:
        self.checkpoint = Path(self.checkpoint)
        self.output = Path(self.output)
        if self.to not in TARGETS:
            raise UsageError(f"--to: {self.to!r} is not one of {', '.join(TARGETS)}")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.world_size is not None and (self.world_size < 1 or self.to != "universal"):
            raise UsageError("--world-size: needs --to universal and a value >= 1")
        if self.tokenizer is not None:
            self.tokenizer = Path(self.tokenizer)
            if not self.tokenizer.exists():
                raise InputError(f"--tokenizer: {self.tokenizer} does not exist")
            if self.to != "hf":
                raise UsageError("--tokenizer: only with --to hf")
        if not self.checkpoint.exists():
            raise InputError(f"{self.checkpoint}: no such checkpoint")
        if self.adapter_only and self.to != "hf":
            raise UsageError("--adapter-only: only with --to hf")


def resolve_checkpoint(path: str | Path, checksums: bool = True) -> Path:
    """A verified checkpoint folder from a checkpoint, a run folder or a checkpoints folder (its newest
    verified one). A folder with meta.json must verify (``checksums=False``: all but the sha256 of every
    file, for readers of structure only); a bare DeepSpeed folder (no meta.json: not ours) has nothing to
    verify against, but its pickles are still checked against the allowlist."""
    from llmtools.ckpt.verify import check, check_pickles

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such checkpoint")
    if layout.model_states_file(path).is_file():
        if (path / layout.META).exists():
            check(path, checksums=checksums)
        else:
            check_pickles(path)
            print(
                f"warning: {path}: no {layout.META} (not written by llmtools): its files cannot be checked "
                "for corruption (their pickles were checked for safety)",
                file=sys.stderr,
                flush=True,
            )
        return path
    ckpt_dir = layout.ckpt_dir_of(path)
    if ckpt_dir.is_dir() and layout.list_checkpoints(ckpt_dir):
        from llmtools.ckpt.manager import CheckpointManager

        found = CheckpointManager(ckpt_dir.parent).latest_verified()
        if found is None:
            raise InputError(f"{ckpt_dir}: no checkpoint verifies")
        return found
    raise InputError(f"{path}: not a checkpoint folder (no DeepSpeed model-states file)")


def _meta_or_none(path: Path) -> dict[str, Any] | None:
    from llmtools.ckpt.verify import read_meta

    try:
        return read_meta(path)
    except InputError:
        return None


def _dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def convert(config: ConvertConfig) -> Path:
    from llmtools.locks import lock_output

    with lock_output(config.output):  # one writer per output, from the existence check on
        return _convert(config)


def _convert(config: ConvertConfig) -> Path:
    if config.to == "universal":
        return to_universal_dir(config.checkpoint, config.output, force=config.force)
    if config.adapter_only:
        from llmtools.ckpt.lora import write_adapter

        return write_adapter(resolve_checkpoint(config.checkpoint), config.output, force=config.force)
    if config.to == "safetensors":
        return to_safetensors(config.checkpoint, config.output, dtype=config.dtype, force=config.force)
    return to_hf(
        config.checkpoint,
        config.output,
        dtype=config.dtype,
        shard_size=config.shard_size,
        tokenizer=config.tokenizer,
        model=config.model,
        force=config.force,
    )


@contextlib.contextmanager
def checkpoint_sources(checkpoint: Path, meta: dict[str, Any] | None, scratch_beside: Path) -> Iterator[dict]:
    """The fp32 parameters of a checkpoint as lazy sources: DeepSpeed's names for ours (which are the
    model's), or, for an expert-parallel run, gathered through DeepSpeed's universal form (in a scratch
    folder beside ``scratch_beside``, removed afterwards) and renamed to the model's names."""
    from llmtools.ckpt.expert_parallel import is_expert_parallel, to_model_names, universal_sources
    from llmtools.ckpt.reader import CheckpointReader
    from llmtools.ckpt.tensor_shards import degree, joined_sources

    if degree(meta) > 1:  # tensor-parallel shards, put together one parameter at a time
        with joined_sources(checkpoint, meta) as sources:  # type: ignore[arg-type]
            yield sources
        return
    if not is_expert_parallel(meta):
        with CheckpointReader(checkpoint) as reader:
            yield reader.sources(include_buffers=False)
        return
    from llmtools.ckpt.reshard import to_universal
    from llmtools.fsutil import TMP_MARK

    scratch_beside.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix=f"{scratch_beside.name}{TMP_MARK}", dir=scratch_beside.parent
    ) as tmp:
        universal = to_universal(checkpoint, Path(tmp) / "universal", int(meta["zero_stage"]))
        yield to_model_names(universal_sources(universal), str(checkpoint))


def to_safetensors(
    checkpoint: str | Path, output: str | Path, dtype: str = "fp32", force: bool = False
) -> Path:
    """One ``.safetensors`` file: the consolidated state dict (DeepSpeed's names, which are the model's;
    an expert-parallel run's under the model's names too), fp32 by default."""
    from llmtools.model.hf import _write_safetensors

    checkpoint, output = resolve_checkpoint(checkpoint), Path(output)
    check_writable([output], force)
    target = _dtype(dtype)
    with checkpoint_sources(checkpoint, _meta_or_none(checkpoint), output) as sources:
        specs = []
        for name, source in sources.items():
            out_dtype = target if source.dtype.is_floating_point else source.dtype
            numel = 1
            for size in source.shape:
                numel *= size
            specs.append((name, tuple(source.shape), out_dtype, numel * out_dtype.itemsize, source))
        with atomic_path(output) as tmp, _counted(sources) as bar:
            _write_safetensors(tmp, [(*spec[:4], _Counted(spec[4], bar)) for spec in specs])
    return output


def _model_config(meta: dict[str, Any] | None, model: str | None, checkpoint: Path):
    from llmtools.model.presets import load_model_config

    if model is not None:
        return load_model_config(model)
    if meta is None or not meta.get("model"):
        raise InputError(
            f"{checkpoint / layout.META}: no model config recorded; name one with --model PRESET|config.yaml"
        )
    try:
        return load_model_config(meta["model"])
    except InputError as error:
        raise InputError(f"{checkpoint / layout.META}[model]: {error} (name a model with --model)") from None


def _strip_prefix(names: list[str], expected: set[str]) -> str:
    """A wrapper prefix (``module.``, ``model.`` twice...) to drop so DeepSpeed's names become HF's."""
    if expected & set(names):
        return ""
    for prefix in ("module.", "_orig_mod.", "model."):
        if expected & {n.removeprefix(prefix) for n in names if n.startswith(prefix)}:
            return prefix
    return ""


def tokenizer_files(spec: Path) -> dict[str, Path]:
    """The tokenizer files to copy from a tokenizer.json / .model / vocab.json / HF folder."""
    if spec.is_dir():
        found = {name: spec / name for name in TOKENIZER_FILES if (spec / name).is_file()}
        if not found:
            raise InputError(f"--tokenizer: {spec} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})")
        return found
    if spec.name.endswith(".model"):
        return {"tokenizer.model": spec}
    if spec.suffix == ".json" and spec.name != "vocab.json":
        return {"tokenizer.json": spec}
    if spec.name == "vocab.json":
        merges = spec.with_name("merges.txt")
        if not merges.is_file():
            raise InputError(f"--tokenizer: {merges} missing beside {spec}")
        return {"vocab.json": spec, "merges.txt": merges}
    raise InputError(f"--tokenizer: {spec} is not a tokenizer.json, .model, vocab.json or tokenizer folder")


def to_hf(
    checkpoint: str | Path,
    output: str | Path,
    dtype: str = "fp32",
    shard_size: str | int = "5GB",
    tokenizer: Path | None = None,
    model: str | None = None,
    force: bool = False,
) -> Path:
    """A folder ``transformers.AutoModelForCausalLM.from_pretrained`` loads with no code of ours."""
    from llmtools.model.hf import expected_parameter_names, save_hf_folder

    checkpoint, output = resolve_checkpoint(checkpoint), Path(output)
    check_writable([output], force)
    meta = _meta_or_none(checkpoint)
    config = _model_config(meta, model, checkpoint)
    tok = (meta or {}).get("tokenizer") or {}
    extra = tokenizer_files(Path(tokenizer)) if tokenizer is not None else None
    with tempfile.TemporaryDirectory(prefix="llm-ckpt-") as scratch:
        # A generated tokenizer_config.json lives in scratch until save_hf_folder has copied it.
        if extra and "tokenizer.json" in extra and "tokenizer_config.json" not in extra:
            extra["tokenizer_config.json"] = _tokenizer_config(extra["tokenizer.json"], tok, Path(scratch))

        marker = Path(scratch) / "llmtools.json"
        marker.write_text(jsonfile.dumps(_marker(checkpoint, meta, "llmtools.hf-model"), indent=1) + "\n")
        extra = {**(extra or {}), "llmtools.json": marker}

        def write(state: dict) -> None:
            if config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            save_hf_folder(
                state,
                config,
                output,
                dtype=dtype,
                max_shard_size=shard_size,
                bos_token_id=tok.get("bos_id"),
                eos_token_id=tok.get("eod_id"),
                extra_files=extra,
                force=force,
            )

        # A LoRA checkpoint is exported as the model it stands for: W + (alpha / r) B A merged in.
        from llmtools.ckpt.lora import checkpoint_lora
        from llmtools.model.lora import merge_state

        found = checkpoint_lora(checkpoint)
        if found is not None:
            write(merge_state(found[1], found[0]))
            return output
        with checkpoint_sources(checkpoint, meta, output) as sources:
            expected = set(expected_parameter_names(config, include_tied=True))
            prefix = _strip_prefix(list(sources), expected)
            state = {name.removeprefix(prefix): src for name, src in sources.items()}
            # The config recorded at save time matches by construction; one named with --model may not.
            # (Building the model on the meta device to learn its shapes costs seconds of imports.)
            shapes = _shapes_of(config) if model is not None else {}
            for name, source in state.items():
                if name in shapes and tuple(source.shape) != shapes[name]:
                    raise InputError(
                        f"{checkpoint}[{name}]: shape {tuple(source.shape)}, the model config implies {shapes[name]}"
                    )
            if config.tie_word_embeddings:  # not written, so not counted
                state.pop("lm_head.weight", None)
            with _counted(state) as bar:
                write({name: _Counted(src, bar) for name, src in state.items()})
    return output


def _counted(sources: dict):
    """The progress of a conversion, in bytes read from the checkpoint."""
    from llmtools.progress import Progress

    return Progress(sum(_nbytes(src) for src in sources.values()), "convert", unit="B")


def _nbytes(source) -> int:
    numel = 1
    for size in source.shape:
        numel *= size
    return numel * source.dtype.itemsize


class _Counted:
    """A lazy tensor that reports its bytes to the progress when it is read."""

    def __init__(self, source, bar) -> None:
        self.source, self.bar = source, bar
        self.shape, self.dtype = source.shape, source.dtype

    def load(self):
        tensor = self.source.load()
        self.bar.update(_nbytes(self))
        return tensor


class _CountedWriter:
    """A binary file that reports the bytes written through it to a progress (torch.save's target)."""

    def __init__(self, handle, bar) -> None:
        self.handle, self.bar = handle, bar

    def write(self, data) -> int:
        written = self.handle.write(data)
        self.bar.update(written)
        return written

    def flush(self) -> None:
        self.handle.flush()


def _marker(checkpoint: Path, meta: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """``llmtools.json`` of a converted folder: what it came from (and the mark --force looks for)."""
    from llmtools import __version__

    carried = {
        k: (meta or {}).get(k) for k in ("step", "consumed_samples", "consumed_tokens", "model", "tokenizer")
    }
    return {"format": kind, "tool": f"llmtools {__version__}", "source": str(checkpoint), **carried}


def _tokenizer_config(tokenizer_json: Path, identity: dict[str, Any], scratch: Path) -> Path:
    """A tokenizer_config.json so ``AutoTokenizer.from_pretrained(DIR)`` loads a bare tokenizer.json."""
    from tokenizers import Tokenizer

    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises its own exception type
        raise InputError(f"--tokenizer: {tokenizer_json} is not a tokenizers JSON file ({error})") from None
    for key, field in (("eos_token", "eod_id"), ("bos_token", "bos_id")):
        token_id = identity.get(field)
        if token_id is not None and tok.id_to_token(token_id) is not None:
            config[key] = tok.id_to_token(token_id)
    path = scratch / "tokenizer_config.json"
    path.write_text(jsonfile.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def _shapes_of(config) -> dict[str, tuple[int, ...]]:
    """Parameter shapes the model config implies (built on the meta device: no memory)."""
    import torch

    from llmtools.model import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}


def to_universal_dir(checkpoint: str | Path, output: str | Path, force: bool = False) -> Path:
    """DeepSpeed's universal checkpoint (any world size loads it with ``load_universal``)."""
    from llmtools.ckpt.reshard import to_universal

    checkpoint, output = resolve_checkpoint(checkpoint), Path(output)
    meta = _meta_or_none(checkpoint)
    if meta is not None and int(meta["zero_stage"]) == 0:
        raise UsageError(
            f"{checkpoint}: a ZeRO-0 checkpoint is not partitioned; any world size loads it as it is"
        )
    with atomic_dir(output, force=force) as tmp:
        # ds_to_universal wants to create its output itself, and writes latest_universal beside it.
        inner = tmp / "universal"
        to_universal(checkpoint, inner, int(meta["zero_stage"]) if meta else 2)
        for child in inner.iterdir():
            os.replace(child, tmp / child.name)
        inner.rmdir()
        (tmp / "latest_universal").unlink(missing_ok=True)
        marker = _marker(checkpoint, meta, "llmtools.universal-checkpoint")
        (tmp / "llmtools.json").write_text(jsonfile.dumps(marker, indent=1) + "\n", encoding="utf-8")
    return output


def import_hf(hf_dir: str | Path, output: str | Path, force: bool = False) -> Path:
    """A Hugging Face Llama/Qwen3 folder as a step-0, weights-only checkpoint folder.

    The folder has DeepSpeed's ZeRO-0 layout (``mp_rank_00_model_states.pt`` with the module state
    dict) and a meta.json with ``init_only: true``: ``llm-train --resume PATH`` (or
    :meth:`CheckpointManager.load`) loads the weights into an engine of any ZeRO stage and world size
    and starts the optimizer fresh.
    """
    from llmtools.locks import lock_output

    hf_dir, output = Path(hf_dir), Path(output)
    with lock_output(output):  # one writer per output, from the existence check on
        return _import_hf(hf_dir, output, force)


def _import_hf(hf_dir: Path, output: Path, force: bool) -> Path:
    from llmtools.thirdparty import import_deepspeed

    deepspeed = import_deepspeed()
    import torch

    from llmtools.ckpt.verify import file_manifest
    from llmtools.model.hf import load_hf_model, weight_files_size
    from llmtools.progress import Progress

    # Three passes over the weights, each with its own bar: read, write, hash.
    with Progress(weight_files_size(hf_dir), "import-hf: read", unit="B") as bar:
        model = load_hf_model(hf_dir, progress=bar, load_pt=lambda path: safeload.load(path, mmap=True))
    config = model.config
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shapes = {name: list(t.shape) for name, t in state.items()}
    with atomic_dir(output, force=force) as tmp:
        from collections import OrderedDict

        blob = {
            "module": state,
            "buffer_names": [],
            "param_shapes": [OrderedDict((n, torch.Size(s)) for n, s in shapes.items())],
            "shared_params": {"lm_head.weight": "model.embed_tokens.weight"}
            if config.tie_word_embeddings
            else {},
            "frozen_param_shapes": None,
            "frozen_param_fragments": None,
            "optimizer": None,
            "lr_scheduler": None,
            "sparse_tensor_module_names": set(),
            "skipped_steps": 0,
            "global_steps": 0,
            "global_samples": 0,
            "dp_world_size": 1,
            "mp_world_size": 1,
            "ds_config": {},
            "ds_version": deepspeed.__version__,
            "step": 0,
            "consumed_samples": 0,
            "consumed_tokens": 0,
            "model": config.to_dict(),
            "tokenizer": None,
        }
        written = tmp / "mp_rank_00_model_states.pt"
        with Progress(sum(_nbytes(t) for t in state.values()), "import-hf: write", unit="B") as bar:
            with open(written, "wb") as handle:
                torch.save(blob, _CountedWriter(handle, bar))
        del blob
        with Progress(written.stat().st_size, "import-hf: sha256", unit="B") as bar:
            files = file_manifest(tmp, progress=bar)
        meta = {
            **layout.meta_header(0, layout.step_name(0)),
            "consumed_samples": 0,
            "consumed_tokens": 0,
            "data": {"consumed_samples": 0, "fingerprint": None},
            "config_hash": None,
            "model": config.to_dict(),
            "tokenizer": None,
            "world_size": 1,
            "dp_world_size": 1,
            "zero_stage": 0,
            "precision": "fp32",
            "rng": {"kinds": [], "files": []},
            "param_shapes": shapes,
            "num_parameters": config.num_parameters(),
            "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0]},
            "init_only": True,
            "source": str(hf_dir),
            "files": files,
            "complete": True,
        }
        (tmp / layout.META).write_text(jsonfile.dumps(meta, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(output / "__pycache__", ignore_errors=True)
    return output
