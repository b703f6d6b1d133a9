"""Section i: the accelerator's step against a textbook loop on the same device.

hetsgd's accelerator worker (its replica step, merged into the master, and its GPU-alone step on
a resident model) against the loop a PyTorch user writes: an ``nn.Sequential``, the data resident
on the device, ``torch.optim.SGD(foreach=True)``, no ``.item()``; on CUDA also that loop captured
in one CUDA graph (the floor a step can reach), the kernels and host waits per step from
``torch.profiler``, and the bandwidth of a model-sized copy from pageable, pinned and registered
(page-locked in place) host memory. Without CUDA the accelerator is the emulated one, a CPU
worker running the same code, against the same loop on the CPU: the same ratios, no graph rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch

from hetsgd.algorithms.hogbatch import hogbatch_link
from hetsgd.config import RunConfig, to_run_config
from hetsgd.engines import device_ops
from hetsgd.engines.common.links import LinkFactory, default_link
from hetsgd.engines.common.memory import SharedData
from hetsgd.model.architectures import build_model
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from scripts.bench import inprocess
from scripts.bench.jobs import Jobs, compose_config
from scripts.bench.section import Section

ACCEL_MODELS = ("mlp", "mlp_paper")
ACCEL_BATCHES = (1024, 8192)
EMULATED_BATCHES = (64, 256)  # the emulated accelerator's sizes: a CPU core takes seconds at 8192
PROFILED_STEPS = 20
# host threads for the replica's add into the master in the threaded row (CUDA): a GPU worker's
# torch threads do nothing else on the host (devices.groups.accel.threads)
MERGE_THREADS = 4
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
COPY_REPEATS = 20


def _config(data: tuple[str, ...], model: str, batch: int, steps: int, n: int,
            graphs: bool = False) -> RunConfig:
    """The accelerator of the ``auto`` mix alone (a GPU, or the emulated CPU worker), one thread
    on the host, ``steps`` steps of ``batch``; its step in a CUDA graph with ``graphs``."""
    return to_run_config(compose_config(
        "algo=hogbatch", "devices=auto_gpu", *data, f"model={model}", "optim.lr=0.01",
        "devices.groups.accel.threads=1", f"devices.groups.accel.batch_size={batch}",
        "data.on_device=always", f"budget.epochs={steps * batch / n}",
        f"devices.cuda_graphs={str(graphs).lower()}"))


@dataclass
class _Timed:
    """The accelerator worker's timed loop: seconds per step, over ``updates`` steps (an
    epoch's last chunk may be shorter, so they may be more than asked)."""

    step_s: float
    updates: int


def _hetsgd(cfg: RunConfig, problem: Problem, data: SharedData, link: LinkFactory,
            around: AbstractContextManager = nullcontext()) -> _Timed:
    """The accelerator worker's loop with ``link``, to its last merge, after two steps outside
    the timing (as the plain loop warms up; a graph is captured at a batch size's second step).
    ``around`` (a profiler) sees the timed steps only."""
    worker = inprocess.worker(cfg, problem, data, link=link)
    for _ in range(2):
        worker.step(0, 0, worker.spec.batch_size)
    device_ops.synchronize(worker.device)
    with around:
        start = time.perf_counter()
        worker.run()
        device_ops.synchronize(worker.device)
        seconds = time.perf_counter() - start
    updates = max(int(worker.state.counters.row(0)["updates"]), 1)
    return _Timed(seconds / updates, updates)


@dataclass
class PlainLoop:
    """The textbook loop on resident data: random index batches drawn up front, on the device;
    :meth:`load` puts batch ``i`` where :meth:`compute` (forward, backward, update) reads it."""

    batches: torch.Tensor
    idx: torch.Tensor
    compute: Callable[[], None]

    def load(self, i: int) -> None:
        self.idx.copy_(self.batches[i % len(self.batches)])

    def step(self, i: int) -> None:
        self.load(i)
        self.compute()


def _plain_loop(cfg: RunConfig, problem: Problem, data: SharedData, device: torch.device,
                steps: int) -> PlainLoop:
    model = build_model(cfg.model, problem.num_features, problem.num_outputs, None,
                        cfg.seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, foreach=True)
    criterion = loss_fn(problem.task)
    x, y = data.x.to(device), data.y.to(device)
    batch = cfg.devices.groups["accel"].batch_size
    generator = torch.Generator().manual_seed(cfg.seed)
    batches = torch.randint(data.num_examples, (steps, batch), generator=generator).to(device)
    idx = batches[0].clone()

    def compute() -> None:
        optimizer.zero_grad(set_to_none=False)
        criterion(model(x.rows(idx)), y.index_select(0, idx)).backward()
        optimizer.step()
    return PlainLoop(batches, idx, compute)


def _graphed(loop: PlainLoop) -> Callable[[int], None]:
    """``loop``'s computation captured in one CUDA graph (after warm-up steps on a side stream,
    as torch's documentation does); a call copies batch ``i`` in and replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            loop.step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loop.compute()

    def replay(i: int) -> None:
        loop.load(i)
        graph.replay()
    return replay


def _per_step(step: Callable[[int], None], steps: int, device: torch.device) -> float:
    for i in range(3):
        step(i)
    device_ops.synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    device_ops.synchronize(device)
    return (time.perf_counter() - start) / steps


def _profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])


def _counts(profiler: torch.profiler.profile, steps: int) -> tuple[float, float]:
    """CUDA kernels and host waits per step in what ``profiler`` saw of ``steps`` steps (and
    the one synchronize that ends their timing)."""
    events = profiler.events()
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    syncs = sum(1 for e in events if e.name in SYNC_CALLS)
    return kernels / steps, syncs / steps


def _bandwidth(nbytes: int, device: torch.device) -> dict[str, float]:
    """GB/s of a host-to-device copy of ``nbytes`` from each kind of host memory."""
    pageable = torch.empty(nbytes // 4)
    pinned = torch.empty(nbytes // 4, pin_memory=True)
    registered = torch.empty(nbytes // 4)
    unregister = device_ops.register_host(registered, device)
    target = torch.empty(nbytes // 4, device=device)
    result = {}
    for name, source in (("pageable", pageable), ("pinned", pinned), ("registered", registered)):
        seconds = _per_step(lambda _i, s=source: target.copy_(s, non_blocking=True),
                            COPY_REPEATS, device)
        result[name] = nbytes / seconds / 1e9
    unregister()
    return result


def bench_accel(jobs: Jobs, seconds: float, models: tuple[str, ...] = ACCEL_MODELS,
                batches: tuple[int, ...] | None = None) -> Section:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batches = batches or (ACCEL_BATCHES if cuda else EMULATED_BATCHES)
    section = Section(
        f"the accelerator step vs a textbook loop ({'CUDA' if cuda else 'emulated, CPU'})",
        "Seconds per step of hetsgd's accelerator worker (its loop: claim, gather, step, and the "
        "replica's copy in and merge into the master, or the GPU-alone step on a resident "
        "model) over a textbook loop on the same device (nn.Sequential, resident data, "
        "torch.optim.SGD(foreach=True), no .item()); ratio > 1: hetsgd is slower. On CUDA also "
        "that loop in one CUDA graph, the replica's step in one (devices.cuda_graphs), that "
        f"again with {MERGE_THREADS} host threads for its add into the master, and kernels and "
        "host waits per step (torch.profiler).",
        ["model", "batch", "precision", "plain ms", "graphed ms", "replica / plain",
         "alone / plain", "replica / graphed", "graphed replica / graphed",
         f"graphed replica, {MERGE_THREADS} host threads / graphed",
         "kernels/step (replica, plain)", "waits/step (replica, plain)"])
    problem, shared = inprocess.training_data(jobs.data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for precision in (("fp32", "tf32") if cuda else ("fp32",)):
            device_ops.set_tf32(device, precision == "tf32")
            for model in models:
                for batch in batches:
                    _measure(section, jobs, seconds, problem, shared, model, batch, precision)
        if cuda:
            nbytes = 4 * sum(p.numel() for p in build_model(
                "mlp_paper", problem.num_features, problem.num_outputs, None, 0).parameters())
            section.data["copy_gb_per_s"] = _bandwidth(nbytes, device)
            section.notes.append("host-to-device copy of mlp_paper's parameters, GB/s: " + ", ".join(
                f"{k} {v:.1f}" for k, v in section.data["copy_gb_per_s"].items()))
    finally:
        device_ops.set_tf32(device, False)
        torch.set_num_threads(threads)
    return section


def _measure(section: Section, jobs: Jobs, seconds: float, problem: Problem,
             shared: SharedData, model: str, batch: int, precision: str) -> None:
    """One row: ``model`` at ``batch``, each loop timed over about ``seconds`` / 4."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probe = _config(jobs.data, model, batch, 3, shared.num_examples)
    probe_loop = _plain_loop(probe, problem, shared, device, 3)
    steps = max(3, round(seconds / 4 / _per_step(probe_loop.step, 3, device)))
    cfg = _config(jobs.data, model, batch, steps, shared.num_examples)
    loop = _plain_loop(cfg, problem, shared, device, steps)
    plain = _per_step(loop.step, steps, device)
    replica = _hetsgd(cfg, problem, shared, partial(hogbatch_link, merge="delta")).step_s
    alone = _hetsgd(cfg, problem, shared, default_link).step_s
    graphed = graphed_replica = threaded = kernels = waits = None
    if device.type == "cuda":
        graphed = _per_step(_graphed(loop), steps, device)
        graphs = _config(jobs.data, model, batch, steps, shared.num_examples, graphs=True)
        graphed_replica = _hetsgd(graphs, problem, shared,
                                  partial(hogbatch_link, merge="delta")).step_s
        torch.set_num_threads(MERGE_THREADS)
        try:
            threaded = _hetsgd(graphs, problem, shared,
                               partial(hogbatch_link, merge="delta")).step_s
        finally:
            torch.set_num_threads(1)
        few = _config(jobs.data, model, batch, PROFILED_STEPS, shared.num_examples)
        with _profiler() as profiler:
            for i in range(PROFILED_STEPS):
                loop.step(i)
            device_ops.synchronize(device)
        theirs = _counts(profiler, PROFILED_STEPS)
        profiler = _profiler()
        profiled = _hetsgd(few, problem, shared, partial(hogbatch_link, merge="delta"),
                           around=profiler)
        ours = _counts(profiler, profiled.updates)
        kernels, waits = (ours[0], theirs[0]), (ours[1], theirs[1])
    section.rows.append([
        model, str(batch), precision, f"{plain * 1e3:.3f}",
        "—" if graphed is None else f"{graphed * 1e3:.3f}", f"{replica / plain:.2f}x",
        f"{alone / plain:.2f}x", "—" if graphed is None else f"{replica / graphed:.2f}x",
        "—" if graphed is None or graphed_replica is None
        else f"{graphed_replica / graphed:.2f}x",
        "—" if graphed is None or threaded is None else f"{threaded / graphed:.2f}x",
        "—" if kernels is None else f"{kernels[0]:.0f}, {kernels[1]:.0f}",
        "—" if waits is None else f"{waits[0]:.1f}, {waits[1]:.1f}"])
    section.data[f"{model}_batch{batch}_{precision}"] = {
        "steps": steps, "plain_s": plain, "graphed_s": graphed, "replica_s": replica,
        "replica_graphed_s": graphed_replica,
        f"replica_graphed_{MERGE_THREADS}_threads_s": threaded, "alone_s": alone, "kernels_per_step": kernels,
        "waits_per_step": waits}
