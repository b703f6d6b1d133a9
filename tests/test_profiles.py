"""Device profiles of the virtual-clock engine: a model's counted cost, the roofline that turns it
into seconds on a named device, and measured profiles read from a calibration."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from hetsgd.config.problem import (
    CnnConfig,
    LogregConfig,
    MlpConfig,
    MlpPaperConfig,
    ModelConfig,
    ResNet20Config,
)
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.engines.virtual.profiles import (
    PROFILES_FILE,
    ExchangeCost,
    MeasuredProfile,
    RooflineDevice,
    RooflineProfile,
    device_names,
    load_calibration,
    named_device,
)
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem

# -- the roofline ----------------------------------------------------------------------------------

GPU = RooflineDevice(name="toy_gpu", kind="cuda", peak_flops=1e9, memory_bandwidth=1e8, launch_s=1e-3,
                     efficiency=0.5, link_bandwidth=1e6, link_latency_s=0.01, sources={})
# 1 MFLOP and 100 bytes an example: compute-bound (0.5 GFLOP/s achievable vs 100 MB/s)
COMPUTE_BOUND = ModelCost(flops_per_example=1e6, update_flops=1e5, param_bytes=5000,
                          bytes_per_example=100.0, bytes_per_step=1000.0, kernels_per_step=10)


def test_a_compute_bound_step_takes_its_flops_at_the_achievable_rate_plus_launches() -> None:
    # 10 launches of 1 ms, then (10 x 1e6 + 1e5) FLOP at 0.5e9 FLOP/s
    assert RooflineProfile(GPU, COMPUTE_BOUND).compute_s(10) == pytest.approx(0.01 + 0.0202)


def test_a_memory_bound_step_takes_its_bytes_at_the_bandwidth() -> None:
    cost = replace(COMPUTE_BOUND, bytes_per_example=1e6)
    # (10 x 1e6 + 1000) bytes at 1e8 bytes/s is longer than the 0.0202 s of arithmetic
    assert RooflineProfile(GPU, cost).compute_s(10) == pytest.approx(0.01 + 0.10001)


def test_every_kernel_adds_the_launch_overhead() -> None:
    fewer = RooflineProfile(GPU, replace(COMPUTE_BOUND, kernels_per_step=3))
    more = RooflineProfile(GPU, COMPUTE_BOUND)
    for batch in (1, 10, 1000):
        assert more.compute_s(batch) - fewer.compute_s(batch) == pytest.approx(7 * GPU.launch_s)


def test_a_copy_takes_the_link_latency_and_the_model_over_the_link() -> None:
    assert RooflineProfile(GPU, COMPUTE_BOUND).copy_s() == pytest.approx(0.01 + 5000 / 1e6)
    core = replace(GPU, kind="cpu", link_bandwidth=None, link_latency_s=None)
    assert RooflineProfile(core, COMPUTE_BOUND).copy_s() == 0.0


# -- what a model's step costs ---------------------------------------------------------------------


def tiny_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 2))


def test_the_cost_of_a_tiny_mlp_by_hand() -> None:
    cost = ModelCost.of(tiny_mlp(), (3,), "multiclass")
    forward = 2 * (3 * 4 + 4 * 2)
    # backward: both weight gradients (as many FLOPs as the forward) and the input gradient of
    # the second layer only: nothing needs the gradient of the data
    assert cost.flops_per_example == forward + forward + 2 * 4 * 2
    params = 3 * 4 + 4 + 4 * 2 + 2
    assert cost.update_flops == 2 * params
    assert cost.param_bytes == 4 * params
    assert cost.bytes_per_step == 4 * 4 * params  # the fused step: W read twice, then updated
    # the input (3), each layer's output (4, 4, 2): four passes of four bytes
    assert cost.bytes_per_example == 4 * 4 * (3 + 4 + 4 + 2)


def test_the_hogbatch_net_costs_three_forwards_less_the_data_gradient() -> None:
    model = Problem("binary", 300, 1, None).build_model(MlpPaperConfig(), seed=0)
    cost = ModelCost.of(model, (300,), "binary")
    forward = 2 * (300 * 512 + 7 * 512 * 512 + 512 * 1)
    assert cost.flops_per_example == 3 * forward - 2 * 300 * 512


def test_the_autograd_step_also_moves_its_gradient() -> None:
    fused, autograd = (ModelCost.of(tiny_mlp(), (3,), "multiclass", step=step)
                       for step in ("fused", "autograd"))
    assert autograd.bytes_per_step == 2 * fused.bytes_per_step
    assert autograd.kernels_per_step > fused.kernels_per_step
    assert autograd.flops_per_example == fused.flops_per_example


def test_views_are_no_activation_memory() -> None:
    with_reshape = nn.Sequential(nn.Flatten(), nn.Unflatten(1, (3,)), nn.Identity(), *tiny_mlp())
    assert (ModelCost.of(with_reshape, (3,), "multiclass").bytes_per_example
            == ModelCost.of(tiny_mlp(), (3,), "multiclass").bytes_per_example)


@pytest.mark.parametrize("task, outputs", [("binary", 1), ("multiclass", 3), ("multilabel", 5)])
def test_every_task_can_be_costed(task: str, outputs: int) -> None:
    cost = ModelCost.of(nn.Sequential(nn.Linear(6, outputs)), (6,), task)
    assert cost.flops_per_example == 2 * 6 * outputs * 2  # forward and the weight gradient
    assert cost.kernels_per_step > 0


def deep_mlp(depth: int) -> nn.Sequential:
    return nn.Sequential(*(layer for _ in range(depth) for layer in (nn.Linear(8, 8), nn.ReLU())),
                         nn.Linear(8, 1))


@pytest.mark.parametrize("step", ["auto", "autograd"])
def test_kernels_grow_with_depth(step: str) -> None:
    counts = [ModelCost.of(deep_mlp(depth), (8,), "binary", step=step).kernels_per_step
              for depth in (1, 2, 4)]
    assert 0 < counts[0] < counts[1] < counts[2]
    assert counts[2] - counts[1] == 2 * (counts[1] - counts[0])  # the same calls per layer


MODELS: list[tuple[ModelConfig, Problem]] = [
    (MlpPaperConfig(), Problem("binary", 20, 1, None)),
    (MlpConfig(), Problem("multilabel", 20, 4, None)),
    (LogregConfig(), Problem("multiclass", 20, 3, None)),
    (CnnConfig(), Problem("multiclass", 64, 10, (1, 8, 8))),
    (ResNet20Config(), Problem("multiclass", 3 * 8 * 8, 10, (3, 8, 8))),
]


@pytest.mark.parametrize("model_cfg, problem", MODELS, ids=[cfg.name for cfg, _ in MODELS])
def test_every_project_model_is_costed_and_left_as_it_was(model_cfg: ModelConfig,
                                                          problem: Problem) -> None:
    model = problem.build_model(model_cfg, seed=0)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    storages = [p.data_ptr() for p in model.parameters()]
    cost = ModelCost.of(model, (problem.num_features,), problem.task)
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())
    assert [p.data_ptr() for p in model.parameters()] == storages
    assert all(p.grad is None for p in model.parameters())
    assert cost.flops_per_example > 0 and cost.bytes_per_example > 0 and cost.kernels_per_step > 0
    # what a replica copies: the parameters and the floating buffers (ResNet20's running
    # statistics), 4 bytes each
    floats = [b for b in model.buffers() if b.is_floating_point()]
    assert cost.param_bytes == 4 * sum(t.numel() for t in [*model.parameters(), *floats])


@pytest.mark.parametrize("args, message", [
    (((3,), "regression"), "unknown task"),
    (((), "binary"), "input shape"),
    (((3, 0), "binary"), "input shape"),
])
def test_bad_cost_arguments_are_one_line_errors(args: tuple, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ModelCost.of(tiny_mlp(), *args)


def test_an_unknown_step_choice_is_an_error() -> None:
    with pytest.raises(UserError, match="unknown step 'eager'"):
        ModelCost.of(tiny_mlp(), (3,), "multiclass", step="eager")


# -- the named devices -----------------------------------------------------------------------------


def test_every_named_device_loads_with_a_source_for_each_number() -> None:
    entries = yaml.safe_load(PROFILES_FILE.read_text())
    assert device_names() == tuple(entries)
    assert {"xeon_e5_2686v4_core", "v100_sxm2_16gb", "k80_die", "a100_sxm4_40gb",
            "h200_sxm"} <= set(device_names())
    for name in device_names():
        device = named_device(name)
        numbers = [field for field, value in entries[name].items()
                   if isinstance(value, (int, float))]
        assert numbers, name
        for field in numbers:
            source = device.sources[field]
            assert source.startswith(("https://", "estimate: ")), (name, field)
        assert (device.link_bandwidth is None) == (device.kind == "cpu"), name
        assert 0 < device.efficiency <= 1, name


def test_a_v100_steps_the_hogbatch_net_faster_than_a_xeon_core() -> None:
    model = Problem("binary", 300, 1, None).build_model(MlpPaperConfig(), seed=0)
    cost = ModelCost.of(model, (300,), "binary")
    gpu = RooflineProfile(named_device("v100_sxm2_16gb"), cost)
    core = RooflineProfile(named_device("xeon_e5_2686v4_core"), cost)
    assert gpu.compute_s(1024) < core.compute_s(1024)
    assert gpu.copy_s() > 0 and core.copy_s() == 0
    assert gpu.name == "v100_sxm2_16gb"


def test_an_unknown_device_names_the_known_ones() -> None:
    with pytest.raises(UserError, match=re.escape("unknown device profile 'tpu': one of xeon_")):
        named_device("tpu")


# -- measured profiles -----------------------------------------------------------------------------

CALIBRATION = """group,device,label,threads,batch_size,examples_per_s,ms_per_step,comm_ms_per_step
accel,cpu,emulated,1,1,500,2.0,1.0
accel,cpu,emulated,1,16,1450,11.0,3.0
accel,cpu,emulated,1,4,1250,3.2,1.2
cpu,cpu,cpu,1,4,8000,0.5,0.0
cpu,cpu,cpu,1,64,16000,4.0,0.0
"""


@pytest.fixture
def measured(tmp_path: Path) -> dict[str, MeasuredProfile]:
    path = tmp_path / "calibration.csv"
    path.write_text(CALIBRATION)
    return load_calibration(path)


def test_a_measured_profile_reproduces_its_points_without_the_copies(
        measured: dict[str, MeasuredProfile]) -> None:
    accel = measured["accel"]
    assert accel.name == "measured:accel"
    assert [accel.compute_s(b) for b in (1, 4, 16)] == pytest.approx([1e-3, 2e-3, 8e-3], rel=1e-12)
    assert accel.copy_s() == pytest.approx(1.2e-3 / 2)  # the median comm time, over two copies
    assert measured["cpu"].copy_s() == 0.0


def test_between_points_a_measured_profile_is_a_power_law(
        measured: dict[str, MeasuredProfile]) -> None:
    accel = measured["accel"]
    assert accel.compute_s(2) == pytest.approx(math.sqrt(1e-3 * 2e-3))  # midway in log-log
    times = [accel.compute_s(b) for b in range(1, 17)]
    assert times == sorted(times) and 1e-3 <= min(times) and max(times) <= 8e-3


def test_beyond_the_largest_batch_time_grows_in_proportion(
        measured: dict[str, MeasuredProfile]) -> None:
    accel = measured["accel"]
    assert accel.compute_s(32) == pytest.approx(2 * 8e-3)
    assert accel.compute_s(160) == pytest.approx(10 * 8e-3)


def test_below_the_smallest_batch_the_fixed_costs_remain(
        measured: dict[str, MeasuredProfile]) -> None:
    assert measured["cpu"].compute_s(1) == pytest.approx(0.5e-3)


def test_an_emulated_groups_sleep_is_taken_out_of_its_steps(tmp_path: Path) -> None:
    """Measured with slowdown 4, a step of 8 ms is 2 ms of the device's own (the rest was the
    sleep), 1 ms of which copies."""
    path = tmp_path / "slowed.csv"
    path.write_text("group,batch_size,ms_per_step,comm_ms_per_step,slowdown\n"
                    "cpu,1,8.0,1.0,4\ncpu,8,20.0,1.0,4\n")
    cpu = load_calibration(path)["cpu"]
    assert cpu.compute_s(1) == pytest.approx(1e-3) and cpu.compute_s(8) == pytest.approx(4e-3)
    assert cpu.copy_s() == pytest.approx(0.5e-3)


@pytest.mark.parametrize("text, message", [
    ("group,batch_size,ms_per_step\naccel,1,2.0\n", "lacks the columns comm_ms_per_step"),
    ("group,batch_size,ms_per_step,comm_ms_per_step,slowdown\naccel,1,2.0,0.5,0.5\n",
     r"line 2 \(group 'accel'\): slowdown=0.5 is not allowed"),
    ("group,batch_size,ms_per_step,comm_ms_per_step,slowdown\naccel,1,2.0,0.6,4\n",
     r"line 2 .*comm_ms_per_step=0.6 is not allowed: .* \(0 to 0.499\)"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\n", "has no rows"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\naccel,one,2.0,1.0\n",
     "line 2 .*batch_size=one is not allowed"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\naccel,1,2.0,2.5\n",
     "line 2 .*comm_ms_per_step=2.5 is not allowed"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\naccel,1,2.0,1.0\naccel,1,3.0,1.0\n",
     "line 3 .*batch_size=1 is not allowed: the group has a row for it already"),
    ("group,batch_size,ms_per_step,comm_ms_per_step,exchange_wait_ms,exchange_ms\n"
     "accel,1,2.0,1.0,0.1 4.0,1.5\n", "line 2 .*exchange_ms as many numbers each"),
])
def test_a_bad_calibration_file_is_a_one_line_error_naming_it(tmp_path: Path, text: str,
                                                              message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as raised:
        load_calibration(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_calibration_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read .*nowhere.csv: No such file"):
        load_calibration(tmp_path / "nowhere.csv")


def test_an_exchange_costs_by_the_earliest_ranks_wait_between_the_measured_points() -> None:
    cost = ExchangeCost.of([(0.003, 0.006), (0.001, 0.002), (0.002, 0.003)])
    assert cost.waits_s == (0.001, 0.002, 0.003)
    assert [cost(w) for w in (0.0, 0.001, 0.0015, 0.0025, 0.003, 0.01)] == pytest.approx(
        [0.002, 0.002, 0.0025, 0.0045, 0.006, 0.006])
    # ranks of one speed: every pattern waits as little, and counts as the patterns' mean
    assert ExchangeCost.of([(0.0, 0.002), (0.0, 0.004), (0.0, 0.003)])(0.5) == pytest.approx(0.003)
