#!/usr/bin/env python3
"""llm-prep json2bin: end-to-end speed and memory against the raw encoders and Megatron-LM.

One run, one input, one tokenizer, the same cores for every row:

* input: 600 MB of JSONL (``--size-mb``) built in a temp folder, and a 10x smaller one. With
  ``--corpus linux`` (the real, non-repeating one): the Linux kernel sources of Debian's
  ``linux-source`` package, one JSON line per source file, in archive order (files that are not UTF-8
  are left out); ``--install-linux-source`` runs ``apt-get install linux-source`` when the tarball is
  not in /usr/src yet. With ``--corpus shared`` (default): the ../shared/data corpora (lambada,
  tinyshakespeare, wikitext-2, the OpenWebText fixture, C4 samples), repeated in rotation;
* raw batch encoding with HF ``tokenizers`` (``encode_batch_fast``), ``tiktoken`` (GPT-2 built offline
  from the local vocab.json/merges.txt) and ``gigatoken`` (``encode_batch``) of the same texts (in
  memory), on the first 30 MB (``--slow-mb``: the slow ones would take an hour on 600 MB); each one's
  ids are checked against ``tokenizers``;
* the goal's comparison, in paired rounds (``--rounds``, alternating, medians): raw gigatoken
  ``encode_batch`` of all the texts of the input (a fresh process that reads them first, then times one
  call after a 200-text warm-up) against ``llm-prep json2bin`` end to end (a subprocess: interpreter
  start, imports, tokenizer loads, reading, JSON parsing, encoding, writing), on the large and on the
  small input;
* ``json2bin --backend tokenizers`` on the first 30 MB: its files must equal the gigatoken backend's;
* peak RSS of json2bin on the small and the large input (sum over its process tree, sampled every
  20 ms, and the largest single process's kernel high-water mark VmHWM);
* optionally Megatron-LM's ``tools/preprocess_data.py`` on the same input and workers, and its newer
  ``tools/preprocess_data_fast.py`` (gigatoken over the whole file, held in memory), their output bytes
  compared with ours. (The fast script appends an EOD to *empty* documents too, unlike preprocess_data.py;
  the benchmark input has none, so all three outputs can be byte-identical.)

* the many-machines path (``--shards 10``; ``--corpus linux`` only): the same documents cut into 64
  JSONL files; ``json2bin --shard I/10`` for each I, one after the other on this machine, then
  ``llm-prep merge``, against one json2bin run over the 64 files (bytes compared): the sum of the
  shard runs, and the critical path a cluster would see (the slowest shard + the merge).

Every MB/s is also given per core (``--workers`` cores for every row).

Ratios: json2bin / raw gigatoken (the fastest encoder with identical ids; same texts, median seconds);
json2bin / Megatron (input-file MB/s, both end to end). On the small input a fixed ~0.7 s of start-up
(gigatoken's imports -- awkward, pyarrow -- and two tokenizer loads for the identity probe) weighs more
than the encoding itself; the large input shows the steady state.

    python benchmarks/bench_json2bin.py --quick                 # ~6 MB, under a minute
    python benchmarks/bench_json2bin.py                         # 600 MB, ~5 minutes on 2 cores
    python benchmarks/bench_json2bin.py --megatron-dir /work/megatron-src --megatron-mb 10
    python benchmarks/bench_json2bin.py --corpus linux --install-linux-source    # the kernel, 600 MB

``--megatron-dir`` is a folder holding Megatron-LM's ``tools/preprocess_data.py`` and its ``megatron/``
package (e.g. ``git archive HEAD tools megatron | tar -x -C DIR`` of a Megatron-LM clone; never inside
this repo). It is put first on PYTHONPATH, with ``DIR/site`` if present (extra packages the newest
Megatron imports at module level on CPU, e.g. ``pip install --target DIR/site triton``). Python 3.11 lacks
``typing.override`` (used by the newest Megatron): this script adds it through a sitecustomize in its temp
folder. Megatron's GPT2BPETokenizer calls ``AutoTokenizer.from_pretrained("gpt2", ...)``; it is run from a
folder holding a local ``gpt2/`` tokenizer folder so that nothing is downloaded.
``--megatron-mb N`` runs Megatron (and a json2bin run for the byte comparison) on the first N MB only,
since it is ~100x slower; its MB/s is compared with ours on the full input.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("LLMTOOLS_SHARED_DATA", REPO.parent / "shared" / "data"))
CORPORA = [
    "lambada/lambada_test.jsonl",
    "tinyshakespeare/input.jsonl",
    "wikitext-2/valid.jsonl",
    "megatron-deepspeed-fixtures/openwebtext-1000.reconstructed.jsonl",
]
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MB = 1e6
BATCHED_MB = 64  # raw gigatoken's best call size measured here (4/16/64 MB: 146/183/206 MB/s on 600 MB)


# -- input -------------------------------------------------------------------------------------------
def corpus_lines(data: Path) -> list[bytes]:
    """One JSONL line per document ({"text": ...}), from every corpus, C4 samples decompressed."""
    lines: list[bytes] = []
    for name in CORPORA:
        with open(data / name, "rb") as handle:
            lines += [line if line.endswith(b"\n") else line + b"\n" for line in handle if line.strip()]
    for path in sorted((data / "c4-samples").glob("c4-sample.0*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines += [
                (json.dumps({"text": json.loads(line)["text"]}, ensure_ascii=False) + "\n").encode()
                for line in handle
            ]
    return lines


def build_input(lines: list[bytes], path: Path, target_bytes: int) -> int:
    """Write the corpora in rotation until ``target_bytes``; returns the number of documents."""
    written = docs = 0
    with open(path, "wb") as out:
        while written < target_bytes:
            for line in lines:
                out.write(line)
                written += len(line)
                docs += 1
                if written >= target_bytes:
                    break
    return docs


LINUX_TARBALLS = "/usr/src/linux-source-*.tar.*"


def linux_tarball(install: bool) -> Path:
    """Debian's kernel source tarball; installed with apt-get when asked (root; the network to Debian)."""
    found = sorted(glob.glob(LINUX_TARBALLS))
    if not found and install:
        apt_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=apt_env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "linux-source"], check=True, env=apt_env)
        found = sorted(glob.glob(LINUX_TARBALLS))
    if not found:
        raise SystemExit(
            f"no {LINUX_TARBALLS}: pass --install-linux-source (runs apt-get install linux-source) or install it"
        )
    return Path(found[-1])


def build_linux_input(tarball: Path, path: Path, target_bytes: int) -> int:
    """One JSON line per (UTF-8, non-empty) file of the kernel tarball, in archive order, until
    ``target_bytes``; returns the number of documents."""
    written = docs = 0
    with tarfile.open(tarball) as tar, open(path, "wb") as out:
        for member in tar:
            if not member.isfile() or member.size == 0:
                continue
            data = tar.extractfile(member).read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            line = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode("utf-8")
            out.write(line)
            written += len(line)
            docs += 1
            if written >= target_bytes:
                break
    return docs


def split_lines(src: Path, folder: Path, parts: int) -> list[Path]:
    """``src`` cut into ``parts`` JSONL files of about equal size, lines in order (part-000, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    budget = src.stat().st_size / parts
    paths, out, size = [], None, 0.0
    with open(src, "rb") as inp:
        for line in inp:
            if out is None or (size >= budget and len(paths) < parts):
                if out is not None:
                    out.close()
                paths.append(folder / f"part-{len(paths):03d}.jsonl")
                out, size = open(paths[-1], "wb"), 0.0  # noqa: SIM115 - closed above and below
            out.write(line)
            size += len(line)
    if out is not None:
        out.close()
    return paths


def shards_vs_one_run(parts: Path, tokenizer: Path, work: Path, workers: int, shards: int, env: dict) -> dict:
    """One json2bin run over the part files, then ``shards`` runs with --shard I/N (one after the other)
    and a merge; seconds of each, and whether the merged bytes equal the single run's."""
    pattern = f"{parts}/*.jsonl"
    one = run_measured(json2bin_cmd(pattern, tokenizer, work / "one", workers, "auto"), env)
    if one["rc"] != 0:
        raise SystemExit(f"json2bin failed: {one['stderr'][-2000:]}")
    shard_seconds = []
    for i in range(shards):
        cmd = json2bin_cmd(pattern, tokenizer, work / "sharded", workers, "auto") + [
            "--shard",
            f"{i}/{shards}",
        ]
        result = run_measured(cmd, env)
        if result["rc"] != 0:
            raise SystemExit(f"json2bin --shard {i}/{shards} failed: {result['stderr'][-2000:]}")
        shard_seconds.append(result["seconds"])
    merge_cmd = [sys.executable, "-m", "llmtools.cli.prep", "merge", f"{work}/sharded-*-of-*_text_document"]
    merge = run_measured(merge_cmd + ["-o", str(work / "merged"), "-q", "--force"], env)
    if merge["rc"] != 0:
        raise SystemExit(f"merge failed: {merge['stderr'][-2000:]}")
    return {
        "one_seconds": one["seconds"],
        "shard_seconds": shard_seconds,
        "merge_seconds": merge["seconds"],
        "merge_maxrss_mb": merge["maxrss_mb"],
        "identical": same_bytes(work / "one_text_document", work / "merged"),
    }


def read_texts(path: Path) -> tuple[list[str], int]:
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8")]
    return texts, sum(len(t.encode("utf-8")) for t in texts)


# -- raw encoders ------------------------------------------------------------------------------------
def flatten(ids_lists) -> tuple:
    import numpy as np

    lengths = np.fromiter((len(x) for x in ids_lists), dtype=np.int64, count=len(ids_lists))
    flat = np.fromiter((t for x in ids_lists for t in x), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


def raw_encoders(tokenizer_dir: Path, workers: int) -> dict:
    """name -> callable texts -> (flat ids, lengths) as numpy arrays, or a list of id lists.

    Only the call is timed: each returns what its library hands a caller (lists of ids, or
    gigatoken's flat arrays); turning lists into numpy for the id check happens outside the timing."""
    import numpy as np

    encoders = {}
    import tokenizers

    hf = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encoders["HF tokenizers (encode_batch_fast)"] = lambda texts: [
        e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)
    ]
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks

        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(tokenizer_dir / "merges.txt"),
            encoder_json_file=str(tokenizer_dir / "vocab.json"),
        )
        enc = tiktoken.Encoding(
            "gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
        )
        # allowed_special="all": a literal <|endoftext|> becomes its id, as in tokenizers and Megatron.
        encoders["tiktoken (encode_batch)"] = lambda texts: enc.encode_batch(
            texts, num_threads=workers, allowed_special="all"
        )
    except ImportError as error:
        print(f"note: tiktoken not available ({error})", file=sys.stderr)
    try:
        import gigatoken

        giga = gigatoken.Tokenizer(str(tokenizer_dir / "tokenizer.json"))

        def giga_encode(texts):
            layout = giga.encode_batch(texts).layout
            offsets = np.asarray(layout.offsets.data)
            return np.asarray(layout.content.data), np.diff(offsets)

        encoders["gigatoken (encode_batch)"] = giga_encode
    except ImportError as error:
        print(f"note: gigatoken not available ({error})", file=sys.stderr)
    return encoders


def measure_raw(encoders: dict, texts: list[str], text_bytes: int) -> list[dict]:
    import numpy as np

    rows, reference = [], None
    for name, encode in encoders.items():
        encode(texts[:200])  # load/warm-up outside the timing (thread pools, lazy init)
        started = time.perf_counter()
        out = encode(texts)
        seconds = time.perf_counter() - started
        flat, lengths = out if isinstance(out, tuple) else flatten(out)
        del out
        if reference is None:
            reference = (flat, lengths)
            same, note = True, "reference"
        else:
            same = np.array_equal(lengths, reference[1]) and np.array_equal(
                flat.astype(np.int64), reference[0]
            )
            note = "identical ids" if same else f"DIFFERENT ids ({int((lengths != reference[1]).sum())} docs)"
        rows.append(
            {
                "name": name,
                "seconds": seconds,
                "mb_s": text_bytes / MB / seconds,
                "tok_s": int(flat.size) / seconds,
                "tokens": int(flat.size),
                "identical": same,
                "note": note,
            }
        )
        print(f"  {name}: {rows[-1]['mb_s']:.2f} MB/s ({note})", file=sys.stderr)
    return rows


# -- subprocesses with peak memory ---------------------------------------------------------------------
def run_measured(cmd: list[str], env: dict, cwd: Path | None = None, timeout: float = 3600) -> dict:
    """Run ``cmd``: wall time, exit code, the sampled peak RSS summed over its process tree, and the
    largest per-process high-water mark (VmHWM, which the kernel keeps exactly, so no sample is missed).

    Not wait4's ru_maxrss: after fork+exec it starts from the *parent's* RSS at fork, i.e. this script's.
    """
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = {"tree": 0, "hwm": 0}
    done = threading.Event()

    me = psutil.Process().cmdline()

    def sample() -> None:
        try:
            root = psutil.Process(proc.pid)
        except psutil.Error:
            return
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        if p.cmdline() == me:
                            continue  # forked but not yet exec'd: it still maps this script's memory
                        total += p.memory_info().rss
                        peak["hwm"] = max(peak["hwm"], vm_hwm(p.pid))
                    except (psutil.Error, OSError):
                        pass
                peak["tree"] = max(peak["tree"], total)
            except psutil.Error:
                break
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks, err_chunks = [], []
    readers = [
        threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True),
        threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = started + timeout
    status = None
    while status is None:
        pid, raw_status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            status = raw_status
        elif time.perf_counter() > deadline:
            kill_tree(proc.pid)
            deadline = float("inf")
        else:
            time.sleep(0.01)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    for reader in readers:
        reader.join()
    return {
        "rc": proc.returncode,
        "seconds": seconds,
        "stdout": b"".join(out_chunks).decode(errors="replace"),
        "stderr": b"".join(err_chunks).decode(errors="replace"),
        "peak_tree_mb": peak["tree"] / 2**20,
        "maxrss_mb": peak["hwm"] / 2**20,
    }


def vm_hwm(pid: int) -> int:
    """Peak resident set size of one process, in bytes (Linux /proc)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def kill_tree(pid: int) -> None:
    """Kill a process and its descendants (a Megatron pool whose worker died can hang forever)."""
    import psutil

    try:
        root = psutil.Process(pid)
        for child in root.children(recursive=True):
            child.kill()
        root.kill()
    except psutil.Error:
        pass


def json2bin_cmd(
    input_path: Path | str, tokenizer: Path, prefix: Path, workers: int, backend: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llmtools.cli.prep",
        "json2bin",
        str(input_path),
        "-t",
        str(tokenizer),
        "-o",
        str(prefix),
        "--append-eod",
        "--workers",
        str(workers),
        "--backend",
        backend,
        "-q",
        "--json",
        "--force",
    ]


def run_json2bin(input_path, tokenizer, prefix, workers, backend, env) -> dict:
    result = run_measured(json2bin_cmd(input_path, tokenizer, prefix, workers, backend), env)
    if result["rc"] != 0:
        raise SystemExit(f"json2bin ({backend}) failed with exit {result['rc']}:\n{result['stderr'][-2000:]}")
    result["summary"] = json.loads(result["stdout"])
    return result


def same_bytes(a: Path, b: Path) -> bool:
    import filecmp

    return all(filecmp.cmp(f"{a}{s}", f"{b}{s}", shallow=False) for s in (".bin", ".idx"))


# -- Megatron-LM --------------------------------------------------------------------------------------
def run_megatron(
    megatron_dir: Path,
    input_path: Path,
    tokenizer_dir: Path,
    workdir: Path,
    workers: int,
    env: dict,
    timeout: float,
    fast: bool = False,
) -> dict:
    """Run preprocess_data.py (``fast=False``: worker processes, one tokenizer call per document) or
    preprocess_data_fast.py (``fast=True``: gigatoken over the whole file, no --workers flag)."""
    script = megatron_dir / "tools" / ("preprocess_data_fast.py" if fast else "preprocess_data.py")
    if not script.exists():
        return {"error": f"{script} not found"}
    workdir.mkdir(parents=True, exist_ok=True)
    local = workdir / "gpt2"  # AutoTokenizer.from_pretrained("gpt2") resolves to this folder: no download
    local.mkdir(exist_ok=True)
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        if (tokenizer_dir / name).exists():
            shutil.copyfile(tokenizer_dir / name, local / name)
    (local / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"})
    )
    (local / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    shim = workdir / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(
        "import typing\nif not hasattr(typing, 'override'):\n    typing.override = lambda fn: fn  # 3.12+ only\n"
    )
    paths = (
        [str(megatron_dir)]
        + ([str(megatron_dir / "site")] if (megatron_dir / "site").is_dir() else [])
        + [str(shim)]
    )
    menv = dict(
        env,
        PYTHONPATH=os.pathsep.join(paths),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        RAYON_NUM_THREADS=str(workers),  # preprocess_data_fast.py: gigatoken's threads
    )
    prefix = workdir / ("megatron-fast" if fast else "megatron")
    cmd = [
        sys.executable,
        str(script),
        "--input",
        str(input_path),
        "--output-prefix",
        str(prefix),
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        str(tokenizer_dir / "vocab.json"),
        "--merge-file",
        str(tokenizer_dir / "merges.txt"),
        "--append-eod",
    ]
    cmd += ["--use-gigatoken"] if fast else ["--workers", str(workers), "--log-interval", "1000000"]
    result = run_measured(cmd, menv, cwd=workdir, timeout=timeout)
    result["prefix"] = Path(f"{prefix}_text_document")
    if result["rc"] != 0 or not Path(f"{result['prefix']}.idx").exists():
        result["error"] = (
            f"exit {result['rc']}: " + result["stderr"].strip().splitlines()[-1][:300]
            if result["stderr"].strip()
            else f"exit {result['rc']}"
        )
    for line in result["stdout"].splitlines():
        if line.startswith("Time to startup:"):
            result["startup_s"] = float(line.split(":")[1])
        if line.startswith("Data preprocessing is finished. Elapsed time:"):  # the fast script's own clock
            result["inner_s"] = float(line.split(":")[1].split()[0])
    return result


# -- report -------------------------------------------------------------------------------------------
def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def raw_gigatoken_child(path: Path, workers: int, batch_mb: float) -> None:
    """``--raw-gigatoken FILE``: in a fresh process (so its pretoken caches start as cold as json2bin's),
    read the texts, warm up on 200 of them, time ``encode_batch`` of all of them -- in one call, or in
    calls of ``batch_mb`` MB of text each; print JSON figures."""
    os.environ["RAYON_NUM_THREADS"] = str(workers)
    texts, text_bytes = read_texts(path)
    import gigatoken
    import numpy as np

    giga = gigatoken.Tokenizer(str(path.parent / "gpt2-tokenizer.json"))
    giga.encode_batch(texts[:200])
    bounds = [0]
    if batch_mb:
        size = 0
        for i, text in enumerate(texts):
            size += len(text)
            if size >= batch_mb * MB:
                bounds.append(i + 1)
                size = 0
    if bounds[-1] != len(texts):
        bounds.append(len(texts))
    tokens = 0
    started = time.perf_counter()
    for a, b in zip(bounds, bounds[1:]):  # noqa: B905
        tokens += int(np.asarray(giga.encode_batch(texts[a:b]).layout.offsets)[-1])
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "text_bytes": text_bytes, "tokens": tokens, "docs": len(texts)}))


def run_raw_gigatoken(path: Path, workers: int, env: dict, batch_mb: float = 0) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--raw-gigatoken", str(path), "--workers", str(workers)]
        + ["--raw-batch-mb", str(batch_mb)],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"raw gigatoken run failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def paired_rounds(path: Path, tokenizer: Path, prefix: Path, workers: int, env: dict, rounds: int) -> dict:
    """Raw gigatoken and json2bin on the same file, alternating, ``rounds`` times: per-round ratios and
    medians (the machine is shared: a pair run back to back sees the same load)."""
    import statistics

    pairs = []
    for round_no in range(rounds):
        raw = run_raw_gigatoken(path, workers, env)
        ours = run_json2bin(path, tokenizer, prefix, workers, "gigatoken", env)
        batched = run_raw_gigatoken(path, workers, env, BATCHED_MB)
        raw_mb_s = raw["text_bytes"] / MB / raw["seconds"]
        ours_mb_s = raw["text_bytes"] / MB / ours["seconds"]
        pairs.append(
            {"raw": raw, "ours": ours, "batched": batched, "raw_mb_s": raw_mb_s, "ours_mb_s": ours_mb_s}
        )
        print(
            f"  round {round_no + 1}: raw gigatoken {raw['seconds']:.2f} s ({raw_mb_s:.1f} MB/s; in "
            f"{BATCHED_MB:.0f} MB calls {batched['seconds']:.2f} s), json2bin {ours['seconds']:.2f} s "
            f"({ours_mb_s:.1f} MB/s): {ours_mb_s / raw_mb_s:.2f}x",
            file=sys.stderr,
        )
    return {
        "pairs": pairs,
        "raw_seconds": statistics.median(p["raw"]["seconds"] for p in pairs),
        "batched_seconds": statistics.median(p["batched"]["seconds"] for p in pairs),
        "ours_seconds": statistics.median(p["ours"]["seconds"] for p in pairs),
        "loop_seconds": statistics.median(p["ours"]["summary"]["seconds"] for p in pairs),
        "ratios": [p["ours_mb_s"] / p["raw_mb_s"] for p in pairs],
        "text_bytes": pairs[0]["raw"]["text_bytes"],
        "tokens": pairs[0]["ours"]["summary"]["tokens"]["text"],
        "raw_tokens": pairs[0]["raw"]["tokens"],
        "docs": pairs[0]["raw"]["docs"],
        "peak_tree_mb": max(p["ours"]["peak_tree_mb"] for p in pairs),
        "maxrss_mb": max(p["ours"]["maxrss_mb"] for p in pairs),
    }


def prefix_file(src: Path, dst: Path, megabytes: float) -> Path:
    """The first ``megabytes`` of a JSONL file, in whole lines."""
    budget = int(megabytes * MB)
    with open(src, "rb") as inp, open(dst, "wb") as out:
        for line in inp:
            if budget <= 0:
                break
            out.write(line)
            budget -= len(line)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~6 MB input (smoke run)")
    parser.add_argument(
        "--size-mb", type=float, default=None, help="input size in MB (default 600; 6 with --quick)"
    )
    parser.add_argument(
        "--slow-mb",
        type=float,
        default=None,
        help="the slow rows (HF tokenizers, tiktoken, json2bin --backend tokenizers) run on the first N MB "
        "of the input (default 30; 3 with --quick)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="paired json2bin / raw gigatoken rounds (default 3)"
    )
    parser.add_argument("--workers", type=int, default=2, help="cores for every row (default 2)")
    parser.add_argument(
        "--corpus",
        choices=("shared", "linux"),
        default="shared",
        help="shared (repeated) or linux (real, non-repeating)",
    )
    parser.add_argument(
        "--install-linux-source", action="store_true", help="apt-get install linux-source if it is missing"
    )
    parser.add_argument(
        "--shards", type=int, default=10, help="the --shard I/N + merge row (--corpus linux; 0: skip)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument(
        "--megatron-dir", type=Path, default=None, help="Megatron-LM source folder (outside the repo)"
    )
    parser.add_argument("--megatron-mb", type=float, default=None, help="run Megatron on the first N MB only")
    parser.add_argument("--megatron-timeout", type=float, default=3600)
    parser.add_argument(
        "--skip-megatron-fast", action="store_true", help="no Megatron-LM preprocess_data_fast.py row"
    )
    parser.add_argument(
        "--skip-tokenizers-backend", action="store_true", help="no json2bin --backend tokenizers row"
    )
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--raw-gigatoken", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--raw-batch-mb", type=float, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_gigatoken:
        raw_gigatoken_child(args.raw_gigatoken, args.workers, args.raw_batch_mb)
        return
    size_mb = args.size_mb or (6.0 if args.quick else 600.0)
    slow_mb = min(args.slow_mb or (3.0 if args.quick else 30.0), size_mb)
    tokenizer_dir = args.data / "tokenizers" / "gpt2"
    if not tokenizer_dir.exists():
        raise SystemExit(f"{tokenizer_dir}: missing (the shared data folder; set --data)")
    # The same cores for every Rust pool (tokenizers, gigatoken) in this process.
    os.environ["RAYON_NUM_THREADS"] = str(args.workers)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("LLMTOOLS_DEBUG", None)

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_json2bin."))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict = {"size_mb": size_mb, "slow_mb": slow_mb, "workers": args.workers, "cpus": os.cpu_count()}
    try:
        large, small = work / "input.jsonl", work / "input-small.jsonl"
        if args.corpus == "linux":
            tarball = linux_tarball(args.install_linux_source)
            figures["corpus"] = f"linux ({tarball.name})"
            print(f"building {size_mb:.0f} MB of JSONL from {tarball} ...", file=sys.stderr)
            docs = build_linux_input(tarball, large, int(size_mb * MB))
            prefix_file(large, small, size_mb / 10)
        else:
            lines = corpus_lines(args.data)
            figures["corpus"] = "shared (repeated in rotation)"
            docs = build_input(lines, large, int(size_mb * MB))
            build_input(lines, small, int(size_mb * MB / 10))
        slow_input = prefix_file(large, work / "input-slow.jsonl", slow_mb)
        shutil.copyfile(tokenizer_dir / "tokenizer.json", work / "gpt2-tokenizer.json")  # for the raw child
        file_bytes = large.stat().st_size
        print(
            f"input: {large} {file_bytes / MB:.1f} MB, {docs} docs; the slow rows on its first "
            f"{slow_input.stat().st_size / MB:.1f} MB; {args.workers} workers, {os.cpu_count()} cpus",
            file=sys.stderr,
        )

        print(f"raw encoders on the first {slow_mb:.0f} MB (ids compared) ...", file=sys.stderr)
        slow_texts, slow_text_bytes = read_texts(slow_input)
        raw = measure_raw(raw_encoders(tokenizer_dir, args.workers), slow_texts, slow_text_bytes)
        del slow_texts

        tokenizer = tokenizer_dir / "vocab.json"  # the GPT2BPETokenizer inputs Megatron is given
        print(
            f"json2bin vs raw gigatoken, {args.rounds} paired rounds, {file_bytes / MB:.0f} MB ...",
            file=sys.stderr,
        )
        big = paired_rounds(large, tokenizer, work / "ours", args.workers, env, args.rounds)
        print(
            f"json2bin vs raw gigatoken, {args.rounds} paired rounds, {file_bytes / MB / 10:.0f} MB ...",
            file=sys.stderr,
        )
        little = paired_rounds(small, tokenizer, work / "small", args.workers, env, args.rounds)
        ours_prefix = work / "ours_text_document"
        text_bytes, tokens = big["text_bytes"], big["tokens"]
        ours_mb_s = file_bytes / MB / big["ours_seconds"]
        fastest = max((r for r in raw if r["identical"]), key=lambda r: r["mb_s"])
        if not fastest["name"].startswith("gigatoken"):
            print(
                f"WARNING: the fastest raw encoder here is {fastest['name']}, not gigatoken", file=sys.stderr
            )
        if tokens != big["raw_tokens"] + big["docs"]:  # + one EOD per document (none is empty here)
            print(
                f"WARNING: json2bin wrote {tokens} tokens, raw gigatoken + EOD gives {big['raw_tokens'] + big['docs']}",
                file=sys.stderr,
            )

        rows = [["row", "seconds", "MB/s (text)", "MB/s (file)", "Mtok/s", "check", "peak RSS MB"]]
        for r in raw:
            rows.append(
                [
                    f"raw {r['name']}, first {slow_mb:.0f} MB",
                    f"{r['seconds']:.2f}",
                    f"{r['mb_s']:.2f}",
                    "",
                    f"{r['tok_s'] / 1e6:.2f}",
                    r["note"],
                    "",
                ]
            )
        for label, run in ((f"{file_bytes / MB:.0f} MB", big), (f"{file_bytes / MB / 10:.0f} MB", little)):
            rows.append(
                [
                    f"raw gigatoken (encode_batch), all {label}, median of {args.rounds}",
                    f"{run['raw_seconds']:.2f}",
                    f"{run['text_bytes'] / MB / run['raw_seconds']:.2f}",
                    "",
                    f"{run['raw_tokens'] / run['raw_seconds'] / 1e6:.2f}",
                    "fresh process, after a 200-text warm-up",
                    "",
                ]
            )
            rows.append(
                [
                    f"raw gigatoken (encode_batch) in {BATCHED_MB} MB calls, {label}, median of {args.rounds}",
                    f"{run['batched_seconds']:.2f}",
                    f"{run['text_bytes'] / MB / run['batched_seconds']:.2f}",
                    "",
                    f"{run['raw_tokens'] / run['batched_seconds'] / 1e6:.2f}",
                    "fresh process, after a 200-text warm-up",
                    "",
                ]
            )
            rows.append(
                [
                    f"json2bin end to end (gigatoken), {label}, median of {args.rounds}",
                    f"{run['ours_seconds']:.2f}",
                    f"{run['text_bytes'] / MB / run['ours_seconds']:.2f}",
                    f"{(file_bytes if run is big else small.stat().st_size) / MB / run['ours_seconds']:.2f}",
                    f"{run['tokens'] / run['ours_seconds'] / 1e6:.2f}",
                    f"{run['tokens']} tokens",
                    f"{run['peak_tree_mb']:.0f}",
                ]
            )
            # json2bin's own clock: reading + encoding + writing, without interpreter startup and imports
            rows.append(
                [
                    "  of which json2bin's own loop (no startup)",
                    f"{run['loop_seconds']:.2f}",
                    f"{run['text_bytes'] / MB / run['loop_seconds']:.2f}",
                    "",
                    f"{run['tokens'] / run['loop_seconds'] / 1e6:.2f}",
                    "",
                    "",
                ]
            )
        figures["raw"] = raw
        figures["paired"] = {
            name: {k: v for k, v in run.items() if k != "pairs"}
            | {
                "rounds": [
                    {"raw_seconds": p["raw"]["seconds"], "json2bin_seconds": p["ours"]["seconds"]}
                    for p in run["pairs"]
                ]
            }
            for name, run in (("large", big), ("small", little))
        }

        if not args.skip_tokenizers_backend:
            print(f"json2bin, both backends, first {slow_mb:.0f} MB ...", file=sys.stderr)
            fast_run = run_json2bin(slow_input, tokenizer, work / "slow-giga", args.workers, "gigatoken", env)
            slow = run_json2bin(slow_input, tokenizer, work / "slow-tok", args.workers, "tokenizers", env)
            identical = same_bytes(work / "slow-giga_text_document", work / "slow-tok_text_document")
            rows.append(
                [
                    f"json2bin end to end (tokenizers), first {slow_mb:.0f} MB",
                    f"{slow['seconds']:.2f}",
                    f"{slow_text_bytes / MB / slow['seconds']:.2f}",
                    f"{slow_input.stat().st_size / MB / slow['seconds']:.2f}",
                    f"{slow['summary']['tokens']['text'] / slow['seconds'] / 1e6:.2f}",
                    "files identical to gigatoken's" if identical else "FILES DIFFER from gigatoken's",
                    f"{slow['peak_tree_mb']:.0f}",
                ]
            )
            figures["json2bin_tokenizers"] = {
                "seconds": slow["seconds"],
                "gigatoken_seconds": fast_run["seconds"],
                "identical": identical,
            }

        figures["rss"] = {
            "small_mb_input": small.stat().st_size / MB,
            "large_mb_input": file_bytes / MB,
            "small_tree_mb": little["peak_tree_mb"],
            "large_tree_mb": big["peak_tree_mb"],
            "small_maxrss_mb": little["maxrss_mb"],
            "large_maxrss_mb": big["maxrss_mb"],
        }

        megatron = None
        if args.megatron_dir:
            meg_input, meg_bytes = large, file_bytes
            if args.megatron_mb:
                meg_input = prefix_file(large, work / "input-megatron.jsonl", args.megatron_mb)
                meg_bytes = meg_input.stat().st_size
            print(f"Megatron-LM preprocess_data.py on {meg_bytes / MB:.1f} MB ...", file=sys.stderr)
            megatron = run_megatron(
                args.megatron_dir.resolve(),
                meg_input,
                tokenizer_dir,
                work / "megatron",
                args.workers,
                env,
                args.megatron_timeout,
            )
            if "error" in megatron:
                rows.append(
                    ["Megatron-LM preprocess_data.py", "", "", "", "", f"FAILED: {megatron['error']}", ""]
                )
            else:
                compare_prefix = ours_prefix
                if meg_input != large:
                    run_json2bin(meg_input, tokenizer, work / "ours-meg", args.workers, "gigatoken", env)
                    compare_prefix = work / "ours-meg_text_document"
                identical = same_bytes(compare_prefix, megatron["prefix"])
                meg_mb_s = meg_bytes / MB / megatron["seconds"]
                rows.append(
                    [
                        f"Megatron-LM preprocess_data.py ({meg_bytes / MB:.1f} MB)",
                        f"{megatron['seconds']:.2f}",
                        "",
                        f"{meg_mb_s:.2f}",
                        "",
                        "byte-identical to ours" if identical else "OUTPUT DIFFERS from ours",
                        f"{megatron['peak_tree_mb']:.0f}",
                    ]
                )
                figures["megatron"] = {
                    "seconds": megatron["seconds"],
                    "mb": meg_bytes / MB,
                    "mb_s_file": meg_mb_s,
                    "startup_s": megatron.get("startup_s"),
                    "identical": identical,
                    "peak_tree_mb": megatron["peak_tree_mb"],
                }
            if not args.skip_megatron_fast:
                print(f"Megatron-LM preprocess_data_fast.py on {file_bytes / MB:.1f} MB ...", file=sys.stderr)
                fast = run_megatron(
                    args.megatron_dir.resolve(),
                    large,
                    tokenizer_dir,
                    work / "megatron",
                    args.workers,
                    env,
                    args.megatron_timeout,
                    fast=True,
                )
                if "error" in fast:
                    rows.append(
                        [
                            "Megatron-LM preprocess_data_fast.py",
                            "",
                            "",
                            "",
                            "",
                            f"FAILED: {fast['error']}",
                            "",
                        ]
                    )
                else:
                    identical = same_bytes(ours_prefix, fast["prefix"])
                    rows.append(
                        [
                            "Megatron-LM preprocess_data_fast.py (gigatoken)",
                            f"{fast['seconds']:.2f}",
                            f"{text_bytes / MB / fast['seconds']:.2f}",
                            f"{file_bytes / MB / fast['seconds']:.2f}",
                            f"{tokens / fast['seconds'] / 1e6:.2f}",
                            "byte-identical to ours" if identical else "OUTPUT DIFFERS from ours",
                            f"{fast['peak_tree_mb']:.0f}",
                        ]
                    )
                    if "inner_s" in fast:
                        inner_fast = fast["inner_s"]
                        rows.append(
                            [
                                "  of which its own clock (after imports)",
                                f"{inner_fast:.2f}",
                                f"{text_bytes / MB / inner_fast:.2f}",
                                f"{file_bytes / MB / inner_fast:.2f}",
                                f"{tokens / inner_fast / 1e6:.2f}",
                                "",
                                "",
                            ]
                        )
                    figures["megatron_fast"] = {
                        "seconds": fast["seconds"],
                        "inner_s": fast.get("inner_s"),
                        "identical": identical,
                        "peak_tree_mb": fast["peak_tree_mb"],
                    }

        print()
        print(
            f"json2bin benchmark: {figures['corpus']}, {file_bytes / MB:.1f} MB JSONL ({text_bytes / MB:.1f} MB text, {docs} docs), "
            f"GPT-2 ({tokenizer_dir}), {args.workers} workers on {os.cpu_count()} cpus"
        )
        if args.corpus == "linux" and args.shards:
            print(f"{args.shards} shards + merge vs one run ...", file=sys.stderr)
            parts = split_lines(large, work / "parts", 64)
            sharded = shards_vs_one_run(work / "parts", tokenizer, work, args.workers, args.shards, env)
            figures["shards"] = sharded | {"parts": len(parts)}
            total = sum(sharded["shard_seconds"]) + sharded["merge_seconds"]
            critical = max(sharded["shard_seconds"]) + sharded["merge_seconds"]
            check = "identical to one run" if sharded["identical"] else "DIFFERS from one run"
            rows.append([f"json2bin, one run over {len(parts)} files", f"{sharded['one_seconds']:.2f}",
                         f"{text_bytes / MB / sharded['one_seconds']:.2f}", "", "", "", ""])  # fmt: skip
            rows.append([f"{args.shards} x json2bin --shard I/{args.shards} (in turn) + merge", f"{total:.2f}",
                         f"{text_bytes / MB / total:.2f}", "", "", check, ""])  # fmt: skip
            rows.append([f"  critical path: slowest shard + merge ({sharded['merge_seconds']:.2f} s, "
                         f"{sharded['merge_maxrss_mb']:.0f} MB)", f"{critical:.2f}", f"{text_bytes / MB / critical:.2f}",
                         "", "", "on 10 machines", ""])  # fmt: skip
        # MB/s per core: every row ran on --workers cores
        rows[0].insert(3, "MB/s/core")
        for row in rows[1:]:
            row.insert(3, f"{float(row[2]) / args.workers:.2f}" if row[2] else "")
        print()
        print(table(rows))
        print()
        ratio_rows = [["ratio", "value", "goal"]]
        for label, run in ((f"{file_bytes / MB:.0f} MB", big), (f"{file_bytes / MB / 10:.0f} MB", little)):
            per_round = ", ".join(f"{r:.2f}" for r in run["ratios"])
            ratio_rows.append(
                [
                    f"json2bin / raw gigatoken (the fastest encoder; identical ids), {label}",
                    f"{run['raw_seconds'] / run['ours_seconds']:.2f}x (rounds: {per_round})",
                    ">= 0.8x" if run is big else "(start-up dominated)",
                ]
            )
            ratio_rows.append(
                [
                    f"json2bin / raw gigatoken in {BATCHED_MB} MB calls (its best batching), {label}",
                    f"{run['batched_seconds'] / run['ours_seconds']:.2f}x",
                    "(for reference)",
                ]
            )
        rss = figures["rss"]
        ratio_rows.append(
            [
                f"peak RSS, {rss['large_mb_input']:.0f} MB input / {rss['small_mb_input']:.0f} MB input (process tree)",
                f"{rss['large_tree_mb']:.0f} / {rss['small_tree_mb']:.0f} MB = {rss['large_tree_mb'] / rss['small_tree_mb']:.2f}x",
                "~1x (flat)",
            ]
        )
        ratio_rows.append(
            [
                "peak RSS of the largest single process (VmHWM)",
                f"{rss['large_maxrss_mb']:.0f} / {rss['small_maxrss_mb']:.0f} MB = {rss['large_maxrss_mb'] / rss['small_maxrss_mb']:.2f}x",
                "~1x (flat)",
            ]
        )
        if megatron and "megatron" in figures:
            meg = figures["megatron"]
            ratio_rows.append(
                [
                    "json2bin / Megatron-LM preprocess_data.py (file MB/s, end to end)",
                    f"{ours_mb_s / meg['mb_s_file']:.1f}x",
                    ">= 15x, byte-identical",
                ]
            )
        if "megatron_fast" in figures:
            ratio_rows.append(
                [
                    "json2bin / Megatron-LM preprocess_data_fast.py (end to end, same input)",
                    f"{figures['megatron_fast']['seconds'] / big['ours_seconds']:.2f}x",
                    "(reference: the same gigatoken)",
                ]
            )
        elif args.megatron_dir is None:
            ratio_rows.append(
                ["json2bin / Megatron-LM preprocess_data.py", "not measured (no --megatron-dir)", ">= 15x"]
            )
        print(table(ratio_rows))
        figures["ratio_vs_fastest_raw"] = big["raw_seconds"] / big["ours_seconds"]
        figures["ratio_vs_fastest_raw_small"] = little["raw_seconds"] / little["ours_seconds"]
        if "megatron" in figures:
            figures["ratio_vs_megatron"] = ours_mb_s / figures["megatron"]["mb_s_file"]
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
