"""``llm-prep decontaminate`` through the installed console script: index then run, a pipe into json2bin,
bad evaluation files and bad index files (one line, exit 2, nothing written), shards that concatenate
to the one-machine output, and cut mode equal to lm-eval's Janitor.clean."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from .decontam_data import training_documents, write_tasks

BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def llm_prep(*args, cwd, stdin=None, env=None):
    exe = BIN / "llm-prep" if (BIN / "llm-prep").exists() else "llm-prep"
    return subprocess.run(
        [str(exe), *map(str, args)], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=120
    )


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(5)
    texts = write_tasks(tmp_path / "tasks", rng)
    evals = [t for group in texts.values() for t in group]
    docs = training_documents(evals, rng, 13, 120)
    for part in range(3):  # three input files, so shards have something to cut
        lines = [json.dumps({"id": i, "text": d}) for i, d in enumerate(docs) if i % 3 == part]
        (tmp_path / f"train-{part}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path, texts, docs


def test_index_run_and_pipe_into_json2bin(corpus, cli_env):
    tmp, texts, docs = corpus
    made = llm_prep("decontaminate", "index", "tasks", "-o", "eval.ngrams", "-q", cwd=tmp, env=cli_env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.decode().split() == ["eval.ngrams"]
    again = llm_prep("decontaminate", "index", "tasks", "-o", "eval.ngrams", "-q", cwd=tmp, env=cli_env)
    assert again.returncode == 2 and b"--force" in again.stderr

    inputs = [f"train-{i}.jsonl" for i in range(3)]
    whole = llm_prep(
        "decontaminate",
        "run",
        *inputs,
        "--index",
        "eval.ngrams",
        "-o",
        "clean.jsonl",
        "-q",
        cwd=tmp,
        env=cli_env,
    )
    assert whole.returncode == 0, whole.stderr
    stats = json.loads((tmp / "clean.jsonl.stats.json").read_text())
    report = stats["steps"][0]["report"]
    removed = [json.loads(line) for line in (tmp / "clean.jsonl.removed").read_text().splitlines()]
    assert stats["documents"]["removed"] == len(removed) == report["hit"]["documents"] > 0
    assert set(report["tasks"]) == set(texts) and all(c["documents"] > 0 for c in report["tasks"].values())
    assert all(
        r["rule"] == "decontaminate.overlap" and r["values"]["tasks"] and r["values"]["ngram"]
        for r in removed
    )

    # The same run into a pipe: the kept bytes go to json2bin, whose sidecar carries the stats.
    piped = subprocess.run(
        f"{BIN}/llm-prep decontaminate run {' '.join(inputs)} --index eval.ngrams -o - --stats pipe.stats.json -q"
        f" | {BIN}/llm-prep json2bin - -t byte -o data/clean --json",
        shell=True, cwd=tmp, capture_output=True, env=cli_env, timeout=120,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    sidecar = json.loads((tmp / "data" / "clean_text_document.json").read_text())
    assert sidecar["counts"]["documents"] == stats["documents"]["kept"]
    assert json.loads((tmp / "pipe.stats.json").read_text())["output"]["sha256"] == stats["output"]["sha256"]

    # Shards: the kept files, concatenated in order, are the one-machine output.
    parts = []
    for i in range(2):
        shard = llm_prep(
            "decontaminate", "run", *inputs, "--index", "eval.ngrams", "-o", "sh.jsonl", "--shard", f"{i}/2", "-q",
            cwd=tmp, env=cli_env,
        )  # fmt: skip
        assert shard.returncode == 0, shard.stderr
        parts.append((tmp / f"sh-{i:05d}-of-00002.jsonl").read_bytes())
    assert b"".join(parts) == (tmp / "clean.jsonl").read_bytes()


def test_cut_mode_equals_janitor_clean(corpus, cli_env):
    janitor_module = pytest.importorskip("lm_eval.decontamination.janitor")
    tmp, texts, docs = corpus
    run = llm_prep(
        "decontaminate", "run", "train-0.jsonl", "--eval", "tasks", "--mode", "cut", "--window", "30",
        "--min-chunk", "40", "--too-dirty", "4", "-o", "cut.jsonl", "-q", cwd=tmp, env=cli_env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    janitor = janitor_module.Janitor(
        ngram_n=13, window_to_remove=30, minimum_slice_length=40, too_dirty_cutoff=4
    )
    for text in (t for group in texts.values() for t in group):
        janitor.register_contaminant_python(text)
    kept = [json.loads(line) for line in (tmp / "cut.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r["text"] for r in kept}
    gone = {json.loads(line)["id"] for line in (tmp / "cut.jsonl.removed").read_text().splitlines()}
    changed = 0
    for i, doc in enumerate(docs):
        if i % 3:
            continue
        chunks = janitor.clean_python(doc)
        if i in gone:
            assert chunks == []
        elif by_id[i] != doc:
            assert by_id[i] == "".join(chunks)
            changed += 1
    assert changed and gone


BAD_EVALS = [
    ("bad_json.jsonl", b'{"text": "fine"}\n{"text": \n', "bad_json.jsonl:2: not JSON"),
    ("bad_kind.jsonl", b'{"context": "q", "choices": ["a"], "gold": 0}\n', "bad_kind.jsonl:1: choices"),
    ("bad_utf8.txt", b"plain text \xff here\n", "bad_utf8.txt:1: invalid UTF-8"),
]


@pytest.mark.parametrize("name,content,words", BAD_EVALS)
def test_bad_evaluation_file_is_one_line_exit_2(tmp_path, cli_env, name, content, words):
    (tmp_path / name).write_bytes(content)
    result = llm_prep("decontaminate", "index", name, "-o", "eval.ngrams", cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert words in err and "\n" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_bad_index_file_is_one_line_exit_2(corpus, cli_env):
    tmp, texts, docs = corpus
    assert (
        llm_prep(
            "decontaminate", "index", "tasks", "-o", "eval.ngrams", "-q", cwd=tmp, env=cli_env
        ).returncode
        == 0
    )
    good = (tmp / "eval.ngrams").read_bytes()
    cases = [
        (b"not an index at all", "no LLMNGRAM magic"),
        (good[:-1], "bytes where its header promises"),
        (good[:8] + b"\x07" + good[9:], "version 7"),
        (good[: -18 * 2] + good[-18 * 2 :][::-1], "task"),
    ]
    for number, (content, words) in enumerate(cases):
        (tmp / f"bad{number}.ngrams").write_bytes(content)
        result = llm_prep(
            "decontaminate", "run", "train-0.jsonl", "--index", f"bad{number}.ngrams", "-o", f"o{number}.jsonl",
            cwd=tmp, env=cli_env,
        )  # fmt: skip
        err = result.stderr.decode().strip()
        assert result.returncode == 2 and words in err and "\n" not in err, (number, err)
        assert not (tmp / f"o{number}.jsonl").exists() and not (tmp / f"o{number}.jsonl.stats.json").exists()
