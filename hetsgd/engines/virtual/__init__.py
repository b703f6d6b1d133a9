"""The virtual-clock engine: simulated devices step on a shared model in virtual time."""
