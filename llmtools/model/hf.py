"""Hugging Face interop: ``config.json`` both ways, safetensors folders in and out.

Because :class:`~llmtools.model.llama.LlamaForCausalLM` uses Hugging Face's parameter names, a
folder written by ``transformers``' ``save_pretrained`` loads with no renaming, and the folders
written here load with ``AutoModelForCausalLM.from_pretrained``.

:func:`save_hf_folder` streams: tensors are written one at a time straight into the shard files
(it writes the safetensors header itself, from shapes known in advance), so converting a checkpoint
never holds more than one tensor beyond what the caller already holds. Values may be
:class:`TensorSource` objects that load their tensor only when it is written.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.fsutil import atomic_dir, inside
from llmtools.model.config import ModelConfig, shape_mismatch
from llmtools.model.hf_config import from_hf_config, read_hf_config, to_hf_config
from llmtools.model.hf_layout import parameter_names, to_memory_layout, to_saved_layout

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
}
DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
DEFAULT_SHARD_SIZE = 5 * 10**9  # "5GB", transformers 4.x save_pretrained's default
# Buffers some older checkpoints carry; they are recomputed, never loaded.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# ---- names -------------------------------------------------------------------------------------------


def expected_parameter_names(config: ModelConfig, include_tied: bool = False) -> list[str]:
    """Hugging Face's parameter names for this shape (transformers 5's in-memory names, which are
    ours), in state-dict order. ``lm_head.weight`` is left out when tied unless ``include_tied``.

    A saved folder of a MoE model names its experts one by one instead: :mod:`llmtools.model.hf_layout`.
    """
    return parameter_names(config, include_tied)


# ---- loading -----------------------------------------------------------------------------------------


def load_hf_state_dict(
    folder: str | os.PathLike, dtype: str | torch.dtype | None = None, progress=None, load_pt=None
) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face model folder: ``model.safetensors``, sharded safetensors with
    ``model.safetensors.index.json``, or (older folders) ``pytorch_model.bin`` (+ index).

    ``progress`` (a :class:`llmtools.progress.Progress`, in bytes) is told each tensor as it is read;
    :func:`weight_files_size` is its total. ``load_pt(path)``: how a ``.bin`` (a ``torch.save`` zip) is
    read — the checkpoint layer passes its checked loader, so torch never parses an untrusted archive;
    without it, ``torch.load(weights_only=True)``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder")
    target = _as_dtype(dtype) if dtype is not None else None
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(folder):
        for name, tensor in _read_weight_file(path, load_pt):
            if progress is not None:
                progress.update(tensor.nbytes)
            if name.endswith(IGNORED_SUFFIXES):
                continue
            if name in state:
                raise InputError(f"{path}[{name}]: tensor appears in two weight files")
            state[name] = tensor.to(target) if target is not None and tensor.is_floating_point() else tensor
    return state


def weight_files_size(folder: str | os.PathLike) -> int:
    """The bytes of a Hugging Face folder's weight files (the total of a load's progress)."""
    return sum(path.stat().st_size for path in _weight_files(Path(folder)))


def _read_weight_file(path: Path, load_pt=None) -> Iterable[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of one weight file, one tensor at a time for safetensors."""
    from safetensors import SafetensorError, safe_open

    try:
        if path.suffix == ".safetensors":
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                    yield name, handle.get_tensor(name)
            return
        if load_pt is not None:
            part = load_pt(path)
        else:
            part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (SafetensorError, OSError, RuntimeError, pickle.UnpicklingError) as error:
        # pickle: torch's weights-only loader refused a global (only tensors may be in weights)
        raise InputError(f"{path}: cannot read weights ({str(error).strip().splitlines()[0]})") from None
    if not isinstance(part, dict):
        raise InputError(f"{path}: not a state dict of tensors (a {type(part).__name__})")
    yield from part.items()


def _weight_files(folder: Path) -> list[Path]:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                weight_map = jsonfile.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise InputError(f"{index}[weight_map]: not a valid shard index ({error})") from None
            if not isinstance(weight_map, dict):
                raise InputError(f"{index}[weight_map]: not an object of tensor name -> file")
            # Names read from a file: each must stay inside the folder (no /abs, no .., no symlink out).
            files = [
                inside(folder, name, f"{index}[weight_map]") for name in dict.fromkeys(weight_map.values())
            ]
            for path in files:
                if not path.is_file():
                    raise InputError(f"{index}: names shard {path.name}, which is missing")
            return files
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise InputError(f"{folder}: no model.safetensors, shard index or pytorch_model.bin")


def load_state_dict_into(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str, assign: bool = False
) -> None:
    """``model.load_state_dict`` with errors that name the source and the tensor, and tied
    embeddings handled (a checkpoint may or may not carry ``lm_head.weight``). A MoE folder's experts
    may be saved one by one (``save_pretrained``'s layout) or fused (ours, transformers 5 in memory)."""
    config: ModelConfig = model.config
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
    state = to_memory_layout(state, config, source)
    expected = expected_parameter_names(config, include_tied=True)
    wanted = set(expected)
    for name in state:
        if name not in wanted:
            raise InputError(f"{source}[{name}]: unexpected tensor for this model shape")
    if config.tie_word_embeddings and "lm_head.weight" in state and "model.embed_tokens.weight" in state:
        if not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
            raise InputError(f"{source}[lm_head.weight]: differs from the embedding but the config ties them")
    own = dict(model.named_parameters(remove_duplicate=False))
    for name in expected:
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name not in state:
            raise InputError(f"{source}[{name}]: missing")
        if tuple(state[name].shape) != tuple(own[name].shape):
            raise InputError(
                f"{source}[{name}]: shape {tuple(state[name].shape)}, the model expects "
                f"{tuple(own[name].shape)}"
            )
    state = {k: v for k, v in state.items() if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    model.load_state_dict(state, strict=False, assign=assign)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def load_hf_model(folder: str | os.PathLike, dtype: str | torch.dtype | None = None, progress=None, load_pt=None):
    """A :class:`LlamaForCausalLM` with the config and weights of a Hugging Face folder.

    Built on the meta device and filled by assignment, so the weights are held once.
    """
    from llmtools.model.llama import LlamaForCausalLM

    folder = Path(folder)
    config = from_hf_config(read_hf_config(folder), source=str(folder / "config.json"))
    state = load_hf_state_dict(folder, dtype=dtype, progress=progress, load_pt=load_pt)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    load_state_dict_into(model, state, str(folder), assign=True)
    return model


def load_hf_weights(model: torch.nn.Module, folder: str | os.PathLike, load_pt=None) -> None:
    """Copy a Hugging Face folder's weights into an existing model (``--init-from``), after checking
    that the folder's config describes the same shape."""
    folder = Path(folder)
    theirs = from_hf_config(read_hf_config(folder), source=str(folder / "config.json"))
    check_same_shape(model.config, theirs, str(folder / "config.json"))
    state = load_hf_state_dict(folder, load_pt=load_pt)
    with torch.no_grad():
        load_state_dict_into(model, state, str(folder))


def check_same_shape(ours: ModelConfig, theirs: ModelConfig, source: str) -> None:
    mismatch = shape_mismatch(ours, theirs)
    if mismatch:
        name, mine, other = mismatch
        raise InputError(f"{source}[{name}]: {other!r} but the model config has {mine!r}")


# ---- saving ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSource:
    """A tensor known by shape and dtype, loaded only when :func:`save_hf_folder` writes it.

    Any object with ``shape``, ``dtype`` and ``load()`` is accepted in its place (duck typing), so a
    checkpoint reader can hand over its own lazy tensors.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]


def save_hf_folder(
    state: Mapping[str, torch.Tensor | TensorSource] | torch.nn.Module,
    config: ModelConfig,
    folder: str | os.PathLike,
    *,
    dtype: str | torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    extra_files: Mapping[str, str | os.PathLike] | Iterable[str | os.PathLike] | None = None,
    force: bool = False,
) -> Path:
    """Write a folder that ``AutoModelForCausalLM.from_pretrained`` loads: config.json,
    generation_config.json, model.safetensors (or shards of at most ``max_shard_size`` bytes with
    model.safetensors.index.json), and ``extra_files`` (e.g. tokenizer.json) copied in.

    ``state`` uses the model's names (a module is taken by its state_dict); a tied ``lm_head.weight``
    is dropped; a MoE model's fused experts are written one tensor per expert, as transformers'
    ``save_pretrained`` writes them. ``dtype`` casts floating tensors (None keeps each as it is). The
    folder appears only when complete; an existing one is replaced only with ``force``.
    """
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    names = expected_parameter_names(config)
    missing = [n for n in names if n not in state]
    if missing:
        raise InputError(
            f"save_hf_folder: tensor {missing[0]!r} missing from the state dict "
            f"({len(missing)} missing in all)"
        )
    extra = sorted(
        set(state) - set(names) - {"lm_head.weight"} - {k for k in state if k.endswith(IGNORED_SUFFIXES)}
    )
    if extra:
        raise InputError(f"save_hf_folder: unexpected tensor {extra[0]!r} for this model shape")
    target = _as_dtype(dtype) if dtype is not None else None
    saved = to_saved_layout({name: state[name] for name in names}, config)
    specs = []
    for name, value in saved.items():
        shape = tuple(value.shape)
        src_dtype = value.dtype
        out_dtype = target if target is not None and src_dtype.is_floating_point else src_dtype
        if out_dtype not in SAFETENSORS_DTYPES:
            raise InputError(f"save_hf_folder[{name}]: dtype {out_dtype} cannot be written")
        nbytes = _numel(shape) * out_dtype.itemsize
        specs.append((name, shape, out_dtype, nbytes, value))
    limit = _parse_size(max_shard_size)
    shards: list[list[tuple]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec[3] > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec[3]
    config_dtype = target or specs[0][2]

    folder = Path(folder)
    with atomic_dir(folder, force=force) as tmp:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            file = (
                "model.safetensors"
                if len(shards) == 1
                else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            )
            write_safetensors(tmp / file, shard)
            weight_map.update({spec[0]: file for spec in shard})
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(s[3] for s in specs)}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(
                jsonfile.dumps(index, indent=2) + "\n", encoding="utf-8"
            )
        hf_config = to_hf_config(
            config, dtype=config_dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id
        )
        (tmp / "config.json").write_text(jsonfile.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
        generation = {"_from_model_config": True, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
        (tmp / "generation_config.json").write_text(
            jsonfile.dumps({k: v for k, v in generation.items() if v is not None}, indent=2) + "\n",
            encoding="utf-8",
        )
        for name, path in _extra_items(extra_files):
            path = Path(path)
            if not path.is_file():
                raise InputError(f"{path}: extra file to copy into the model folder is missing")
            shutil.copyfile(path, tmp / name)
    return folder


def write_safetensors(path: Path, shard: list[tuple]) -> None:
    """Write one safetensors file from ``(name, shape, dtype, nbytes, tensor_or_source)`` specs.

    Header from the planned shapes, then each tensor's bytes as it is loaded (the safetensors
    layout: u64 little-endian header length, JSON header padded to 8 bytes, contiguous data)."""
    # "producer" lets llmtools recognise its own files (what --force may replace); loaders ignore it.
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "producer": "llmtools"}}
    offset = 0
    for name, shape, dtype, nbytes, _ in shard:
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = jsonfile.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for name, shape, dtype, nbytes, value in shard:
            # Anything with shape/dtype/load() streams (TensorSource, or a checkpoint reader's own type).
            tensor = value if isinstance(value, torch.Tensor) else value.load()
            if tuple(tensor.shape) != shape:
                raise InputError(
                    f"save_hf_folder[{name}]: loaded shape {tuple(tensor.shape)}, announced {shape}"
                )
            tensor = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
            data = tensor.reshape(-1).view(torch.uint8).numpy()  # raw bytes; the machine is little-endian
            if data.nbytes != nbytes:
                raise InputError(f"save_hf_folder[{name}]: {data.nbytes} bytes, expected {nbytes}")
            handle.write(memoryview(data))
            del tensor, data
        handle.flush()
        os.fsync(handle.fileno())


_write_safetensors = write_safetensors  # the name llmtools.ckpt.convert imported first


def _extra_items(extra_files) -> list[tuple[str, Path]]:
    if not extra_files:
        return []
    if isinstance(extra_files, Mapping):
        return [(str(k), Path(v)) for k, v in extra_files.items()]
    return [(Path(p).name, Path(p)) for p in extra_files]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _parse_size(size: int | str) -> int:
    """Bytes from an int or a string like ``"5GB"``, ``"500MB"``, ``"2GiB"``."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        text = str(size).strip().upper().replace(" ", "")
        units = {
            "KIB": 1024,
            "MIB": 1024**2,
            "GIB": 1024**3,
            "TIB": 1024**4,
            "KB": 10**3,
            "MB": 10**6,
            "GB": 10**9,
            "TB": 10**12,
            "B": 1,
        }
        number, factor = text, 1
        for unit, scale in units.items():
            if text.endswith(unit):
                number, factor = text[: -len(unit)], scale
                break
        try:
            value = int(float(number) * factor)
        except ValueError:
            raise InputError(f"--shard-size: {size!r} is not a size (e.g. 5GB, 500MB, 2GiB)") from None
    if value <= 0:
        raise InputError(f"--shard-size: must be positive, got {size!r}")
    return value


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise InputError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPE_NAMES)}")


__all__ = [
    "to_hf_config",
    "from_hf_config",
    "read_hf_config",
    "load_hf_state_dict",
    "load_hf_model",
    "weight_files_size",
    "load_hf_weights",
    "load_state_dict_into",
    "save_hf_folder",
    "TensorSource",
    "write_safetensors",
    "expected_parameter_names",
    "check_same_shape",
]
