"""Nothing read back is trusted: a crafted file in the data cache runs no code, files honour the
umask, and a table's errors and memory stay within bounds."""

from __future__ import annotations

import ast
import os
import pickle
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import hetsgd
from hetsgd import readback
from hetsgd.atomic import remove_abandoned, writing_path
from hetsgd.config import DatasetConfig
from hetsgd.config.problem import FilesConfig
from hetsgd.data import load_dataset, tables
from hetsgd.data.splits import split_rows
from hetsgd.errors import UserError
from hetsgd.liveness import this_process

RUN = ["run", "budget.epochs=null", "budget.seconds=1", "progress=false", "algo=hogwild",
       "devices=cpu", "devices.groups.cpu.count=2", "seed=0"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("HETSGD_DATA", str(path))
    return path


def hetsgd_command(*args: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    """The command in a process of its own, under ``umask`` (HETSGD_DATA and HETSGD_RESULTS as
    the fixtures set them)."""
    return subprocess.run([sys.executable, "-m", "hetsgd", *args], capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: os.umask(umask))


class _Marker:
    """A pickle that, when loaded, creates the file ``path``: what an attacker would plant."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


# --------------------------------------------------------------------------------------------
# the split cache: plain arrays, never a pickle
# --------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_crafted_pickle_in_the_split_cache_runs_no_code(tmp_path: Path, home: Path,
                                                          results_dir: Path) -> None:
    """Every file of the split cache replaced by a pickle that would create a marker: the next
    run takes none of them for a split, draws it again, and completes."""
    load_dataset(DatasetConfig(name="digits"), seed=0, progress=False)  # the split, cached
    marker = tmp_path / "marker"
    planted = [file for file in (home / "splits").rglob("*") if file.is_file()]
    assert planted
    for file in planted:
        file.write_bytes(pickle.dumps(_Marker(marker)))
    done = hetsgd_command(*RUN)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    warned = [line for line in done.stderr.splitlines() if "the split cache's" in line]
    assert len(warned) == 1 and "drawing the split again" in warned[0], done.stderr
    for file in (home / "splits").rglob("*.npz"):  # rewritten as plain arrays
        with np.load(file, allow_pickle=False) as archive:
            assert archive["kept"].dtype == np.bool_


def _npz_with_object_array(path: Path) -> None:
    np.savez(path, kept=np.array([object()] * 40, dtype=object), how=np.array("stratified"))


@pytest.mark.parametrize("damage", [
    lambda path: path.write_bytes(b"PK\x03\x04 not a zip archive"),
    lambda path: os.truncate(path, path.stat().st_size // 2),
    lambda path: np.savez(path, kept=np.ones(39, bool), how=np.array("stratified")),
    lambda path: np.savez(path, kept=np.ones(40, bool), how=np.array("stratified")),
    lambda path: np.savez(path, kept=np.zeros(40, bool), how=np.array("stratified")),
    lambda path: np.savez(path, kept=np.zeros(40, np.int64), how=np.array("stratified")),
    lambda path: np.savez(path, kept=np.ones(40, bool) & (np.arange(40) % 2 == 0),
                          how=np.array("os.system")),
    _npz_with_object_array,
    # half the rows kept, a test fraction of 0.5 instead of 0.25: an entry edited by hand
    lambda path: np.savez(path, kept=np.arange(40) % 2 == 0, how=np.array("stratified")),
], ids=["not-zip", "truncated", "other-rows", "empty-part", "nothing-kept", "not-flags",
        "bad-how", "objects", "other-count"])
def test_a_damaged_split_is_drawn_again_with_one_warning(
        home: Path, capsys: pytest.CaptureFixture[str], damage) -> None:
    y = np.repeat(np.arange(4), 10)
    kept, rest, how = split_rows(y, "multiclass", 5, test_size=0.25)
    assert how == "stratified" and len(rest) == 10
    entry, = (home / "splits").iterdir()
    assert not np.array_equal(split_rows(y, "multiclass", 6, test_size=0.25)[1], rest)
    assert len(list((home / "splits").iterdir())) == 2  # the seed is part of the key
    damage(entry)
    capsys.readouterr()
    again = split_rows(y, "multiclass", 5, test_size=0.25)
    warning = capsys.readouterr().err.strip()
    assert warning.startswith(f"the split cache's {entry} is unusable (")
    assert warning.endswith("): drawing the split again") and "\n" not in warning
    np.testing.assert_array_equal(again[0], kept)
    np.testing.assert_array_equal(again[1], rest)
    assert again[2] == "stratified"
    split_rows(y, "multiclass", 5, test_size=0.25)
    assert capsys.readouterr().err == ""  # rewritten whole
    with np.load(entry, allow_pickle=False) as cached:
        np.testing.assert_array_equal(np.flatnonzero(cached["kept"]), kept)


# YAML loaders that build plain values only: yaml's safe ones, and hetsgd's, which refuses
# aliases besides (hetsgd/readback.py)
SAFE_LOADERS = ("yaml.SafeLoader", "yaml.CSafeLoader", "_PlainLoader")


def _unsafe_loads(tree: ast.AST) -> Iterator[str]:
    """Calls that would run code a file names: pickle's loads and unpickler, pandas'
    read_pickle, torch.load without ``weights_only=True``, YAML's unsafe loaders, numpy's
    ``allow_pickle=True``, joblib."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(name.split(".")[0] == "joblib" for name in names):
                yield "joblib"
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        call = f"{owner}.{node.func.attr}"
        keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
        if call in ("pickle.load", "pickle.loads", "yaml.unsafe_load", "yaml.full_load"):
            yield call
        if node.func.attr in ("read_pickle", "Unpickler"):  # whatever the module's name
            yield call
        if call == "torch.load" and keywords.get("weights_only") != "True":
            yield call
        if call == "yaml.load" and keywords.get("Loader") not in SAFE_LOADERS:
            yield call
        if keywords.get("allow_pickle") not in (None, "False"):
            yield f"{call}(allow_pickle={keywords['allow_pickle']})"


def test_no_module_of_the_package_loads_what_could_run_code() -> None:
    assert issubclass(readback._PlainLoader, yaml.SafeLoader)  # the package's own, in SAFE_LOADERS
    found = [f"{path.relative_to(root)}: {call}"
             for root in [Path(hetsgd.__file__).parent] for path in sorted(root.rglob("*.py"))
             for call in _unsafe_loads(ast.parse(path.read_text(), str(path)))]
    assert found == []


def test_the_scan_finds_each_unsafe_load() -> None:
    source = ("import joblib\npickle.loads(b)\ntorch.load(f)\nyaml.load(t, Loader=yaml.Loader)\n"
              "np.load(f, allow_pickle=True)\ntorch.load(f, weights_only=True)\n"
              "yaml.load(t, Loader=yaml.SafeLoader)\nnp.load(f, allow_pickle=False)\n"
              "pd.read_pickle(p)\npickle.Unpickler(f).load()\n")
    assert list(_unsafe_loads(ast.parse(source))) == [
        "joblib", "pickle.loads", "torch.load", "yaml.load", "np.load(allow_pickle=True)",
        "pd.read_pickle", "pickle.Unpickler"]


# --------------------------------------------------------------------------------------------
# modes: the umask's, never wider
# --------------------------------------------------------------------------------------------


def _modes(*folders: Path) -> dict[str, set[str]]:
    """The modes of every file and folder under ``folders``, by kind."""
    found: dict[str, set[str]] = {"file": set(), "folder": set()}
    for folder in folders:
        for path in [folder, *folder.rglob("*")]:
            mode = path.lstat().st_mode
            found["folder" if stat.S_ISDIR(mode) else "file"].add(oct(stat.S_IMODE(mode)))
    return found


@pytest.mark.integration
@pytest.mark.wall  # a whole run in its own process
@pytest.mark.parametrize("umask", [0o077, 0o022])
def test_a_runs_files_and_the_data_cache_honour_the_umask(home: Path, results_dir: Path,
                                                          umask: int) -> None:
    done = hetsgd_command(*RUN, umask=umask)
    assert done.returncode == 0, done.stderr
    modes = _modes(results_dir, home)
    assert len(list(results_dir.rglob("summary.json"))) == 1
    assert (home / "splits").is_dir()
    assert modes == {"file": {oct(0o666 & ~umask)}, "folder": {oct(0o777 & ~umask)}}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.integration
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_download_gets_the_umask_mode(tmp_path: Path, home: Path,
                                        monkeypatch: pytest.MonkeyPatch, umask: int) -> None:
    """pooch assembles a download in a file of mode 0o600; the cached file has the umask's."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "w8a").write_text("1 1:1\n-1 2:1\n")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(served)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    code = ("from hetsgd.data.download import RemoteFile, download; "
            f"download(RemoteFile('w8a', 'http://127.0.0.1:{httpd.server_address[1]}/w8a'), "
            "'w8a', progress=False)")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, preexec_fn=lambda: os.umask(umask))
    finally:
        httpd.shutdown()
    assert done.returncode == 0, done.stderr
    assert oct(stat.S_IMODE((home / "w8a").stat().st_mode)) == oct(0o666 & ~umask)
    assert (home / "w8a").read_text() == "1 1:1\n-1 2:1\n"


def test_a_writer_whose_pid_was_reused_is_gone_and_a_live_ones_write_kept(tmp_path: Path) -> None:
    """A leftover named with a live pid but another start time is a dead writer's (the pid was
    reused): removed; this process's own write in progress is kept."""
    me = this_process()
    reused = tmp_path / f"entry.0a1b.{me['pid']}-{round(me['started'] * 100) - 500}@{me['host']}.tmp"
    live = writing_path(tmp_path / "entry")
    elsewhere = tmp_path / f"entry.0a1b.{me['pid']}-0@not-{socket.gethostname()}.tmp"
    for leftover in (reused, live, elsewhere):
        leftover.mkdir()
    remove_abandoned(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name])


# --------------------------------------------------------------------------------------------
# tables: errors that stay one short line, memory checked before parsing
# --------------------------------------------------------------------------------------------


def _wide_csv(path: Path, columns: int, rows: int = 8) -> Path:
    names = [f"feature_with_a_long_name_{i}" for i in range(columns)]
    frame = pd.DataFrame(np.arange(rows * columns).reshape(rows, columns) % 7, columns=names)
    frame["label"] = np.arange(rows) % 2
    frame.to_csv(path, index=False)
    return path


def _error(cfg: FilesConfig) -> str:
    with pytest.raises(UserError) as caught:
        load_dataset(cfg, seed=0, progress=False)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_misspelt_label_of_a_wide_csv_is_one_short_line(tmp_path: Path, home: Path) -> None:
    path = _wide_csv(tmp_path / "wide.csv", 5000)
    message = _error(FilesConfig(path=str(path), label="lable"))
    assert message.startswith(f"{path} has no column 'lable' (dataset.label); its columns: "
                              "feature_with_a_long_name_0, feature_with_a_long_name_1, ")
    assert message.endswith(", ... (5,001 in all)") and len(message) - len(str(path)) < 250


def test_test_columns_that_differ_are_one_short_line(tmp_path: Path, home: Path) -> None:
    train = _wide_csv(tmp_path / "train.csv", 3000)
    test = tmp_path / "test.csv"
    pd.read_csv(train).rename(columns=lambda name: name.replace("long", "other")).to_csv(
        test, index=False)
    message = _error(FilesConfig(path=str(train), test_path=str(test)))
    assert message.startswith(f"{test}'s feature columns are not the training file's (differing:")
    assert message.endswith(", ... (6,000 in all))") and len(message) - len(str(test)) < 250


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_table_wider_than_memory_allows_is_refused_before_parsing(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    frame = pd.read_csv(_wide_csv(tmp_path / "wide.csv", 2000, rows=10))
    path = tmp_path / f"wide.{fmt}"
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
        frame.to_parquet(path)
    cfg = FilesConfig(path=str(path))
    assert load_dataset(cfg, seed=0, progress=False).num_features == 2000  # it fits here

    def parsed(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed before its memory was checked")

    monkeypatch.setattr(pd, "read_csv", parsed)
    monkeypatch.setattr(pd, "read_parquet", parsed)
    monkeypatch.setattr(tables, "available_memory", lambda: 1 << 20)
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "fresh"))  # no parsed cache to take it from
    message = _error(cfg)
    # CSV: 11 rows (10 lines and one that may lack its newline), 2,001 x (1,536 + 11 x 20) B =
    # 3.4 MiB; Parquet: 10 rows, 2,001 x (16,384 + 10 x 32) B = 31.9 MiB
    rows, mib = {"csv": (11, 3), "parquet": (10, 32)}[fmt]
    assert message == (f"{path}: a table of 2,001 columns and about {rows} rows takes about "
                       f"{mib} MiB to read, more than the 1 MiB of memory available")


def test_a_parquet_label_column_of_lists_is_one_line(tmp_path: Path, home: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "lists.parquet"
    pd.DataFrame({"a": np.arange(40.0), "y": [[i % 2, 1] for i in range(40)]}).to_parquet(path)
    assert _error(FilesConfig(path=str(path), label="y")) == (
        f"{path}: column 'y' (dataset.label) holds a map or list in row 1 (array([0, 1])), not a "
        "label: one number or name per row")


def test_an_npz_that_is_no_zip_archive_is_one_line(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(b"PK\x03\x04 and then no zip archive")
    assert _error(FilesConfig(path=str(path))) == (
        f"cannot read {path} as .npz: File is not a zip file")


def test_an_array_header_no_memory_holds_names_its_file(tmp_path: Path, home: Path) -> None:
    """A damaged (or crafted) header that promises 8 PiB (past any address space) ended as 'out
    of memory', naming no file: the labels' .npy and an .npz member alike."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False,
                                                  "shape": (10**15,)})
    huge = header.getvalue() + bytes(80)
    labels, features, archive = tmp_path / "y.npy", tmp_path / "x.npy", tmp_path / "big.npz"
    labels.write_bytes(huge)
    np.save(features, np.zeros((10, 3), np.float32))
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("X.npy", huge)
        zipped.writestr("y.npy", huge)
    assert _error(FilesConfig(path=str(features), labels_path=str(labels))).startswith(
        f"cannot read {labels} as .npy: ")
    assert _error(FilesConfig(path=str(archive))).startswith(
        f"cannot read {archive} as .npz: ")
