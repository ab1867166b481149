"""The outputs of one command that writes datasets, owned by one object: naming, lock, writers, sidecar,
commit as a group.

Every writer of ours (json2bin, hf2bin, sft, pref, merge, the sample corpus) writes the same way::

    output = DatasetOutput([prefix], force=force)
    claim(output.claimed(), inputs=..., force=force)        # the CLI: what --force may replace
    with output:                                         # lock every output, check it, (--force) clear
        writer = output.open(prefix, dtype)              #   a killed run's leftovers
        ...                                              # add documents
        output.set_sidecar(prefix, build_sidecar(...))   # complete when built
        output.commit()                                  # .bin/.idx + sidecars in one step
    output.paths                                         # what was written, for stdout

An error or a signal inside the block leaves nothing under the final names: the writers discard their
temporaries, the lock goes. Plain files (the sample corpus' JSONL) are written through :meth:`path` and
renamed into place with the datasets, each then marked (``NAME.llmtools.json``: what ``--force`` may
replace later); a dataset committed without a sidecar is marked by :meth:`mark`.

The lock (:mod:`llmtools.locks`) is why this lives in ``prep/`` and not in ``formats/``: the file formats
use nothing of ours but errors and atomic writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llmtools.formats.indexed import IndexedDatasetWriter, bin_path, idx_path
from llmtools.formats.output_marks import marker_path, write_marker
from llmtools.formats.sidecar import commit_with_sidecars, sidecar_path
from llmtools.fsutil import TMP_MARK, AtomicGroup, check_writable, disk_full_error
from llmtools.locks import lock_output


def dataset_files(prefix: str | os.PathLike) -> list[Path]:
    """``PREFIX.bin``, ``PREFIX.idx``, ``PREFIX.json``: the files of one dataset."""
    return [bin_path(prefix), idx_path(prefix), sidecar_path(prefix)]


def remove_stale_temporaries(outputs: Iterable[Path]) -> None:
    """With --force: the ``NAME.tmp-*`` leftovers of an earlier killed run for these outputs go too."""
    for path in outputs:
        for stale in path.parent.glob(f"{path.name}{TMP_MARK}*"):
            if stale.is_dir() and not stale.is_symlink():  # --partitions' folder of partial datasets
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


class DatasetOutput:
    """The datasets (``prefixes``) and plain ``files`` one command writes; see the module.

    ``files`` maps each plain file to its marker's record (``kind`` and what else it says); ``force``:
    existing outputs may be replaced (what may be is the CLI's decision, made before); ``clear_stale``:
    with ``force``, a killed run's temporaries of these outputs are removed on entry; ``markable``: a
    dataset may be committed without a sidecar, then :meth:`mark` s it; ``durable``: fsync what is
    committed.
    """

    def __init__(
        self,
        prefixes: Sequence[str] = (),
        *,
        files: Mapping[str | os.PathLike, dict] | None = None,
        force: bool = False,
        clear_stale: bool = False,
        markable: bool = False,
        durable: bool = True,
    ) -> None:
        self.prefixes = list(prefixes)
        self.files = {Path(path): dict(record) for path, record in (files or {}).items()}
        self.force = force
        self.clear_stale = clear_stale
        self.markable = markable
        self.durable = durable
        self.paths: list[Path] = []
        self._writers: dict[str, object] = {}
        self._sidecars: dict[str, dict] = {}
        self._group = AtomicGroup(durable)
        self._stack: contextlib.ExitStack | None = None

    # -- naming ----------------------------------------------------------------------------------------
    def checked(self) -> list[Path]:
        """What must not exist unless ``force``: each dataset's files, each plain file and its marker."""
        datasets = [p for prefix in self.prefixes for p in dataset_files(prefix)]
        return [*datasets, *(p for path in self.files for p in (path, marker_path(path)))]

    def claimed(self) -> list[Path]:
        """Every file this output may write (for the CLI's claim): :meth:`checked`, and the markers of a
        dataset written without a sidecar."""
        if not self.markable:
            return self.checked()
        datasets = [
            p
            for prefix in self.prefixes
            for p in (*dataset_files(prefix), marker_path(bin_path(prefix)), marker_path(idx_path(prefix)))
        ]
        return [*datasets, *(p for path in self.files for p in (path, marker_path(path)))]

    # -- the block -------------------------------------------------------------------------------------
    def __enter__(self) -> DatasetOutput:
        stack = contextlib.ExitStack()
        # One writer per output, from before the existence check to the last rename.
        stack.enter_context(lock_output([*self.prefixes, *self.files]))
        try:
            check_writable(self.checked(), self.force)
            if self.force and self.clear_stale:
                remove_stale_temporaries(self.checked())
        except BaseException:
            stack.close()
            raise
        stack.callback(self._group.discard)  # nothing is pending after a commit
        self._stack = stack
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        stack, self._stack = self._stack, None
        # A full disk while writing a plain file: one error naming that file.
        full = disk_full_error(error, self._group.pending[-1][1]) if self._group.pending else None
        if not isinstance(error, Exception) or full is None or full is error:
            return stack.__exit__(kind, error, traceback)
        stack.__exit__(type(full), full, None)
        raise full from None

    def open(self, prefix: str, dtype) -> IndexedDatasetWriter:
        """An :class:`IndexedDatasetWriter` for ``prefix``, discarded unless :meth:`commit` is reached."""
        return self.enter(IndexedDatasetWriter(prefix, dtype, durable=self.durable))

    def enter(self, writer):
        """Take a ready writer of one of the prefixes (a look-alike such as ``PartitionedWriter``)."""
        self._writers[writer.prefix] = self._stack.enter_context(writer)
        return writer

    def path(self, final: str | os.PathLike) -> Path:
        """The temporary to write the plain file ``final`` to; renamed into place by :meth:`commit`."""
        return self._group.path(final)

    def set_sidecar(self, prefix: str, record: dict) -> None:
        """The complete sidecar record of ``prefix`` (:func:`llmtools.formats.sidecar.build_sidecar`)."""
        self._sidecars[prefix] = record

    def commit(self) -> list[Path]:
        """Finish the writers and put everything in place as one step: each dataset's ``.bin/.idx`` and
        its sidecar (a signal cannot leave one without the other), the plain files; then the plain files'
        markers. Returns :attr:`paths`: per dataset ``.bin``, ``.idx`` (and the sidecar when it has one),
        then the plain files."""
        if self._writers:
            group = self._group if self._group.pending else None
            written = iter(commit_with_sidecars(list(self._writers.values()), self._sidecars, group=group))
        else:  # plain files alone: renamed as a group, signals held only while renaming
            self._group.commit()
        for prefix in self.prefixes:
            self.paths += [bin_path(prefix), idx_path(prefix)]
            if prefix in self._sidecars:
                self.paths.append(next(written))
        for path, record in self.files.items():
            write_marker(path, **record)
            self.paths.append(path)
        return self.paths

    def mark(self, kind: str, **info) -> None:
        """Markers beside the ``.bin/.idx`` of each dataset committed without a sidecar: they say we wrote
        it (what ``--force`` may replace)."""
        for prefix in self.prefixes:
            if prefix not in self._sidecars:
                for path in (bin_path(prefix), idx_path(prefix)):
                    write_marker(path, kind, **info)
