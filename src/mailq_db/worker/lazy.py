"""Lazy content: the body of a template mail and the content of lazy
attachments are made here, at send time, before any SMTP connection.

:func:`prepare` turns a claimed mail into one :func:`message.build` can send:
it renders the template version mailq.ClaimMail resolved (the attempt already
records it) with the mail's JSON model in the sandbox of
:mod:`mailq_db.templates`, and calls the generators of lazy attachments
(:mod:`mailq_db.generators`), holding their output to the attachment limits.
Any failure is a :class:`LazyContentError` whose ``reason`` says what and
where (template, version, part, line; generator, file).  The worker stops the
mail with it (disposition Stop: no retry can fix it, a new template version or
a corrected model plus mailq.RequeueMail can), except when a generator itself
raised (``retry``): that may be transient (a service it calls timed out), so
the mail is deferred (Retry, one attempt spent) as a mail server defers, and
fails only when its attempts run out.

A mail may call only the generators its application is allowed
(``allowed``: the worker's ``[generators]`` configuration): the arguments of
a lazy attachment come from whoever enqueued the mail, so the generator's
name must not let one application run another's generators.
"""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Any, Mapping

from ..procedures import Attachment, ClaimedMail, LazyAttachment


class LazyContentError(Exception):
    """The mail's content cannot be made; ``reason`` (<= 4000 chars) says why."""

    def __init__(self, reason: str, *, retry: bool = False):
        super().__init__(reason)
        self.reason = reason[:4000]
        #: True: a generator raised; the same call may succeed later (Retry).
        self.retry = retry


def needs_preparing(mail: ClaimedMail) -> bool:
    return mail.template_name is not None or any(isinstance(a, LazyAttachment) for a in mail.attachments)


def prepare(mail: ClaimedMail, *, registry: Mapping[str, Any] | None = None,
            allowed: AbstractSet[str] | None = None) -> ClaimedMail:
    """The mail with its body rendered and its attachments generated; the mail
    itself when it has neither.  ``allowed``: the generators the mail's
    application may call (None: any).  Raises :class:`LazyContentError`."""
    if not needs_preparing(mail):
        return mail
    # Imported here: a worker that never sees lazy content never loads Jinja2.
    from ..generators import AttachmentError, check_attachments, generate_attachment
    from ..templates import MailTemplate, TemplateError, render_mail

    changes: dict[str, Any] = {}
    if mail.template_name is not None:
        if mail.template_version is None or mail.template is None:
            raise LazyContentError(
                f"template {mail.template_name!r}: no version to render: the template is retired and the "
                "mail pinned no version (bring it back with mailq.RetireMailTemplate @Retire = 0, "
                "then mailq.RequeueMail)")
        try:
            rendered = render_mail(MailTemplate.from_row(mail.template), mail.template_model)
        except TemplateError as exc:
            raise LazyContentError(exc.reason()) from None
        body, body_format, text_body = rendered.enqueue_body()
        changes.update(subject=rendered.subject, body=body, body_format=body_format, text_body=text_body)
    made: list[Attachment] = []
    for a in mail.attachments:
        if isinstance(a, LazyAttachment):
            if allowed is not None and a.generator not in allowed:
                raise LazyContentError(
                    f"attachment {a.file_name!r}: generator {a.generator!r} is not allowed for application "
                    f"{mail.app_name!r} (allowed: {', '.join(sorted(allowed)) or 'none'}); an operator adds it "
                    "to [generators] of the worker configuration")
            try:
                # The stored default type (EnqueueMail's) lets the generator's own win.
                ctype = None if a.content_type in (None, "application/octet-stream") else a.content_type
                made.append(generate_attachment(a.generator, a.arguments, file_name=a.file_name,
                                                content_type=ctype, registry=registry))
            except AttachmentError as exc:
                raise LazyContentError(exc.reason(), retry=exc.transient) from None
        else:
            made.append(a)
    try:
        check_attachments(made)
    except AttachmentError as exc:
        raise LazyContentError(exc.reason()) from None
    changes["attachments"] = made
    return replace(mail, **changes)
