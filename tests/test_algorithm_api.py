"""The public algorithm API is the one the built-ins use: each built-in imports from hetsgd only
``hetsgd.algorithms.api`` (and the built-ins it builds on), the API imports no built-in, one
class is called ``RankLoop``, and the link protocol's members are checked when a link is built."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from hetsgd.algorithms import ALGORITHMS, api
from hetsgd.engines.common.links import InPlace, Link, Replica, Resident, check_link
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.workers import WorkerSpec

PACKAGE = Path(api.__file__).parent
ROOT = PACKAGE.parent  # hetsgd/
BUILT_INS = ["sync", "hogwild", "hogbatch", "adaptive", "local_sgd", "biased_sampling"]
# the built-in modules themselves: one may build on another (Adaptive on Hogbatch)
ALLOWED = {"hetsgd.algorithms.api", *(f"hetsgd.algorithms.{m}" for m in BUILT_INS)}


def _hetsgd_imports(path: Path) -> set[str]:
    """Every hetsgd module a file imports (``from hetsgd.x import y`` names hetsgd.x.y when y
    is a module, as ``from hetsgd.algorithms import hogbatch`` does)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: a relative import"
            module = node.module or ""
            if module == "hetsgd.algorithms":
                found |= {f"{module}.{alias.name}" for alias in node.names}
            else:
                found.add(module)
    return {name for name in found if name.split(".")[0] == "hetsgd"}


@pytest.mark.parametrize("name", BUILT_INS)
def test_each_builtin_imports_only_the_public_api(name: str) -> None:
    imports = _hetsgd_imports(PACKAGE / f"{name}.py")
    assert imports <= ALLOWED, sorted(imports - ALLOWED)


def test_every_registered_builtin_is_checked() -> None:
    assert set(ALGORITHMS) <= set(BUILT_INS)


def test_the_api_imports_no_builtin() -> None:
    imports = _hetsgd_imports(PACKAGE / "api.py")
    assert not imports & {f"hetsgd.algorithms.{m}" for m in BUILT_INS}, imports
    assert set(api.__all__) == {n for n in dir(api) if not n.startswith("_")} - {"annotations"}


def test_one_thing_is_called_rank_loop() -> None:
    defined = [f"{path.relative_to(ROOT)}" for path in ROOT.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and node.name == "RankLoop"]
    assert defined == ["engines/ranks/loop.py"]


def test_the_builtin_loops_are_rank_loops_and_declare_checkpoints() -> None:
    from hetsgd.algorithms import local_sgd, sync
    assert issubclass(sync.SyncLoop, api.RankLoop) and issubclass(local_sgd.LocalSGDLoop,
                                                                   api.RankLoop)
    assert sync.CHECKPOINTS is True and local_sgd.CHECKPOINTS is True
    assert not any(getattr(ALGORITHMS[n], "CHECKPOINTS", False)
                   for n in ("hogwild", "hogbatch", "adaptive"))


class _Link:
    """A user's link with every member; each test breaks one."""

    COPIES_PER_STEP = 0

    def __init__(self) -> None:
        self.flat = FlatModel(torch.nn.Linear(2, 1))

    def before_step(self) -> float:
        return 0.0

    after_step = publish = finish = before_step


SPEC = WorkerSpec(rank=1, group="accel", kind="cpu", device="cpu", threads=1, batch_size=8,
                  slowdown=1.0, accel=True)


def test_a_link_with_every_member_passes_and_the_builtins_are_links() -> None:
    link = _Link()
    assert check_link(link, SPEC) is link
    for cls in (InPlace, Replica, Resident):
        assert all(hasattr(cls, m) for m in ("before_step", "after_step", "publish", "finish",
                                              "COPIES_PER_STEP"))
    assert isinstance(link, Link)


@pytest.mark.parametrize("member, value, message", [
    ("publish", None, r"has no publish\(\)"),
    ("after_step", 3, r"has no after_step\(\)"),
    ("flat", torch.zeros(3), r"has no flat: the FlatModel its steps train"),
    ("COPIES_PER_STEP", -1, r"has COPIES_PER_STEP=-1, not a count of copies"),
    ("COPIES_PER_STEP", 1.5, r"has COPIES_PER_STEP=1\.5, not a count of copies"),
])
def test_a_link_breaking_the_protocol_is_one_line_naming_the_member(member: str, value: object,
                                                                     message: str) -> None:
    link = _Link()
    setattr(link, member, value)
    with pytest.raises(UserError, match=r"^the link of worker 1 \(accel\), a _Link, " + message):
        check_link(link, SPEC)
