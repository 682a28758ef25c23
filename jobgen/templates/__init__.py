"""The Jinja templates of the batch scripts: one block per launcher, container runtime and recovery rule."""
