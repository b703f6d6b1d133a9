"""Hydra's and OmegaConf's private calls (hetsgd/config/hydra_private.py): each signature pinned
as hetsgd calls it, so that an upgrade that changes one fails here by name; and no other module
of hetsgd reaches for them."""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra import compose
from omegaconf import MISSING, OmegaConf
from test_sweeps import hydra_conf  # noqa: F401 - the fixture: Hydra on the config tree

import hetsgd
from hetsgd.config import hydra_private

#: Each private callable hetsgd calls -> its parameters (name, default) as hydra-core 1.3.x and
#: omegaconf 2.3.x declare them.
PINNED: dict[str, list[tuple[str, object]]] = {
    "hydra._internal.utils._run_hydra": [
        ("args", inspect.Parameter.empty), ("args_parser", inspect.Parameter.empty),
        ("task_function", inspect.Parameter.empty), ("config_path", inspect.Parameter.empty),
        ("config_name", inspect.Parameter.empty), ("caller_stack_depth", 2)],
    "hydra._internal.utils.get_args_parser": [],
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments": [
        ("overrides", inspect.Parameter.empty), ("max_batch_size", inspect.Parameter.empty)],
    "hydra.version.setbase": [("ver", inspect.Parameter.empty)],
    "omegaconf.DictConfig._get_node": [
        ("self", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
        ("validate_access", True), ("validate_key", True), ("throw_on_missing_value", False),
        ("throw_on_missing_key", False)],
    "omegaconf.DictConfig._is_missing": [("self", inspect.Parameter.empty)],
    "omegaconf.DictConfig._is_none": [("self", inspect.Parameter.empty)],
}

#: What only hydra_private.py may name: Hydra's private package, and each private name above.
PRIVATE_NAMES = ("hydra._internal", *sorted({dotted.rsplit(".", 1)[1] for dotted in PINNED
                                             if dotted.rsplit(".", 1)[1].startswith("_")}))


def _resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", sorted(PINNED))
def test_each_private_call_keeps_its_signature(dotted: str) -> None:
    parameters = inspect.signature(_resolve(dotted)).parameters.values()  # type: ignore[arg-type]
    assert [(p.name, p.default) for p in parameters] == PINNED[dotted], (
        f"{dotted} changed: update hetsgd/config/hydra_private.py for this Hydra/OmegaConf")


def test_every_private_import_of_the_module_is_pinned() -> None:
    """A private import added to hydra_private.py without a pin fails here."""
    tree = ast.parse(Path(hydra_private.__file__).read_text())
    imported = {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith(("hydra._internal", "hydra.version"))
                for alias in node.names}
    unpinned = [name for name in imported
                if not any(d == name or d.startswith(f"{name}.") for d in PINNED)]
    assert imported and unpinned == []


def test_no_other_module_names_a_private_call() -> None:
    """Neither the package nor its scripts (tests may patch Hydra to stage a fault)."""
    repo = Path(hetsgd.__file__).parent.parent
    sources = [*(repo / "hetsgd").rglob("*.py"), *(repo / "scripts").rglob("*.py")]
    offenders = [f"{path.relative_to(repo)}: {name}" for path in sorted(sources)
                 if path != Path(hydra_private.__file__)
                 for name in PRIVATE_NAMES if name in path.read_text()]
    assert offenders == []


@dataclass
class _Inner:
    x: int = 1


@dataclass
class _Outer:
    """Where a typed config's mapping is a DictConfig that is None or missing."""

    inner: _Inner = field(default_factory=_Inner)
    gone: _Inner | None = None
    unset: _Inner = MISSING


def test_the_wrappers_work_on_the_installed_hydra() -> None:
    """Not only the signatures: the calls do what hetsgd reads from them."""
    assert hydra_private.basic_sweep(["seed=0,1", "algo=sync"]) == [
        ["seed=0", "algo=sync"], ["seed=1", "algo=sync"]]
    parsed = hydra_private.args_parser().parse_args(["-m", "seed=1"])
    assert parsed.multirun and parsed.overrides == ["seed=1"]
    node = OmegaConf.create({"a": {"b": 1}, "gone": None, "unset": "???", "leaf": 2,
                             "ref": {"x": "${nowhere}"}})
    assert [k for k in ("a", "gone", "unset", "leaf", "ref")
            if hydra_private.present_child(node, k) is not None] == ["a", "ref"]
    typed = OmegaConf.structured(_Outer)  # None and ??? as mappings, not as plain values
    assert [k for k in ("inner", "gone", "unset")
            if hydra_private.present_child(typed, k) is not None] == ["inner"]
    assert _resolve(hydra_private.BASIC_SWEEPER).__name__ == "BasicSweeper"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("hydra_conf")
def test_the_basic_sweeper_is_named_as_hydra_names_it() -> None:
    """A multirun's ``hydra.sweeper._target_`` is what :mod:`hetsgd.outputs.sweep_progress`
    compares with to count the jobs."""
    config = compose("config", return_hydra_config=True)
    assert config.hydra.sweeper._target_ == hydra_private.BASIC_SWEEPER
