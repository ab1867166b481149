"""Megatron-LM's tokenizer flags (``--tokenizer-type`` and friends) -> the tokenizer it would build, offline.

``tools/preprocess_data.py`` has had two tokenizer systems, and they give different ids for the same
files. Both are reproduced and tested against megatron-core's own code where it is installable:

* **megatron-core's** (``megatron/core/tokenizers``; the default of ``preprocess_data.py`` from
  core_v0.15.0 to core_v0.16.1, and the only one after): a Hugging Face tokenizer is called as
  ``tokenize(text)`` + ``convert_tokens_to_ids`` -- special-token strings in the text become their ids,
  but no BOS/EOS is added (``--tokenizer-hf-include-special-tokens`` adds them: ``tokenizer(text)``);
  ``GPT2BPETokenizer`` is transformers' GPT-2 tokenizer (``<|endoftext|>`` in the text becomes 50256);
  every SentencePiece type (``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer``,
  ``Llama2Tokenizer``) is ``encode_as_ids(text)``, no BOS; ``TikTokenizer`` splits special tokens out.
* the **legacy** one (``--legacy-tokenizer``; the only one up to core_v0.14 and in Megatron-DeepSpeed):
  ``GPT2BPETokenizer`` is OpenAI's original BPE code (``<|endoftext|>`` in the text is ordinary text);
  ``HuggingFaceTokenizer`` is ``tokenizer(text).input_ids`` (BOS/EOS added by the post-processor);
  ``Llama2Tokenizer`` prepends BOS; ``GPTSentencePieceTokenizer`` is ``encode_as_ids``;
  ``TikTokenizer`` encodes everything as ordinary text.

What cannot be honoured is refused with the reason, never approximated: tokenizers that would be
downloaded (a hub name, GPT-2 files not given), code from a tokenizer folder (``--trust-remote-code``),
BERT and multimodal tokenizers, metadata files naming a class to import.

Known difference: megatron-core loads Hugging Face tokenizers with ``use_fast=False`` unless
``--tokenizer-hf-use-fast``; the slow (Python) and fast (Rust) classes of one tokenizer give the same
ids for the tokenizers tested here, and llmtools always uses the fast one. For ``GPT2BPETokenizer``
megatron-core ignores ``--merge-file`` and takes GPT-2's merges from the ``gpt2`` hub repository; the
files given here are used as given (the same thing for GPT-2's own files).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmtools.errors import InputError, UsageError
from llmtools.tokenize import loader
from llmtools.tokenize.base import Tokenizer
from llmtools.tokenize.spm import SentencePieceTokenizer
from llmtools.tokenize.tiktoken_megatron import MegatronTikTokenizer

CORE_SYSTEM = (
    "megatron-core tokenizers (preprocess_data.py default in core_v0.15.0-core_v0.16.1; tested with 0.16.1)"
)
LEGACY_SYSTEM = "Megatron-LM legacy tokenizers (--legacy-tokenizer; the only system up to core_v0.14)"

SUPPORTED = (
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
)
REFUSED = {
    "BertWordPieceLowerCase": "BERT WordPiece tokenizers (encoder models) are not supported",
    "BertWordPieceCase": "BERT WordPiece tokenizers (encoder models) are not supported",
    "MultimodalTokenizer": "multimodal tokenizers are not supported",
    "NullMultimodalTokenizer": "multimodal tokenizers are not supported",
    "NullTokenizer": "the NullTokenizer (space-separated ids, for synthetic benchmarks) is not supported",
    "SFTTokenizer": "SFT prompt formats are not supported here; use llm-prep sft",
}
TOKENIZER_TYPES = SUPPORTED + tuple(REFUSED)


@dataclass
class MegatronTokenizerArgs:
    """Megatron's tokenizer flags, checked; :func:`load_megatron_tokenizer` builds the tokenizer."""

    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    legacy: bool = False
    """--legacy-tokenizer"""
    hf_include_special_tokens: bool = False
    """--tokenizer-hf-include-special-tokens"""
    special_tokens: tuple[str, ...] = ()
    """--tokenizer-special-tokens"""
    sentencepiece_legacy: bool = False
    """--tokenizer-sentencepiece-legacy"""
    tiktoken_pattern: str | None = None
    tiktoken_num_special_tokens: int = 1000
    vocab_size: int | None = None
    """--vocab-size (TikTokenizer only; Megatron ignores it for the others when preparing data)"""
    notes: list[str] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        self.special_tokens = tuple(self.special_tokens or ())
        kind = self.tokenizer_type
        if kind in REFUSED:
            raise UsageError(f"--tokenizer-type {kind}: {REFUSED[kind]}")
        if kind not in SUPPORTED:
            raise UsageError(
                f"--tokenizer-type: unknown type {kind!r} (Megatron's choices: {', '.join(TOKENIZER_TYPES)})"
            )
        if kind == "GPT2BPETokenizer":
            if not self.vocab_file or not self.merge_file:
                raise UsageError(
                    "--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file (without them Megatron "
                    "downloads GPT-2's; nothing is downloaded here)"
                )
        elif not self.tokenizer_model:
            raise UsageError(f"--tokenizer-type {kind} needs --tokenizer-model")
        elif kind == "HuggingFaceTokenizer" and (self.vocab_file or self.merge_file):
            raise UsageError(
                "--vocab-file/--merge-file with HuggingFaceTokenizer (overriding a folder's files) is not "
                "supported; give a folder with its own files as --tokenizer-model"
            )
        if kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
            if self.legacy and kind == "SentencePieceTokenizer":
                raise UsageError(
                    "--legacy-tokenizer with SentencePieceTokenizer (the BERT/T5 wrapper that adds <CLS>, <SEP>, "
                    "<EOD>, <MASK> to the vocabulary) is not supported; GPTSentencePieceTokenizer and "
                    "Llama2Tokenizer are"
                )
            if self.special_tokens and not self.legacy:
                if not self.sentencepiece_legacy:
                    raise UsageError(
                        "--tokenizer-special-tokens with a SentencePiece tokenizer needs "
                        "--tokenizer-sentencepiece-legacy in Megatron (it raises otherwise)"
                    )
                raise UsageError(
                    "--tokenizer-special-tokens with --tokenizer-sentencepiece-legacy (special tokens added to a "
                    "SentencePiece model by Megatron's wrapper) is not supported"
                )
        if kind == "TikTokenizer":
            if self.tiktoken_pattern is None and self.legacy:
                raise UsageError(
                    "--tiktoken-pattern v1|v2 is required with --legacy-tokenizer (as Megatron's is)"
                )
            if self.tiktoken_pattern not in (None, "v1", "v2"):
                raise UsageError(f"--tiktoken-pattern: expected v1 or v2, got {self.tiktoken_pattern!r}")
        if self.special_tokens and self.legacy and kind in ("GPT2BPETokenizer", "HuggingFaceTokenizer"):
            self.notes.append("--tokenizer-special-tokens is ignored, as Megatron's legacy system ignores it")
        if self.hf_include_special_tokens and (kind != "HuggingFaceTokenizer" or self.legacy):
            self.notes.append(
                "--tokenizer-hf-include-special-tokens changes nothing here "
                + ("(the legacy system always adds them)" if self.legacy else f"for {kind}")
            )

    @property
    def system(self) -> str:
        return LEGACY_SYSTEM if self.legacy else CORE_SYSTEM

    def record(self) -> dict:
        """What the sidecar says: the flags that decided the ids, and which Megatron behaviour they select."""
        record = {
            "tokenizer_type": self.tokenizer_type,
            "legacy_tokenizer": self.legacy,
            "reproduces": self.system,
        }
        if self.tokenizer_type == "HuggingFaceTokenizer":
            record["include_special_tokens"] = self.legacy or self.hf_include_special_tokens
        if self.special_tokens:
            record["special_tokens"] = list(self.special_tokens)
        if self.tokenizer_type == "TikTokenizer":
            record.update(
                pattern=self.tiktoken_pattern or "v2",
                num_special_tokens=self.tiktoken_num_special_tokens,
                vocab_size=self.vocab_size,
            )
        return record


def load_megatron_tokenizer(
    args: MegatronTokenizerArgs, backend: str = "auto", defer_probe: bool = False
) -> Tokenizer:
    """The tokenizer ``tools/preprocess_data.py`` builds from these flags, giving the same ids."""
    kind = args.tokenizer_type
    if kind == "GPT2BPETokenizer":
        vocab, merges = _existing(args.vocab_file, "--vocab-file"), _existing(args.merge_file, "--merge-file")
        extra = () if args.legacy else args.special_tokens
        # megatron-core: transformers' GPT-2 tokenizer (special strings -> ids); legacy: OpenAI's code (plain)
        tok = loader._load_gpt2(
            vocab,
            backend,
            "plain" if args.legacy else "auto",
            defer_probe,
            merges=merges,
            extra_special=extra,
        )
    elif kind == "HuggingFaceTokenizer":
        folder = Path(args.tokenizer_model)
        if not folder.is_dir():
            if folder.exists():
                raise InputError(
                    f"--tokenizer-model {folder}: HuggingFaceTokenizer takes a tokenizer folder (AutoTokenizer), "
                    "not a file"
                )
            raise InputError(
                f"--tokenizer-model {folder}: no such folder; a hub name would be downloaded, and nothing is "
                "downloaded here (fetch it first, e.g. hf download NAME --local-dir DIR)"
            )
        if not (folder / "tokenizer.json").exists():
            raise InputError(f"{folder}: no tokenizer.json (only fast tokenizers' folders are supported)")
        include = args.legacy or args.hf_include_special_tokens
        extra = () if args.legacy else args.special_tokens
        tok = loader._load_hf_folder(
            folder, backend, "auto", defer_probe, add_special_tokens=include, extra_special=extra
        )
        if tok.eod_id is None and not args.legacy:
            tok.eod_id = _sep_id(folder)  # megatron-core makes the SEP token the EOS when there is no EOS
    elif kind == "TikTokenizer":
        path = _existing(args.tokenizer_model, "--tokenizer-model")
        params = json.dumps(
            {
                "legacy": args.legacy,
                "pattern": args.tiktoken_pattern,
                "vocab_size": args.vocab_size,
                "num_special_tokens": args.tiktoken_num_special_tokens,
                "special_tokens": list(args.special_tokens),
            },
            sort_keys=True,
        )
        digest = hashlib.sha256((loader.file_sha256([path]) + params).encode()).hexdigest()
        tok = MegatronTikTokenizer(
            path,
            hash=f"sha256:{digest}",
            legacy=args.legacy,
            pattern=args.tiktoken_pattern,
            vocab_size=args.vocab_size,
            num_special_tokens=args.tiktoken_num_special_tokens,
            special_tokens=args.special_tokens or None,
        )
    else:  # the SentencePiece types
        path = _existing(args.tokenizer_model, "--tokenizer-model")
        bos = args.legacy and kind == "Llama2Tokenizer"  # the legacy Llama-2 wrapper prepends BOS
        try:
            tok = SentencePieceTokenizer(
                path, source=str(path), hash=loader.file_sha256([path]), policy="plain", add_bos=bos
            )
        except (RuntimeError, OSError) as error:
            raise InputError(f"{path}: cannot load as a SentencePiece model ({error})") from None
    tok.rebuild = (load_megatron_tokenizer, (args, backend))
    return tok


def _existing(path: str | None, flag: str) -> Path:
    if not path or not Path(path).is_file():
        raise InputError(f"{flag} {path}: no such file")
    return Path(path)


def _sep_id(folder: Path) -> int | None:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True).sep_token_id
    except Exception:  # noqa: BLE001 - no transformers, or not loadable: no EOD then
        return None
