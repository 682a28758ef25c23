"""A run folder's records: claiming a run, the manifest and its journal, and reading the records back."""
