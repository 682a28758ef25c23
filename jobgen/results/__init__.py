"""What a run's records and its scheduler say: each job's state and numbers, and every view of them."""
