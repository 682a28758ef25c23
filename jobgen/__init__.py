"""jobgen: run Hugging Face fine-tuning experiments on Slurm clusters."""

__version__ = "0.1.0"
