"""Placeholder: replaced by the CLI."""


def main() -> None:
    raise SystemExit(0)
