"""A sqlfluff plugin adding Service Broker statements to the ``tsql`` dialect."""

from sqlfluff_tsql_broker.grammar import extend_tsql

__all__ = ["extend_tsql"]
