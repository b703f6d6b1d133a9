"""Engines run an algorithm's workers: the shared-memory processes of one machine, the
torch.distributed ranks of one or several machines, and both on a virtual clock in one process.
Every engine implements :class:`~hetsgd.engines.training.Engine` and is built by
:func:`~hetsgd.engines.factory.build_engine`; they consume an algorithm's hooks
(:mod:`hetsgd.engines.hooks`) and never import the algorithms."""
