"""Faults on the data side: a damaged cache is rebuilt, a killed write is cleaned up, and a file
that is not data (a FIFO, a device, an endless line, a compression bomb) is one line, at once;
a table's parsed frame is not kept beside its copy in shared memory."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from hetsgd.atomic import writing_path
from hetsgd.config import DatasetConfig
from hetsgd.config.problem import FilesConfig
from hetsgd.data import download as download_module
from hetsgd.data import download_progress, files, load_dataset
from hetsgd.data.dataset import Dataset
from hetsgd.data.download import RemoteFile, download
from hetsgd.errors import UserError

DENSE = "".join(f"{label} 1:{i} 3:0.5\n" for i, label in enumerate(["-1", "1"] * 10))
SPARSE = DENSE + "1 2000:1\n-1 2000:2\n"  # wider than DENSE_MAX_FEATURES: cached as CSR parts


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache whose path holds a closing markup tag: printed as markup, it would crash rich."""
    path = tmp_path / "cache[/x]"
    monkeypatch.setenv("HETSGD_DATA", str(path))
    return path


def load(path: Path, progress: bool = False) -> Dataset:
    return load_dataset(DatasetConfig(name="libsvm", path=str(path)), seed=0, progress=progress)


def entry(home: Path) -> Path:
    found, = (home / "parsed").iterdir()
    return found


def write_nans(file: Path) -> None:
    array = np.load(file, mmap_mode="r+")
    array[:2] = np.nan
    array.flush()


def dead_pid() -> int:
    """A pid no process has now (found without starting one)."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while pid > 1:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1
    raise AssertionError("no free pid")


@pytest.mark.parametrize(("text", "name", "damage", "problem"), [
    (DENSE, "x_train.npy", write_nans, "was altered since it was written"),
    (SPARSE, "x_train.data.npy", write_nans, "was altered since it was written"),
    (DENSE, "y_train.npy", Path.unlink, "is missing"),
    (DENSE, "x_train.npy", lambda f: os.truncate(f, f.stat().st_size // 2), "holds"),
], ids=["nan-dense", "nan-sparse", "deleted", "truncated"])
def test_a_damaged_cached_array_is_parsed_again_with_one_warning(
        tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], text: str, name: str,
        damage, problem: str) -> None:
    path = tmp_path / "f.svm"
    path.write_text(text)
    first = load(path)
    damage(entry(home) / name)
    capsys.readouterr()
    again = load(path)
    warning = capsys.readouterr().err.strip()
    assert warning.startswith(f"the parsed cache's {entry(home) / name} {problem}")
    assert warning.endswith(": parsing libsvm again") and "\n" not in warning
    for part in ("x_train", "x_test"):
        got, want = (getattr(d, part) for d in (again, first))
        got, want = (x.toarray() if hasattr(x, "toarray") else x for x in (got, want))
        assert np.isfinite(got).all() and np.array_equal(got, want)
    np.testing.assert_array_equal(again.y_train, first.y_train)
    capsys.readouterr()
    load(path)  # rebuilt whole: no warning the next time
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("edit", ["fields", "files"])
def test_a_cache_record_edited_by_hand_is_parsed_again(tmp_path: Path, home: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       edit: str) -> None:
    """meta.json says what the arrays are (a binary task, which test part): one that says
    otherwise than was written (5 classes; no test arrays, so a split of the training file)
    is not believed."""
    path = tmp_path / "f.svm"
    path.write_text(DENSE)
    test = tmp_path / "f.t"
    test.write_text(DENSE)
    given = FilesConfig(path=str(path), test_path=str(test), format="libsvm")
    first = load_dataset(given, seed=0, progress=False)
    meta_file = entry(home) / "meta.json"
    meta = json.loads(meta_file.read_text())
    if edit == "fields":
        meta["fields"].update(task="multiclass", num_classes=5)
    else:
        meta["files"] = {k: v for k, v in meta["files"].items() if not k.endswith("_test.npy")}
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    again = load_dataset(given, seed=0, progress=False)
    assert capsys.readouterr().err.startswith(f"the parsed cache's {meta_file} is unreadable "
                                              "(its fields are not as written)")
    assert (again.task, again.num_classes) == (first.task, first.num_classes) == ("binary", 2)
    assert (again.num_train, again.num_test) == (first.num_train, first.num_test)


def test_a_killed_writers_leftovers_are_removed_and_a_live_ones_kept(tmp_path: Path,
                                                                     home: Path) -> None:
    path = tmp_path / "f.svm"
    path.write_text(DENSE)
    host = socket.gethostname()
    parsed = home / "parsed"
    dead = parsed / f"libsvm-0123456789abcdef.0a1b.{dead_pid()}-0@{host}.tmp"
    live = writing_path(parsed / "libsvm-0123456789abcdef")
    elsewhere = parsed / f"libsvm-0123456789abcdef.0a1b.{dead_pid()}-0@not-{host}.tmp"
    for leftover in (dead, live, elsewhere):
        leftover.mkdir(parents=True)
        (leftover / "x_train.npy").write_bytes(b"half")
    load(path)
    assert not dead.exists()
    assert (live / "x_train.npy").exists() and (elsewhere / "x_train.npy").exists()
    assert len(list(parsed.glob("libsvm-*"))) == 3  # the new entry beside the two kept


def test_a_failed_download_removes_a_killed_ones_leftovers_and_leaves_none(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETSGD_DATA_MIRROR", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    home.mkdir(parents=True)
    dead = home / f"w8a.0a1b.{dead_pid()}-0@{socket.gethostname()}.tmp"
    dead.mkdir()
    (dead / "tmpabc").write_bytes(b"half a download")
    with socket.socket() as s:  # a port nothing listens on: refused at once, on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match="could not be downloaded"):
        download(RemoteFile("w8a", f"http://127.0.0.1:{port}/w8a"), "w8a", progress=False)
    assert list(home.iterdir()) == []


class _Trickle(BaseHTTPRequestHandler):
    """Serves 100 bytes a byte every 0.2 s: each read well within the per-read timeout, the
    whole transfer far below any usable rate."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b"1")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_a_download_that_trickles_fails_in_one_line(home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that sends a byte at a time never trips the per-read timeout: the transfer's
    average rate, checked as each byte arrives, ends it (past a grace of 1 s here, not 30)."""
    monkeypatch.setattr(download_module, "RATE_GRACE_S", 1.0)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_port}/w8a"
    try:
        message = error_within_bound(lambda: download(RemoteFile("w8a", url), "w8a", False), 15,
                                     f"downloading {url}")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert re.fullmatch(
        rf"w8a is not in the cache and could not be downloaded from {re.escape(url)} \(\d+ bytes "
        r"in \d+ s, under the 32 KiB/s a download must average\): put the file at "
        rf"{re.escape(str(home / 'w8a'))} \(or a \.xz/\.bz2/\.gz of it\)", message), message
    assert not (home / "w8a").exists()


def refused_within_bound(path: Path) -> str:
    """The error loading ``path``, from a thread given 60 s: a read that blocks fails the test
    rather than hanging it (and is unblocked by opening the FIFO's other end)."""
    return error_within_bound(lambda: load(path), 60, f"loading {path}",
                              lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))


def error_within_bound(call: Callable[[], object], bound_s: float, what: str,
                       unblock: Callable[[], None] = lambda: None) -> str:
    """The UserError of ``call()``, from a thread given ``bound_s``: a call that blocks fails
    the test (after ``unblock()``) rather than hanging it."""
    caught: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=bound_s)
    if thread.is_alive():
        unblock()
        pytest.fail(f"{what} blocked")
    assert len(caught) == 1 and isinstance(caught[0], UserError), caught
    return str(caught[0])


def test_a_fifo_is_refused_in_one_line_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "data.svm"
    os.mkfifo(fifo)
    assert refused_within_bound(fifo).startswith(
        f"cannot read {fifo}: not a regular file but a FIFO or pipe; ")


def test_a_device_is_refused_in_one_line() -> None:
    assert refused_within_bound(Path("/dev/zero")).startswith(
        "cannot read /dev/zero: not a regular file but a character device; ")


@pytest.mark.parametrize(("text", "line"), [
    (b"\0" * 5000, 1),  # /dev/zero's endless line, as a file
    ("".join(DENSE.splitlines(keepends=True)[:4]).encode() + b"1 1:1" + b" " * 5000 + b"\n"
     + DENSE.encode(), 5),
], ids=["zeros", "after-good-lines"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_line_past_the_bound_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        text: bytes, line: int, suffix: str) -> None:
    monkeypatch.setattr(files, "MAX_LINE_BYTES", 1000)  # reads go 1000 bytes at a time too
    path = tmp_path / f"long.svm{suffix}"
    path.write_bytes(gzip.compress(text) if suffix else text)
    with pytest.raises(UserError) as caught:
        load(path)
    assert str(caught.value) == (f"{path}: line {line} is longer than 1,000 bytes: not a text "
                                 "data file")


def test_a_line_at_the_bound_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_LINE_BYTES", 1000)
    padded = "1 1:7".ljust(1000) + "\n"  # 1000 bytes before its newline, across two reads
    path = tmp_path / "padded.svm"
    path.write_text(DENSE + padded + DENSE)
    data = load(path)
    assert data.num_train + data.num_test == 41


def test_a_compression_bomb_is_named_at_the_line_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "EXPANSION_FREE_BYTES", 0)
    path = tmp_path / "bomb.svm.gz"
    path.write_bytes(gzip.compress(b"1 1:1\n" * 200_000))  # 1.2 MB of valid lines, ~1000x
    bound = files.MAX_EXPANSION * path.stat().st_size
    with pytest.raises(UserError) as caught:
        load(path)
    assert str(caught.value).startswith(
        f"{path}: line {bound // 6 + 1} is past {bound:,} bytes decompressed, the bound for "
        f"{path.stat().st_size:,} bytes on disk: a compression bomb")


def test_a_large_read_shows_its_progress_and_a_bracketed_name_is_no_markup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shown = io.StringIO()
    monkeypatch.setattr(download_progress, "console",
                        Console(file=shown, force_terminal=True, width=200))
    monkeypatch.setattr(download_progress, "PROGRESS_MIN_BYTES", 0)
    path = tmp_path / "a[red].svm"  # shown as markup, "[red]" would vanish
    path.write_text(DENSE)
    assert load(path, progress=True).num_train == 16
    assert f"parsing {path.name}: 0 of 0 MiB of {path.name} read (100%)" in shown.getvalue()


# In a fresh interpreter: a tiny table loaded first (the libraries' own memory in), then the
# table; what the process holds itself after each, and the shared copy's size, in bytes
_HELD = """
import gc, sys
from hetsgd.config import compose_run, to_run_config
from hetsgd.runs.setup import load_run_data

def held():  # anonymous and shared memory: not library files, which other processes share
    rows = dict(line.split(":") for line in open("/proc/self/smaps_rollup") if ":" in line)
    return sum(int(rows[key].split()[0]) * 1024 for key in ("Pss_Anon", "Pss_Shmem"))

def load(path):
    cfg = to_run_config(compose_run(["dataset=files", f"dataset.path={path}", "progress=false"]))
    return load_run_data(cfg, progress=False)

load(sys.argv[2])
gc.collect()
before = held()
data = load(sys.argv[1])
gc.collect()
print(held() - before, data.train.nbytes + data.test.nbytes)
"""


def _table(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((rows, 60)).astype(np.float32),
                         columns=[f"f{i}" for i in range(60)])
    frame["label"] = rng.integers(0, 3, rows)
    frame.to_parquet(path)


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's smaps")
def test_a_parquet_tables_frame_is_released_once_it_is_in_shared_memory(
        home: Path, tmp_path: Path) -> None:
    """The coordinator holds the shared copy and little else (its PSS within 1.2x of it), not
    the parsed frame beside it (4.8x before)."""
    table, tiny = tmp_path / "table.parquet", tmp_path / "tiny.parquet"
    _table(table, 200_000)
    _table(tiny, 300)
    done = subprocess.run([sys.executable, "-c", _HELD, str(table), str(tiny)],
                          capture_output=True, text=True, timeout=300, check=True)
    grown, shared = map(int, done.stdout.split())
    assert shared > 40 * 2**20  # the table's, not the tiny one's
    assert grown <= 1.2 * shared, f"{grown / shared:.2f}x the shared copy"
