"""The models a run can train, built deterministically from a seed.

Every model takes a flat batch ``[B, num_features]`` and returns logits ``[B, num_outputs]``; image
models reshape the batch themselves, so the data layer and the workers never need to know the
model's input shape. The MLP family (``mlp_paper``, ``mlp``, ``logreg``) also accepts a sparse CSR
batch: ``nn.Linear`` multiplies a CSR input with a sparse-dense kernel and autograd returns the
dense weight gradient, so a 20,958-feature sparse set is never densified. A user's own model
(``model=custom``) is built by :mod:`hetsgd.model.custom` under the same seeding.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import nn

from hetsgd.config.problem import (
    CnnConfig,
    CustomModelConfig,
    LogregConfig,
    MlpConfig,
    MlpPaperConfig,
    ModelConfig,
    ResNet20Config,
)
from hetsgd.errors import UserError
from hetsgd.model.custom import build_custom

ImageShape = tuple[int, int, int]

PAPER_LAYERS = 8
PAPER_WIDTH = 512

_ACTIVATIONS: dict[str, type[nn.Module]] = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}


def _mlp(widths: list[int], activation: type[nn.Module], bias: bool) -> nn.Sequential:
    """Linear layers between consecutive ``widths`` with ``activation`` between them."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(pairwise(widths)):
        if i > 0:
            layers.append(activation())
        layers.append(nn.Linear(fan_in, fan_out, bias=bias))
    return nn.Sequential(*layers)


def paper_mlp(num_features: int, num_outputs: int) -> nn.Sequential:
    """Ma & Rusu's network: input -> 8 x 512 sigmoid -> outputs, no bias anywhere.

    The initialization follows the authors' released code (the paper does not state one): every
    layer's weights ~ N(0, std = sqrt(2 t / (fan_in + fan_out))), with t = floor(sqrt(units[0] +
    units[1])) + 1 computed once from the first layer's sizes (t = 24 for covtype's 54 features).
    Two differences remain: their code runs in float64 and re-seeds its generator with the same seed
    before each layer; here the model is float32 and one seeded stream fills every layer.
    """
    widths = [num_features] + [PAPER_WIDTH] * PAPER_LAYERS + [num_outputs]
    model = _mlp(widths, nn.Sigmoid, bias=False)
    t = math.floor(math.sqrt(widths[0] + widths[1])) + 1
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.normal_(0.0, math.sqrt(2.0 * t / (layer.in_features
                                                              + layer.out_features)))
    return model


def _require_image(name: str, num_features: int, image_shape: ImageShape | None) -> ImageShape:
    if image_shape is None:
        raise UserError(f"model={name} needs an image dataset (e.g. fashion_mnist, cifar10); "
                        "this dataset has flat features, use model=mlp, mlp_paper or logreg")
    if math.prod(image_shape) != num_features:
        raise ValueError(f"image shape {image_shape} does not hold {num_features} features")
    return image_shape


def small_cnn(image_shape: ImageShape, channels: list[int], num_outputs: int,
              batch_norm: bool = False) -> nn.Sequential:
    """3x3 conv (+ BatchNorm2d with ``batch_norm``) + ReLU + 2x2 max-pool per width in
    ``channels``, then a linear head."""
    depth, height, width = image_shape
    layers: list[nn.Module] = [nn.Unflatten(1, image_shape)]
    for out_channels in channels:
        layers.append(nn.Conv2d(depth, out_channels, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out_channels))
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
        depth, height, width = out_channels, height // 2, width // 2
    if height == 0 or width == 0:
        raise UserError(f"model.channels={channels} pools a {image_shape[1]}x{image_shape[2]} "
                        f"image away; use at most {int(math.log2(min(image_shape[1:])))} widths")
    layers += [nn.Flatten(), nn.Linear(depth * height * width, num_outputs)]
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity shortcut, or 1x1 conv + BN when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet20(nn.Module):
    """The CIFAR ResNet20: a 16-channel stem, 3 stages x 3 basic blocks of 16/32/64 channels
    (stride 2 entering stages 2 and 3), global average pool, linear head.

    Initialization as in the biased local SGD authors' code: Xavier-uniform weights for every conv
    and linear layer, and the second BatchNorm's gamma of each block set to 0, so that each block
    starts as its shortcut.
    """

    def __init__(self, image_shape: ImageShape, num_outputs: int) -> None:
        super().__init__()
        self.unflatten = nn.Unflatten(1, image_shape)
        self.conv = nn.Conv2d(image_shape[0], 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks: list[nn.Module] = []
        in_channels = 16
        for stage, out_channels in enumerate((16, 32, 64)):
            for i in range(3):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(in_channels, out_channels, stride))
                in_channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(64, num_outputs)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
            elif isinstance(module, BasicBlock):
                nn.init.zeros_(module.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn(self.conv(self.unflatten(x))))
        out = self.blocks(out)
        return self.head(out.mean(dim=(2, 3)))


def _build(cfg: ModelConfig, num_features: int, num_outputs: int,
           image_shape: ImageShape | None, task: str | None, input_dtype: torch.dtype) -> nn.Module:
    """The architecture of ``cfg``'s schema; the schema has already checked every value."""
    match cfg:
        case MlpConfig():
            return _mlp([num_features, *cfg.hidden, num_outputs], _ACTIVATIONS[cfg.activation],
                        cfg.bias)
        case LogregConfig():
            return nn.Sequential(nn.Linear(num_features, num_outputs, bias=cfg.bias))
        case CnnConfig():
            shape = _require_image(cfg.name, num_features, image_shape)
            return small_cnn(shape, list(cfg.channels), num_outputs, cfg.batch_norm)
        case ResNet20Config():
            return ResNet20(_require_image(cfg.name, num_features, image_shape), num_outputs)
        case MlpPaperConfig():
            return paper_mlp(num_features, num_outputs)
        case CustomModelConfig():
            if task is None:
                raise TypeError("a custom model needs the data's task: build it with "
                                "Problem.build_model")
            return build_custom(cfg, num_features, num_outputs, image_shape, task, input_dtype)
    raise TypeError(f"no architecture is registered for {type(cfg).__name__}")


def build_model(cfg: ModelConfig, num_features: int, num_outputs: int,
                image_shape: ImageShape | None, seed: int, task: str | None = None,
                input_dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build the model ``cfg.name`` with float32 parameters in registration order.

    The same seed gives the same weights; the global RNG state is left as it was, so building a
    model never shifts the data order or any other seeded stream. CUDA is never touched by the
    in-tree models. ``task`` is needed by a custom model only (its factory may take it), as is
    ``input_dtype``, that of the features (int64 for integers kept, which only it may take).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _build(cfg, num_features, num_outputs, image_shape, task, input_dtype)
