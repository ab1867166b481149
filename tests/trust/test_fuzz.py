"""Fuzzing the real readers: mutated ``.idx``/``.bin`` pairs, ``meta.json`` files and ``mix.json`` files may
only ever produce our named errors (:class:`~llmtools.errors.LlmtoolsError`), never another exception, a
crash, or a read out of bounds (the compiled sample gather would take the process down).

Bounded: a few hundred examples in all, derandomized (the same examples on every run), no example database.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from llmtools.errors import LlmtoolsError  # noqa: E402
from llmtools.formats.indexed import HEADER_SIZE, IndexedDatasetReader, IndexedDatasetWriter  # noqa: E402

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# ----------------------------------------------------------------------------------------- .idx / .bin
DOCS = [[1, 2, 3], [], [4, 5], [6] * 40, [7, 8, 9, 10], [], [11], [12] * 17, [13, 14]]


def _write_dataset(prefix: Path) -> None:
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        for doc in DOCS:
            writer.add_document(np.array(doc, dtype=np.uint16))
        writer.add_document(np.arange(30, dtype=np.uint16), sequence_lengths=[10, 0, 20])  # two sentences


@pytest.fixture(scope="module")
def dataset_bytes(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("fuzzidx") / "d"
    _write_dataset(prefix)
    return Path(f"{prefix}.idx").read_bytes(), Path(f"{prefix}.bin").read_bytes()


class _Unchecked(IndexedDatasetReader):
    def validate(self) -> None:
        pass


def _same_verdict(prefix: Path) -> None:
    """The compiled check and the numpy check accept and refuse the same indexes, with the same words."""
    try:
        reader = _Unchecked(prefix)
    except LlmtoolsError:
        return  # the header: checked by one piece of code before either
    verdicts = []
    for check in (IndexedDatasetReader.validate, IndexedDatasetReader.validate_numpy):
        try:
            check(reader)
            verdicts.append(None)
        except LlmtoolsError as error:
            verdicts.append(str(error))
    assert verdicts[0] == verdicts[1]


def _read_everything(prefix: Path) -> None:
    """What downstream readers do: every sequence, document and token; a blend of samples through the
    compiled gather."""
    from llmtools.data.dataset import BlendedGPTDataset

    _same_verdict(prefix)
    reader = IndexedDatasetReader(prefix)
    for i in range(len(reader)):
        reader[i]
    for j in range(reader.num_documents):
        reader.document(j)
    reader.tokens()
    reader.document_lengths()
    if reader.num_tokens >= 8:
        ds = BlendedGPTDataset.from_prefixes(
            [str(prefix)], None, seq_length=4, num_samples=6, split="100,0,0"
        )
        ds.batch(np.arange(len(ds)))
        for i in range(len(ds)):
            ds[i]


mutation = st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=8))


@FUZZ
@given(
    edits=st.lists(mutation, min_size=1, max_size=4),
    idx_cut=st.one_of(st.none(), st.integers(0, 400)),
    bin_delta=st.integers(-6, 6),
    header=st.booleans(),
)
def test_mutated_indexes_give_only_named_errors(dataset_bytes, edits, idx_cut, bin_delta, header):
    idx, binary = bytearray(dataset_bytes[0]), bytearray(dataset_bytes[1])
    low = 0 if header else HEADER_SIZE  # mostly the arrays: a broken header is the easy case
    for at, data in edits:
        at = low + at % max(1, len(idx) - low)
        idx[at : at + len(data)] = data
    if idx_cut is not None:
        idx = idx[: min(len(idx), idx_cut)]
    binary = binary[: len(binary) + bin_delta] if bin_delta < 0 else binary + b"\x07" * bin_delta
    with tempfile.TemporaryDirectory() as folder:
        prefix = Path(folder) / "d"
        Path(f"{prefix}.idx").write_bytes(bytes(idx))
        Path(f"{prefix}.bin").write_bytes(bytes(binary))
        try:
            _read_everything(prefix)
        except LlmtoolsError:
            pass


@FUZZ
@given(lengths=st.lists(st.integers(-5, 2**31 - 1), min_size=1, max_size=6), pointer_shift=st.integers(-9, 9))
def test_forged_lengths_and_pointers(dataset_bytes, lengths, pointer_shift):
    """Structured forgeries: plausible-looking lengths (up to 2**31-1) and shifted pointers."""
    idx = bytearray(dataset_bytes[0])
    (s,) = struct.unpack_from("<Q", idx, 18)
    for i, value in enumerate(lengths[:s]):
        struct.pack_into("<i", idx, HEADER_SIZE + 4 * i, value)
    last = HEADER_SIZE + 4 * s + 8 * (s - 1)
    (pointer,) = struct.unpack_from("<q", idx, last)
    struct.pack_into("<q", idx, last, pointer + pointer_shift)
    with tempfile.TemporaryDirectory() as folder:
        prefix = Path(folder) / "d"
        Path(f"{prefix}.idx").write_bytes(bytes(idx))
        Path(f"{prefix}.bin").write_bytes(dataset_bytes[1])
        try:
            _read_everything(prefix)
        except LlmtoolsError:
            pass


# ----------------------------------------------------------------------------------------- JSON mutation
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=True),
    st.sampled_from(["", "/etc/passwd", "../../x", "..", "/", "a\x00b", "step_00000004", "0" * 64]),
    st.text(max_size=12),
    st.lists(st.integers(-3, 10**6), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-1, 3), max_size=2),
)


def _paths(value, prefix=()):
    """Every (path, value) in a JSON document, containers included."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


def _mutate(document, data) -> object:
    document = json.loads(json.dumps(document))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(document) if p]
        path = data.draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(ODD_VALUES)
    return document


@pytest.fixture(scope="module")
def checkpoint_master(run_master):
    return run_master / "checkpoints" / "step_00000004"


@FUZZ
@given(data=st.data())
def test_mutated_meta_json_gives_only_named_errors(checkpoint_master, data):
    from llmtools.ckpt.manager import CheckpointManager
    from llmtools.ckpt.verify import read_meta, verify

    meta = json.loads((checkpoint_master / "meta.json").read_text())
    mutated = _mutate(meta, data)
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        step = run / "checkpoints" / checkpoint_master.name
        step.mkdir(parents=True)
        for file in checkpoint_master.glob("*.pt"):
            shutil.copyfile(file, step / file.name)
        text = json.dumps(mutated)
        if data.draw(st.booleans()):  # or cut short
            text = text[: data.draw(st.integers(0, len(text)))]
        (step / "meta.json").write_text(text)
        try:
            read_meta(step)
        except LlmtoolsError:
            pass
        report = verify(step, checksums=data.draw(st.booleans()))
        assert isinstance(report.problems, list)
        try:
            CheckpointManager(run).resolve(data.draw(st.sampled_from(["auto", "latest", "4", str(step)])))
        except LlmtoolsError:
            pass


@pytest.fixture(scope="module")
def mix_master(trust_data):
    return trust_data["folder"]


def _copy_mix(master: Path, folder: Path) -> tuple[Path, dict]:
    """The mix and its sources copied into ``folder``, the mix pointing at the copies."""
    for file in master.iterdir():
        if file.is_dir():  # the index cache folder
            shutil.copytree(file, folder / file.name)
        else:
            shutil.copyfile(file, folder / file.name)
    mix_path = folder / "mix.json"
    plan = json.loads(mix_path.read_text())
    for source in plan["sources"]:
        source["prefix"] = str(folder / Path(source["prefix"]).name)
    mix_path.write_text(json.dumps(plan))
    return mix_path, plan


def _read_mix(mix_path: Path) -> None:
    from llmtools.data.dataset import BlendedGPTDataset

    dataset = BlendedGPTDataset.from_mix(mix_path, split="train")
    dataset.batch(np.arange(len(dataset)))
    for i in range(0, len(dataset), max(1, len(dataset) // 16)):
        dataset[i]


def test_control_the_copied_mix_reads(mix_master, tmp_path):
    """The fuzzers below start from a mix that opens and reads (so their refusals are the mutations')."""
    mix_path, _ = _copy_mix(mix_master, tmp_path)
    _read_mix(mix_path)


@FUZZ
@given(data=st.data())
def test_mutated_mix_json_gives_only_named_errors(mix_master, data):
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        mix_path, plan = _copy_mix(mix_master, folder)
        mix_path.write_text(json.dumps(_mutate(plan, data)))
        if data.draw(st.booleans()):  # a cache array swapped for another of the same plan
            names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.npy"))
            a, b = data.draw(st.sampled_from(names)), data.draw(st.sampled_from(names))
            if a != b:
                shutil.copyfile(folder / a, folder / b)
        try:
            _read_mix(mix_path)
        except LlmtoolsError:
            pass


@FUZZ
@given(data=st.data())
def test_forged_cache_arrays_give_only_named_errors(mix_master, data):
    """What someone who rewrites the index cache *and* its recorded digests can do: arrays of any values
    and lengths under the names mix.json gives. The reader must still never read out of bounds."""
    import hashlib

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        mix_path, plan = _copy_mix(mix_master, folder)
        files = plan["cache"]["files"]["train"]
        key = data.draw(st.sampled_from(sorted(files)))
        original = np.load(folder / files[key])
        if data.draw(st.booleans()):  # the same shape, values nudged or replaced
            forged = original.astype(np.int64).copy()
            flat = forged.reshape(-1)
            for _ in range(data.draw(st.integers(1, 4))):
                at = data.draw(st.integers(0, max(0, flat.size - 1)))
                if flat.size:
                    flat[at] = data.draw(st.integers(-3, 10**7)) if data.draw(st.booleans()) else flat[at] + 1
            forged = forged.astype(original.dtype) if data.draw(st.booleans()) else forged
        else:  # another length
            size = data.draw(st.integers(0, 2 * max(1, original.shape[0])))
            forged = np.resize(original, (size, *original.shape[1:]))
        np.save(folder / files[key], forged, allow_pickle=False)
        raw = (folder / files[key]).read_bytes()
        digest = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        plan["cache"].setdefault("digests", {}).setdefault("train", {})[key] = digest
        mix_path.write_text(json.dumps(plan))
        try:
            _read_mix(mix_path)
        except LlmtoolsError:
            pass
