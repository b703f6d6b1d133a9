"""What a worker needs to know about the data to build the model and its loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hetsgd.config import ModelConfig
from hetsgd.model.architectures import build_model

if TYPE_CHECKING:  # workers import this module: keep the data stack (sklearn, pandas) out
    from hetsgd.data import Dataset


@dataclass(frozen=True)
class Problem:
    """The data's task and shapes: enough to build the run's model in any process."""

    task: str
    num_features: int
    num_outputs: int
    image_shape: tuple[int, int, int] | None
    # image sets: per channel, the stored value of a black pixel (``Dataset.pixel_zero``), which
    # data.augment=crop_flip pads with
    channel_fill: tuple[float, ...] | None = None
    # the features' dtype: float32, or int64 where a file's integers are kept (token ids)
    features_dtype: str = "float32"

    @classmethod
    def of(cls, dataset: Dataset) -> Problem:
        return cls(dataset.task, dataset.num_features, dataset.num_outputs, dataset.image_shape,
                   dataset.pixel_zero, str(dataset.x_train.dtype))

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype of a batch the model takes."""
        dtype: torch.dtype = getattr(torch, self.features_dtype)
        return dtype

    def build_model(self, model: ModelConfig, seed: int) -> torch.nn.Module:
        """The run's seeded initial model for this data: the same in every process."""
        return build_model(model, self.num_features, self.num_outputs, self.image_shape, seed,
                           self.task, self.input_dtype)
