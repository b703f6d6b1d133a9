"""TensorBoard event files of one run (`logger=tensorboard`): ``<dir>/<run folder>``, or
``<dir>/<sweep folder>/<job folder>`` for a sweep's job, so that one TensorBoard pointed at a
sweep's folder compares its jobs. The tags and swept values are the run's hparams, so that the
HParams tab groups by method and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetsgd.config.schema import TensorBoardConfig
from hetsgd.outputs.trackers.record import RunRecord

#: The final values the HParams tab shows beside each run's hparams (series logged as scalars).
RESULTS = ("train/loss", "test/loss", "test/accuracy")


def events_dir(cfg: TensorBoardConfig, sweep: str | None, name: str) -> Path:
    """The folder of run ``name``'s event files (under its sweep's, for a sweep's job)."""
    return Path(cfg.dir, *([sweep] if sweep else []), name)


def write_events(record: RunRecord, cfg: TensorBoardConfig) -> Path:
    """Write the run's scalars, config, hparams and figures; return the folder written."""
    from PIL import Image  # matplotlib's own dependency
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    folder = events_dir(cfg, record.sweep, record.name)
    with SummaryWriter(str(folder), max_queue=1000) as writer:
        for name, points in record.series.items():
            for point in points:
                writer.add_scalar(name, point.value, point.step, walltime=point.time)
        config = "\n".join(f"    {key}: {value}" for key, value in record.params.items())
        writer.add_text("config", config, walltime=record.started)  # indented: shown verbatim
        results = {name: value for name in RESULTS if (value := record.final(name)) is not None}
        for summary in hparams(dict(record.tags), results):
            writer.file_writer.add_summary(summary, walltime=record.ended)
        for figure in record.figures:
            with Image.open(figure) as image:
                pixels = np.asarray(image.convert("RGB"))
            writer.add_image(f"figures/{figure.stem}", pixels, dataformats="HWC",
                             walltime=record.ended)
    return folder
