"""What a delivery report's codes and words mean for a sender: the per-recipient kind.

Kinds of one recipient's outcome, most severe first (a report's kind is the
most severe of its recipients'):

* ``hard``: the address does not work: enhanced status 5.1.x (bad mailbox or
  domain), 5.4.4 (no such domain), or a permanent failure whose text says so
  ("user unknown", "no such user", "not listed", ...).
* ``soft``: every other failure: mailbox full (4.2.2/5.2.2), the message ran
  out of time (Action failed with a 4.x.x status, e.g. 4.4.7), and policy,
  content or sender rejections (5.7.x): they are about the message or the
  sending host, not about the address.  A rejection of the *sender* (our VERP
  return path: X.1.7 and X.1.8 of RFC 3463, "Sender address rejected", a
  failed sender verification callout) is soft whatever else its text says:
  "Sender address rejected: User unknown" names no recipient that failed.
* ``delayed``: a warning only (Action delayed); the report-generating MTA
  keeps trying.
* ``delivered``: delivered, relayed or expanded (a positive DSN).

Status codes: RFC 3463 (class.subject.detail) and the IANA "SMTP Enhanced
Status Codes" registry (RFC 5248).  The phrase lists are the texts that
common MTAs write where no enhanced code is given (qmail, Lotus Domino,
Yahoo, IIS, Exim, Chinese providers); docs/bounces.md says where each comes from.
"""

from __future__ import annotations

import re

SEVERITY = {"hard": 4, "soft": 3, "delayed": 2, "delivered": 1}
ACTIONS = ("failed", "delayed", "delivered", "relayed", "expanded")

#: An RFC 3463 enhanced status code inside text: "5.1.1", "#5.5.0",
#: "550-5.1.1", "4.2.2".  Not a part of an IP address or version string.
ENHANCED = re.compile(r"(?<![\d.])([245])\.(\d{1,3})\.(\d{1,3})(?!\.?\d)")
#: The same, failures only (plain-text reports; a 2.x.x there is noise).
FAILURE_CODE = re.compile(r"(?<![\d.])([45])\.(\d{1,3})\.(\d{1,3})(?!\.?\d)")
#: A basic SMTP reply code at the start of a reply: "550 ", "550-", "554:".
BASIC_REPLY = re.compile(r"(?<![\d.])([45]\d\d)(?=[\s:-])")

#: The address does not exist (permanent).  English texts of Postfix, Exim,
#: Sendmail, qmail, Exchange, IIS, Domino, Yahoo, Gmail; Chinese texts of QQ
#: Mail, NetEase (163/126) and Alibaba Mail; the Japanese one of Lotus Notes.
HARD_TEXT = re.compile(
    r"user(?:name)? unknown|unknown (?:user|recipient|mailbox|address|local[- ]part)"
    r"|no such (?:user|mailbox|recipient|address|account|person|local user|domain)"
    r"|(?:user|mailbox|recipient|address|account|domain)s? (?:does not|doesn't|did not) exist"
    r"|does not exist|doesn't exist|not exist\b"
    r"|not (?:a )?valid (?:recipient|mailbox|user|address|e-?mail)"
    r"|invalid (?:recipient|mailbox|user|address|e-?mail address)"
    r"|not listed in|is not listed|not in the directory|not found in (?:the )?directory"
    r"|no (?:mailbox|account) (?:here )?by that name|no account by that name"
    r"|mailbox (?:is )?unavailable|mailbox not found|recipient not found|address not found"
    r"|unrouteable address|unroutable address|no such domain|domain (?:name )?not found"
    r"|recipient address rejected: (?:user unknown|undeliverable address|unknown)"
    r"|addressee unknown|address unknown|not our customer|user not found|account not found"
    r"|用户不存在|用戶不存在|收件人不存在|收信人不存在|地址不存在|邮箱不存在|郵箱不存在|邮件地址不存在"
    r"|帐号不存在|账号不存在|帐户不存在|账户不存在|无此用户|查无此人|该用户不存在|收件人地址有误"
    r"|ディレクトリのリストにありません|存在しません|宛先不明",
    re.IGNORECASE,
)
#: The mailbox is full (soft, whatever the class digit says).
FULL_TEXT = re.compile(
    r"mailbox (?:is )?full|over ?quota|quota exceeded|exceeded (?:the |his |her )?(?:storage|quota)"
    r"|insufficient (?:system )?storage|mailbox size limit|mail ?box has exceeded"
    r"|邮箱已满|邮箱空间不足|空间不足|容量不足|邮箱容量|信箱已满|郵箱已滿",
    re.IGNORECASE,
)
#: The receiving side refused the envelope sender (the return path), not the
#: recipient: Postfix's "Sender address rejected", Exim's "Sender verify
#: failed" / "Verification failed for <...>", Sendmail's "Domain of sender
#: address ... does not exist".  RFC 3463 codes X.1.7 and X.1.8 say the same.
SENDER_TEXT = re.compile(
    r"sender address rejected|sender verif(?:y|ication) failed|verification failed for <"
    r"|domain of sender address|sender domain (?:must exist|does not exist|not found|is unknown)"
    r"|(?:unknown|invalid|bad) sender|sender (?:address )?(?:is )?(?:unknown|invalid|not allowed)",
    re.IGNORECASE,
)
SENDER_CODES = ("5.1.7", "5.1.8", "4.1.7", "4.1.8")
#: A warning that the MTA keeps trying (plain-text reports).
DELAY_TEXT = re.compile(
    r"warning message only|has not yet been delivered|not yet been delivered|has been delayed"
    r"|delivery (?:is |has been )?delayed|delayed \d+ (?:hours?|minutes?|days?)|will (?:continue to )?(?:re)?try"
    r"|will be retried|delay reason|still trying|retry (?:time|timeout) not reached|delivery attempts will continue"
    r"|暂时无法投递|延迟投递|正在重试|将继续尝试",
    re.IGNORECASE,
)
#: A permanent failure said in words (plain-text reports).
PERMANENT_TEXT = re.compile(
    r"permanent(?:ly)? (?:error|failure|fatal)|failed permanently|given up|could not be delivered"
    r"|couldn't be delivered|undeliverable|delivery (?:has )?failed|was not delivered|wasn't delivered"
    r"|failed to deliver|unable to deliver|returning message to sender|delivery to the following recipients? failed"
    r"|投递失败|退信|无法投递|未能投递|發送失敗|发送失败",
    re.IGNORECASE,
)


def enhanced_codes(text: str | None, *, failures_only: bool = False) -> list[str]:
    """Every enhanced status code in ``text``, in order, without repeats."""
    pattern = FAILURE_CODE if failures_only else ENHANCED
    out: list[str] = []
    for m in pattern.finditer(text or ""):
        code = ".".join(m.groups())
        if code not in out:
            out.append(code)
    return out


def clean_status(value: str | None) -> str | None:
    """The enhanced code of a DSN Status field ("5.0.0 (permanent failure)" -> "5.0.0")."""
    codes = enhanced_codes(value)
    return codes[0] if codes else None


def generic(code: str | None) -> bool:
    """x.0.0 (or none): says only the class, "Other undefined status" (RFC 3463 3.1)."""
    return code is None or code.endswith(".0.0")


def specific_code(status: str | None, diagnostic: str | None) -> str | None:
    """The most specific code for one recipient: the DSN Status, unless it is
    generic (x.0.0) and the diagnostic text carries a specific one of the same class."""
    if not generic(status):
        return status
    for code in enhanced_codes(diagnostic):
        if not generic(code) and (status is None or code[0] == status[0]):
            return code
    return status


def failed_kind(code: str | None, text: str | None) -> str:
    """hard or soft for a recipient whose delivery failed for good."""
    if code in SENDER_CODES or SENDER_TEXT.search(text or ""):
        return "soft"  # about our return path, not the recipient's address
    if code is not None and not generic(code):
        # 4.x.x with Action failed ran out of time (e.g. 4.4.7): soft, whatever the words
        return "hard" if code.startswith("5.1.") or code == "5.4.4" else "soft"
    # Generic or missing code: the words decide.
    if FULL_TEXT.search(text or ""):
        return "soft"
    if HARD_TEXT.search(text or ""):
        return "hard"
    return "soft"


def recipient_kind(action: str | None, status: str | None, diagnostic: str | None) -> str:
    """hard | soft | delayed | delivered for one recipient of a DSN."""
    action = (action or "").lower()
    if action in ("delivered", "relayed", "expanded"):
        return "delivered"
    if action == "delayed":
        return "delayed"
    if action != "failed" and status is not None:
        if status.startswith("2."):
            return "delivered"
        if status.startswith("4."):
            return "delayed"
    return failed_kind(specific_code(status, diagnostic), diagnostic)


def worst(kinds: list[str]) -> str | None:
    """The most severe kind of a report's recipients (hard > soft > delayed > delivered)."""
    known = [k for k in kinds if k in SEVERITY]
    return max(known, key=SEVERITY.__getitem__) if known else None
