"""The code a run folder names, called only when the user names it too.

A custom model's config names the factory that builds it (``model._target_``) and may name more
in its arguments (nested ``_target_`` keys, which Hydra builds as well); a custom algorithm's
names the module that plans and hooks it (``algo._target_``); ``optim=torch`` names its optimizer
and scheduler, local SGD's ``algo.outer`` an outer optimizer. A run folder is data
that may come from someone else, and Hydra calls any importable function it is given
(``shutil.copyfile`` copies a file): so reading a folder back (``hetsgd recover``, a resume)
calls a target only when the user's own command names it as well (``--model-target TARGET``,
or a resume's ``model=custom model._target_=TARGET``; ``algo._target_=TARGET`` for an
algorithm), or, for an optimizer, when it is one of ``torch.optim``'s own classes (a name, not a
path through modules: ``torch.optim.sgd.torch.hub.load`` is none). The overrides a folder recorded are
composed again, so they may not set Hydra's own config either: ``hydra.searchpath=[pkg://M]``
imports the module M while the config is composed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hetsgd.config import RunConfig
from hetsgd.config.algorithms import CustomAlgoConfig, LocalSGDConfig
from hetsgd.config.optim import TorchOptimConfig
from hetsgd.config.problem import CustomModelConfig
from hetsgd.errors import UserError
from hetsgd.outputs.index import override_key
from hetsgd.outputs.safe_text import shown

TARGET = "_target_"
#: The parts of a config that name an optimizer or a scheduler: torch.optim's own are trusted.
OPTIMIZERS = ("optim", "algo.outer")


def _keyed_targets(cfg: RunConfig, algorithm: bool) -> list[tuple[str, str]]:
    """(key, target) for every target the run's config would have called: its custom model's,
    those nested in the model's arguments and, with ``algorithm`` (a run that trains), its custom
    algorithm's and its optimizers' (``optim=torch``'s and its scheduler's, ``algo.outer``'s)."""
    found = []
    if algorithm and isinstance(cfg.algo, CustomAlgoConfig):
        found.append(("algo", cfg.algo._target_))
    if algorithm and isinstance(cfg.optim, TorchOptimConfig):
        found += [("optim", target) for target in (cfg.optim._target_,
                                                   *_nested(cfg.optim.scheduler))]
    if algorithm and isinstance(cfg.algo, LocalSGDConfig):
        found += [("algo.outer", target) for target in _nested(cfg.algo.outer)]
    if isinstance(cfg.model, CustomModelConfig):
        found += [("model", target) for target in (cfg.model._target_, *_nested(cfg.model.kwargs))]
    return found


def named_targets(cfg: RunConfig) -> list[str]:
    """Every target the run's config would have called: its custom algorithm's, its custom
    model's and those nested in the model's arguments; none for built-ins."""
    return [target for _, target in _keyed_targets(cfg, algorithm=True)]


def _nested(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == TARGET:
                yield str(item)
            else:
                yield from _nested(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _nested(item)


def check_targets(cfg: RunConfig, source: Path | str, given: Iterable[str], how: str,
                  calls_algorithm: bool = True) -> None:
    """Refuse (a one-line :class:`UserError`) a config read from ``source`` (a run folder, the
    torch.distributed store) that names a target the user did not give; ``how`` says how to
    give a model's, with ``{}`` for the target (an algorithm's is given as
    ``algo._target_=TARGET``). A reader that never runs the algorithm (a recovery evaluates
    snapshots) passes ``calls_algorithm=False``."""
    trusted = set(given)
    for part, target in _keyed_targets(cfg, calls_algorithm):
        if target in trusted or (part in OPTIMIZERS and _torch_optim_class(target)):
            continue
        if part == "model":
            give = how.format(shown(target))
        elif part == "algo":
            give = f"add algo=custom algo.{TARGET}={shown(target)} to your command"
        else:
            give = f"add {part}.{TARGET}={shown(target)} to your command"
        raise UserError(f"{source} names {part}.{TARGET} '{shown(target)}', which hetsgd "
                        f"would import and call; what it reads back is data and may come "
                        f"from anyone, so it calls only what you name: {give} to call it")


def _torch_optim_class(target: str) -> bool:
    """Whether ``target`` names one of torch.optim's optimizers or schedulers by its public name
    (``torch.optim.AdamW``, ``torch.optim.lr_scheduler.CosineAnnealingLR``)."""
    from torch import optim
    from torch.optim import lr_scheduler

    module, _, name = target.rpartition(".")
    exported = {"torch.optim": optim.__all__, "torch.optim.lr_scheduler": lr_scheduler.__all__}
    return name in exported.get(module, ())


def check_recorded_overrides(overrides: Sequence[str], source: Path) -> None:
    """Refuse (a one-line :class:`UserError`) overrides read from ``source`` that set Hydra's
    own config. Hydra records a run's own overrides apart from its (``.hydra/overrides.yaml``
    against ``hydra.yaml``), so a folder's that name ``hydra`` were put there by hand."""
    for override in overrides:
        key = override_key(str(override))
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise UserError(f"{source} records the override '{shown(override)}', which sets "
                            "Hydra's own config (a search path imports modules): a run's "
                            "recorded overrides never do; remove it")


def override_targets(overrides: Sequence[str]) -> list[str]:
    """The targets a command's own Hydra overrides name (``model._target_=PKG.FACTORY``, and
    ``+model.ARG._target_=...``)."""
    found = []
    for override in overrides:
        key, sep, value = str(override).partition("=")
        if sep and key.lstrip("+~").split(".")[-1] == TARGET:
            found.append(value.strip().strip("'\""))
    return found
