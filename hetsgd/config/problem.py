"""Typed configuration of the problem a run learns: the dataset (embedded, synthetic, files, an
image folder) and the model, one schema per choice, so that a key the choice would ignore is an
error rather than a silent no-op. The rest of a run's schema is :mod:`hetsgd.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from hetsgd.config.checks import one_of, require, seconds

TASKS = ("binary", "multiclass", "multilabel")

SCALINGS = ("auto", "standard", "maxabs", "none")


@dataclass
class DatasetConfig:
    """Which data to train on; see ``hetsgd data list`` for the sources."""

    name: str = MISSING
    path: str | None = None  # a local file (required for `libsvm`, optional override otherwise)
    task: str = "auto"  # auto: inferred from the labels
    test_fraction: float = 0.2  # used only where the source has no published test split
    # fit on the training part only; auto: the source's own default, none for LIBSVM-format
    # files (published already scaled) except covtype_binary (raw), standard for the others
    scale: str = "auto"
    limit: int | None = None  # keep a seeded, stratified subset of this many training examples
    # the seed of the data a run sees (the test split, the `limit` subset, generated data),
    # apart from the run's seed, so that a sweep's seeds train and test on the same rows (and
    # share one copy in shared memory); null: the run's seed draws them too
    split_seed: int | None = 0

    def __post_init__(self) -> None:
        one_of("dataset.task", self.task, ("auto", *TASKS))
        one_of("dataset.scale", self.scale, SCALINGS)
        require(0.0 < self.test_fraction < 1.0, "dataset.test_fraction", "0 < x < 1",
                self.test_fraction)
        require(self.limit is None or self.limit > 0, "dataset.limit", "a positive count",
                self.limit)
        require(self.split_seed is None or 0 <= self.split_seed < 2**32, "dataset.split_seed",
                "a seed 0 <= x < 2**32, or null for the run's seed", self.split_seed)


@dataclass
class SyntheticConfig(DatasetConfig):
    """Generated data of a configurable shape (the `synthetic` source)."""

    name: str = "synthetic"
    n_samples: int = 10000
    n_features: int = 100
    n_classes: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.n_samples > 1, "dataset.n_samples", "at least 2", self.n_samples)
        require(self.n_features > 0, "dataset.n_features", "at least 1", self.n_features)
        require(self.n_classes > 1, "dataset.n_classes", "at least 2", self.n_classes)


FILE_FORMATS = ("auto", "npz", "npy", "csv", "parquet", "libsvm")
MISSING_CHOICES = ("error", "drop")


@dataclass
class FilesConfig(DatasetConfig):
    """Your own data in a file (`dataset=files dataset.path=FILE`, see hetsgd/data/tables.py):
    `.npz` (arrays `x_array` and `y_array`), `.npy` features with labels in `labels_path`, a CSV
    or Parquet table (the `label` column; the other columns, or those `features` names, or all
    but those `drop` names, are features: numbers as they are, text and categories one-hot
    encoded), or a LIBSVM file. The test part comes from `test_path` (and `test_labels_path`
    for `.npy`), else the seeded stratified split of `test_fraction`."""

    name: str = "files"
    format: str = "auto"  # auto: from the file's suffix (.npz .npy .csv .parquet; else LIBSVM)
    label: str = "label"  # CSV / Parquet: the label column
    x_array: str = "X"  # .npz: the features array
    y_array: str = "y"  # .npz: the labels array
    labels_path: str | None = None  # .npy: the labels of `path`
    test_path: str | None = None
    test_labels_path: str | None = None  # .npy: the labels of `test_path`
    features: list[str] = field(default_factory=list)  # tables: the feature columns (empty: all)
    drop: list[str] = field(default_factory=list)  # tables: columns that are not features
    missing: str = "error"  # tables: a row with a missing value is an error, or dropped
    # tables: the most distinct values a text or categorical column may hold to be one-hot
    # encoded (an identifier or free-text column would become a feature per row)
    max_categories: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("dataset.format", self.format, FILE_FORMATS)
        one_of("dataset.missing", self.missing, MISSING_CHOICES)
        require(self.max_categories > 0, "dataset.max_categories", "a positive count",
                self.max_categories)
        require(not (self.features and self.drop), "dataset.features",
                "give dataset.features (the columns kept) or dataset.drop (the columns left "
                "out), not both", self.features)
        for key, names in (("dataset.features", self.features), ("dataset.drop", self.drop)):
            require(len(set(names)) == len(names), key, "each column named once", names)
            require(self.label not in names, key,
                    f"the label column dataset.label={self.label!r} is never a feature", names)


@dataclass
class FolderConfig(DatasetConfig):
    """An image folder, one subfolder per class (`dataset=folder dataset.path=DIR`), read through
    torchvision (the `images` extra). Every image is resized to `image_size` (empty: the first
    image's size, which every other must have) and converted to `channels` (1 or 3)."""

    name: str = "folder"
    image_size: list[int] = field(default_factory=list)  # [height, width]
    channels: int = 3
    test_path: str | None = None  # a second folder of the same classes

    def __post_init__(self) -> None:
        super().__post_init__()
        require(not self.image_size or (len(self.image_size) == 2 and min(self.image_size) > 0),
                "dataset.image_size", "[height, width] in pixels, or empty", self.image_size)
        require(self.channels in (1, 3), "dataset.channels", "1 (grayscale) or 3 (RGB)",
                self.channels)


ACTIVATIONS = ("sigmoid", "relu", "tanh")

# What the data says about a custom model, under the names its factory may take
# (hetsgd/model/custom.py: data_arguments)
DATA_ARGUMENTS = ("in_features", "input_shape", "num_classes", "num_outputs", "task")


@dataclass
class ModelConfig:
    """A model choice; each has its own schema, so a key the chosen model would ignore is an
    error rather than a silent no-op."""

    name: str = MISSING


@dataclass
class MlpPaperConfig(ModelConfig):
    """Ma & Rusu's fixed network (8 x 512 sigmoid, no bias, their init): nothing to set."""

    name: str = "mlp_paper"


@dataclass
class MlpConfig(ModelConfig):
    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 128])
    activation: str = "relu"
    bias: bool = True

    def __post_init__(self) -> None:
        one_of("model.activation", self.activation, ACTIVATIONS)
        require(all(w > 0 for w in self.hidden), "model.hidden", "positive widths", self.hidden)


@dataclass
class LogregConfig(ModelConfig):
    name: str = "logreg"
    bias: bool = True


@dataclass
class CnnConfig(ModelConfig):
    name: str = "cnn"
    channels: list[int] = field(default_factory=lambda: [16, 32])  # conv widths
    batch_norm: bool = False  # a BatchNorm2d after each convolution

    def __post_init__(self) -> None:
        require(len(self.channels) > 0 and all(c > 0 for c in self.channels), "model.channels",
                "a non-empty list of positive widths", self.channels)


@dataclass
class ResNet20Config(ModelConfig):
    name: str = "resnet20"


@dataclass
class CustomModelConfig(ModelConfig):
    """Your own ``nn.Module`` (`model=custom model._target_=PKG.MODULE.FACTORY`), built by
    ``hydra.utils.instantiate`` (hetsgd/model/custom.py). Every other key of ``model`` (given as
    `+model.NAME=VALUE` or in your own YAML) is an argument of the factory: composition gathers
    them into ``kwargs``. hetsgd adds what the data says (``DATA_ARGUMENTS``) to the parameters
    the factory names so, and under the factory's own names as ``data_args`` maps them
    (``{d_in: in_features}``; ``{in_features: null}``: nothing to that parameter)."""

    name: str = "custom"
    _target_: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    # the factory's parameter -> what the data says there (one of DATA_ARGUMENTS), or null for
    # nothing; a parameter named as one of DATA_ARGUMENTS gets it unless mapped here
    data_args: dict[str, str | None] = field(default_factory=dict)
    # how long importing the factory, calling it and probing its module may take, in each
    # process that builds it: a factory that never returns fails the run instead of hanging it
    build_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        seconds("model.build_timeout_s", self.build_timeout_s)
        for parameter, size in self.data_args.items():
            if size is not None:
                one_of(f"model.data_args.{parameter}", size, DATA_ARGUMENTS)


MODEL_SCHEMAS: dict[str, type[ModelConfig]] = {
    "mlp_paper": MlpPaperConfig, "mlp": MlpConfig, "logreg": LogregConfig, "cnn": CnnConfig,
    "resnet20": ResNet20Config, "custom": CustomModelConfig}
