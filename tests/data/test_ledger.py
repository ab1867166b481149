"""The data of a run whose mix changes: streams, stages and the ledger, on the data layer (no training).

The property: a run of A samples on weights w1 continued for B on w2 (and on w3 with a new source, and
with one removed) draws every source's stream in order, with no repeat and no gap, exactly as many
samples from each as the blends prescribe, and the same samples whether it was interrupted never,
once, or five times (each interruption a resume through the ledger as a checkpoint keeps it); a
schedule declared up front (a staged mix.json) gives the same data as the mixes applied in flight.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from llmtools.data import mix as M
from llmtools.data.blend import blend_weights, build_blending_indices, normalize_weights
from llmtools.data.ledger import Ledger
from llmtools.data.ledger_report import ledger_report
from llmtools.data.reconcile import open_run_data
from llmtools.data.stages import StageKey, StageSpec
from llmtools.data.train_streams import TrainStreams
from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import IndexedDatasetWriter
from llmtools.formats.quarantine import make_record
from llmtools.formats.sidecar import write_sidecar

SEQ = 32


def write_source(prefix, num_docs, seed, tokenizer_hash):
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(prefix, np.uint16, durable=False) as writer:
        for _ in range(num_docs):
            writer.add_document(rng.randint(1, 500, size=rng.randint(1, 200)))
    tokenizer = {"kind": "byte", "name": f"test-{tokenizer_hash}", "hash": tokenizer_hash, "vocab_size": 500}
    write_sidecar(prefix, {"format": "llmtools.indexed-sidecar", "version": 1, "tokenizer": tokenizer})
    return str(prefix)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("ledger")
    return {
        "a": write_source(d / "a", 300, 11, tokenizer_hash="tokA"),
        "b": write_source(d / "b", 90, 12, tokenizer_hash="tokA"),
        "c": write_source(d / "c", 40, 13, tokenizer_hash="tokA"),
        "other_tokenizer": write_source(d / "o", 50, 14, tokenizer_hash="tokB"),
    }


def save_mix(path, prefixes, weights, samples, stages=None, seq=SEQ, split="100,0,0", seed=1234):
    config = M.MixConfig(
        blend=M.Blend(list(prefixes), weights),
        seq_length=seq,
        num_samples=samples,
        split=split,
        seed=seed,
        stages=stages,
    )
    M.save_plan(M.build_plan(config), path)
    return TrainStreams.from_mix(path)


def stage(start, until, *weights):
    return StageSpec(StageKey("samples", start), until, tuple(weights))


def draws(data, lo, hi):
    """(source name, stream position) of every sample at global positions [lo, hi)."""
    di = data.built.dataset_index[lo - data.base : hi - data.base]
    dsi = data.built.dataset_sample_index[lo - data.base : hi - data.base]
    out = []
    for p, w in zip(di.tolist(), dsi.tolist(), strict=True):
        key, segment = data.built.parts[p]
        out.append((data.sources[key].spec.name, data.streams[key].start(segment) + w))
    return out


def checkpoint(data, position):
    """The ledger as a checkpoint keeps it (through JSON), read back."""
    return Ledger.from_json(json.loads(json.dumps(data.state(position))), "meta.json[data.ledger]")


def run(phases, cuts):
    """Train the phases [(plan, until)] in order, stopping and resuming (through the ledger) at every
    position in ``cuts`` and at each phase's end; the samples drawn at each position."""
    data, _ = open_run_data(phases[0][0], None, 0)
    data.run = "test-run"
    drawn, at, plan_now = [], 0, phases[0][0]
    stops = sorted({*cuts, *(until for _, until in phases)})
    for stop in stops:
        drawn += draws(data, at, stop)
        at = stop
        plan_now = next(plan for plan, until in phases if until > at) if at < phases[-1][1] else plan_now
        if at < phases[-1][1]:
            data, _ = open_run_data(plan_now, checkpoint(data, at), at)
    return drawn, data


def blend_counts(weights, size):
    di, _ = build_blending_indices(blend_weights(normalize_weights(weights)), size)
    return np.bincount(di, minlength=len(weights)).tolist()


@pytest.fixture(scope="module")
def plans(sources, tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    a, b, c = sources["a"], sources["b"], sources["c"]
    A, B, C = 600, 500, 400
    return {
        "A": A,
        "B": B,
        "C": C,
        "w1": save_mix(d / "w1.json", [a, b], [0.7, 0.3], A),
        "w2": save_mix(d / "w2.json", [a, b], [0.2, 0.8], B),
        "w3": save_mix(d / "w3.json", [b, c], [0.4, 0.6], C),  # a removed, c new
        "staged": save_mix(
            d / "staged.json",
            [a, b, c],
            None,
            A + B + C,
            [
                stage(0, StageKey("samples", A), 0.7, 0.3, 0),
                StageSpec(StageKey("samples", A), StageKey("samples", A + B), (0.2, 0.8, 0)),
                StageSpec(StageKey("samples", A + B), StageKey("end"), (0, 0.4, 0.6)),
            ],
        ),
    }


@pytest.mark.parametrize(
    "cuts",
    [[], [137], [50, 333, 777, 901, 1201]],
    ids=["never", "once", "five-times"],
)
def test_mix_changes_continue_every_stream_exactly(plans, cuts):
    A, B, C = plans["A"], plans["B"], plans["C"]
    phases = [(plans["w1"], A), (plans["w2"], A + B), (plans["w3"], A + B + C)]
    drawn, data = run(phases, cuts)
    reference, _ = run(phases, [])
    assert drawn == reference  # interrupted or not: the same samples at every position

    # every source's stream read in order: no repeat, no gap, none skipped
    per_source = defaultdict(list)
    for name, position in drawn:
        per_source[name].append(position)
    for name, positions in per_source.items():
        assert positions == list(range(len(positions))), name

    # the counts each blend prescribes: Megatron's greedy over each phase on its own
    ca, cb = blend_counts([0.7, 0.3], A)
    da, db = blend_counts([0.2, 0.8], B)
    eb, ec = blend_counts([0.4, 0.6], C)
    assert {n: len(p) for n, p in per_source.items()} == {"a": ca + da, "b": cb + db + eb, "c": ec}

    # the ledger says the same, and what happened to each source
    state = data.state(A + B + C)
    ledger = {s["name"]: s for s in state["sources"]}
    assert {n: s["drawn"] for n, s in ledger.items()} == {"a": ca + da, "b": cb + db + eb, "c": ec}
    assert {n: s["position"] for n, s in ledger.items()} == {n: s["drawn"] for n, s in ledger.items()}
    assert [(s["start"], s["end"]) for s in state["stages"]] == [(0, A), (A, A + B), (A + B, A + B + C)]


def test_a_schedule_up_front_is_the_mixes_applied_in_flight(plans):
    A, B, C = plans["A"], plans["B"], plans["C"]
    in_flight, _ = run([(plans["w1"], A), (plans["w2"], A + B), (plans["w3"], A + B + C)], [])
    staged, _ = run([(plans["staged"], A + B + C)], [])
    interrupted, _ = run([(plans["staged"], A + B + C)], [A - 1, A, A + 7, A + B + 1])
    assert staged == in_flight == interrupted


def test_a_staged_plan_reads_past_a_stream_segment_into_whole_epochs(plans):
    staged = plans["staged"]
    data, _ = open_run_data(staged, None, 0)
    segments = {(key, seg) for key, seg in data.built.parts}
    b = [rec.spec for rec in data.sources.values() if rec.spec.name == "b"][0]
    assert (b.key, 1) in segments  # b's draws outgrow the index its first stage built
    stream = data.streams[b.key]
    first, second = stream.segment(0), stream.segment(1)
    assert second.num_epochs == 1 and not second.separate_final_epoch
    # segment 0 spans whole epochs, so the extension starts a new epoch: every sequence once in it
    assert sorted(second.document_index.tolist()) == list(range(*b.sequence_range))
    assert first.num_samples == stream.start(1)


def test_a_one_stage_schedule_is_the_static_plan_array_for_array(sources, tmp_path):
    prefixes = [sources["a"], sources["b"], sources["c"]]
    staged = save_mix(tmp_path / "s.json", prefixes, None, 700, [stage(0, StageKey("end"), 0.5, 0.3, 0.2)])
    static = save_mix(tmp_path / "w.json", prefixes, [0.5, 0.3, 0.2], 700)
    assert np.array_equal(staged.dataset.dataset_index, static.dataset.dataset_index)
    assert np.array_equal(staged.dataset.dataset_sample_index, static.dataset.dataset_sample_index)
    for x, y in zip(staged.dataset.parts, static.dataset.parts, strict=True):
        for name in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(getattr(x, name), getattr(y, name))


def test_a_static_run_reads_the_mix_arrays_as_they_are(plans):
    data, report = open_run_data(plans["w1"], None, 0)
    assert report.kind == "fresh" and data.dataset is plans["w1"].dataset
    data.run = "r"
    again, report = open_run_data(plans["w1"], checkpoint(data, 256), 256)
    assert report.kind == "same" and again.dataset is plans["w1"].dataset  # an exact resume rebuilds nothing


def test_continuation_report_names_what_continues_starts_and_stops(plans):
    A, B = plans["A"], plans["B"]
    _, data = run([(plans["w1"], A), (plans["w2"], A + B)], [])
    _, report = open_run_data(plans["w3"], checkpoint(data, A + B), A + B)
    assert report.kind == "continued"
    assert report.sources == {"a": "stops", "b": "continues", "c": "starts"}
    text = "\n".join(report.lines)
    assert (
        "a: stops at sample" in text
        and "b: continues at sample" in text
        and "c: new, starts at sample 0" in text
    )


def test_the_same_blend_planned_longer_goes_on(sources, tmp_path):
    short = save_mix(tmp_path / "short.json", [sources["a"], sources["b"]], [0.6, 0.4], 300)
    long = save_mix(tmp_path / "long.json", [sources["a"], sources["b"]], [0.6, 0.4], 900)
    data, _ = open_run_data(short, None, 0)
    data.run = "r"
    both = draws(data, 0, 300)
    more, report = open_run_data(long, checkpoint(data, 300), 300)
    assert report.kind == "extended"
    both += draws(more, 300, 900)
    whole, _ = open_run_data(long, None, 0)
    # the greedy goes on as one blend: the same source at every position as the longer plan from 0 ...
    assert [n for n, _ in both] == [n for n, _ in draws(whole, 0, 900)]
    # ... and each source goes on along its own stream, nothing read twice
    for name in ("a", "b"):
        positions = [p for n, p in both if n == name]
        assert positions == list(range(len(positions)))


@pytest.mark.parametrize(
    "change, words",
    [
        ("seq", ["seq_length", "64 tokens per sample", "has 32"]),
        ("tokenizer", ["tokenizer", "tokA", "tokB", "tokenized differently"]),
        ("split", ["another --split", "0..300", "0..150"]),
    ],
)
def test_a_mix_that_cannot_continue_is_refused_naming_both_sides(sources, tmp_path, change, words):
    seq = 64 if change == "seq" else SEQ
    old = save_mix(tmp_path / "old.json", [sources["a"], sources["b"]], [0.5, 0.5], 200, seq=seq)
    data, _ = open_run_data(old, None, 0)
    data.run = "r"
    saved = checkpoint(data, 100)
    prefixes = [sources["other_tokenizer"]] if change == "tokenizer" else [sources["a"], sources["b"]]
    split = "50,50,0" if change == "split" else "100,0,0"
    new = save_mix(tmp_path / "new.json", prefixes, [1.0] * len(prefixes), 200, split=split)
    with pytest.raises(InputError) as error:
        open_run_data(new, saved, 100, where="ck/meta.json[data.ledger]")
    message = str(error.value)
    assert "\n" not in message and message.startswith("ck/meta.json[data.ledger]")
    for word in words:
        assert word in message


def test_quarantine_passes_over_the_documents_and_counts_the_replacements(plans):
    A, B = plans["A"], plans["B"]
    _, data = run([(plans["w1"], A), (plans["w2"], A + B)], [])
    # a sample of b drawn early in phase 2 reads documents that later samples of b read too
    later = [(pos, data.describe([pos])[0]) for pos in range(A, A + B)]
    bs = [(pos, d) for pos, d in later if d["source"] == "b"]
    pos, bad = next(
        (pos, d)
        for pos, d in bs
        if any(
            {x["document"] for x in d["documents"]} & {x["document"] for x in e["documents"]}
            for p, e in bs
            if p > pos + 10
        )
    )
    poisoned = {x["document"] for x in bad["documents"]}
    resume_at = pos + 1
    record = make_record("r", 9, 0, "nan", [bad])
    continued, report = open_run_data(
        plans["w2"], checkpoint(data, resume_at), resume_at, quarantine=[record]
    )
    assert report.quarantine == {"b": len(poisoned)}
    after = draws(continued, resume_at, A + B)
    stream = continued.streams[bad["key"]]
    for name, position in after:
        if name == "b":
            assert not poisoned & {d["document"] for d in stream.documents(position)}
    # the blend is unchanged (the same source at every position); b's draws skip, never repeat
    assert [n for n, _ in after] == [n for n, _ in draws(data, resume_at, A + B)]
    b_after = [p for n, p in after if n == "b"]
    assert b_after == sorted(set(b_after))
    state = {s["name"]: s for s in continued.state(A + B)["sources"]}
    assert state["b"]["quarantined"] == 1 and state["b"]["skipped"] >= 1
    assert state["b"]["position"] == state["b"]["drawn"] + state["b"]["skipped"]
    # the replacement draws are recorded: the positions passed over, each reading a poisoned document
    assert len(state["b"]["passed_over"]) == state["b"]["skipped"]
    for position in state["b"]["passed_over"]:
        assert position not in b_after and poisoned & {d["document"] for d in stream.documents(position)}
    # a later exact resume keeps passing over them, identically
    again, _ = open_run_data(plans["w2"], checkpoint(continued, A + 300), A + 300, quarantine=[record])
    assert draws(again, A + 300, A + B) == after[A + 300 - resume_at :]
    report = ledger_report({"step": 1, "data": {"ledger": continued.state(A + B)}}, "ck", [record])
    assert {s["name"]: s["quarantined"] for s in report["sources"]}["b"] == 1


def test_quarantine_of_a_source_the_run_never_drew_is_refused(plans):
    data, _ = open_run_data(plans["w1"], None, 0)
    data.run = "r"
    sample = data.describe([3])[0]
    sample["key"] = "f" * 64
    with pytest.raises(InputError, match="never drew from: a quarantine file of another run"):
        open_run_data(
            plans["w1"], checkpoint(data, 10), 10, quarantine=[make_record("r", 1, 0, "nan", [sample])]
        )


def test_reset_data_restarts_the_streams_and_counts_the_repeats(plans):
    data, _ = open_run_data(plans["w1"], None, 0)
    data.run = "r"
    reset, report = open_run_data(plans["w1"], checkpoint(data, 400), 0, reset=True)
    assert report.kind == "reset" and draws(reset, 0, 400) == draws(data, 0, 400)
    state = {s["name"]: s for s in reset.state(200)["sources"]}
    before = {s["name"]: s for s in data.state(400)["sources"]}
    assert state["a"]["drawn"] == before["a"]["drawn"] + state["a"]["position"]
    assert state["a"]["repeated"] == state["a"]["position"]  # everything re-read was read before


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="x"), "not a data ledger"),
        (lambda d: d.update(run=""), "run: missing"),
        (lambda d: d["sources"][0].update(position=-1), "sources[0].position: expected an integer >= 0"),
        (lambda d: d["sources"][0].update(sequence_range=[5, 2]), "sources[0].sequence_range"),
        (lambda d: d["sources"].pop(), "is not one of the ledger's sources"),
        (lambda d: d["stages"][0]["offsets"].clear(), "stages[0].offsets"),
        (lambda d: d["sources"][0].update(skips=[{"from": 1}]), "sources[0].skips[0]"),
    ],
)
def test_a_malformed_ledger_is_refused_naming_the_key(plans, mutate, message):
    data, _ = open_run_data(plans["w1"], None, 0)
    data.run = "r"
    state = json.loads(json.dumps(data.state(100)))
    mutate(state)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Ledger.from_json(state, "meta.json[data.ledger]")


@pytest.mark.parametrize(
    "stages, message",
    [
        ([(0, ("samples", 100), (1, 1)), (150, ("end", None), (1, 1))], "a gap of 50 samples"),
        ([(0, ("samples", 100), (1, 1)), (50, ("end", None), (1, 1))], "the ranges overlap"),
        ([(0, ("samples", 100), (1, 1)), (100, ("samples", 300), (1, 1))], "ends at sample 300"),
        ([(0, ("step", 3), (1, 1)), (None, ("end", None), (1, 1))], "needs --global-batch-size"),
        ([(0, ("samples", 100), (1,))], "1 weight(s) for 2 source(s)"),
    ],
)
def test_bad_schedules_are_refused(sources, stages, message):
    specs, before = [], StageKey("samples", 0)
    for start, (unit, value), weights in stages:
        begin = before if start is None else StageKey("samples", start)
        specs.append(StageSpec(begin, StageKey(unit, value), weights))
        before = specs[-1].until
    with pytest.raises((InputError, UsageError)) as error:
        M.MixConfig(
            blend=M.Blend([sources["a"], sources["b"]]),
            seq_length=SEQ,
            num_samples=400,
            split="100,0,0",
            stages=specs,
        )
    assert message in str(error.value)


@pytest.mark.parametrize(
    "shift, message",
    [
        (5, r"stages\[1\]\]: starts at sample 605 but stage 0 ends at sample 600: a gap"),
        (
            -5,
            r"stages\[1\]\]: starts at sample 595, inside stage 0 \(until sample 600\): the stage ranges overlap",
        ),
    ],
)
def test_a_hand_edited_schedule_with_a_gap_or_an_overlap_is_refused(plans, tmp_path, shift, message):
    import shutil
    from pathlib import Path

    mix = json.loads(open(plans["staged"].origin).read())
    mix["stages"][1]["start"] += shift
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mix))
    folder = Path(plans["staged"].origin).parent
    for name in mix["cache"]["files"]["train"].values():  # names inside the mix's cache folder
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / name, tmp_path / name)
    with pytest.raises(InputError, match=message):
        TrainStreams.from_mix(path)


def test_the_continued_blend_is_the_same_greedy_with_or_without_the_compiled_helper(monkeypatch):
    from llmtools import _native

    w = [0.5, 0.2, 0.2, 0.1]
    fast = build_blending_indices(w, 5000, parts=[7, 3, 5, 9], offsets=[10, 0, 4, 99], with_counts=True)
    monkeypatch.setenv("LLMTOOLS_NO_NATIVE", "1")
    monkeypatch.setattr(_native, "_tried", False)
    monkeypatch.setattr(_native, "_lib", None)
    slow = build_blending_indices(w, 5000, parts=[7, 3, 5, 9], offsets=[10, 0, 4, 99], with_counts=True)
    for x, y in zip(fast, slow, strict=True):
        assert np.array_equal(x, y)
    plain, _ = build_blending_indices(w, 5000)
    assert np.array_equal(fast[0], np.asarray([7, 3, 5, 9], np.int16)[plain])


def plan_in_memory(prefixes, weights, samples, seed=1234):
    config = M.MixConfig(
        blend=M.Blend(list(prefixes), weights),
        seq_length=SEQ,
        num_samples=samples,
        split="100,0,0",
        seed=seed,
    )
    return TrainStreams.from_mix_plan(M.build_plan(config), "in memory")


def test_random_mix_changes_and_interruptions_keep_every_stream_exact(sources):
    from hypothesis import assume, given, settings
    from hypothesis import strategies as st

    names = ["a", "b", "c"]
    weight = st.floats(0.05, 1.0)

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(
        phases=st.lists(
            st.tuples(
                st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True), st.integers(50, 400)
            ),
            min_size=1,
            max_size=4,
        ),
        weights=st.lists(weight, min_size=12, max_size=12),
        cuts=st.lists(st.integers(1, 1500), max_size=5),
        seed=st.sampled_from([1234, 7]),
    )
    def check(phases, weights, cuts, seed):
        built, end, w = [], 0, iter(weights)
        for chosen, size in phases:
            ws = [next(w) for _ in chosen]
            end += size
            built.append(
                (plan_in_memory([sources[n] for n in chosen], ws, size, seed), end, chosen, ws, size)
            )
        # Two identical mixes in a row are one mix resumed, not a change: the second would continue the
        # first past its end (a real run is refused there: the mix holds fewer samples than its steps).
        assume(all(one[2:] != two[2:] for one, two in zip(built, built[1:], strict=False)))
        schedule = [(plan, until) for plan, until, *_ in built]
        drawn, data = run(schedule, [c for c in cuts if c < end])
        assert drawn == run(schedule, [])[0]
        per_source = defaultdict(list)
        for name, position in drawn:
            per_source[name].append(position)
        for name, positions in per_source.items():
            assert positions == list(range(len(positions))), name
        expected = defaultdict(int)
        for _, _, chosen, ws, size in built:
            for name, n in zip(chosen, blend_counts(ws, size), strict=True):
                expected[name] += n
        assert {n: len(p) for n, p in per_source.items()} == {n: c for n, c in expected.items() if c}
        state = {s["name"]: s["drawn"] for s in data.state(end)["sources"]}
        assert {n: c for n, c in state.items() if c} == {n: c for n, c in expected.items() if c}

    check()


def test_a_many_source_mix_named_by_globs_continues_every_stream(tmp_path, monkeypatch):
    """24 shards in two folders (the same file names in each), named by a glob and an @list file as
    llm-mix takes them; the run changes to the web shards only: every surviving stream goes on at its
    cursor, the code shards stop."""
    from llmtools.formats.pathlists import expand_prefixes

    for k in range(24):
        folder = tmp_path / ("code" if k % 2 else "web")
        write_source(folder / f"shard{k // 2:02d}", 15, 100 + k, tokenizer_hash="tokA")
    (tmp_path / "web.txt").write_text(f"# the web shards\n{tmp_path}/web/shard*\n")
    every = expand_prefixes([str(tmp_path / "*" / "shard*")])
    web = expand_prefixes([f"@{tmp_path / 'web.txt'}"])
    assert len(every) == 24 and len(web) == 12
    first, second = 700, 500
    phases = [
        (save_mix(tmp_path / "all.json", every, None, first), first),
        (save_mix(tmp_path / "web.json", web, None, second), first + second),
    ]
    drawn, data = run(phases, [311, first, first + 3])
    assert drawn == run(phases, [])[0]
    per_source = defaultdict(list)
    for name, position in drawn:
        per_source[name].append(position)
    assert len(per_source) == 24  # the same file names, told apart
    for name, positions in per_source.items():
        assert positions == list(range(len(positions))), name
    ledger = data.state(first + second)
    prefix = {s["name"]: s["prefix"] for s in ledger["sources"]}
    assert sum(s["drawn"] for s in ledger["sources"]) == first + second
    assert {prefix[name] for name, _ in drawn[first:]} == set(web)  # code stopped at the change

    # what a resume says: one line per fate, not one per source; metrics: tokens per folder
    first_data, _ = open_run_data(phases[0][0], None, 0)
    first_data.run = "test-run"
    changed, report = open_run_data(phases[1][0], checkpoint(first_data, first), first)
    assert report.kind == "continued" and len(report.sources) == 24
    assert report.lines[0] == f"data: the mix changed at sample {first}: now {tmp_path / 'web.json'}"
    assert report.lines[1].startswith("data: 12 sources continue, each at its cursor (")
    assert report.lines[1].endswith(" and 9 more)")
    assert report.lines[2].startswith("data: 12 sources stop: not in ")
    assert report.lines[3:] == [
        "data: llm-ckpt inspect --data RUN lists every source's samples, tokens and cursor"
    ]
    per_source = changed.consumed_tokens(first + second)
    assert len(per_source) == 24 and sum(per_source.values()) == (first + second) * SEQ
    import llmtools.data.run_data as ledger_module

    monkeypatch.setattr(ledger_module, "MAX_SOURCES_LOGGED", 20)
    changed._folders = None
    per_folder = changed.consumed_tokens(first + second)
    assert per_folder == {
        "web/": sum(n for name, n in per_source.items() if "/web/" in prefix[name]),
        "code/": sum(n for name, n in per_source.items() if "/code/" in prefix[name]),
    }
    assert per_folder["code/"] == first_data.consumed_tokens(first)["code/"]  # stopped at the change


def test_folder_names_are_short_unless_two_folders_share_one():
    from llmtools.data.run_data import folder_names

    assert folder_names({"1": "/d/web/s0", "2": "/d/web/s1", "3": "/d/code/s0", "4": "top"}) == {
        "1": "web/",
        "2": "web/",
        "3": "code/",
        "4": "./",
    }
    assert folder_names({"1": "a/web/s0", "2": "b/web/s0"}) == {"1": "a/web/", "2": "b/web/"}
