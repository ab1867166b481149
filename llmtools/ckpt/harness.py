"""``llm-ckpt eval``: lm-evaluation-harness on a checkpoint of ours, without converting it first.

The checkpoint (any ZeRO stage, dense or MoE, LoRA merged on the way) is converted into a temporary
Hugging Face folder (:func:`llmtools.ckpt.convert.to_hf`), loaded with transformers, and wrapped as an
lm-eval ``LM`` that tokenizes with the run's own tokenizer (the one its data was made with, as the
in-loop evaluation does). Tasks are local JSONL files (:mod:`llmtools.formats.tasks`), turned into
lm-eval task definitions that read them with ``dataset_path: json`` (nothing is downloaded:
``HF_DATASETS_OFFLINE`` and ``HF_HUB_OFFLINE`` are set):

* multiple choice: ``output_type: multiple_choice``, ``target_delimiter: ""``, metrics ``acc`` and
  ``acc_norm`` (lm-eval's own definitions); each request is tokenized as lm-eval's ``hf`` model does
  (:func:`llmtools.model.scoring.encode_pair`: an empty context is the BOS or EOD token), and a request
  it refuses is refused before any scoring, naming the file and example;
* perplexity: ``output_type: loglikelihood_rolling``, metrics ``word_perplexity``, ``byte_perplexity``,
  ``bits_per_byte``. Without a BOS token the first token has no context: it is not scored (as in the
  in-loop evaluation), where lm-eval's ``hf`` model scores it after its prefix token.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.formats.tasks import TaskFile, read_task_files


def check_ready(tasks: list[str]) -> list[TaskFile]:
    """Before any compute: lm_eval installed, every task file readable and well-formed."""
    if importlib.util.find_spec("lm_eval") is None:
        raise InputError("--tasks: lm_eval is not installed; pip install 'llmtools[eval]'")
    if not tasks:
        raise InputError("--tasks: give at least one task file (JSONL)")
    return read_task_files(tasks, None, where="--tasks")


def task_yaml(task: TaskFile) -> dict[str, Any]:
    """The lm-eval task definition reading ``task``'s JSONL file as a local json dataset."""
    base = {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(task.path.resolve())}},
        "test_split": "test",
    }
    if task.kind == "multiple_choice":
        return {
            **base,
            "output_type": "multiple_choice",
            "doc_to_text": "{{context}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{gold}}",
            "target_delimiter": "",
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        }
    return {
        **base,
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
    }


def check_requests(tasks: list[TaskFile], tokenizer, max_length: int, limit: int | None = None) -> None:
    """Every multiple-choice request lm-eval will make is one it can score (an InputError naming the file
    and example otherwise), before lm-eval starts."""
    from llmtools.model.scoring import encode_pair

    for task in tasks:
        if task.kind != "multiple_choice":
            continue
        for number, item in enumerate(task.examples[:limit], 1):
            for choice in item["choices"]:
                try:
                    encode_pair(tokenizer, item["context"], choice, max_length)
                except InputError as error:
                    raise InputError(f"{task.path}: example {number}: {error}") from None


def make_lm(model, tokenizer, max_length: int, batch: int):
    """Our model (a transformers causal LM) and our tokenizer as an lm-eval ``LM``."""
    from lm_eval.api.model import LM

    from llmtools.model.scoring import encode_pair, score_continuations

    class LlmtoolsLM(LM):
        def _score(self, sequences: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
            scored = score_continuations(lambda ids: model(ids).logits, sequences, model.device, batch)
            return [(total, greedy) for total, _, greedy in scored]

        def loglikelihood(self, requests):
            return self._score([encode_pair(tokenizer, *r.args, max_length) for r in requests])

        def loglikelihood_rolling(self, requests):
            out = []
            for r in requests:
                ids = list(tokenizer.encode(r.args[0]))
                total = 0.0
                # windows of max_length predicted tokens, each after the token before it
                for begin in range(1, len(ids), max_length):
                    window = ids[max(0, begin - 1) : begin + max_length]
                    total += self._score([(window, 1)])[0][0]
                out.append(total)
            return out

        def generate_until(self, requests):
            raise InputError("--tasks: generation tasks are not supported (multiple choice and perplexity)")

    return LlmtoolsLM()


def evaluate_checkpoint(
    checkpoint: Path, tasks: list[TaskFile], tokenizer, limit: int | None = None, batch: int = 8
) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` of lm-evaluation-harness on ``checkpoint`` (converted in a temporary
    folder, removed afterwards)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # stderr: our lines, not bars
    os.environ.setdefault("TQDM_DISABLE", "1")
    import yaml
    from transformers import AutoModelForCausalLM

    from llmtools.ckpt.convert import to_hf

    with tempfile.TemporaryDirectory(prefix="llm-ckpt-eval-") as scratch:
        folder = to_hf(checkpoint, Path(scratch) / "hf", dtype="fp32")
        model = AutoModelForCausalLM.from_pretrained(str(folder)).eval().float()
        max_length = int(model.config.max_position_embeddings) - 1
        check_requests(tasks, tokenizer, max_length, limit)
        task_dir = Path(scratch) / "tasks"
        task_dir.mkdir()
        for task in tasks:
            (task_dir / f"{task.name}.yaml").write_text(yaml.safe_dump(task_yaml(task)), encoding="utf-8")
        import lm_eval
        from lm_eval.tasks import TaskManager

        with _without_environment_probe():
            results = lm_eval.simple_evaluate(
                model=make_lm(model, tokenizer, max_length, batch),
                tasks=[task.name for task in tasks],
                task_manager=TaskManager(include_path=str(task_dir)),
                limit=limit,
                log_samples=False,
            )
    return {name: _metrics(values) for name, values in results["results"].items()}


@contextmanager
def _without_environment_probe():
    """lm-eval records with every result the git commit of the working folder (``git describe``, whose
    "fatal: not a git repository" lands on our stderr outside a repository) and the machine's environment
    (torch's collect_env: pip, compilers, GPUs; ~20 s on a busy machine). We report neither, so neither
    runs."""
    import lm_eval.evaluator as evaluator

    names = ("get_git_commit_hash", "add_env_info")
    saved = {name: getattr(evaluator, name) for name in names if hasattr(evaluator, name)}
    evaluator.get_git_commit_hash = lambda: None
    evaluator.add_env_info = lambda storage: None
    try:
        yield
    finally:
        for name in names:
            if name in saved:
                setattr(evaluator, name, saved[name])
            else:
                delattr(evaluator, name)


def _metrics(values: dict) -> dict[str, float]:
    """lm-eval's ``acc,none`` -> ``acc`` (standard errors dropped)."""
    out = {}
    for key, value in values.items():
        metric, _, _ = key.partition(",")
        if isinstance(value, (int, float)) and not metric.endswith("_stderr") and metric != "sample_len":
            out[metric] = float(value)
    return out


def results_path(checkpoint: Path) -> Path:
    """``RUN/eval/<checkpoint>.json`` for a checkpoint under ``RUN/checkpoints``, else beside the checkpoint."""
    checkpoint = Path(checkpoint).resolve()
    run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return run / "eval" / f"{checkpoint.name}.json"


def dumps(report: dict) -> str:
    return jsonfile.dumps(report, indent=1, sort_keys=True) + "\n"
