"""An experiment file: its schema, loading and validation, a site's defaults, and random search's draws."""
