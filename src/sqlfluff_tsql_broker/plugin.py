"""sqlfluff plugin entry point: teaches the ``tsql`` dialect Service Broker.

sqlfluff finds this module through the ``sqlfluff`` entry point group and
imports it from ``get_plugin_manager()``, which every ``FluffConfig`` calls
before it selects (and expands) its dialect. The plugin API has no dialect
hook, so the extension runs on import, and again, idempotently, from the
``load_default_config`` hook that ``FluffConfig`` calls right before
``dialect_selector``.
"""

from __future__ import annotations

from typing import Any

from sqlfluff.core.plugin import hookimpl

from sqlfluff_tsql_broker.grammar import extend_tsql

extend_tsql()


@hookimpl
def load_default_config() -> dict[str, Any]:
    """Make sure the dialect is extended; this plugin adds no configuration."""
    extend_tsql()
    return {}
