"""jobgen's training entrypoint: one spec.json in, result.json + metrics.csv + checkpoints out.

Engines: torch (plain loop; DDP over launcher-started ranks), lightning (Trainer), fabric (Fabric),
hf_trainer (transformers.Trainer); strategies auto, ddp,
fsdp[_offload] (FSDP2), deepspeed_stage_2/3[_offload]; precision 32-true, 16-mixed, bf16-mixed, bf16-true.

Launch (jobgen writes these lines into job.sbatch; one srun task per device):

    # 1 GPU
    srun python -m training --spec /abs/run/jobs/j/spec.json
    # 1 node x 4 GPUs (spec: devices=4, num_nodes=1)
    #SBATCH --nodes=1 --ntasks-per-node=4 --gpus-per-node=4
    srun python -m training --spec /abs/run/jobs/j/spec.json
    # 2 nodes x 4 GPUs (spec: devices=4, num_nodes=2); ranks come from SLURM_PROCID & co.
    #SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4
    export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))
    srun python -m training --spec /abs/run/jobs/j/spec.json
    # Without Slurm, 1 machine x N devices: the entrypoint starts the other N-1 processes itself
    python -m training --spec spec.json          # spec: devices=N, engine lightning or fabric
    # torchrun / accelerate launch: one task per node, which starts the node's ranks (RANK, LOCAL_RANK, ...)
    #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4
    srun bash -c 'exec torchrun --nnodes 2 --nproc-per-node 4 --node-rank "$SLURM_NODEID" \
        --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" -m training --spec spec.json'
    # On a login node with internet: fetch and cache data, tokenized splits and model, then stop
    python -m training --spec spec.json --prepare-only     # what `jobgen prefetch` runs

accelerator="cpu" in the spec runs the same (GPU-shaped) job on CPU with gloo, which is how the
tests exercise ddp/fsdp/deepspeed. Importing this package is cheap: torch & co load inside functions.
"""
