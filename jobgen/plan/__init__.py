"""The plan: an experiment in, each job's name, spec, batch script and shape out (nothing written or submitted)."""
