"""fsutil: temporaries registered before they exist, removed whatever happens; the umask honoured; groups of
outputs committed together; a full disk named (the real-process versions are in tests/contract/)."""

from __future__ import annotations

import os
import signal
import stat

import pytest

from llmtools import fsutil, interrupt
from llmtools.errors import DiskFullError, Interrupted


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_temporaries_and_outputs_honour_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        tmp = fsutil.tmp_sibling(tmp_path / "a" / "b" / "out.bin")
        assert _mode(tmp) == 0o640 and _mode(tmp_path / "a") == 0o750
        fsutil.commit_file(tmp, tmp_path / "a" / "b" / "out.bin")
        with fsutil.atomic_dir(tmp_path / "folder") as folder:
            (folder / "x").write_text("x")
        assert _mode(tmp_path / "folder") == 0o750 and _mode(tmp_path / "folder" / "x") == 0o640
    finally:
        os.umask(old)
    assert fsutil.live_temporaries() == []


def test_what_is_left_is_removed_with_the_folders_made_for_it(tmp_path):
    tmp = fsutil.tmp_sibling(tmp_path / "new" / "deep" / "out.bin")
    folder = fsutil.tmp_folder(tmp_path / "new" / "hf")
    (folder / "shard").write_bytes(b"x")
    assert set(fsutil.live_temporaries()) == {tmp, folder}
    fsutil.remove_temporaries()
    assert not (tmp_path / "new").exists()  # the temporaries, then the emptied folders made for them


def test_a_committed_output_keeps_its_folders(tmp_path):
    with fsutil.atomic_file(tmp_path / "made" / "out.txt") as handle:
        handle.write("done")
    fsutil.remove_temporaries()
    assert (tmp_path / "made" / "out.txt").read_text() == "done"


def test_a_group_appears_together_or_not_at_all(tmp_path):
    with pytest.raises(RuntimeError), fsutil.atomic_group() as group:
        group.path(tmp_path / "a.txt").write_text("a")
        group.path(tmp_path / "b.txt").write_text("b")
        raise RuntimeError("stopped before the end")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with fsutil.atomic_group() as group:
        group.path(tmp_path / "a.txt").write_text("a")
        group.path(tmp_path / "b.txt").write_text("b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_short_write_on_a_full_filesystem_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: 0)
    error = fsutil.disk_full_error(OSError("139960 requested and 11232 written"), tmp_path / "x.npy")
    assert isinstance(error, DiskFullError) and str(error).startswith(f"{tmp_path / 'x.npy'}: no space left")
    assert fsutil.disk_full_error(RuntimeError("unexpected pos 704 vs 598"), tmp_path / "c") is not None
    assert fsutil.disk_full_error(PermissionError(13, "Permission denied", "x"), tmp_path / "x") is None
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: 10 << 30)
    assert fsutil.disk_full_error(RuntimeError("unexpected pos 704 vs 598"), tmp_path / "c") is None


def test_signals_become_exceptions_and_wait_out_a_critical_section():
    previous = interrupt.install()
    try:
        with pytest.raises(Interrupted) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes of this thread
                pass
        assert interrupt.exit_code(caught.value) == 143
        interrupt.install()
        reached = []
        with pytest.raises(Interrupted) as caught:
            with interrupt.critical():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
                reached.append("end of the section")
        assert reached == ["end of the section"] and interrupt.exit_code(caught.value) == 130
    finally:
        interrupt.restore(previous)
