"""What a run leaves and what is built from it: the run directory, the index of runs,
metrics, reports, figures and sweep summaries. Reads files; never trains."""
