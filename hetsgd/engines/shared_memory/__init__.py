"""The shared-memory engine: worker processes that claim chunks of the epoch and step on one
master model in shared memory, watched and snapshotted by a coordinator."""
