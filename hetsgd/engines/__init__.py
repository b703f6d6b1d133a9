"""Engines run an algorithm's workers: the shared-memory processes of one machine, and the
torch.distributed ranks of one or several machines. They consume an algorithm's hooks and never
import the algorithms."""
