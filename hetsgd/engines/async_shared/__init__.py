"""The asynchronous engine (Hogwild, Hogbatch, Adaptive, one-worker sync): worker processes that
claim chunks of the epoch and step on one master model in shared memory, each through its
algorithm's link (:func:`~hetsgd.engines.async_shared.process.worker_process`), started and
watched by the process coordinator of :mod:`hetsgd.engines.common`."""
