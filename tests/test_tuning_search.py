"""A tuned comparison's search brackets its optimum and is its own: edge choices flagged and
extended, each method's objective from its own trials, settings that did not learn never
chosen, a search folder claimed, an interrupted search's table kept, tuning keys never swept,
the user's own methods tuned; and Hydra's Optuna sweeper searching hetsgd runs."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf
from typer.testing import CliRunner

from hetsgd.cli import app
from hetsgd.errors import SearchInterrupted, UserError
from hetsgd.invocation import invoke
from hetsgd.outputs.index import SEARCH_CLAIM
from hetsgd.tuning.bracket import beyond, edges, report_edges
from hetsgd.tuning.choice import choose
from hetsgd.tuning.objective import run_objective
from hetsgd.tuning.phases import tune_then_compare
from tests.test_tuning import TINY, spec, trials, tuned_sweep


def chosen_trials(rows: list[tuple[str, str, int, float, float]]) -> pd.DataFrame:
    table = trials(rows)
    choose(table, maximized=False)
    return table


def test_a_choice_on_the_edge_of_what_its_method_tried_is_flagged_with_its_side() -> None:
    table = chosen_trials([("gpu", "0.01", 0, 3.0, 0.5), ("gpu", "0.1", 0, 2.0, 0.4),
                           ("gpu", "1", 0, 1.0, 0.3),            # best at the top
                           ("hogwild", "0.01", 0, 3.0, 0.5), ("hogwild", "0.1", 0, 1.0, 0.4),
                           ("hogwild", "1", 0, 2.0, 0.3),        # best inside
                           ("hogbatch", "0.01", 0, 1.0, 0.3), ("hogbatch", "0.1", 0, 2.0, 0.4),
                           ("hogbatch", "1", 0, 3.0, 0.5)])      # best at the bottom
    assert edges(table) == {"gpu": {"optim.lr": "high"}, "hogbatch": {"optim.lr": "low"}}
    assert table.loc[table["chosen"], "edge"].tolist() == ["optim.lr:high", "", "optim.lr:low"]
    assert beyond(table, "gpu", "optim.lr", "high") == "10"  # one step of the grid's ratio
    assert beyond(table, "gpu", "optim.lr", "low") == "0.001"


def test_a_value_whose_trials_diverged_bounds_the_search_on_its_side() -> None:
    table = trials([("gpu", "0.1", 0, 2.0, 0.4), ("gpu", "1", 0, 1.0, 0.3),
                    ("gpu", "10", 0, 0.5, math.nan)])
    table.loc[2, "status"] = "diverged"
    assert choose(table, maximized=False) == {"gpu": {"optim.lr": "1"}}
    assert edges(table) == {}


def test_integer_knobs_step_by_whole_numbers_and_one_value_is_no_search() -> None:
    table = chosen_trials([("gpu", "1", 0, 2.0, 0.4), ("gpu", "2", 0, 1.0, 0.3)])
    table = table.rename(columns={"set.optim.lr": "set.algo.batch"})
    assert edges(table) == {"gpu": {"algo.batch": "high"}}
    assert beyond(table, "gpu", "algo.batch", "high") == "4"
    # a geometric grid of positive integers stays positive: below 1 there is no step (a batch
    # of 0 is no setting), above a 2 it is a 1
    assert beyond(table, "gpu", "algo.batch", "low") is None
    wider = table.assign(**{"set.algo.batch": ["2", "4"]})
    assert beyond(wider, "gpu", "algo.batch", "low") == "1"
    assert edges(chosen_trials([("gpu", "0.1", 0, 2.0, 0.4)])) == {}


def test_each_edge_is_logged_with_what_comes_of_it(caplog: pytest.LogCaptureFixture) -> None:
    def logged(objectives: tuple[float, float], extending: bool) -> str:
        table = chosen_trials([("gpu", "1", 0, objectives[0], 0.4),
                               ("gpu", "2", 0, objectives[1], 0.3)])
        table = table.rename(columns={"set.optim.lr": "set.algo.batch"})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hetsgd.tuning.bracket"):
            report_edges(table, edges(table), extending)
        message, = caplog.messages
        return message

    said = "+method=gpu chose algo.batch on the {} edge of the values it tried: {}"
    assert logged((2.0, 1.0), True) == said.format("high", "extending the grid past it "
                                                           "(algo.batch=4)")
    assert logged((1.0, 2.0), True) == said.format("low", "no value lies past it, so the "
                                                          "choice stays flagged")
    assert logged((2.0, 1.0), False) == said.format(
        "high", "the bound on extensions (tuning.extend) is reached, so the choice stays "
        "flagged")


def test_a_setting_that_did_not_learn_is_never_chosen() -> None:
    """lr=1e30: its trials 'complete' with a loss that went up; the best objective is no
    reason to choose it."""
    table = trials([("gpu", "1e30", 0, 0.1, 3e30), ("gpu", "0.1", 0, 5.0, 0.4)])
    table.loc[0, "learnt"] = False
    assert choose(table, maximized=False) == {"gpu": {"optim.lr": "0.1"}}
    with pytest.raises(UserError, match=r"no setting of \+method=gpu completed and learnt"):
        choose(table[:1].copy(), maximized=False)


def test_an_interrupted_search_keeps_its_table_and_its_folder_is_claimed(tmp_path: Path) -> None:
    def stopped(overrides: list[str]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(SearchInterrupted, match=r"search interrupted after 0 trial\(s\), in "):
        tune_then_compare(spec(), [], tmp_path, stopped)
    assert (tmp_path / "tuning.csv").is_file() and (tmp_path / "tuning" / SEARCH_CLAIM).is_file()
    with pytest.raises(UserError, match=r"tuning already holds a search, whose trials"):
        tune_then_compare(spec(), [], tmp_path, stopped)


@pytest.mark.integration
@pytest.mark.parametrize("key", ["tuning.methods=hogbatch,hogwild", "tuning.extend=0,1"])
def test_a_sweep_of_a_tuning_key_is_refused_in_one_line(tmp_path: Path, key: str) -> None:
    invocation = invoke(["-m", "+experiment=tuned_comparison", key, f"results_dir={tmp_path}"])
    assert invocation.code == 1
    error, = invocation.errors
    name, value = key.split("=")
    assert error.startswith(f"{name} is swept") and f"\"{name}='{value}'\"" in error
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.integration
@pytest.mark.wall
def test_an_edge_choice_is_extended_then_stays_flagged_at_the_bound(tmp_path: Path) -> None:
    """lrs far too small for the budget: the largest is chosen, the grid grows past it once
    (tuning.extend=1), and the choice, on the new edge, stays flagged in the table and report."""
    sweep = tuned_sweep(tmp_path, "tuning.methods='hogbatch'", "tuning.objective=test_loss",
                        "tuning.search.optim.lr='0.0001,0.0003'", "tuning.extend=1")
    tried = pd.read_csv(sweep / "tuning.csv", dtype={"set.optim.lr": str})
    extended = tried[tried["round"] == 1]
    assert extended["set.optim.lr"].tolist() == ["0.0009", "0.0009"]  # both trial seeds
    assert Path(extended["run_dir"].iloc[0]).parent.name == "extend1_hogbatch_optim.lr"
    chosen = tried[tried["chosen"]]
    assert set(chosen["set.optim.lr"]) == {"0.0009"} and set(chosen["edge"]) == {"optim.lr:high"}
    report = (sweep / "report.md").read_text()
    assert "(high edge) |" in report
    assert "Search: 6 trials (the grid, then 1 round(s) past edge choices)" in report
    assert "On an edge of the values tried" in report and "hogbatch (optim.lr:high)" in report


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.timeout(1800)
def test_a_methods_objective_does_not_move_with_another_methods_trials(tmp_path: Path) -> None:
    """time_to_0.9 against each method's own best loss: hogwild's values and choice are the
    same with hogbatch's trials beside it as without them (hogbatch reaching lower losses,
    which a search-wide best loss would have moved hogwild's targets by)."""
    both = pd.read_csv(tuned_sweep(tmp_path / "both") / "tuning.csv")
    alone = pd.read_csv(tuned_sweep(tmp_path / "alone", "tuning.methods='hogwild'") /
                        "tuning.csv")
    best = both.groupby("method")["train_loss"].min()
    assert best["hogbatch"] < best["hogwild"]  # else this test could not tell
    mine = both[both["method"] == "hogwild"].reset_index(drop=True)
    pd.testing.assert_series_equal(mine["objective.time_to_0.9"], alone["objective.time_to_0.9"])
    assert mine["chosen"].tolist() == alone["chosen"].tolist()


@pytest.mark.integration
@pytest.mark.wall
def test_a_method_from_the_users_config_dir_is_tuned(tmp_path: Path) -> None:
    own = tmp_path / "conf" / "method"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /algo: hogwild\n"
                                   "  - override /devices: cpu\n")
    invocation = invoke(["-m", "--config-dir", str(tmp_path / "conf"), *TINY,
                         "tuning.methods='mine'", f"results_dir={tmp_path / 'r'}"])
    assert invocation.code == 0, invocation.errors
    assert invocation.sweep_dir is not None
    tried = pd.read_csv(invocation.sweep_dir / "tuning.csv")
    assert set(tried["method"]) == {"mine"} and tried["chosen"].any()
    job, = (d for d in invocation.sweep_dir.iterdir() if (d / "config.yaml").is_file())
    assert yaml.safe_load((job / "config.yaml").read_text())["algo"]["name"] == "hogwild"


OPTUNA = importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.skipif(not OPTUNA, reason="hydra-optuna-sweeper is not installed (pip install "
                                       "'hetsgd[tune]')")
def test_hydras_optuna_sweeper_searches_hetsgd_runs_by_their_objective(tmp_path: Path) -> None:
    invocation = invoke(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                         "optim.lr=tag(log,interval(1e-3,1))", "devices=paper_hogbatch_v100",
                         "devices.groups.cpu.count=2", "model=logreg", "progress=false",
                         "budget.seconds=0.01", "budget.epochs=null", "eval.every_s=0.002",
                         f"results_dir={tmp_path}"])
    assert invocation.code == 0, invocation.errors
    assert invocation.sweep_dir is not None
    found = yaml.safe_load((invocation.sweep_dir / "optimization_results.yaml").read_text())
    losses = [json.loads((d / "summary.json").read_text())["final"]["test_loss"]
              for d in invocation.sweep_dir.iterdir() if (d / "summary.json").is_file()]
    assert len(losses) == 2 and found["best_value"] == pytest.approx(min(losses))
    # named by the key it samples, as a basic sweep's jobs are (Optuna writes no multirun.yaml:
    # they were 0_ and 1_)
    jobs = sorted(d.name for d in invocation.sweep_dir.iterdir() if d.is_dir() and d.name[0].isdigit())
    assert [name.split("_", 1)[1].split("=")[0] for name in jobs] == ["optim.lr", "optim.lr"]


@pytest.mark.integration
@pytest.mark.skipif(not OPTUNA, reason="hydra-optuna-sweeper is not installed")
def test_a_sweeper_direction_against_the_metric_is_refused(tmp_path: Path) -> None:
    invocation = invoke(["-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=minimize",
                         "objective.metric=test_acc", "optim.lr=tag(log,interval(1e-3,1))",
                         f"results_dir={tmp_path}"])
    assert invocation.code == 1
    assert invocation.errors == ["hydra.sweeper.direction=minimize would search for the worst "
                                 "objective.metric=test_acc: set hydra.sweeper.direction=maximize"]


@pytest.mark.integration
@pytest.mark.skipif(not OPTUNA, reason="hydra-optuna-sweeper is not installed")
def test_a_dry_run_of_a_sampling_sweep_checks_one_job_and_says_so() -> None:
    """Expanded as the basic sweeper would, it was refused (`BasicSweeper does not support
    sweep type : INTERVAL_SWEEP`) though the sweep itself runs."""
    result = CliRunner().invoke(app, ["run", "-m", "hydra/sweeper=optuna",
                                      "hydra.sweeper.n_trials=2",
                                      "optim.lr=tag(log,interval(1e-3,1))", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        "hetsgd: OptunaSweeper draws its 2 jobs as it runs: one checked, the keys it samples "
        "(optim.lr) left at the config's values"]
    assert "1 job(s) composed and checked, 0 would fail" in result.stdout
    wrong = CliRunner().invoke(app, ["run", "-m", "hydra/sweeper=optuna", "algo=hogbach",
                                     "optim.lr=tag(log,interval(1e-3,1))", "--dry-run"])
    assert wrong.exit_code == 1 and "did you mean hogbatch?" in wrong.stderr


#: A tuned comparison of one method on one trial seed, before its grid
ONE = ("-m", "+experiment=tuned_comparison", "seed=0", "budget.seconds=1",
       "tuning.methods=sync", "tuning.trials.seed=100")


@pytest.mark.integration
@pytest.mark.parametrize(("given", "error"), [
    (("tuning.search.optim.lr='0.03,0.3'", "optim.lr=0.05"),  # the comparison ran 0.05
     "optim.lr=0.05 sets a key that tuning.search searches"),
    (("tuning.search.optim.lr=0.1", "+tuning.search.model='mlp,logreg'"),  # ran, then failed
     "tuning.search: knob 'model' is a config group or node of +method=sync's config"),
    (("tuning.search.optim.lr='0.01,O.1'",),  # the dry run passed it
     "tuning.search.optim.lr='O.1' does not compose for +method=sync: Value 'O.1'"),
    (("tuning.search.optim.lr=0.1", "seed=range(0)"),  # searched, then compared nothing
     "seed=range(0) sweeps no value: the sweep would run no job"),
    (("tuning.search.optim.lr=0.1", "tuning.trials.seed='range(0)'"),  # no trial, no choice
     "tuning.trials.seed=range(0) sweeps no value: the search would run no trial"),
    (("tuning.search.optim.lr=0.1", "tuning.methods='sync,sync'"),  # each seed counted twice
     "tuning.methods gives 'sync' more than once"),
    (("tuning.search.optim.lr='0.1,0.10'",), "tuning.search.optim.lr gives 0.1 more than once"),
])
def test_a_tuned_comparison_that_cannot_run_as_asked_is_refused_before_any_trial(
        given: tuple[str, ...], error: str, tmp_path: Path) -> None:
    """Each passed the dry run (and the sweep's own checks), and went on to run trials: now
    the dry run and the sweep itself refuse it, the sweep leaving no folder."""
    args = [a for a in ONE if a.split("=")[0] not in {g.split("=")[0] for g in given}]
    sweep = tmp_path / "sweep"
    for flag in (["--dry-run"], [f"hydra.sweep.dir={sweep}"]):
        result = CliRunner().invoke(app, ["run", *args, *given, *flag])
        assert result.exit_code == 1
        line, = result.stderr.strip().splitlines()
        assert line.startswith(f"hetsgd: error: {error}")
    assert not sweep.exists()


@pytest.mark.integration
@pytest.mark.skipif(not OPTUNA, reason="hydra-optuna-sweeper is not installed")
def test_a_tuned_comparison_under_a_sampling_sweeper_is_refused(tmp_path: Path) -> None:
    """Optuna drew one trial of a two-value grid, and the edge went unflagged."""
    invocation = invoke(["hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", *ONE,
                         "tuning.search.optim.lr='0.03,0.3'", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert invocation.code == 1 and not (tmp_path / "s").exists()
    assert invocation.errors == ["a tuned comparison (tuning) searches its grid whole with Hydra's "
                                 "basic sweeper, which a sampling one would not: leave "
                                 "hydra/sweeper out"]


def test_a_run_that_did_not_complete_is_its_metrics_worst_which_optuna_ranks_last() -> None:
    """Optuna refuses NaN (the sweep stopped, its results unwritten); the worst value it takes."""
    optuna = pytest.importorskip("optuna")
    loss, accuracy = (OmegaConf.create({"objective": {"metric": m}}) for m in ("test_loss", "test_acc"))
    done = {"status": "completed", "learnt": True, "final": {"test_loss": 0.5, "test_acc": 0.9}}
    assert run_objective(loss, done) == 0.5 and run_objective(accuracy, done) == 0.9
    for summary in ({**done, "status": "diverged"}, {**done, "learnt": False}, None,
                    {**done, "final": {"test_loss": math.nan}}):
        assert run_objective(loss, summary) == math.inf
        assert run_objective(accuracy, summary) == -math.inf
    study = optuna.create_study(direction="minimize")
    for value in (run_objective(loss, None), 0.5):
        study.tell(study.ask(), state=optuna.trial.TrialState.COMPLETE, values=[value])
    assert study.best_value == 0.5


@pytest.mark.integration
@pytest.mark.skipif(not OPTUNA, reason="hydra-optuna-sweeper is not installed")
def test_an_optuna_search_goes_on_past_runs_that_failed_and_writes_its_results(
        tmp_path: Path) -> None:
    """Every lr it draws is refused as the run starts (no training): the sweep stopped after
    the first, with Optuna's `Values were told` and no summary, report or results."""
    sweep = tmp_path / "s"
    invocation = invoke(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "progress=false",
                         "optim.lr=interval(-2,-1)", f"hydra.sweep.dir={sweep}"])
    assert invocation.code == 1 and len(invocation.errors) == 2
    assert all("is not allowed: a positive number" in e for e in invocation.errors)
    found = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert found["best_value"] == math.inf
    assert (sweep / "summary.csv").is_file() and (sweep / "report.md").is_file()


@pytest.mark.integration
def test_an_unknown_objective_metric_is_refused_before_any_job(tmp_path: Path) -> None:
    invocation = invoke(["-m", "objective.metric=time_to_0.9", "seed=0,1",
                         f"hydra.sweep.dir={tmp_path / 's'}"])
    assert invocation.code == 1 and not (tmp_path / "s").exists()
    assert invocation.errors == ["objective.metric='time_to_0.9' is not allowed: choose one of "
                                 "train_loss, test_loss, test_acc"]
