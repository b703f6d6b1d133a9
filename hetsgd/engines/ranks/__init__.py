"""The torch.distributed engine: ranks that exchange by all-reduce, on one machine or under
torchrun, started and watched by a coordinator built on the shared-memory one."""
