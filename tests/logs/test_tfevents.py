"""The hand-written TensorBoard records must be what TensorBoard's own code reads."""

from __future__ import annotations

import math
import random

import pytest

from llmtools.logs import tfevents
from tests.logs.helpers import accumulate, f32


def test_crc_matches_tensorboard():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    rng = random.Random(0)
    for size in (0, 1, 3, 4, 7, 64, 255, 1000):
        data = bytes(rng.randrange(256) for _ in range(size))
        assert tfevents.masked_crc32c(data) == masked_crc32c(data)


def test_vectorized_framing_equals_one_by_one():
    rng = random.Random(1)
    payloads = [
        bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 5, 180, 181, 183, 900])))
        for _ in range(300)
    ]
    assert tfevents.frame_many(payloads) == b"".join(tfevents.frame(p) for p in payloads)


def test_event_encoding_parses_with_protobuf():
    from tensorboard.compat.proto import event_pb2

    payload = tfevents.event(
        1234.5,
        2**40,
        [tfevents.scalar_value("train/loss", 2.5), tfevents.text_value("events", "resumed at 7")],
    )
    event = event_pb2.Event.FromString(payload)
    assert event.wall_time == 1234.5 and event.step == 2**40
    loss, text = event.summary.value
    assert (loss.tag, loss.simple_value) == ("train/loss", 2.5)
    assert text.metadata.plugin_data.plugin_name == "text"
    assert text.tensor.string_val == [b"resumed at 7"]
    assert event_pb2.Event.FromString(tfevents.file_version_event(1.0)).file_version == "brain.Event:2"


def test_writer_file_reads_back_with_event_accumulator(tmp_path):
    values = {
        "train/loss": [3.0, 2.5, float("nan")],
        "train/lr": [1e-4, 2e-4, 1e40],
        "train/tiny": [1e-45, -0.0, -1e40],
    }
    path = tmp_path / tfevents.new_event_file_name(1)
    with tfevents.EventFileWriter(path, buffer_bytes=64) as writer:  # tiny buffer: many batches
        for step in range(3):
            writer.write(
                tfevents.event(
                    100.0 + step, step, [tfevents.scalar_value(t, v[step]) for t, v in values.items()]
                )
            )
        writer.write(tfevents.event(103.0, 2, [tfevents.text_value("events", "loss spike")]))
    acc = accumulate(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == sorted(values)
    for tag, series in values.items():
        got = acc.Scalars(tag)
        assert [e.step for e in got] == [0, 1, 2]
        assert [e.wall_time for e in got] == [100.0, 101.0, 102.0]
        for event, want in zip(got, series, strict=True):
            if math.isnan(want):
                assert math.isnan(event.value)
            elif abs(want) > 3.5e38:
                assert event.value == math.copysign(math.inf, want)  # beyond float32: inf, not a crash
            else:
                assert event.value == f32(want)
    assert [e.tensor_proto.string_val for e in acc.Tensors("events")] == [[b"loss spike"]]


@pytest.mark.parametrize("step", [0, 1, 127, 128, 2**31, -1])
def test_varint_steps(step):
    from tensorboard.compat.proto import event_pb2

    assert event_pb2.Event.FromString(tfevents.event(0.0, step, [])).step == step
