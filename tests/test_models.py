from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from conftest import compose_config
from hydra.errors import ConfigCompositionException
from torch import nn

from hetsgd.config import ConfigError, to_run_config
from hetsgd.config.problem import MODEL_SCHEMAS
from hetsgd.errors import UserError
from hetsgd.model.architectures import BasicBlock, build_model


def _build(name: str, features: int = 20, outputs: int = 3,
           image_shape: tuple[int, int, int] | None = None, seed: int = 0,
           **fields: object) -> nn.Module:
    return build_model(MODEL_SCHEMAS[name](**fields), features, outputs, image_shape, seed)


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("name, shape", [
    ("mlp_paper", None), ("mlp", None), ("logreg", None),
    ("cnn", (1, 8, 8)), ("cnn", (3, 16, 16)), ("resnet20", (1, 8, 8)), ("resnet20", (3, 16, 16)),
])
def test_every_model_maps_a_flat_batch_to_logits(name: str, shape: tuple[int, int, int] | None):
    features = math.prod(shape) if shape else 20
    model = _build(name, features, 5, shape)
    out = model(torch.randn(4, features))
    assert out.shape == (4, 5)
    assert out.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = _build("resnet20", 64, 10, (1, 8, 8), seed=7)
    b = _build("resnet20", 64, 10, (1, 8, 8), seed=7)
    assert torch.equal(torch.rand(3), expected)  # building did not consume the global stream
    c = _build("resnet20", 64, 10, (1, 8, 8), seed=8)
    names_a = [n for n, _ in a.named_parameters()]
    assert names_a == [n for n, _ in b.named_parameters()]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_paper_mlp_shape_no_bias_and_authors_init():
    # covtype: 54 features, t = floor(sqrt(54 + 512)) + 1 = 24
    model = _build("mlp_paper", 54, 7)
    linears = _linears(model)
    assert [(m.in_features, m.out_features) for m in linears] == \
        [(54, 512)] + [(512, 512)] * 7 + [(512, 7)]
    assert all(m.bias is None for m in linears)
    assert sum(isinstance(m, nn.Sigmoid) for m in model.modules()) == 8
    assert not isinstance(list(model)[-1], nn.Sigmoid)  # the loss applies the output sigmoid
    for m in linears:
        std = math.sqrt(2 * 24 / (m.in_features + m.out_features))
        w = m.weight.detach()
        assert abs(w.mean().item()) < 0.1 * std
        assert w.std().item() == pytest.approx(std, rel=0.1)


def test_mlp_follows_its_config():
    model = _build("mlp", 10, 2, hidden=[6, 4], activation="tanh", bias=False)
    linears = _linears(model)
    assert [(m.in_features, m.out_features) for m in linears] == [(10, 6), (6, 4), (4, 2)]
    assert all(m.bias is None for m in linears)
    assert sum(isinstance(m, nn.Tanh) for m in model.modules()) == 2
    with_bias = _build("mlp", 10, 2, hidden=[6], activation="sigmoid", bias=True)
    assert all(m.bias is not None for m in _linears(with_bias))
    assert any(isinstance(m, nn.Sigmoid) for m in with_bias.modules())


@pytest.mark.parametrize("bias", [True, False])
def test_logreg_is_one_linear_layer(bias: bool):
    model = _build("logreg", 10, 4, bias=bias)
    assert [type(m) for m in model.modules() if not isinstance(m, nn.Sequential)] == [nn.Linear]
    assert (_linears(model)[0].bias is not None) == bias


def test_resnet20_structure_and_init():
    model = _build("resnet20", 3 * 32 * 32, 10, (3, 32, 32))
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 9
    assert [b.conv2.out_channels for b in blocks] == [16] * 3 + [32] * 3 + [64] * 3
    assert sum(isinstance(b.shortcut, nn.Sequential) for b in blocks) == 2  # 16->32, 32->64
    # stride 2 entering stages 2 and 3: 32 x 32 -> 16 x 16 -> 8 x 8
    assert [b.conv1.stride for b in blocks] == [(1, 1)] * 3 + [(2, 2), (1, 1), (1, 1)] * 2
    assert model.blocks(torch.zeros(2, 16, 32, 32)).shape == (2, 64, 8, 8)
    assert all(torch.all(b.bn2.weight == 0) for b in blocks)
    # 269,722 for the option-A ResNet20 plus the two 1x1 conv + BN shortcuts
    assert sum(p.numel() for p in model.parameters()) == 269_722 + 16 * 32 + 32 * 64 + 2 * 96
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(m.weight)
            bound = math.sqrt(6 / (fan_in + fan_out))  # Xavier's, not PyTorch's default (the
            # head's would be 1 / sqrt(64) = 0.125 < 0.285): of 432 or more uniform draws the
            # largest is below 0.9 x bound with odds under 1e-19
            assert 0.9 * bound <= m.weight.abs().max() <= bound


def test_resnet20_trains_on_a_one_channel_image():
    model = _build("resnet20", 28 * 28, 10, (1, 28, 28))
    x, y = torch.randn(8, 28 * 28), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_cnn_layers_follow_channels():
    model = _build("cnn", 64, 10, (1, 8, 8), channels=[4, 6])
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 4), (4, 6)]
    assert _linears(model)[0].in_features == 6 * 2 * 2


@pytest.mark.parametrize("batch_norm", [False, True])
def test_cnn_batch_norm_follows_each_convolution_before_its_relu(batch_norm: bool):
    model = _build("cnn", 64, 10, (1, 8, 8), channels=[4, 6], batch_norm=batch_norm)
    kinds = [type(m) for m in model]
    block = [nn.Conv2d, *([nn.BatchNorm2d] if batch_norm else []), nn.ReLU, nn.MaxPool2d]
    assert kinds == [nn.Unflatten, *block, *block, nn.Flatten, nn.Linear]
    norms = [m for m in model if isinstance(m, nn.BatchNorm2d)]
    assert [n.num_features for n in norms] == ([4, 6] if batch_norm else [])
    assert model(torch.randn(3, 64)).shape == (3, 10)


@pytest.mark.parametrize("name", ["cnn", "resnet20"])
def test_image_models_need_an_image_shape(name: str):
    with pytest.raises(UserError, match="image dataset"):
        _build(name, 64, 10, None)


def test_cnn_cannot_pool_the_image_away():
    with pytest.raises(UserError, match="model.channels"):
        _build("cnn", 16, 2, (1, 4, 4), channels=[2, 2, 2])


@pytest.mark.parametrize("model,key", [("mlp_paper", "model.hidden=[4]"),
                                       ("mlp_paper", "model.activation=tanh"),
                                       ("logreg", "model.channels=[4]"),
                                       ("cnn", "model.hidden=[4]")])
def test_a_key_the_chosen_model_would_ignore_is_an_error(model: str, key: str):
    """Hydra refuses to set it (the model's schema has no such field), and the schema check
    refuses it added with `+`."""
    name = key.split("=")[0]
    with pytest.raises(ConfigCompositionException, match=rf"^Could not override '{re.escape(name)}'\."):
        to_run_config(compose_config(f"model={model}", key))
    with pytest.raises(ConfigError,
                       match=rf"^unknown config key\(s\) {re.escape(name)}: no schema has them$"):
        to_run_config(compose_config(f"model={model}", f"+{key}"))


def test_each_model_schema_holds_its_defaults():
    cfg = to_run_config(compose_config("model=mlp"))
    assert (cfg.model.hidden, cfg.model.activation, cfg.model.bias) == ([128, 128], "relu", True)
    with pytest.raises(ConfigError, match="model.activation"):
        to_run_config(compose_config("model=mlp", "model.activation=gelu"))


def _sparse_batch(rows: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    dense = torch.rand(rows, features, generator=generator)
    dense[dense < 0.9] = 0  # about 10% non-zeros, and some empty rows
    dense[1] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        return dense, dense.to_sparse_csr()


@pytest.mark.parametrize("name, fields", [("mlp_paper", {}), ("mlp", {"hidden": [16]}),
                                          ("logreg", {"bias": True}), ("logreg", {"bias": False})])
def test_sparse_and_dense_inputs_agree(name: str, fields: dict):
    dense, sparse = _sparse_batch(6, 300)
    assert sparse.layout == torch.sparse_csr
    model = _build(name, 300, 3, **fields)
    outputs, grads = [], []
    for x in (dense, sparse):
        model.zero_grad(set_to_none=True)
        out = model(x)
        (out ** 2).sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    for g_sparse, g_dense in zip(grads[1], grads[0]):
        assert g_sparse.layout == torch.strided
        torch.testing.assert_close(g_sparse, g_dense, rtol=1e-5, atol=1e-5)
