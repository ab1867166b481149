#!/usr/bin/env python3
"""Decontamination benchmarks: the index of evaluation n-grams at benchmark scale, lookups against lm-eval's
Janitor side by side, and memory against corpus size.

1. Index: a perplexity task file of ``--eval-words`` random words (a 60,000-word vocabulary, so nearly
   every 13-gram is distinct) is indexed by ``llm-prep decontaminate index`` in a child process.
   Reported: seconds, index size, entries, peak RSS (``wait4``). The default, 5.6M words, makes an
   index of about 100 MB (18 bytes per distinct n-gram).
2. Lookup, one process each, the same documents (``--docs`` of ``--doc-words`` words, one in four with
   an evaluation passage planted in it) and the same evaluation text (``--janitor-eval-words`` of it:
   lm-eval's Janitor keeps every n-gram as a Python string in a set, a few hundred bytes each):
   ``Matcher.hits`` (ours) and ``Janitor.clean_python`` (lm-eval), documents/s, and whether both
   flagged the same documents. Ours is then timed again against the full benchmark-scale index.
3. Memory flat in corpus size: ``llm-prep decontaminate run`` over 1x and 4x the documents with the
   full index; peak RSS of each (``wait4``).

    python benchmarks/bench_decontaminate.py                    # ~100 MB index; a few minutes
    python benchmarks/bench_decontaminate.py --quick            # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LLM_PREP = str(Path(sys.executable).parent / "llm-prep")


def vocabulary(rng: np.random.Generator, size: int = 60_000) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(3, 10, size)
    return np.array(["".join(rng.choice(letters, n)) for n in lengths])


def write_eval(
    path: Path, vocab: np.ndarray, rng: np.random.Generator, words: int, per_text: int = 200
) -> list[str]:
    texts = [" ".join(vocab[rng.integers(0, len(vocab), per_text)]) for _ in range(max(1, words // per_text))]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return texts


def documents(vocab, rng, evals: list[str], count: int, words: int) -> list[str]:
    docs = []
    for i in range(count):
        text = " ".join(vocab[rng.integers(0, len(vocab), words)])
        if i % 4 == 0:
            source = evals[int(rng.integers(0, len(evals)))].split()
            start = int(rng.integers(0, max(1, len(source) - 20)))
            text += " " + " ".join(source[start : start + 20]).upper()
        docs.append(text)
    return docs


def child(args: list[str]) -> tuple[float, int, str]:
    """Run a command; (seconds, peak RSS in bytes, stderr)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{err}")
    return time.perf_counter() - start, usage.ru_maxrss * 1024, err


def time_ours(index_path: Path, docs: list[str]) -> tuple[float, list[bool]]:
    from llmtools.prep.curate.decontam.index import NgramIndex
    from llmtools.prep.curate.decontam.match import Matcher

    matcher = Matcher(NgramIndex(index_path))
    start = time.perf_counter()
    flags = [bool(matcher.hits(d)) for d in docs]
    return time.perf_counter() - start, flags


def time_janitor(evals: list[str], docs: list[str], n: int) -> tuple[float, float, list[bool]]:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from lm_eval.decontamination.janitor import Janitor

    class Spy(Janitor):
        def _split_chunks(self, dirty_string, dirty_parts):
            parts = list(dirty_parts)
            self.flag = bool(parts)
            return super()._split_chunks(dirty_string, parts)

    janitor = Spy(ngram_n=n)
    start = time.perf_counter()
    for text in evals:
        janitor.register_contaminant_python(text)
    registered = time.perf_counter() - start
    flags = []
    start = time.perf_counter()
    for d in docs:
        janitor.clean_python(d)
        flags.append(janitor.flag)
    return registered, time.perf_counter() - start, flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-words", type=int, default=5_600_000)
    parser.add_argument("--janitor-eval-words", type=int, default=400_000)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--doc-words", type=int, default=400)
    parser.add_argument("--ngram", type=int, default=13)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.eval_words, args.janitor_eval_words, args.docs = 200_000, 50_000, 500
    rng = np.random.default_rng(0)
    vocab = vocabulary(rng)
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        work = Path(folder)
        (work / "big").mkdir()
        (work / "small").mkdir()
        big = write_eval(work / "big" / "bench_ppl.jsonl", vocab, rng, args.eval_words)
        small = big[: max(1, args.janitor_eval_words // 200)]
        (work / "small" / "bench_ppl.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in small), encoding="utf-8"
        )
        rows = []
        for name in ("big", "small"):
            secs, rss, _ = child(
                [LLM_PREP, "decontaminate", "index", str(work / name), "-o", str(work / f"{name}.ngrams"),
                 "--ngram", str(args.ngram), "-q"]
            )  # fmt: skip
            size = (work / f"{name}.ngrams").stat().st_size
            words = args.eval_words if name == "big" else len(small) * 200
            rows.append(
                f"index {name}: {words:,} eval words -> {size / 1e6:.1f} MB, {secs:.1f} s, peak RSS {rss / 1e6:.0f} MB"
            )
        docs = documents(vocab, rng, small, args.docs, args.doc_words)
        ours_small, ours_flags = time_ours(work / "small.ngrams", docs)
        registered, janitor_secs, janitor_flags = time_janitor(small, docs, args.ngram)
        ours_big, _ = time_ours(work / "big.ngrams", docs)
        rows.append(
            f"lookup, {args.docs:,} docs x {args.doc_words} words, {len(small) * 200:,} eval words: ours "
            f"{args.docs / ours_small:,.0f} docs/s, lm-eval Janitor (python) {args.docs / janitor_secs:,.0f} docs/s "
            f"({janitor_secs / ours_small:.1f}x); Janitor registering took {registered:.1f} s; "
            f"same documents flagged: {ours_flags == janitor_flags} ({sum(ours_flags):,} flagged)"
        )
        rows.append(
            f"lookup against the {args.eval_words:,}-word index: ours {args.docs / ours_big:,.0f} docs/s"
        )
        for scale in (1, 4):
            corpus = work / f"corpus{scale}.jsonl"
            with open(corpus, "w", encoding="utf-8") as handle:
                for _ in range(scale):
                    handle.writelines(json.dumps({"text": d}) + "\n" for d in docs)
            secs, rss, _ = child(
                [LLM_PREP, "decontaminate", "run", str(corpus), "--index", str(work / "big.ngrams"),
                 "-o", str(work / f"out{scale}.jsonl"), "-q"]
            )  # fmt: skip
            mb = corpus.stat().st_size / 1e6
            rows.append(
                f"run {scale}x: {scale * args.docs:,} docs ({mb:.0f} MB) in {secs:.1f} s "
                f"({scale * args.docs / secs:,.0f} docs/s with start-up), peak RSS {rss / 1e6:.0f} MB"
            )
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
