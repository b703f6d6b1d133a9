"""A user's factory as it is written: the data's sizes go only to the parameters it names, under
its own names where ``model.data_args`` maps them (or to none, with ``null``), a ``**kwargs``
factory gets none unmapped, and a model returning an output object with ``logits`` trains."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_config

from hetsgd.config import ConfigError
from hetsgd.config.optim import SGDConfig
from hetsgd.config.problem import DATA_ARGUMENTS, CustomModelConfig
from hetsgd.errors import UserError
from hetsgd.model.custom import LogitsOf, data_arguments
from hetsgd.model.flat import FlatModel
from hetsgd.model.problem import Problem
from hetsgd.model.step import AutogradStep, build_step

PACKAGE = "factories_as_written"
FACTORIES = '''
from dataclasses import dataclass

import torch
from torch import nn

calls = []


def open_ended(**kwargs):
    calls.append(kwargs)
    return nn.Linear(kwargs.get("d_in", 64), kwargs.get("d_out", 10))


def renamed(d_in, d_out, num_classes=None):
    calls.append({"d_in": d_in, "d_out": d_out, "num_classes": num_classes})
    return nn.Linear(d_in, d_out)


@dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class WithOutput(nn.Module):
    """A HuggingFace-style model: its forward returns an object holding the logits."""

    def __init__(self, in_features, num_outputs, width=None):
        super().__init__()
        self.body = nn.Linear(in_features, width or num_outputs)

    def forward(self, x):
        out = self.body(x)
        return Output(logits=out, hidden=out)


class WithMapping(WithOutput):
    def forward(self, x):
        return {"logits": self.body(x)}
'''
DIGITS = Problem("multiclass", 64, 10, None)


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / f"{PACKAGE}.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    import factories_as_written

    factories_as_written.calls.clear()
    yield factories_as_written
    sys.modules.pop(PACKAGE, None)


def _custom(factory: str, data_args: dict[str, str | None] | None = None,
            **kwargs: object) -> CustomModelConfig:
    return CustomModelConfig(_target_=f"{PACKAGE}.{factory}", kwargs=dict(kwargs),
                             data_args=data_args or {})


def test_the_data_arguments_are_the_ones_the_schema_names() -> None:
    assert tuple(data_arguments(64, 10, None, "multiclass")) == DATA_ARGUMENTS


def test_a_kwargs_factory_gets_the_sizes_only_as_mapped(factories: Any) -> None:
    DIGITS.build_model(_custom("open_ended"), seed=0)
    assert factories.calls == [{}]
    model = DIGITS.build_model(
        _custom("open_ended", {"d_in": "in_features", "d_out": "num_outputs"}), seed=0)
    assert factories.calls[-1] == {"d_in": 64, "d_out": 10}
    assert (model.in_features, model.out_features) == (64, 10)


def test_a_mapping_names_the_factorys_own_parameters_and_null_withholds_one(
        factories: Any) -> None:
    renamed = {"d_in": "in_features", "d_out": "num_outputs"}
    DIGITS.build_model(_custom("renamed", renamed), seed=0)
    assert factories.calls[-1] == {"d_in": 64, "d_out": 10, "num_classes": 10}  # by its name
    DIGITS.build_model(_custom("renamed", {**renamed, "num_classes": None}), seed=0)
    assert factories.calls[-1] == {"d_in": 64, "d_out": 10, "num_classes": None}


def test_a_mapped_parameter_the_factory_lacks_or_also_given_is_one_line(factories: Any) -> None:
    with pytest.raises(UserError, match=r"^model.data_args.d_input=in_features: "
                                        rf"{PACKAGE}.renamed has no parameter 'd_input' "
                                        r"\(it takes: d_in, d_out, num_classes\)$"):
        DIGITS.build_model(_custom("renamed", {"d_input": "in_features", "d_out": "num_outputs"}),
                           seed=0)
    with pytest.raises(UserError, match=r"^model.data_args.d_in=in_features: model.d_in is given "
                                        r"too; give one of them$"):
        DIGITS.build_model(_custom("renamed", {"d_in": "in_features"}, d_in=64, d_out=10), seed=0)
    assert factories.calls == []


def test_a_mapping_to_a_size_hetsgd_has_not_is_refused_by_the_config() -> None:
    cfg = run_config("model=custom", f"model._target_={PACKAGE}.renamed",
                     "model.data_args={d_in:in_features,d_out:num_outputs}")
    assert cfg.model.data_args == {"d_in": "in_features", "d_out": "num_outputs"}
    assert cfg.model.kwargs == {}  # a key of the schema, not an argument of the factory
    with pytest.raises(ConfigError, match=r"^model.data_args.d_in='in_feature' is not allowed: "
                                          r"choose one of in_features, input_shape, num_classes"):
        run_config("model=custom", f"model._target_={PACKAGE}.renamed",
                   "model.data_args={d_in:in_feature}")


@pytest.mark.parametrize("factory", ["WithOutput", "WithMapping"])
def test_a_model_returning_an_output_object_trains_on_its_logits(factories: Any,
                                                                 factory: str) -> None:
    model = DIGITS.build_model(_custom(factory), seed=0)
    assert isinstance(model, LogitsOf)
    x, y = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 10
    assert model(x).shape == (32, 10)
    step = build_step("auto", FlatModel(model), SGDConfig(lr=0.5), "multiclass")
    assert isinstance(step, AutogradStep)
    losses = [float(step(x, y, 0.0, 32)[0]) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]


def test_an_output_objects_logits_of_the_wrong_shape_are_one_line(factories: Any) -> None:
    with pytest.raises(UserError, match=r"^model._target_=factories_as_written.WithOutput: on a "
                                        r"batch \[2, 64\] it returns a Output whose logits are "
                                        r"\[2, 3\] logits; the data has 10 classes"):
        DIGITS.build_model(_custom("WithOutput", width=3), seed=0)
