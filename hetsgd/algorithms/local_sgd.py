"""Local SGD on heterogeneous workers, and biased local SGD (Lim et al., arXiv 2508.08540).

A round: every rank trains its own replica for tau_r local steps of its own batch size, then the
replicas (parameters and floating BatchNorm statistics) are aggregated by one all-reduce and every
replica restarts from the aggregate. Momentum buffers stay local by default, never averaged or
reset (the authors' code; ``momentum_at_round`` below); integer buffers (BatchNorm's
num_batches_tracked) stay local too.

Where the paper is silent, these are the project's choices (the authors' code where it has one):

- ``tau`` per group: ``{group: steps}``; one number for every group (balanced local SGD);
  ``{fast: N, slow: M}`` on a two-group mix; or ``auto``: proportional to each group's measured
  step speed (a few warm-up steps on a throwaway copy, the emulated slowdown included), so that
  all groups finish a round together, the slowest group taking ``tau_min`` steps. The authors'
  code sets tau by hand (32 fast, 1 slow).
- The **fast group** is the group with the largest tau; on a tie (balanced runs, or the
  ``fast``/``slow`` form), the one with the highest measured step speed. Every other group is
  the slow side.
- ``aggregation``: ``uniform`` (1/W per rank, the authors' code), ``samples`` (weighted by the
  examples each rank processed in the round, tau_r * B_r), ``fast_weighted`` (weight ``alpha``
  on each fast-group rank, 1 on the others, normalized). The paper's own weights are not known
  (its method section was not available); this stays a config option.
- Data: every ``period`` = max(1, floor(N / examples per round)) rounds the ranks reshuffle: the
  period's seeded permutation is cut into contiguous shards, one per rank, of period * tau_r * B_r
  examples (data share proportional to tau, as the authors' code), walked in order. A round of
  more than N examples (the authors' code has none: its period would be 0) takes as many
  seeded permutations, one after the other, as it needs (:attr:`RoundPlan.blocks`): no example
  comes twice before every example has come once.
- ``biased.sampling``: at each reshuffle the loss tables are min-merged and the ``side``'s ranks
  train on the top-k of a pool instead (see :mod:`hetsgd.algorithms.biased_sampling`); the other
  side keeps its uniform shards, which may overlap. The side is chosen by device role, as the
  paper's hardware has it: ``slow`` (the authors' code) is the host (CPU) groups, ``fast`` (the
  paper's summary) the accelerator groups. Where the taus make a host group the fast one (say an
  emulated mix whose small-batch CPU group steps faster), rank 0 warns.
- Epochs: ``epoch_accounting: examples`` counts N examples consumed by all ranks as one epoch
  (the budget then stops at the first round that reaches it); ``authors`` counts the authors'
  R = floor(N / (sum of batch sizes * tau_fast)) rounds as one epoch (the round count balanced
  local SGD at tau_fast would need), so unbalanced runs consume less data per "epoch". The
  budget, the learning-rate milestones and the round count follow the chosen accounting;
  summary.json's ``epochs`` is always examples / N.
- ``momentum_at_round``: plain SGD's momentum at each aggregation stays local (``keep``, the
  authors' code), is zeroed (``reset``) or becomes the ranks' weighted average (``average``,
  one more all-reduce of a model's size); the paper does not say.
- The stop signal (time budget) is agreed at each aggregation, so a run overshoots
  ``budget.seconds`` by at most one round.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch

from hetsgd.algorithms.api import (
    Batches,
    Hooks,
    LocalSGDConfig,
    OuterOptimizer,
    Plan,
    RankLoop,
    RankLoopHooks,
    RunConfig,
    UserError,
    Verdict,
    WorkerSpec,
    check_world,
    choose_backend,
    per_group,
)
from hetsgd.algorithms.biased_sampling import LossTable, generator, top_k_of_pool

NAME = "local_sgd"
CONFIG = LocalSGDConfig
CHECKPOINTS = True  # after every aggregation the models agree; the rest is each rank's
log = logging.getLogger("hetsgd")


def _groups(world: list[WorkerSpec]) -> list[str]:
    return list(dict.fromkeys(spec.group for spec in world))


def _uses_fast_group(algo: LocalSGDConfig) -> bool:
    return algo.aggregation == "fast_weighted"


def group_taus(algo: LocalSGDConfig, groups: list[str],
               step_times: dict[str, float] | None) -> dict[str, int]:
    """Local steps per round of each group; `step_times` (seconds per step, by group) are
    needed where ``algo.tau.measured``."""
    tau = algo.tau
    if tau.mode == "all":
        return {group: tau.steps["*"] for group in groups}
    if tau.mode == "groups":
        return {group: tau.steps[group] for group in groups}
    if step_times is None:
        raise ValueError(f"algo.tau={tau} needs measured step times")
    slowest = max(step_times.values())
    if tau.mode == "auto":
        return {g: max(1, round(algo.tau_min * slowest / step_times[g])) for g in groups}
    fast = min(groups, key=step_times.__getitem__)
    return {g: tau.steps["fast"] if g == fast else tau.steps["slow"] for g in groups}


def fast_group(taus: dict[str, int], step_times: dict[str, float] | None) -> str:
    """The group with the largest tau; on a tie, the one with the shortest measured step."""
    top = max(taus.values())
    tied = [g for g, t in taus.items() if t == top]
    if len(tied) == 1:
        return tied[0]
    if step_times is None:
        raise ValueError("a tie on tau needs measured step times to tell the fast group")
    return min(tied, key=step_times.__getitem__)


def needs_step_times(algo: LocalSGDConfig, groups: list[str]) -> bool:
    if algo.tau.measured:
        return True
    if not _uses_fast_group(algo):
        return False
    taus = group_taus(algo, groups, None)
    return sum(t == max(taus.values()) for t in taus.values()) > 1


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    """Checks the layout; fixed taus are settled here, measured ones on the ranks at setup."""
    check_world(specs, cfg.devices.name)
    choose_backend(cfg.dist.backend, specs)
    algo, groups, mix = cfg.algo, _groups(specs), cfg.devices.name
    assert isinstance(algo, LocalSGDConfig)
    if algo.tau.mode == "fast_slow" and len(groups) != 2:
        raise UserError(f"algo.tau={{fast, slow}} needs a two-group mix; devices={mix} has "
                        f"{', '.join(groups)}: name the groups instead")
    if algo.tau.mode == "groups" and set(algo.tau.steps) != set(groups):
        raise UserError(f"algo.tau names {', '.join(algo.tau.steps)}, but the groups of "
                        f"devices={mix} are {', '.join(groups)}: give one tau per group "
                        "(or fast/slow)")
    if _uses_fast_group(algo) and len(groups) < 2:
        raise UserError(f"fast_weighted aggregation needs a fast and a slow group; devices={mix} "
                        f"has one ({groups[0]})")
    if algo.biased.sampling and {s.accel for s in specs} != {True, False}:
        raise UserError(f"biased sampling picks its side by device role (side=slow: the host "
                        f"groups, fast: the accelerator groups) and needs both; devices={mix} "
                        f"has only {'accelerator' if specs[0].accel else 'host'} groups")
    if algo.momentum_at_round != "keep" and cfg.optim.name != "sgd":
        raise UserError(f"algo.momentum_at_round={algo.momentum_at_round} acts on plain SGD's "
                        f"momentum (optim=sgd); optim={cfg.optim.name} keeps its optimizer's own "
                        "state: leave it at keep")
    measured = "from the device profiles" if cfg.devices.simulated else "measured at setup"
    tau = measured if algo.tau.measured else group_taus(algo, groups, None)
    return Plan(cfg, specs, {"tau": tau})


def hooks(plan: Plan) -> Hooks:
    return RankLoopHooks(LocalSGDLoop, setup_summary, publishing=False)


def setup_summary(world: list[WorkerSpec], columns: dict[str, list[float]]) -> dict:
    """summary.json's `local_sgd` entry: tau, aggregation weight and measured step time by group."""
    taus: dict[str, int] = {}
    for g, t in per_group(world, columns["tau"]).items():
        assert t is not None, "taus are whole numbers (LocalSGDLoop.setup), never NaN"
        taus[g] = int(t)
    return {"local_sgd": {"tau": taus,
                          "aggregation_weight": per_group(world, columns["weight"]),
                          "step_s": per_group(world, columns["step_s"])}}


@dataclass(frozen=True)
class RoundPlan:
    """What every rank knows about every round, the same on all of them."""

    taus: list[int]  # local steps per round, by rank
    batches: list[int]  # batch size, by rank
    weights: list[float]  # aggregation weight, by rank
    side: frozenset[int]  # ranks that train on the top-k of a pool (biased sampling)
    num_examples: int
    period: int  # rounds between reshuffles
    rounds_per_epoch: float
    total_rounds: int | None  # the epoch budget, in rounds
    pool_ratio: float
    seed: int

    @classmethod
    def build(cls, cfg: RunConfig, world: list[WorkerSpec], num_examples: int,
              step_times: list[float] | None) -> RoundPlan:
        algo = cfg.algo
        assert isinstance(algo, LocalSGDConfig)
        groups = _groups(world)
        by_group = None
        if step_times is not None:
            by_group = {g: sum(t for s, t in zip(world, step_times) if s.group == g)
                        / sum(s.group == g for s in world) for g in groups}
        group_tau = group_taus(algo, groups, by_group)
        taus = [group_tau[s.group] for s in world]
        batches = [s.batch_size for s in world]
        fast = fast_group(group_tau, by_group) if _uses_fast_group(algo) else None
        if algo.aggregation == "samples":
            raw = [float(t * b) for t, b in zip(taus, batches)]
        elif algo.aggregation == "fast_weighted":
            raw = [algo.alpha if s.group == fast else 1.0 for s in world]
        else:
            raw = [1.0] * len(world)
        weights = [w / sum(raw) for w in raw]
        side = frozenset(r for r, s in enumerate(world) if algo.biased.sampling
                         and s.accel == (algo.biased.side == "fast"))
        per_round = sum(t * b for t, b in zip(taus, batches))
        epochs = cfg.budget.epochs
        if algo.epoch_accounting == "authors":
            rounds_per_epoch = float(max(1, num_examples // (sum(batches) * max(taus))))
            total = None if epochs is None else max(1, round(epochs * rounds_per_epoch))
        else:
            rounds_per_epoch = num_examples / per_round
            total = None if epochs is None else -(-round(epochs * num_examples) // per_round)
        return cls(taus, batches, weights, side, num_examples,
                   max(1, num_examples // per_round), rounds_per_epoch, total,
                   algo.biased.pool_ratio, cfg.seed)

    def epoch(self, round_: int) -> float:
        return round_ / self.rounds_per_epoch

    @property
    def blocks(self) -> int:
        """How many of the data's permutations a reshuffle period takes: one, unless a round
        takes more than N examples (one permutation, wrapped, gave a rank some examples twice
        in a round and the next rank's shard the same examples again)."""
        return -(-sum(t * b for t, b in zip(self.taus, self.batches)) // self.num_examples)

    def done(self, round_: int) -> bool:
        return self.total_rounds is not None and round_ >= self.total_rounds

    def shard(self, rank: int, period: int, permutation: torch.Tensor,
              table: LossTable | None) -> torch.Tensor:
        """The examples `rank` trains on during reshuffle `period`, in order: its contiguous
        shard of the period's permutation, or its part of the shuffled top-k of a pool."""
        lengths = [self.period * t * b for t, b in zip(self.taus, self.batches)]
        if table is not None and rank in self.side:
            side = sorted(self.side)
            chosen = top_k_of_pool(table.values, sum(lengths[r] for r in side), self.pool_ratio,
                                   generator(self.seed, period))
            offset = sum(lengths[r] for r in side if r < rank)
        else:
            chosen, offset = permutation, sum(lengths[:rank])
        return chosen[(offset + torch.arange(lengths[rank])) % chosen.numel()]


class ShardBatches(Batches):
    """Batches walked from this rank's shard of the current period instead of an epoch's order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shard = self.permutation(0)

    def permutation(self, period: int, blocks: int = 1) -> torch.Tensor:
        """The seeded order of a reshuffle period (file order without data.shuffle): ``blocks``
        permutations of the data one after the other (one in a period of N examples or fewer,
        the same as before there were blocks)."""
        order = super().order
        return torch.cat([order(period * blocks + block) for block in range(blocks)])

    def order(self, epoch: int) -> torch.Tensor:
        return self.shard


def warn_if_the_side_is_not_as_named(world: list[WorkerSpec], plan: RoundPlan,
                                     side: str) -> None:
    """The sampling side is chosen by role; say so when the taus make it the other kind."""
    top = max(plan.taus)
    if min(plan.taus) == top:
        return
    fast_on_side = all(r in plan.side for r, t in enumerate(plan.taus) if t == top)
    if fast_on_side != (side == "fast"):
        groups = ", ".join(dict.fromkeys(world[r].group for r in sorted(plan.side)))
        log.warning("biased sampling: side=%s is the %s group(s) (%s) by device role, but their "
                    "tau makes them the %s side of this run", side,
                    "accelerator" if side == "fast" else "host", groups,
                    "fast" if fast_on_side else "slow")


class LocalSGDLoop(RankLoop):
    """One rank of local SGD: rounds of tau local steps of the run's optimizer, then one
    aggregating all-reduce and, with ``algo.outer``, the outer optimizer's step (DiLoCo's). A
    subclass may do more with the average (override :meth:`aggregate`)."""

    SETUP_COLUMNS: ClassVar[tuple[str, ...]] = ("tau", "weight", "step_s")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        rank = self.rank
        cfg, world = rank.cfg, rank.world
        self.batches = rank.batches(ShardBatches)
        algo = cfg.algo
        assert isinstance(algo, LocalSGDConfig)
        saved = rank.restored_loop
        self.step_times: list[float] | None = None  # as measured by the run a checkpoint began
        if "step_times" in saved:
            self.step_times = saved["step_times"].tolist()
        elif needs_step_times(algo, _groups(world)):
            self.step_times = rank.step_times(self.batches, cfg.optim.step)
        self.plan = RoundPlan.build(cfg, world, rank.num_examples, self.step_times)
        self.table = LossTable(rank.num_examples) if algo.biased.sampling else None
        outer = algo.outer_optimizer
        self.outer = None if outer is None else OuterOptimizer(outer, rank.flat.params)
        if self.table is not None and rank.spec.rank == 0:
            warn_if_the_side_is_not_as_named(world, self.plan, algo.biased.side)

    def setup(self) -> dict[str, list[float]]:
        return {"tau": [float(t) for t in self.plan.taus], "weight": self.plan.weights,
                "step_s": self.step_times or [math.nan] * len(self.plan.taus)}

    def state_dict(self) -> dict[str, Any]:
        """After an aggregation the models are equal; this rank's shard of the period and loss
        table are its own, as is its copy of the outer optimizer. The round plan's measured
        step times go along, so a resumed run keeps its taus."""
        loop: dict[str, Any] = {"shard": self.batches.shard}
        if self.step_times is not None:
            loop["step_times"] = torch.tensor(self.step_times)
        if self.table is not None:
            loop["loss_table"] = self.table.values
        if self.outer is not None:
            loop["outer"] = self.outer.state_dict()
        return loop

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.shard = state["shard"]
        if self.table is not None:
            self.table.values = state["loss_table"]
        if self.outer is not None:
            self.outer.load_state_dict(state["outer"])

    def aggregate(self) -> Verdict:
        """The round's aggregation: the replica becomes the weighted average of the ranks'
        (:meth:`Rank.average`), with the ranks' agreement on stopping and checkpoints; then the
        momentum as ``algo.momentum_at_round`` says, and the outer optimizer's step from the
        average, if any."""
        weight = self.plan.weights[self.rank.spec.rank]
        verdict = self.rank.average(weight, self.loss)
        momentum = self.rank.optimizer.momentum_buffer
        algo = self.rank.cfg.algo
        assert isinstance(algo, LocalSGDConfig)
        if momentum is not None and algo.momentum_at_round == "reset":
            momentum.zero_()
        elif momentum is not None and algo.momentum_at_round == "average":
            self.rank.average_state(momentum, weight)  # with the models' weights
        if self.outer is not None:
            self.outer.step()
        return verdict

    def local_steps(self) -> bool:
        """A round's tau local steps on this rank's shard (reshuffled every ``period`` rounds),
        the loss read on the workers' cadence and at the round's last step, for the
        exchange's divergence flag."""
        rank, plan, table = self.rank, self.plan, self.table
        if plan.done(self.position):
            return False
        me = rank.spec.rank
        tau, batch = plan.taus[me], plan.batches[me]
        round_ = self.position
        period, offset = divmod(round_, plan.period)
        if offset == 0:
            if table is not None:
                table.merge(rank.group)
            self.batches.shard = plan.shard(me, period,
                                            self.batches.permutation(period, plan.blocks), table)
        epoch = plan.epoch(round_)
        self.loss, self.where = None, f"in round {round_} (epoch {epoch:.3f})"
        for step in range(tau):
            start = (offset * tau + step) * batch
            x, y = self.batches.get(period, start, batch)
            record = None
            if table is not None:  # the rows trained on: a batch-norm merge's neighbour too
                first, rows = self.batches.span(len(self.batches.shard), start, batch)
                record = partial(table.record, self.batches.shard[first:first + rows])
            if not self.finite(self.train(x, y, epoch, batch, read=step == tau - 1,
                                          per_sample=record)):
                break
        self.position += 1
        return True
