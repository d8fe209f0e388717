"""What `mailq-db stats` and `mailq-db doctor` say about bounces and suppressions.

Rates are per account over the window of mailq.GetSuppressionStats: hard
bounces and complaints divided by the mail Sent in that window.  Warning
thresholds: hard bounces above 2 % and complaints above 0.1 % -- the
reading's suggested defaults (docs/bounces.md), kept well below Gmail's
published 0.30 % spam-rate ceiling for bulk senders
(https://support.google.com/mail/answer/81126).
"""

from __future__ import annotations

from typing import Any

HARD_RATE_WARN = 0.02
COMPLAINT_RATE_WARN = 0.001

#: (area, name, status, detail, fix) -- the fields of commands.doctor.Check
Finding = tuple[str, str, str, str, "str | None"]


def _by_account(stats: Any) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in stats.reports:
        out.setdefault(str(r["AccountName"]), {})[str(r["Kind"])] = int(r["Reports"] or 0)
    for r in stats.sent:
        out.setdefault(str(r["AccountName"]), {})["Sent"] = int(r["Sent"] or 0)
    return out


def findings(stats: Any, days: int) -> list[Finding]:
    """One finding for the suppression list, one per account with reports."""
    active: dict[str, int] = {}
    for r in stats.suppressed:
        active[str(r["Reason"])] = active.get(str(r["Reason"]), 0) + int(r["Suppressed"] or 0)
    listed = ", ".join(f"{n} {reason}" for reason, n in sorted(active.items())) or "none"
    out: list[Finding] = [("Bounces", "Suppression list", "OK", f"active suppressions: {listed}", None)]
    for account, counts in sorted(_by_account(stats).items()):
        sent = counts.get("Sent", 0)
        hard, complaints = counts.get("Hard", 0), counts.get("Complaint", 0)
        detail = (f"last {days} day(s): {sent} sent, {hard} hard, {counts.get('Soft', 0)} soft, "
                  f"{counts.get('Delayed', 0)} delayed, {complaints} complaint(s), "
                  f"{counts.get('Unsubscribe', 0)} unsubscribe(s)")
        problems = []
        if sent and hard / sent > HARD_RATE_WARN:
            problems.append(f"hard-bounce rate {hard / sent:.2%} > {HARD_RATE_WARN:.0%}")
        if sent and complaints / sent > COMPLAINT_RATE_WARN:
            problems.append(f"complaint rate {complaints / sent:.2%} > {COMPLAINT_RATE_WARN:.1%}")
        if problems:
            out.append(("Bounces", f"Account {account}", "WARN", f"{detail}; {'; '.join(problems)}",
                        "clean the list (mailq-db bounces list), check where the addresses come from; "
                        "providers suspend senders whose bounce or complaint rates stay high"))
        else:
            out.append(("Bounces", f"Account {account}", "OK", detail, None))
    return out


def rows(stats: Any) -> dict[str, list[dict[str, Any]]]:
    """The sections `mailq-db stats` prints (and --json emits)."""
    return {"suppressions": stats.suppressed, "bounce_reports": stats.reports}
