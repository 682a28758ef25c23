"""How many CPU threads a rank's math gets (training.hardware.cpu_threads): the CPUs Slurm gave its
task; what the user or a launcher said stands. The jobs on the real cluster check the rank lines
(tests/slurm/test_jobs.py: srun, one CPU a task; tests/slurm/test_launchers.py: srun, torchrun, accelerate)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from training.hardware import cpu_threads


@given(cpus=st.integers(1, 1024), said=st.integers(1, 1024))
def test_a_rank_computes_on_the_cpus_of_its_task_unless_someone_said(cpus: int, said: int) -> None:
    assert cpu_threads({"SLURM_CPUS_PER_TASK": str(cpus), "SLURM_NTASKS_PER_NODE": "4"}) == cpus
    assert cpu_threads({"SLURM_CPUS_PER_TASK": str(cpus), "OMP_NUM_THREADS": str(said)}) is None


def test_nothing_is_chosen_outside_slurm_or_where_it_cannot_be_read() -> None:
    for env in ({}, {"SLURM_CPUS_PER_TASK": ""}, {"SLURM_CPUS_PER_TASK": "x"}, {"SLURM_CPUS_PER_TASK": "0"}):
        assert cpu_threads(env) is None, env
