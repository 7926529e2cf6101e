"""Every file memlab_rs writes is written whole or not at all: a save that fails midway (a
full disk, a quota, a size limit) or a process killed while saving leaves the file that was
there, readable.

A colleague saw `save()` truncate its target and write in place: a full disk destroyed a
previously good `.json`, `.json.gz` and `.pickle`, and SIGKILL during a repeated `.json.gz`
save left it unreadable in 2 of 5 runs. Every writer now goes through
`memlab_rs.results.atomic.atomic_open`: a new file in the same folder, flushed, fsync'ed and
renamed over the target. A full disk is simulated with RLIMIT_FSIZE (writes past the limit
fail with EFBIG, as they fail with ENOSPC on a full disk). A process killed while saving
(os.fork, then SIGKILL) is in tests/integration/test_atomic_save_processes.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from result_samples import samples, second_rank

import memlab_rs
import memlab_rs.cli


def _writers(folder: Path) -> dict[str, Callable[[Path], Any]]:
    """Every writer, as a call that writes the path it is given."""
    s = samples()
    rank1 = folder / "rank1.json"
    second_rank("line_profile").save(rank1)

    def cli(*args: Any) -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            status = memlab_rs.cli.main([str(a) for a in args])
        if status:
            raise OSError(f"memlab-rs {args[0]}: status {status}")

    def saved(kind: str) -> Callable[[Path], Any]:
        return lambda path: s[kind].save(path)

    return {
        **{f"{kind}.json": saved(kind) for kind in s},
        **{f"{kind}.json.gz": saved(kind) for kind in ("line_profile", "trace")},
        "trace.pickle": saved("trace"),
        "copied.pickle": lambda p: memlab_rs.trace.load(folder / "trace.pickle").save(p),
        "viz.pickle": lambda p: s["trace"].export_memory_viz(p),
        "viz.json": lambda p: s["trace"].export_memory_viz(p, format="json"),
        "lines.csv": lambda p: s["line_profile"].to_csv(p),
        "merged.csv": lambda p: s["merged_line_profile"].to_csv(p),
        "diff.csv": lambda p: memlab_rs.diff_results(s["line_profile"], rank1, None).to_csv(p),
        "monitor.csv": lambda p: s["monitor"].to_csv(p),
        "report-table.json": lambda p: s["tensor_report"].to_json(p),
        "trace-report.json": lambda p: s["trace"].to_json(p),
        "trace-tags.csv": lambda p: s["trace"].to_csv(p),
        "untagged.txt": lambda p: s["trace"].untagged_log(p),
        "timeline.html": lambda p: s["trace"].timeline_html(p),
        "timeline.png": lambda p: s["trace"].timeline_png(p),
        "monitor.png": lambda p: s["monitor"].plot_png(p),
        "show.txt": lambda p: cli("show", folder / "line_profile.json", "-o", p),
        "merge.json": lambda p: cli("merge", folder / "line_profile.json", rank1, "-o", p),
    }


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG, as they fail with ENOSPC on a full disk
    (SIGXFSZ, which would end the process, ignored meanwhile)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_save_that_fails_midway_leaves_the_file_that_was_there(tmp_path):
    """Each writer writes a good file, then the same again with at most half its size
    allowed: the second write fails (an OSError, or status 2 from the CLI) and the good file
    is there, byte for byte, with nothing left beside it. (memlab-rs run and --memlab-save
    save through the results' save(), tested here for every kind.)"""
    for name, write in _writers(tmp_path).items():
        path = tmp_path / name
        write(path)
        good = path.read_bytes()
        assert len(good) > 1, name
        with _file_size_limit(len(good) // 2):
            with pytest.raises(OSError):
                write(path)
        assert path.read_bytes() == good, name
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], name
        if name.endswith(".json") and name.split(".")[0] in samples():
            assert memlab_rs.load(path).kind == name.split(".")[0]  # still a good result


def test_atomic_open_keeps_the_targets_mode_writes_through_links_and_devices(tmp_path):
    from memlab_rs.results.atomic import atomic_open, write_text

    target = tmp_path / "shared.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    write_text(os.devnull, "nothing")  # not a regular file: written, not replaced
    assert Path(os.devnull).exists() and not Path(os.devnull).is_file()
    read, write = os.pipe()  # `memlab-rs show ... -o /dev/stdout | less`
    try:
        write_text(f"/proc/self/fd/{write}", "through a pipe")
        assert os.read(read, 100) == b"through a pipe"
    finally:
        os.close(read)
        os.close(write)
    # An exception in the block leaves the old content and no temporary file.
    try:
        with atomic_open(target) as f:
            f.write("half")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "shared.json"]
    # A folder that is not there: the error names the file asked for, not ours.
    missing = tmp_path / "no-such-folder" / "r.json"
    try:
        write_text(missing, "x")
    except FileNotFoundError as error:
        assert error.filename == str(missing)
        assert "writes a new file in the folder" in str(error)
    else:
        raise AssertionError(f"wrote {missing}")
