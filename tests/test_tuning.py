"""Sweeps that tune before they compare (hetsgd/tuning/): the spec's checks, each method's choice
on synthetic trial tables, the report's tuned columns, and a tuned comparison on the virtual
clock that chooses the same settings when run again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf
from test_comparable_rows import edit_summary
from test_report import write_overrides, write_run

from hetsgd.errors import UserError
from hetsgd.invocation import invoke
from hetsgd.outputs.report import add_tuning, write_report
from hetsgd.tuning import Tuning
from hetsgd.tuning.choice import choose, trial_table
from hetsgd.tuning.phases import check_knobs, tuned_config

OBJECTIVE = "objective.time_to_0.9"


def trials(rows: list[tuple[str, str, int, float, float]]) -> pd.DataFrame:
    """(method, lr, seed, objective, train loss) per trial, each completed and learnt."""
    table = pd.DataFrame(rows, columns=["method", "set.optim.lr", "seed", OBJECTIVE, "train_loss"])
    return table.assign(status="completed", learnt=True)


def test_each_method_gets_the_setting_whose_mean_over_the_seeds_is_best() -> None:
    table = trials([("gpu", "0.1", 0, 3.0, 0.2), ("gpu", "0.1", 1, 1.0, 0.2),   # mean 2.0
                    ("gpu", "0.3", 0, 2.5, 0.1), ("gpu", "0.3", 1, 2.5, 0.1),   # mean 2.5
                    # mean 0.6 over 0.4, though its best seed (0.3) beats both of 0.3's
                    ("hogwild", "0.1", 0, 0.3, 0.3), ("hogwild", "0.1", 1, 0.9, 0.3),
                    ("hogwild", "0.3", 0, 0.4, 0.3), ("hogwild", "0.3", 1, 0.4, 0.3)])
    assert choose(table, maximized=False) == {"gpu": {"optim.lr": "0.1"},
                                              "hogwild": {"optim.lr": "0.3"}}
    assert table["chosen"].tolist() == [True, True, False, False, False, False, True, True]
    assert choose(table, maximized=True) == {"gpu": {"optim.lr": "0.3"},
                                             "hogwild": {"optim.lr": "0.1"}}


def test_a_setting_that_a_seed_never_brought_to_the_target_ranks_behind_one_that_all_did() -> None:
    table = trials([("sync", "1.0", 0, 0.2, 0.1), ("sync", "1.0", 1, math.nan, 0.9),
                    ("sync", "0.1", 0, 5.0, 0.5), ("sync", "0.1", 1, 6.0, 0.5)])
    assert choose(table, maximized=False) == {"sync": {"optim.lr": "0.1"}}


def test_without_any_objective_the_lowest_training_loss_then_the_first_listed_wins() -> None:
    # listed out of their sorted order, so "first listed" is not "first sorted"
    table = trials([("sync", "1.0", 0, math.nan, 0.4), ("sync", "0.1", 0, math.nan, 0.4),
                    ("sync", "0.01", 0, math.nan, 0.8)])
    assert choose(table, maximized=False) == {"sync": {"optim.lr": "1.0"}}


def test_a_method_none_of_whose_settings_completed_on_every_seed_is_one_line() -> None:
    table = trials([("sync", "0.1", 0, math.nan, math.nan), ("sync", "0.3", 0, 1.0, 0.2),
                    ("sync", "0.3", 1, math.nan, math.nan)])
    with pytest.raises(UserError, match=r"^no setting of \+method=sync completed and learnt on "):
        choose(table, maximized=False)


def test_the_report_gives_the_chosen_setting_and_the_search_spread_per_method() -> None:
    table = trials([("gpu", "0.1", 0, 2.0, 0.2), ("gpu", "0.3", 0, 4.0, 0.1),
                    ("gpu", "1.0", 0, math.nan, 0.9),
                    ("hogwild", "0.1", 0, 0.5, 0.3), ("hogwild", "0.3", 0, 0.25, 0.3),
                    ("adaptive", "0.1", 0, math.nan, 0.5), ("adaptive", "0.3", 0, math.nan, 0.4)])
    choose(table, maximized=False)
    rows = pd.DataFrame({"algo": ["sync", "hogwild", "adaptive", "sync"],
                         "variant": ["+tuned=gpu", "+tuned=hogwild", "+tuned=adaptive",
                                     "optim.lr=0.5"]})
    columns = add_tuning(rows, table)
    assert columns == ["chosen optim.lr", "search time_to_0.9"]
    assert rows["chosen optim.lr"].tolist() == ["0.1", "0.3", "0.3", "—"]
    assert rows["search time_to_0.9"].tolist() == ["2 .. 4 (2/3)", "0.25 .. 0.5", "— (0/2)", "—"]
    # an objective maximized: the best is the highest
    rows = rows[["algo", "variant"]].copy()
    add_tuning(rows, table.rename(columns={OBJECTIVE: "objective.test_acc"}))
    assert rows["search test_acc"].tolist() == ["4 .. 2 (2/3)", "0.5 .. 0.25", "— (0/2)", "—"]


def spec(**given: object) -> Tuning:
    node = {"methods": "gpu,hogwild", "search": {"optim": {"lr": "0.1,0.3"}}, **given}
    return Tuning.of(OmegaConf.create({"tuning": node}))  # type: ignore[return-value]


def test_a_tuning_node_gives_its_grid_its_trials_and_its_methods() -> None:
    tuning = spec(trials={"seed": "100,101", "budget": {"seconds": 2}})
    assert tuning.method_names == ["gpu", "hogwild"]
    assert tuning.search_overrides() == ["optim.lr=0.1,0.3"]
    assert tuning.trial_overrides() == ["seed=100,101", "budget.seconds=2"]
    assert spec(search={"optim.lr": [0.1, 0.3]}).grid == {"optim.lr": ["0.1", "0.3"]}
    assert spec(search={"optim.lr": "range(1,3)"}).grid == {"optim.lr": ["1", "2"]}


@pytest.mark.parametrize(("given", "error"), [
    ({"search": {}}, r"search is empty"),
    ({"search": {"optim": {"lr": ""}}}, r"search\.optim\.lr is empty"),
    ({"search": {"optim": {"lr": "interval(0.1,1)"}}}, r"not an interval"),
    ({"objective": "speed"}, r"objective='speed' is not a metric: choose one of time_to_0\.9"),
    ({"methods": "gpu,no/pe"}, r"no \+method choice 'no/pe'"),
    ({"extend": -1}, r"extend=-1: a whole number >= 0"),
    ({"methods": ""}, r"methods is empty"),
    ({"sampler": "tpe"}, r"unexpected keyword argument 'sampler'"),
    # each (method, seed) ran twice, and counted as two seeds
    ({"methods": "gpu,hogwild,gpu"}, r"^tuning\.methods gives 'gpu' more than once"),
    ({"search": {"optim": {"lr": "0.1,0.3,0.10"}}}, r"^tuning\.search\.optim\.lr gives 0\.1 more "),
    # no trial, so no choice: the run stopped on `no config 'tuned/gpu'` after the search
    ({"trials": {"seed": "range(0)"}}, r"^tuning\.trials\.seed=range\(0\) sweeps no value"),
])
def test_a_bad_tuning_node_is_one_line(given: dict[str, object], error: str) -> None:
    with pytest.raises(UserError, match=error) as caught:
        spec(**given)
    assert "\n" not in str(caught.value)


@pytest.mark.integration
def test_a_single_run_of_the_tuned_experiment_is_refused_in_one_line(tmp_path: Path) -> None:
    """Only a sweep searches (the experiment's own hydra.mode is MULTIRUN, with or without -m):
    forced into one run, its config is refused before it trains."""
    invocation = invoke([*TINY, "hydra.mode=RUN", f"results_dir={tmp_path}"])
    assert invocation.code == 1 and invocation.sweep_dir is None
    error, = invocation.errors
    assert "tunes before it compares" in error and "hetsgd run -m" in error
    summary, = (json.loads(p.read_text()) for p in tmp_path.rglob("summary.json"))
    assert summary["status"] == "failed" and "tunes before it compares" in summary["error"]


def test_an_unknown_knob_or_method_is_refused_before_any_trial() -> None:
    with pytest.raises(UserError, match=r"unknown knob 'optim\.lrr': \+method=gpu's config"):
        check_knobs(spec(search={"optim": {"lrr": "0.1"}}), [])
    with pytest.raises(UserError, match=r"^tuning\.methods: no \+method choice 'nope'$"):
        check_knobs(spec(methods="gpu,nope"), [])
    check_knobs(spec(), [])


def test_a_knob_that_is_a_group_or_a_value_it_does_not_take_is_refused_before_any_trial() -> None:
    """`model` trained every trial, then its tuned config did not compose; `O.1` passed the
    dry run, then stopped the search with its folder claimed."""
    with pytest.raises(UserError, match=r"^tuning\.search: knob 'model' is a config group or "
                                        r"node of \+method=gpu's config, not a value"):
        check_knobs(spec(search={"model": "mlp,logreg"}), [])
    with pytest.raises(UserError, match=r"^tuning\.search\.optim\.lr='O\.1' does not compose for "
                                        r"\+method=gpu: Value 'O\.1' of type 'str' could not"):
        check_knobs(spec(search={"optim": {"lr": "0.01,O.1"}}), [])


def test_a_method_without_a_trial_gets_no_choice_and_says_so() -> None:
    """It was left out of the choices, and the comparison then failed on its missing config."""
    table = trials([("gpu", "0.1", 0, 2.0, 0.2)])
    with pytest.raises(UserError, match=r"^no setting of \+method=hogwild completed and learnt"):
        choose(table, maximized=False, methods=["gpu", "hogwild"])


def test_a_methods_tuned_config_is_its_method_with_the_chosen_values_over_it() -> None:
    assert tuned_config("hogbatch", {"optim.lr": "0.3", "algo.min_accel_batch": "64"}) == (
        "# @package _global_\ndefaults:\n- /method: hogbatch\n- _self_\n"
        "optim:\n  lr: 0.3\nalgo:\n  min_accel_batch: 64\n")


#: 2 methods x 2 lrs x 1 trial seed, then 1 evaluation seed, on a simulated paper mix with two
#: host workers, a hundredth of a virtual second each
TINY = ("+experiment=tuned_comparison", "devices=paper_hogbatch_v100",
        "devices.groups.cpu.count=2", "model=logreg", "progress=false",
        "tuning.methods='hogwild,hogbatch'",
        "tuning.search.optim.lr='0.01,0.3'", "tuning.objective=time_to_0.9",
        "tuning.extend=0", "budget.seconds=0.01", "eval.every_s=0.002", "seed=0")


def tuned_sweep(results: Path, *more: str) -> Path:
    invocation = invoke(["-m", *TINY, f"results_dir={results}", *more])
    assert invocation.code == 0, invocation.errors
    assert invocation.sweep_dir is not None
    return invocation.sweep_dir


@pytest.mark.integration
@pytest.mark.wall
def test_a_tuned_comparison_on_the_virtual_clock_chooses_the_same_settings_again(
        tmp_path: Path) -> None:
    first, second = tuned_sweep(tmp_path / "a"), tuned_sweep(tmp_path / "b")
    tried = pd.read_csv(first / "tuning.csv")
    assert len(tried) == 8 and set(tried["status"]) == {"completed"}  # 2 methods, lrs, seeds
    assert (first / "tuning.png").is_file()
    chosen = tried[tried["chosen"]].set_index("method")["set.optim.lr"].to_dict()
    assert sorted(chosen) == ["hogbatch", "hogwild"]
    again = pd.read_csv(second / "tuning.csv")
    assert again[again["chosen"]].set_index("method")["set.optim.lr"].to_dict() == chosen
    pd.testing.assert_series_equal(tried["objective.time_to_0.9"], again["objective.time_to_0.9"])
    # the comparison reruns each method at its choice, and its report leaves the trials out
    report = write_report(first)
    tables = [[row for row in block.splitlines() if row.startswith("| ")]
              for block in report.split("\n\n")]
    # the comparison's table (the time split's below it names the same runs, one row a worker)
    table, = (rows for rows in tables if rows and "| chosen optim.lr |" in rows[0])
    edge = tried[tried["chosen"]].set_index("method")["edge"].fillna("").to_dict()
    for method, lr in chosen.items():
        line, = (row for row in table if f"+tuned={method}" in row)
        side = edge[method].split(":")[1] if edge[method] else ""
        assert f"| {lr:g}{f' ({side} edge)' if side else ''} |" in line
    assert "\n".join(table).count("+tuned=") == 2 and "+method=" not in report
    for job in (first / "0_seed=0,+tuned=hogwild", first / "1_seed=0,+tuned=hogbatch"):
        method = job.name.rsplit("=", 1)[1]
        assert yaml.safe_load((job / "config.yaml").read_text())["optim"]["lr"] == chosen[method]


@pytest.mark.integration
def test_a_bad_tuning_config_stops_the_sweep_with_one_line_before_any_job(tmp_path: Path) -> None:
    invocation = invoke(["-m", *TINY, f"results_dir={tmp_path}",
                         "tuning.objective=speed"])
    assert invocation.code == 1
    error, = invocation.errors
    assert "objective='speed' is not a metric" in error and "\n" not in error
    assert not (tmp_path / "sweeps").exists() or not any((tmp_path / "sweeps").rglob("summary.json"))


def test_an_extensions_trials_are_measured_on_their_methods_scale(tmp_path: Path) -> None:
    """lr 0.3 reaches test loss 0.35, the method's best; the extension to 0.9 plateaus at 1.05:
    on the method's scale it gets to (2.35 - 1.05) / (2.35 - 0.35) = 0.65, never 0.9, so it
    has no time, and is not chosen. (Normalized by its own best, 1.05, it would reach 0.9
    within its first second and be chosen.)"""
    grid, extension = tmp_path / "grid", tmp_path / "tuning" / "extend1_hogbatch_optim.lr"
    curves = {"0.1": (grid, [2.3, 1.9, 1.5, 1.1, 0.7, 0.5]),
              "0.3": (grid, [2.3, 1.2, 0.5, 0.3, 0.3, 0.3]),
              "0.9": (extension, [2.3, 1.0, 1.0, 1.0, 1.0, 1.0])}
    for job, (lr, (folder, loss)) in enumerate(curves.items()):
        run_dir = edit_summary(write_run(folder / f"{job}_lr={lr}", algo="hogbatch",
                                         devices="cpu", seed=0, train_loss=loss), learnt=True)
        write_overrides(run_dir, ["+method=hogbatch", f"optim.lr={lr}", "seed=0"])
    table = trial_table([(0, grid), (1, extension)], ["optim.lr"], "time_to_0.9")
    assert table["round"].tolist() == [0, 0, 1]
    times = dict(zip(table["set.optim.lr"], table["objective.time_to_0.9"], strict=True))
    assert math.isnan(times["0.9"]) and times["0.3"] < times["0.1"]
    assert choose(table, maximized=False) == {"hogbatch": {"optim.lr": "0.3"}}


def test_a_trial_flagged_for_contention_is_timed_not_read_as_never_reaching(
        tmp_path: Path) -> None:
    """lr 0.1 reaches the target in half the time of lr 0.01 on both seeds; one of its seeds ran
    on a busy machine. Untimed, that seed read as a target never reached, and lr 0.01 won."""
    fast, slow = [2.3, 1.2, 0.3, 0.3, 0.3, 0.3], [2.3, 1.8, 1.2, 0.8, 0.3, 0.3]
    grid = tmp_path / "grid"
    for job, (lr, seed, loss) in enumerate([("0.01", 0, slow), ("0.01", 1, slow),
                                            ("0.1", 0, fast), ("0.1", 1, fast)]):
        run_dir = edit_summary(write_run(grid / f"{job}_lr={lr}", algo="sync", devices="cpu",
                                         seed=seed, train_loss=loss), learnt=True)
        if (lr, seed) == ("0.1", 1):
            edit_summary(run_dir, contention={"flagged": True, "workers_cpu_share": 0.4})
        write_overrides(run_dir, ["+method=sync", f"optim.lr={lr}", f"seed={seed}"])
    table = trial_table([(0, grid)], ["optim.lr"], "time_to_0.9")
    assert table["flagged"].tolist() == [False, False, False, True]
    assert table[OBJECTIVE].notna().all()
    assert choose(table, maximized=False) == {"sync": {"optim.lr": "0.1"}}
