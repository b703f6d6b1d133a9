"""Datasets: a registry of sources, a download cache, and preparation into ``Dataset``.

``load_dataset(cfg, seed)`` is what a run calls; ``list_sources``, ``source_info`` and ``fetch``
back ``hetsgd data list|info|fetch``.
"""

from __future__ import annotations

from hetsgd.data.cache import data_home
from hetsgd.data.dataset import Dataset
from hetsgd.data.registry import fetch, list_sources, load_dataset, source_info
from hetsgd.data.source import SourceInfo

__all__ = ["Dataset", "SourceInfo", "data_home", "fetch", "list_sources", "load_dataset",
           "source_info"]
