"""The sender worker: configuration, message building, SMTP, classification, the loop.

Modules: :mod:`.config` (TOML), :mod:`.message` (MIME), :mod:`.smtp` (one
connection per account batch), :mod:`.classify` (Retry/Wait/Stop table),
:mod:`.loop` (one worker thread), :mod:`.runner` (threads, signals, metrics),
:mod:`.metrics`, :mod:`.logs`.
"""
