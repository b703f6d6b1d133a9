"""What reports, summaries, folder names and figures call a run's model and dataset.

A config group's ``name`` says which schema and source a run used (``custom``, ``files``), which
tells two of a user's models or files apart no better than ``model``: a custom model is labelled
by its factory's own name (``mynets.small_cnn`` -> ``small_cnn``) unless its YAML names it, and a
file or folder a generic reader reads (``files``, ``libsvm``, ``folder``) by its stem
(``cells.csv.gz`` -> ``cells``): runs on two files are two comparisons, each with its own best
loss and baseline, never one.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

#: The names the schemas give a user's model and file, which say nothing of which one.
CUSTOM_MODEL, FILES = "custom", "files"
#: The readers of any file or folder (``dataset.path`` required), whose name says not which.
BY_PATH = (FILES, "libsvm", "folder")


def model_label(model: Any) -> str:
    """The model's name, or for a custom model named no more than ``custom``, its factory's."""
    name = str(model.name)
    target = _value(model, "_target_") if name == CUSTOM_MODEL else None
    return str(target).rsplit(".", 1)[-1] or name if isinstance(target, str) else name


def dataset_label(dataset: Any) -> str:
    """The dataset's name, or for a file or folder read by a generic reader (:data:`BY_PATH`),
    its name up to its first dot (``cells.csv.gz`` -> ``cells``)."""
    name = str(dataset.name)
    path = _value(dataset, "path") if name in BY_PATH else None
    return PurePath(str(path)).name.split(".", 1)[0] or name if path else name


def _value(node: Any, key: str) -> Any:
    """``node.key``, None where unset: a composed config not yet checked may lack a value
    (OmegaConf raises for a missing one), which the checks then name."""
    try:
        return getattr(node, key, None)
    except Exception:  # noqa: BLE001 - omegaconf's MissingMandatoryValue and its kin
        return None
