"""mailq-db: a durable mail queue and Service Broker delayed execution for SQL Server."""

__version__ = "0.1.0"
