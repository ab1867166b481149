"""The SFT data path of the training loop (``task: sft`` in the train config).

``data.prefixes`` names ONE prefix written by ``llm-prep sft`` (``PREFIX_input_ids_document`` ...) and
``data.seq_length`` the tokens per sample. Samples are the prep's documents (one conversation, or one
packed sequence with ``--pack``), visited in a seeded random order, epoch after epoch as the run needs.
The loss is the next-token cross-entropy where the loss mask is 1 (assistant tokens), averaged over
those tokens of the micro-batch. Packed sequences pass their segment ids and restarting position ids
to the model, which then attends only within each sample.

No torch at import time (the train config imports :func:`check_task`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmtools.errors import InputError

TASKS = ("pretrain", "sft")


def check_task(value, where: str) -> str:
    if value not in TASKS:
        raise InputError(f"{where}: task: {value!r} is not one of {', '.join(TASKS)}")
    return value


class SftTrainData:
    """``num_samples`` samples over an SFT prefix: ``batch(indices)`` -> the arrays of SftDataset.batch."""

    def __init__(self, prefix: str, seq_length: int, num_samples: int, seed: int = 1234) -> None:
        from llmtools.data.sft_dataset import SftDataset
        from llmtools.formats.sidecar import read_sidecar

        self.dataset = SftDataset(prefix)
        if len(self.dataset) == 0:
            raise InputError(f"{prefix}_input_ids_document: holds no samples")
        self.prefix, self.seq_length, self.num_samples, self.seed = (
            prefix,
            int(seq_length),
            int(num_samples),
            seed,
        )
        sidecar = read_sidecar(f"{prefix}_input_ids_document")
        self.tokenizer = (sidecar or {}).get("tokenizer")
        self.vocab_size = (self.tokenizer or {}).get("vocab_size")
        self._epochs: dict[int, np.ndarray] = {}

    @property
    def packed(self) -> bool:
        return self.dataset.packed

    def __len__(self) -> int:
        return self.num_samples

    def document_of(self, i: int) -> int:
        """Sample ``i`` -> document: a fresh seeded permutation per epoch (same on every rank)."""
        n = len(self.dataset)
        epoch, offset = divmod(int(i), n)
        order = self._epochs.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            self._epochs[epoch] = order
        return int(order[offset])

    def batch(self, indices) -> dict[str, np.ndarray]:
        return self.dataset.batch([self.document_of(i) for i in indices], self.seq_length)


def open_sft_data(config, num_samples: int) -> SftTrainData:
    """The SFT training data of a train config (``task: sft``), checked with file and key named."""
    where = config.source or "<train config>"
    data = config.data
    if data.mix is not None or len(data.prefixes) != 1:
        raise InputError(
            f"{where}: data: task sft reads one prefix written by llm-prep sft: "
            "data.prefixes: [PREFIX] and data.seq_length (no data.mix)"
        )
    return SftTrainData(data.prefixes[0], int(data.seq_length), num_samples, seed=data.seed)


def masked_loss(logits, labels, loss_mask):
    """``sum(ce * mask) / sum(mask)`` in fp32 (0 when the micro-batch has no masked-in token)."""
    import torch.nn.functional as F

    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    mask = loss_mask.flatten().to(ce.dtype)
    return (ce * mask).sum() / mask.sum().clamp(min=1.0)


def to_tensors(batch: dict[str, np.ndarray], device, packed: bool) -> dict:
    import torch

    def t(name):
        return torch.from_numpy(np.ascontiguousarray(batch[name])).to(device=device, dtype=torch.long)

    out = {"tokens": t("tokens"), "labels": t("labels"), "loss_mask": t("loss_mask")}
    if packed:  # unpacked rows are one sample each: plain causal attention, default positions
        out["position_ids"], out["segment_ids"] = t("position_ids"), t("segment_ids")
    return out


def micro_batch_loss(model, batch: dict[str, np.ndarray], device, packed: bool):
    """The masked loss of one micro-batch through ``model`` (a module or a DeepSpeed engine)."""
    b = to_tensors(batch, device, packed)
    kwargs = {"position_ids": b["position_ids"], "segment_ids": b["segment_ids"]} if packed else {}
    logits = model(b["tokens"], **kwargs)
    return masked_loss(logits, b["labels"], b["loss_mask"])


# -- model.init_from one of our checkpoints ---------------------------------------------------------
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


def load_init_weights(model, spec: str) -> None:
    """Copy ``init_from``'s weights into ``model``: a Hugging Face folder, or one of our checkpoints
    (any ZeRO stage; a LoRA checkpoint with its adapters merged into the base)."""
    path = init_checkpoint(spec)
    if path is None:
        from llmtools.model.hf import load_hf_weights

        load_hf_weights(model, spec)
        return
    import torch

    from llmtools.model.hf import load_state_dict_into
    from llmtools.model.lora import checkpoint_weights

    with torch.no_grad():
        load_state_dict_into(model, checkpoint_weights(path), str(path))
