"""Sweeps that tune before they compare: each method's knobs searched on a grid at a tuning
budget, the best setting of each method chosen by a named objective, then rerun on the
evaluation seeds (:mod:`hetsgd.tuning.spec`, :mod:`hetsgd.tuning.choice`,
:mod:`hetsgd.tuning.phases`)."""

from hetsgd.tuning.spec import Tuning

__all__ = ["Tuning"]
