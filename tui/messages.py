"""Messages that workers post back to the UI thread.

Every slow step (parsing, scanning, statistics, histograms, diffing) runs in a
``@work(thread=True)`` worker and reports through one of these. ``key`` fields identify what the
result belongs to, so a result that arrives after the user moved on is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

__all__ = ["ModelsLoaded", "ShardLoaded", "ModelComplete", "LoadFailed", "ScanFinished", "StatsReady", "StatsFailed",
           "HistogramReady", "DiffReady", "DiffFailed"]


@dataclass
class ModelsLoaded(Message):
    """The file(s) given on the command line parsed: ``b`` is None unless diffing."""

    a: Any
    b: Any = None


@dataclass
class ShardLoaded(Message):
    """One more shard of the model on screen was parsed (``k`` of ``total``): ``shard`` is its
    `ModelFile`, ``chunk`` the table's index of its tensors (`model_index.index_chunk`)."""

    shard: Any
    chunk: Any
    k: int
    total: int


@dataclass
class ModelComplete(Message):
    """Every shard parsed: ``model`` is the whole model (`tensorscope.open`'s); ``index`` its
    table index when its order differs from the shards' as they were shown, else None."""

    model: Any
    index: Any = None


@dataclass
class LoadFailed(Message):
    """A file failed to parse; ``message`` is the one-line error (basenames only)."""

    path: str
    message: str


@dataclass
class ScanFinished(Message):
    """The safety scan finished: ``reports`` is ``[(path, ScanReport)]``, ``error`` set when the
    scanner is missing or failed."""

    reports: list
    error: str | None = None


@dataclass
class StatsReady(Message):
    """Statistics of one tensor (a `tensorscope.reader.TensorStats`)."""

    key: str
    stats: Any


@dataclass
class StatsFailed(Message):
    """Values could not be read or are not numeric; ``message`` says why."""

    key: str
    message: str


@dataclass
class HistogramReady(Message):
    """Fixed-bin histogram of finite values over ``[lo, hi]`` (``counts`` is a list of ints)."""

    key: str
    counts: list
    lo: float
    hi: float


@dataclass
class DiffReady(Message):
    """The `tensorscope.diff` result for the two models."""

    result: Any


@dataclass
class DiffFailed(Message):
    """Diffing failed or the diff module is missing."""

    message: str
