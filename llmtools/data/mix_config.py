"""What llm-mix is asked for: a :class:`MixConfig` of :class:`Blend` s, each checked as it is made.

Every error is a one-line :class:`~llmtools.errors.UsageError` naming the flag at fault; the planner
(:mod:`llmtools.data.mix`) takes a config that is already consistent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtools.data.blend import DEFAULT_SURPLUS, check_weights
from llmtools.data.splits import DEFAULT_SPLIT, SPLITS, parse_split
from llmtools.data.stages import StageSpec, resolve_ranges
from llmtools.errors import UsageError
from llmtools.formats.mix import MIN_SEQ_LENGTH

MEGATRON_SEMANTICS = (
    "megatron-core 0.16 (core_v0.16.1): per-dataset samples ceil(ceil(size*w)*(1+surplus)), "
    "blend length sum(ceil(size*w)) (the 2025-02 and later surplus)"
)


DEFAULT_SEED = 1234


DEFAULT_MAX_EPOCHS = 4.0


@dataclass
class Blend:
    """One blend: prefixes and their weights (None = weigh by size, as Megatron does)."""

    prefixes: list[str]
    weights: list[float] | None = None
    flag: str = field(default="--weights", compare=False, repr=False)  # named in error messages

    def __post_init__(self) -> None:
        if not self.prefixes:
            raise UsageError("no data: give at least one PREFIX (or --data-path)")
        if self.weights is not None:
            if len(self.weights) != len(self.prefixes):
                raise UsageError(
                    f"{self.flag}: {len(self.weights)} weight(s) for {len(self.prefixes)} source(s); "
                    "give one weight per PREFIX"
                )
            self.weights = check_weights(self.weights, self.flag)


@dataclass
class MixConfig:
    """What llm-mix is asked for; checks itself and names the flag at fault."""

    blend: Blend | None
    seq_length: int
    num_samples: int | None = None
    tokens: int | None = None
    valid_samples: int = 0
    test_samples: int = 0
    seed: int = DEFAULT_SEED
    split: str = DEFAULT_SPLIT
    blend_per_split: dict[str, Blend] | None = None
    surplus: float = DEFAULT_SURPLUS
    allow_mixed_tokenizers: bool = False
    max_epochs: float = DEFAULT_MAX_EPOCHS
    stages: list[StageSpec] | None = None
    """A mixture schedule for the train split (one weight per train prefix in each stage)."""
    global_batch_size: int | None = None
    """Turns stage boundaries given in steps into samples."""

    def __post_init__(self) -> None:
        _positive_int(self.seq_length, "--seq-length")
        if self.seq_length < MIN_SEQ_LENGTH:
            raise UsageError(f"--seq-length must be at least {MIN_SEQ_LENGTH}")
        if (self.num_samples is None) == (self.tokens is None):
            raise UsageError("give exactly one of --num-samples N or --tokens T")
        if self.tokens is not None:
            _positive_int(self.tokens, "--tokens")
            self.num_samples = -(-int(self.tokens) // int(self.seq_length))
        _positive_int(self.num_samples, "--num-samples")
        for flag, value in (("--valid-samples", self.valid_samples), ("--test-samples", self.test_samples)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"{flag} must be a non-negative integer, not {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be an integer in [0, 2**32), not {self.seed!r}")
        if not (isinstance(self.surplus, float | int) and 0 <= self.surplus < 10):
            raise UsageError(f"--surplus must be a number in [0, 10), not {self.surplus!r}")
        if (self.blend is None) == (self.blend_per_split is None):
            raise UsageError(
                "give either PREFIX.../--data-path or per-split blends (--train-data-path ...), not both"
            )
        if self.blend_per_split is not None:
            unknown = set(self.blend_per_split) - set(SPLITS)
            if unknown:
                raise UsageError(f"unknown split(s) {sorted(unknown)}; use train, valid, test")
            if "train" not in self.blend_per_split:
                raise UsageError("per-split blends need a train blend (--train-data-path)")
        else:
            self.split_vector = parse_split(self.split)
        if self.global_batch_size is not None:
            _positive_int(self.global_batch_size, "--global-batch-size")
        if self.stages is not None:
            self._check_stages()

    def _check_stages(self) -> None:
        train = self.blend if self.blend is not None else self.blend_per_split["train"]
        if not self.stages:
            raise UsageError("--stage: an empty schedule")
        for k, stage in enumerate(self.stages):
            if len(stage.weights) != len(train.prefixes):
                raise UsageError(
                    f"--stage {k + 1} ({stage.until.text()}): {len(stage.weights)} weight(s) for "
                    f"{len(train.prefixes)} source(s); give one weight per PREFIX (0 leaves one out)"
                )
            check_weights(stage.weights, f"--stage {k + 1} ({stage.until.text()})")
        if any(s.until.unit == "step" or s.start.unit == "step" for s in self.stages) and (
            self.global_batch_size is None
        ):
            raise UsageError("--stage in steps needs --global-batch-size N (the samples of one step)")
        # ranges in samples: overlaps, gaps and a schedule that ends early are refused here
        self.stage_ranges = resolve_ranges(
            self.stages, int(self.num_samples), self.seq_length, self.global_batch_size, "--stage {n}"
        )

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": int(self.num_samples), "valid": self.valid_samples, "test": self.test_samples}


def _positive_int(value, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{flag} must be a positive integer, not {value!r}")
