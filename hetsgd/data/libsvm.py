"""LIBSVM files: the parser, any local file (``libsvm``), and the sets hosted on the LIBSVM site.

Parsing is scikit-learn's svmlight loader, one file at a time, so that an error names its file.
Train and test files share one width, that of the wider one (w8a.t uses fewer feature indices
than w8a), widened further to the published feature count where it is known; and one index base:
1-based unless some file uses index 0 (scikit-learn's ``zero_based="auto"`` over both files). Sets
with at most ``DENSE_MAX_FEATURES`` features are made dense (a dense float32 array is then small
and faster to train on); wider ones stay CSR. A line that is not LIBSVM, a value that is not a
finite number or is past float32's range, a feature index past ``MAX_FEATURES``, or a line past
the bounds every text file is read within (:mod:`hetsgd.data.files`) is a UserError naming file
and line; files that hold labels but not one feature value are refused.

LIBSVM files are published already scaled (binary indicators, [0, 1] or [-1, 1] ranges, unit-length
tf-idf rows), so ``dataset.scale=auto`` leaves them as they are; covtype_binary is the exception:
its file (not the ``.scale`` one) holds the raw UCI quantities, standardised as ``covtype`` is.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import scipy.sparse as sp

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import existing_file, find_local, load_or_parse
from hetsgd.data.dataset import FLOAT32_MAX, Parsed
from hetsgd.data.download import NotDownloaded, RemoteFile, checked_parse, ensure, local
from hetsgd.data.download_progress import console, status
from hetsgd.data.files import open_data
from hetsgd.data.labels import encode, multi_hot
from hetsgd.data.native import loading_native
from hetsgd.data.source import Source
from hetsgd.errors import UserError

DENSE_MAX_FEATURES = 1000
# The widest input a model here can take: 2^22 (4,194,304) is three times news20.binary's
# 1,355,191 (the widest set in the registry) and above url's 3,231,961, the widest common LIBSVM
# set; a first layer of 512 units is then at most 8 GiB of float32 weights. An index past it is
# a typo or a hashed feature space, and would fail much later in an allocator without a word.
MAX_FEATURES = 1 << 22
_SNIFF_LINES = 1000


def read_libsvm(train: Path, test: Path | None, task: str, source: str,
                n_features: int | None = None) -> Parsed:
    """Parse a LIBSVM train file (and test file) into labels encoded for ``task``.

    ``task="auto"`` reads comma-separated labels as multilabel, else infers binary or multiclass
    from the number of distinct labels.
    """
    multilabel = task == "multilabel" or (task == "auto" and _looks_multilabel(train))
    paths = [train] + ([test] if test is not None else [])
    parts = [_parse(path, multilabel) for path in paths]
    xs, labels = [x for x, _ in parts], [y for _, y in parts]
    for path, x in zip(paths, xs):  # an empty test file would end the run after training
        if x.shape[0] == 0:
            raise UserError(f"{path} holds no examples")
    valued = [x for x in xs if x.nnz]  # a file of labels alone says nothing of the base
    where = " and ".join(map(str, paths))
    if not valued:  # else scikit-learn's placeholder width would be trained on as a feature
        raise UserError(f"{where}: labels but not one feature value (index:value) to learn from")
    if all(x.indices.min() > 0 for x in valued):  # no index 0 anywhere: 1-based
        for x in xs:
            x.indices -= 1
        width = max(x.shape[1] for x in xs) - 1
    else:
        width = max(x.shape[1] for x in xs)
    width = max(width, n_features or 0)
    xs = [sp.csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], width)) for x in xs]
    # each file's labels as scikit-learn reads them: if multilabel, a list of one tuple of labels
    # per example, else an array
    if multilabel:
        per_example = cast(list[list[tuple[float, ...]]], labels)
        task, (num_classes, ys) = "multilabel", multi_hot(per_example, where)
    else:
        task, num_classes, ys = encode(cast(list[np.ndarray], labels), task, where)
    if width <= DENSE_MAX_FEATURES:
        xs = [x.toarray() for x in xs]
    has_test = test is not None
    return Parsed(task, num_classes, xs[0], ys[0], xs[1] if has_test else None,
                  ys[1] if has_test else None, source)


def _parse(path: Path, multilabel: bool) -> tuple[sp.csr_matrix, list | np.ndarray]:
    """One file's features (indices as written) and raw labels; the first bad line is named."""
    with loading_native():
        from sklearn.datasets import load_svmlight_file  # scikit-learn loads to parse a file

    with open_data(path, text=True) as f:
        try:
            x, y = load_svmlight_file(f, dtype=np.float32, multilabel=multilabel,
                                      zero_based=True)
        except ValueError as exc:
            raise corrupt_error(path, multilabel, exc) from exc
    check_parsed(path, multilabel, x, y)
    return x, y


def check_parsed(path: Path, multilabel: bool, x: sp.csr_matrix, y: list | np.ndarray,
                 skip_lines: int = 0) -> None:
    """What scikit-learn's loader lets through but training cannot take, a feature index past
    ``MAX_FEATURES`` or a value that is not a finite number, as an error naming the line."""
    labels = np.asarray([v for labels in y for v in labels] if multilabel else y, dtype=float)
    if x.shape[1] > MAX_FEATURES + 1:  # + 1: the width of a 1-based file counts index 0
        raise corrupt_error(path, multilabel,
                            ValueError(f"a feature index past {MAX_FEATURES:,}"), skip_lines)
    if not (np.isfinite(x.data).all() and np.isfinite(labels).all()):
        raise corrupt_error(path, multilabel,
                            ValueError("a value that is not a finite number"), skip_lines)


def _looks_multilabel(path: Path) -> bool:
    """Comma-separated labels in the first lines mean a multilabel file."""
    with open_data(path, text=True) as f:
        for raw in itertools.islice(f, _SNIFF_LINES):
            tokens = raw.split(b"#", 1)[0].split()
            if tokens and b"," in tokens[0]:
                return True
    return False


def corrupt_error(path: Path, multilabel: bool, exc: ValueError,
                  skip_lines: int = 0) -> UserError:
    """Name the first bad line (after ``skip_lines`` header lines) and what is wrong with it:
    scikit-learn's error does not say where it is."""
    with open_data(path, text=True) as f:
        for number, raw in enumerate(f, 1):
            tokens = raw.split(b"#", 1)[0].decode(errors="replace").split()
            problem = _problem(tokens, multilabel) if number > skip_lines and tokens else None
            if problem is not None:
                text = raw.decode(errors="replace").strip()
                return UserError(f"{path}: line {number} {problem} ({text[:60]!r})")
    return UserError(f"cannot parse {path} as LIBSVM: {exc}")


def _problem(tokens: list[str], multilabel: bool) -> str | None:
    """What is wrong with a line ``label[,label...] [qid:N] index:value ...`` (indices
    increasing, values finite numbers within float32's range), or None."""
    labels, features = tokens[0], tokens[1:]
    if multilabel and ":" in labels:
        labels, features = "", tokens  # an example without labels
    try:
        for label in filter(None, labels.split(",") if multilabel else [labels]):
            if not math.isfinite(float(label)):
                return f"has a label that is not a finite number: {label}"
        if features and features[0].startswith("qid:"):
            int(features[0][4:])
            features = features[1:]
        previous = -1
        for token in features:
            index, sep, value = token.partition(":")
            if not sep or int(index) <= previous:
                return "is not valid LIBSVM"
            if int(index) > MAX_FEATURES:
                return f"has feature index {int(index)}, past the bound of {MAX_FEATURES:,}"
            if not math.isfinite(float(value)):
                return f"has a value that is not a finite number: {token}"
            if abs(float(value)) > FLOAT32_MAX:  # scikit-learn reads it as float32: infinite
                return f"has a value past float32's range (±{FLOAT32_MAX:.3g}): {token}"
            previous = int(index)
    except ValueError:
        return "is not valid LIBSVM"
    return None


@dataclass(frozen=True)
class LibsvmFile(Source):
    """Any LIBSVM file given as ``dataset.path``; the test part is split off."""

    default_scale: str = "none"

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        if not cfg.path:
            raise UserError("dataset=libsvm needs dataset.path=FILE (a LIBSVM file, optionally "
                            ".xz/.bz2/.gz)")
        path = existing_file(cfg.path)

        def parse() -> Parsed:
            with status(f"parsing {path.name}", progress):
                return read_libsvm(path, None, cfg.task, f"LIBSVM file {path}")

        return load_or_parse(self.name, [path], {"task": cfg.task}, parse)

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        raise UserError("the libsvm source reads dataset.path=FILE; there is nothing to fetch")

    def note(self) -> str:
        return "reads the file given as dataset.path=FILE"


@dataclass(frozen=True)
class LibsvmSet(Source):
    """A set published on the LIBSVM site: ``remotes`` is the train file, then the test file if
    one is published. A run that downloads the train file downloads the test file too; where the
    test file cannot be had, a test part is split off the train file, with a warning, as it is
    (stated in the run's ``dataset_source``) where only the train file is in the cache: a run
    whose data is already at hand never reaches for the network (``hetsgd data fetch`` gets
    both). ``dataset.path`` replaces the train file; a test file is then looked for beside it,
    and without one a test part is split off, as for ``dataset=libsvm``."""

    default_scale: str = "none"
    n_features: int | None = None

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        train_remote, test_remote = self.remotes[0], (self.remotes[1:] or [None])[0]
        if cfg.path:
            train = existing_file(cfg.path)
            test = find_local(train.parent, test_remote.name) if test_remote else None
        else:
            cached = local(train_remote)
            train = cached or ensure(train_remote, self.name, progress)
            test = None if test_remote is None else (
                local(test_remote) if cached else self._published_test(test_remote, progress))
        source = f"{self.name} from {train_remote.url}: {train}"
        if test is not None:
            source += f" + {test}"
        elif test_remote is not None:
            source += f"; no {test_remote.name} beside it"
        # a file the user points at explicitly is taken as it is
        checked = [] if cfg.path else [(path, remote) for path, remote in
                                       ((train, train_remote), (test, test_remote))
                                       if path is not None and remote is not None]

        def parse() -> Parsed:
            with status(f"parsing {train.name}", progress):
                return read_libsvm(train, test, self.task, source, self.n_features)

        files = [train] + ([test] if test is not None else [])
        return load_or_parse(self.name, files, {"n_features": self.n_features},
                             lambda: checked_parse(checked, parse))

    def _published_test(self, remote: RemoteFile, progress: bool) -> Path | None:
        """The published test file, downloaded beside the train file just downloaded; None where
        it cannot be, with a warning: the run goes on, but never on other data without a word."""
        try:
            return ensure(remote, self.name, progress)
        except NotDownloaded as exc:
            console.print(f"{exc}; until then, the test part is split off "
                          f"{self.remotes[0].name}, not the published one", markup=False,
                          soft_wrap=True)
            return None

    def cached(self) -> bool:
        return local(self.remotes[0]) is not None

    def note(self) -> str:
        if len(self.remotes) == 1:
            return "no published test file: a seeded stratified test part is split off"
        return (f"{self.remotes[1].name} is downloaded with {self.remotes[0].name}; without it, "
                f"a test part is split off {self.remotes[0].name}")


_BASE = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"


def _remote(name: str, known_hash: str | None = None) -> RemoteFile:
    return RemoteFile(name, _BASE + name, known_hash)


# sha256 of the published (uncompressed) w8a; the other files have no published checksum
_W8A_SHA256 = "b464b4f6ce6a5d9e181ffc793e19a04751036273722312398ef7673705014902"

SOURCES = (
    LibsvmFile("libsvm", "any LIBSVM/svmlight file (dataset.path=FILE)", "auto"),
    LibsvmSet("w8a", "LIBSVM w8a: web page categories, 300 binary features", "binary",
              "49,749 train / 14,951 test x 300",
              (_remote("w8a", _W8A_SHA256), _remote("w8a.t")), n_features=300),
    LibsvmSet("real_sim", "LIBSVM real-sim: UseNet articles, real vs simulated (sparse)",
              "binary", "72,309 x 20,958", (_remote("real-sim.bz2"),), n_features=20958),
    LibsvmSet("covtype_binary", "LIBSVM covtype.binary: forest cover type, class 2 vs rest",
              "binary", "581,012 x 54", (_remote("covtype.libsvm.binary.bz2"),), n_features=54,
              default_scale="standard"),  # raw UCI quantities (elevation in metres, ...)
    LibsvmSet("rcv1", "LIBSVM rcv1.binary: Reuters news, CCAT/ECAT vs GCAT/MCAT (sparse)",
              "binary", "20,242 train / 677,399 test x 47,236",
              (_remote("rcv1_train.binary.bz2"), _remote("rcv1_test.binary.bz2")),
              n_features=47236),
    LibsvmSet("news20", "LIBSVM news20.binary: 20 Newsgroups in two halves (sparse)", "binary",
              "19,996 x 1,355,191", (_remote("news20.binary.bz2"),), n_features=1355191),
)
