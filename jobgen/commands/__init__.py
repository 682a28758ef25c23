"""One function per command that acts on experiments and runs, shared by the CLI and jobgen.api; none prints."""
