"""Held-out evaluation behind a firewall: cells, the harness, reports and aggregates."""

from bat_gym.evaluation.aggregates import Aggregates, CompletionCounts, TrackAggregate, aggregate
from bat_gym.evaluation.cells import FAILURE_CATEGORIES, Cell, CellResult, FailureCategory

__all__ = [
    "Aggregates",
    "Cell",
    "CellResult",
    "CompletionCounts",
    "FAILURE_CATEGORIES",
    "FailureCategory",
    "TrackAggregate",
    "aggregate",
]
