"""One module per ``mailq-db`` command; each exposes ``register(subparsers)``."""
