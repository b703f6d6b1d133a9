"""What every engine builds on: the data and the master model in shared memory (``memory.py``,
numpy views of shared scalars in ``numpy_views.py``), the epoch cursor, the shared state and
signals (``state.py``), how a step lands in the master (``links.py``), a worker's step loop
(``worker.py``: the asynchronous engine's processes, the virtual clock's events, calibration)
and the coordinator of worker or rank processes (``coordinator.py``)."""
