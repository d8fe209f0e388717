"""Service Broker statements for sqlfluff's ``tsql`` dialect.

sqlfluff 4.5.0 parses ``END CONVERSATION`` but none of the other Service
Broker statements. This module defines them from Microsoft's documented
syntax (https://learn.microsoft.com/en-us/sql/t-sql/statements/)
and :func:`extend_tsql` adds them to the raw ``tsql`` dialect object in place.

Why in place: sqlfluff's plugin API has hooks for rules, templaters and
config, none for dialects. ``dialect_selector("tsql")`` re-reads the raw
dialect object from ``sqlfluff.dialects.dialect_tsql`` and expands a fresh
copy for every config, so whatever is added to the raw object before that
expansion is seen by every later parse. Two things must be respected:

* ``load_raw_dialect`` re-registers every segment class defined in the
  dialect module each time it is called, so *replacing* a library entry such
  as ``StatementSegment`` would be undone. The one existing class we extend,
  ``StatementSegment``, is therefore extended by giving the very class the
  dialect module exports a new ``match_grammar``; our own segments live under
  new names, which ``load_raw_dialect`` leaves alone.
* Keywords must exist before ``expand()``. Words that the dialect does not
  know yet are registered as keyword parsers only, not added to the
  ``unreserved_keywords`` set: rules RF04/RF06 read that set, and adding
  common words such as STATUS there would start flagging existing code.

Upstream these classes would simply live in ``dialect_tsql.py`` (and the new
words in ``dialect_tsql_keywords.UNRESERVED_KEYWORDS``); see README.md.
"""

from __future__ import annotations

from sqlfluff.core.parser import (
    AnyNumberOf,
    BaseSegment,
    Bracketed,
    Dedent,
    Delimited,
    Indent,
    KeywordSegment,
    Matchable,
    OneOf,
    Ref,
    Sequence,
    StringParser,
)
from sqlfluff.dialects import dialect_tsql

# Every keyword the grammars below use; the ones tsql already knows are skipped.
BROKER_KEYWORDS = (
    "ACTIVATION ADD ALTER ANY AS AUTHORIZATION BEGIN BY COLLECTION CONTRACT "
    "CONVERSATION CREATE CURRENT DATABASE DIALOG DROP EMPTY ENCRYPTION "
    "EXECUTE FROM GET GROUP INITIATOR INTO LIFETIME LOB_COMPACTION MAXDOP "
    "MAX_QUEUE_READERS MESSAGE MOVE NONE OFF ON OWNER "
    "POISON_MESSAGE_HANDLING PROCEDURE_NAME QUEUE REBUILD RECEIVE "
    "RELATED_CONVERSATION RELATED_CONVERSATION_GROUP REORGANIZE RETENTION "
    "SCHEMA SELF SEND SENT SERVICE STATUS TARGET TIMEOUT TIMER TO TOP TYPE "
    "VALIDATION VALID_XML WAITFOR WELL_FORMED_XML WHERE WITH"
).split()


# -- Names -----------------------------------------------------------------


class QueueReferenceSegment(dialect_tsql.ObjectReferenceSegment):
    """A queue: ``[database.][schema.]queue``."""

    type = "queue_reference"


class _BrokerNameSegment(dialect_tsql.ObjectReferenceSegment):
    """A one-part broker object name, usually bracketed: ``[//app/Request]``.

    Service, contract and message type names cannot be schema-qualified.
    """

    match_grammar: Matchable = Ref("NakedOrQuotedIdentifierGrammar")


class ServiceReferenceSegment(_BrokerNameSegment):
    """A service name."""

    type = "service_reference"


class ContractReferenceSegment(_BrokerNameSegment):
    """A contract name (``[DEFAULT]`` included)."""

    type = "contract_reference"


class MessageTypeReferenceSegment(_BrokerNameSegment):
    """A message type name (``[DEFAULT]`` included)."""

    type = "message_type_reference"


# -- Shared pieces -----------------------------------------------------------


def _setting(keyword: str, value: Matchable) -> Matchable:
    """``KEYWORD = value``."""
    return Sequence(keyword, Ref("EqualsSegment"), value)


def _comma_optional_list(*options: Matchable) -> Matchable:
    """One or more options, separated by commas that Microsoft marks ``[ , ]``."""
    option = OneOf(*options)
    return Sequence(
        option, AnyNumberOf(Sequence(Ref("CommaSegment", optional=True), option))
    )


def _clause(*elements: Matchable | str, optional: bool = False) -> Matchable:
    """A clause that may start a new, indented line (a line break point)."""
    return Sequence(Indent, *elements, Dedent, optional=optional)


_on_off = OneOf("ON", "OFF")
_authorization = _clause("AUTHORIZATION", Ref("SingleIdentifierGrammar"), optional=True)
_handle = Ref("ParameterNameSegment")
_string_or_variable = OneOf(
    Ref("QuotedLiteralSegmentOptWithN"), Ref("ParameterNameSegment")
)
_timeout_value = OneOf(Ref("NumericLiteralSegment"), Ref("ParameterNameSegment"))

_activation_options = (
    _setting("STATUS", _on_off),
    _setting("PROCEDURE_NAME", Ref("ObjectReferenceSegment")),
    _setting("MAX_QUEUE_READERS", Ref("NumericLiteralSegment")),
    Sequence(
        "EXECUTE", "AS", OneOf("SELF", "OWNER", Ref("QuotedLiteralSegmentOptWithN"))
    ),
)


def _queue_settings(alter: bool) -> Matchable:
    """The ``WITH`` options of CREATE QUEUE or, with ``alter``, of ALTER QUEUE.

    ALTER QUEUE may also ``DROP`` the activation, makes every activation
    option optional (commas ``[ , ]``) and requires the poison message STATUS.
    """
    activation = (
        OneOf("DROP", _comma_optional_list(*_activation_options))
        if alter
        else Delimited(OneOf(*_activation_options))
    )
    poison_status = _setting("STATUS", _on_off)
    # Laid out as in Microsoft's examples: `WITH STATUS = ON,` on a line
    # indented under CREATE/ALTER QUEUE, further options aligned with WITH.
    return _clause(
        "WITH",
        _comma_optional_list(
            _setting("STATUS", _on_off),
            _setting("RETENTION", _on_off),
            Sequence("ACTIVATION", Bracketed(activation)),
            Sequence(
                "POISON_MESSAGE_HANDLING",
                Bracketed(
                    poison_status if alter else Sequence(poison_status, optional=True)
                ),
            ),
        ),
    )


_validation = _setting(
    "VALIDATION",
    OneOf(
        "NONE",
        "EMPTY",
        "WELL_FORMED_XML",
        Sequence(
            "VALID_XML", "WITH", "SCHEMA", "COLLECTION", Ref("ObjectReferenceSegment")
        ),
    ),
)


# -- Objects: queue, service, contract, message type ------------------------


class CreateQueueStatementSegment(BaseSegment):
    """``CREATE QUEUE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/create-queue-transact-sql
    """

    type = "create_queue_statement"
    match_grammar = Sequence(
        "CREATE",
        "QUEUE",
        Ref("QueueReferenceSegment"),
        Sequence(_queue_settings(alter=False), optional=True),
        # ON { filegroup | [DEFAULT] }
        _clause(Ref("FilegroupClause"), optional=True),
    )


class AlterQueueStatementSegment(BaseSegment):
    """``ALTER QUEUE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/alter-queue-transact-sql
    """

    type = "alter_queue_statement"
    match_grammar = Sequence(
        "ALTER",
        "QUEUE",
        Ref("QueueReferenceSegment"),
        OneOf(
            _queue_settings(alter=True),
            Sequence(
                "REBUILD",
                Sequence(
                    "WITH",
                    Bracketed(_setting("MAXDOP", Ref("NumericLiteralSegment"))),
                    optional=True,
                ),
            ),
            Sequence(
                "REORGANIZE",
                Sequence(
                    "WITH",
                    Bracketed(_setting("LOB_COMPACTION", _on_off)),
                    optional=True,
                ),
            ),
            # MOVE TO { file_group | "default" }
            Sequence("MOVE", "TO", Ref("FilegroupNameSegment")),
        ),
    )


class CreateServiceStatementSegment(BaseSegment):
    """``CREATE SERVICE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/create-service-transact-sql
    """

    type = "create_service_statement"
    match_grammar = Sequence(
        "CREATE",
        "SERVICE",
        Ref("ServiceReferenceSegment"),
        _authorization,
        _clause("ON", "QUEUE", Ref("QueueReferenceSegment")),
        # Contracts this service is a target for; [DEFAULT] is a bracketed name.
        _clause(Bracketed(Delimited(Ref("ContractReferenceSegment"))), optional=True),
    )


class AlterServiceStatementSegment(BaseSegment):
    """``ALTER SERVICE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/alter-service-transact-sql
    """

    type = "alter_service_statement"
    match_grammar = Sequence(
        "ALTER",
        "SERVICE",
        Ref("ServiceReferenceSegment"),
        _clause("ON", "QUEUE", Ref("QueueReferenceSegment"), optional=True),
        _clause(
            Bracketed(
                Delimited(
                    Sequence(
                        OneOf("ADD", "DROP"),
                        "CONTRACT",
                        Ref("ContractReferenceSegment"),
                    )
                )
            ),
            optional=True,
        ),
    )


class CreateContractStatementSegment(BaseSegment):
    """``CREATE CONTRACT`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/create-contract-transact-sql
    """

    type = "create_contract_statement"
    match_grammar = Sequence(
        "CREATE",
        "CONTRACT",
        Ref("ContractReferenceSegment"),
        _authorization,
        _clause(
            Bracketed(
                Delimited(
                    Sequence(
                        Ref("MessageTypeReferenceSegment"),
                        "SENT",
                        "BY",
                        OneOf("INITIATOR", "TARGET", "ANY"),
                    )
                )
            )
        ),
    )


class CreateMessageTypeStatementSegment(BaseSegment):
    """``CREATE MESSAGE TYPE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/create-message-type-transact-sql
    """

    type = "create_message_type_statement"
    match_grammar = Sequence(
        "CREATE",
        "MESSAGE",
        "TYPE",
        Ref("MessageTypeReferenceSegment"),
        _authorization,
        _clause(_validation, optional=True),
    )


class AlterMessageTypeStatementSegment(BaseSegment):
    """``ALTER MESSAGE TYPE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/alter-message-type-transact-sql
    """

    type = "alter_message_type_statement"
    match_grammar = Sequence(
        "ALTER",
        "MESSAGE",
        "TYPE",
        Ref("MessageTypeReferenceSegment"),
        _clause(_validation),
    )


class DropBrokerObjectStatementSegment(BaseSegment):
    """``DROP QUEUE | SERVICE | CONTRACT | MESSAGE TYPE``."""

    type = "drop_broker_object_statement"
    match_grammar = Sequence(
        "DROP",
        OneOf(
            Sequence("QUEUE", Ref("QueueReferenceSegment")),
            Sequence("SERVICE", Ref("ServiceReferenceSegment")),
            Sequence("CONTRACT", Ref("ContractReferenceSegment")),
            Sequence("MESSAGE", "TYPE", Ref("MessageTypeReferenceSegment")),
        ),
    )


# -- Conversations -----------------------------------------------------------


class BeginDialogStatementSegment(BaseSegment):
    """``BEGIN DIALOG [CONVERSATION]``.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/begin-dialog-conversation-transact-sql
    """

    type = "begin_dialog_statement"
    match_grammar = Sequence(
        "BEGIN",
        "DIALOG",
        Ref.keyword("CONVERSATION", optional=True),
        _handle,
        _clause("FROM", "SERVICE", Ref("ServiceReferenceSegment")),
        _clause(
            "TO",
            "SERVICE",
            # The target is a case-sensitive string, optionally with the broker
            # instance: 'service_broker_guid' or 'CURRENT DATABASE'.
            _string_or_variable,
            Sequence(Ref("CommaSegment"), _string_or_variable, optional=True),
        ),
        _clause("ON", "CONTRACT", Ref("ContractReferenceSegment"), optional=True),
        _clause(
            "WITH",
            Indent,
            _comma_optional_list(
                _setting("RELATED_CONVERSATION", _handle),
                _setting("RELATED_CONVERSATION_GROUP", _handle),
                _setting("LIFETIME", _timeout_value),
                _setting("ENCRYPTION", _on_off),
            ),
            Dedent,
            optional=True,
        ),
    )


class BeginConversationTimerStatementSegment(BaseSegment):
    """``BEGIN CONVERSATION TIMER``.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/begin-conversation-timer-transact-sql
    """

    type = "begin_conversation_timer_statement"
    match_grammar = Sequence(
        "BEGIN",
        "CONVERSATION",
        "TIMER",
        Bracketed(_handle),
        _setting("TIMEOUT", _timeout_value),
    )


class SendStatementSegment(BaseSegment):
    """``SEND ON CONVERSATION`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/send-transact-sql
    """

    type = "send_statement"
    match_grammar = Sequence(
        "SEND",
        "ON",
        "CONVERSATION",
        # One handle, or several: [(]@h [, @h2 ...][)]
        OneOf(Bracketed(Delimited(_handle)), Delimited(_handle)),
        Indent,
        Sequence("MESSAGE", "TYPE", Ref("MessageTypeReferenceSegment"), optional=True),
        Bracketed(Ref("ExpressionSegment"), optional=True),
        Dedent,
    )


class ReceiveStatementSegment(BaseSegment):
    """``RECEIVE`` statement.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/receive-transact-sql

    Column specifiers are select-list elements: ``*``, expressions with
    optional aliases, ``alias = expression`` and ``@variable = expression``.
    """

    type = "receive_statement"
    match_grammar = Sequence(
        "RECEIVE",
        Sequence("TOP", Bracketed(Ref("ExpressionSegment")), optional=True),
        Indent,
        Delimited(Ref("SelectClauseElementSegment")),
        Dedent,
        "FROM",
        Indent,
        Ref("QueueReferenceSegment"),
        Dedent,
        Sequence("INTO", Indent, Ref("ParameterNameSegment"), Dedent, optional=True),
        # WHERE { conversation_handle | conversation_group_id } = value
        Sequence(
            "WHERE",
            Indent,
            Ref("ColumnReferenceSegment"),
            Ref("EqualsSegment"),
            Ref("ExpressionSegment"),
            Dedent,
            optional=True,
        ),
    )


class GetConversationGroupStatementSegment(BaseSegment):
    """``GET CONVERSATION GROUP``.

    https://learn.microsoft.com/en-us/sql/t-sql/statements/get-conversation-group-transact-sql
    """

    type = "get_conversation_group_statement"
    match_grammar = Sequence(
        "GET", "CONVERSATION", "GROUP", _handle, "FROM", Ref("QueueReferenceSegment")
    )


class WaitForConversationStatementSegment(BaseSegment):
    """``WAITFOR ( RECEIVE ... | GET CONVERSATION GROUP ... ) [, TIMEOUT n]``.

    https://learn.microsoft.com/en-us/sql/t-sql/language-elements/waitfor-transact-sql

    The dialect's own ``WaitForStatementSegment`` keeps ``DELAY`` and ``TIME``.
    """

    type = "waitfor_statement"
    match_grammar = Sequence(
        "WAITFOR",
        Bracketed(
            OneOf(
                Ref("ReceiveStatementSegment"),
                Ref("GetConversationGroupStatementSegment"),
            )
        ),
        Sequence(Ref("CommaSegment"), "TIMEOUT", _timeout_value, optional=True),
    )


STATEMENT_SEGMENTS: tuple[type[BaseSegment], ...] = (
    CreateQueueStatementSegment,
    AlterQueueStatementSegment,
    CreateServiceStatementSegment,
    AlterServiceStatementSegment,
    CreateContractStatementSegment,
    CreateMessageTypeStatementSegment,
    AlterMessageTypeStatementSegment,
    DropBrokerObjectStatementSegment,
    BeginDialogStatementSegment,
    BeginConversationTimerStatementSegment,
    SendStatementSegment,
    ReceiveStatementSegment,
    GetConversationGroupStatementSegment,
    WaitForConversationStatementSegment,
)
OTHER_SEGMENTS: tuple[type[BaseSegment], ...] = (
    QueueReferenceSegment,
    ServiceReferenceSegment,
    ContractReferenceSegment,
    MessageTypeReferenceSegment,
)

# Set on the dialect object once extended, so repeated calls do nothing.
_MARKER = "_sqlfluff_tsql_broker_extended"


def extend_tsql() -> None:
    """Add the Service Broker statements to sqlfluff's raw ``tsql`` dialect.

    Idempotent. Must run before the dialect is expanded (``dialect_selector``),
    which the plugin guarantees by running it when sqlfluff loads plugins.
    """
    dialect = dialect_tsql.tsql_dialect
    if getattr(dialect, _MARKER, False):
        return

    known = dialect.sets("reserved_keywords") | dialect.sets("unreserved_keywords")
    for word in BROKER_KEYWORDS:
        if word not in known:
            # The same parser Dialect.expand() builds for words in the sets.
            dialect.add(
                **{
                    f"{word.capitalize()}KeywordSegment": StringParser(
                        word.lower(), KeywordSegment
                    )
                }
            )

    for segment in STATEMENT_SEGMENTS + OTHER_SEGMENTS:
        dialect.add(**{segment.__name__: segment})

    # Make the new statements reachable wherever a statement may stand: in a
    # batch, in BEGIN ... END, IF/ELSE, TRY/CATCH and procedure bodies. They go
    # before the BEGIN ... END block: the statement OneOf takes the first option
    # that ends at a `;`, otherwise the longest one, and inside a block
    # `BEGIN CONVERSATION TIMER (@h) TIMEOUT = 1; END` also reads as a block
    # around an EXEC-less procedure call `CONVERSATION TIMER(@h) ...`.
    statement = dialect_tsql.StatementSegment
    statement.match_grammar = statement.match_grammar.copy(
        insert=[Ref(segment.__name__) for segment in STATEMENT_SEGMENTS],
        before=Ref("BeginEndSegment"),
    )
    # CREATE TRIGGER's `WITH EXECUTE AS` accepts only a quoted user name in
    # sqlfluff 4.5.0 (dialect_tsql.ExecuteAsClause); Microsoft's DML trigger
    # syntax is `EXECUTE AS { CALLER | SELF | OWNER | 'user_name' }`.  The class
    # is patched in place because sqlfluff re-registers the module's own classes
    # each time it loads the dialect.
    dialect_tsql.ExecuteAsClause.match_grammar = Sequence(
        OneOf("EXEC", "EXECUTE"),
        "AS",
        OneOf("CALLER", "SELF", "OWNER", Ref("QuotedLiteralSegment")),
    )
    setattr(dialect, _MARKER, True)
