"""Held-out evaluation behind a firewall: cells, the harness, reports and aggregates."""

from bat_gym.evaluation.aggregates import Aggregates, CompletionCounts, TrackAggregate, aggregate
from bat_gym.evaluation.cells import FAILURE_CATEGORIES, Cell, CellResult, FailureCategory
from bat_gym.evaluation.evaluate import AGGREGATES_FILE, evaluate, evaluate_spec
from bat_gym.evaluation.harness import EvalConfig, held_out_cells, play_episode, run_cells
from bat_gym.evaluation.report import EvalReport, Interval, bootstrap_interval

__all__ = [
    "AGGREGATES_FILE",
    "Aggregates",
    "EvalConfig",
    "EvalReport",
    "Interval",
    "bootstrap_interval",
    "evaluate",
    "evaluate_spec",
    "held_out_cells",
    "play_episode",
    "run_cells",
    "Cell",
    "CellResult",
    "CompletionCounts",
    "FAILURE_CATEGORIES",
    "FailureCategory",
    "TrackAggregate",
    "aggregate",
]
