"""`make bench`: hetsgd's speed as ratios measured side by side in one run.

Absolute times on a shared or CPU-only machine say little, so every measurement pairs two
configurations run back to back on the same machine and reports their ratio; the absolute numbers
go to ``bench.json`` too, labelled with the machine. Nothing here is a threshold: the bench reports.

a. hetsgd's worker step vs a plain ``torch.optim.SGD`` loop (in-process, one thread, mlp_paper and
   mlp at batch 1/16/256/4096; goals 1.5/1.2/1.0/1.0x the plain loop's examples/s)
b. the loop around the step: claiming, counting, the stop flag (goal: under 5 µs a step)
c. Hogwild over 1 and 2 worker processes (examples/s; goal: 2 workers >= 1.8x one), beside
   2 lone workers with a model each and on one shared model (what sharing the weights costs)
d. memory: the data and the master exist once, however many workers (USS per process; goal:
   the coordinator's rise while loading and evaluating <= 1.5x the training data)
e. time to a common training loss for each algorithm, as a ratio to sync
f. the utilization sampler's overhead (monitor.interval_s 0.5 vs 0.05)
g. the virtual-clock engine's own cost: one worker's examples per real second simulated vs real
   (mlp_paper and mlp at batch 1 and 16; goal: simulated >= 0.9x real), and the costly case, 48
   simulated one-example Hogwild workers: real seconds per virtual second and per 1,000 updates
h. the cost around a 1 s run of the command (one worker, two-worker Hogwild, local SGD on the
   emulated mix, a sweep's second job) as a ratio to ``python -c "import torch"`` measured beside
   it (goal: at most 1.5x), split into before training, after it, and to the exit
i. the accelerator's step (its replica step and its GPU-alone step) against a textbook loop on
   the same device (nn.Sequential, resident data, torch.optim.SGD(foreach=True), no .item())
   and, on CUDA, that loop in one CUDA graph; mlp and mlp_paper at batch 1024 and 8192, FP32 and
   TF32; kernels and host waits per step (torch.profiler); pageable / pinned / registered copy
   bandwidth. Without CUDA: the emulated accelerator against the loop on the CPU, batch 64/256

A ratio below its goal says so, with (for the step) the profile that explains it.
``python -m scripts.bench`` runs every section; ``--quick`` (``make bench-quick``) runs a-d and g
with 2 s runs; ``--only KEYS`` the sections named. One module per section, beside the machinery
they share (:mod:`.section`, :mod:`.load`, :mod:`.jobs`, :mod:`.inprocess`).

Runs use w8a when the file is at hand (``$HETSGD_W8A``, see scripts/w8a_path.py, or the data cache),
else a synthetic set of w8a's shape. ``--seconds`` (or ``$HETSGD_BENCH_SECONDS``) sets the budget of
each training run; results go to ``$HETSGD_RESULTS/bench/<time>/`` (default ``results/``).
"""
