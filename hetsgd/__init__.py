"""hetsgd: train one model on the CPUs and GPUs of a server together, and measure it."""

__version__ = "0.1.0"
