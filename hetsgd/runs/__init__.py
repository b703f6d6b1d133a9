"""The kinds of run the command line starts: one training run, a calibration, a torchrun
follower; each sets up through :mod:`hetsgd.runs.setup`."""
