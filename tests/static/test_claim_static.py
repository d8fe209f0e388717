"""Static checks of the claim (issue 10, points 1, 2, 6).

What can be shown without a server:

* the claim reads mailq.MailQueue only through a per-account CROSS APPLY
  whose TOP is the account's cap, on IX_MailQueue_ClaimByAccount with
  FORCESEEK and READPAST, UPDLOCK, ROWLOCK, and never through a TOP over the
  whole backlog (``TOP (@BatchSize) ... FROM mailq.MailQueue``);
* the claim no longer finalizes (no Expired/Failed status written), and
  mailq.FinalizeMail does, with the same lock hints;
* both follow the one CATCH/isolation pattern (BRIEF point 5) and have no
  savepoint;
* the rate budget: the clock is read after the budget rows are locked, and
  the stored window start never moves backwards (``>=``, never ``=``);
* the new index's definition (keys, filter, INCLUDE, page locks) and that the
  claim's seek predicate implies its filter;
* the fresh install creates the index once and the downgrade drops it;
* run modes: the claim is driven by (account, run mode) pairs, every read of
  the queue is keyed by both, RunMode is the index's second key, and the
  per-pair caps never exceed an account's budget nor the slots left (a model
  of the pass loop).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.deployment import code_only
from mailq_db.devtools.scripts import render

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
CLAIM = SQL / "procedures" / "mailq.ClaimMail.sql"
FINALIZE = SQL / "procedures" / "mailq.FinalizeMail.sql"
INDEX = SQL / "indexes" / "mailq.MailQueue.IX_MailQueue_ClaimByAccount.sql"


def squash(sql: str) -> str:
    """Statements only (comments out, literals kept), white space collapsed, upper case."""
    from mailq_db.deployment import strip_comments

    return re.sub(r"\s+", " ", strip_comments(sql)).upper()


@pytest.fixture(scope="module")
def claim() -> str:
    return squash(CLAIM.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def finalize() -> str:
    return squash(FINALIZE.read_text(encoding="utf-8"))


def mailqueue_reads(sql: str) -> list[tuple[str, str]]:
    """Each ``FROM/JOIN mailq.MailQueue AS x WITH (...)`` of a squashed text, with its
    hints (balanced parentheses: ``FORCESEEK (PK_MAILQUEUE (ID))`` nests twice)."""
    reads = []
    for match in re.finditer(r"(?:FROM|JOIN) MAILQ\.MAILQUEUE AS (\w+)( WITH \()?", sql):
        hints = ""
        if match.group(2):
            depth, i = 1, match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(sql[i], 0)
                i += 1
            hints = sql[match.end():i - 1]
        reads.append((match.group(1), hints))
    return reads


def test_claim_has_no_top_over_the_whole_backlog(claim):
    # The 0001-0004 claim: SELECT TOP (@BatchSize) ... FROM mailq.MailQueue ... ORDER BY Priority.
    assert not re.search(r"TOP \(@BATCHSIZE\)[^;]*?FROM MAILQ\.MAILQUEUE", claim), \
        "a TOP (@BatchSize) reads mailq.MailQueue directly: its seek would read the whole due backlog"
    tops = re.findall(r"SELECT TOP \(([^)]*)\)((?:(?!SELECT ).)*?)FROM MAILQ\.MAILQUEUE", claim)
    assert tops, "no TOP over mailq.MailQueue at all"
    assert {t[0] for t in tops} == {"D.CAP"}, f"every TOP over the queue must be the pair's cap: {tops}"


def test_claim_reads_the_queue_per_account_through_cross_apply_and_forceseek(claim):
    assert "CROSS APPLY" in claim
    assert "K.ACCOUNTNAME = D.ACCOUNTNAME AND K.RUNMODE = D.RUNMODE" in claim, \
        "the per-pair seek is not keyed by the driving (account, run mode) pair"
    # Hinted reads: the per-pair seeks (k), the UPDATE target (q) and the
    # final result set (q again: a forced seek per leased row, no lock hint).
    hinted = [(alias, hints) for alias, hints in mailqueue_reads(claim) if hints]
    assert {alias for alias, _ in hinted} == {"Q", "K"}, hinted
    assert [alias for alias, _ in mailqueue_reads(claim) if alias == "Q"] == ["Q", "Q"]
    # The per-pair reads: the claim's seeks (UPDLOCK) and, with more pairs
    # than slots, the row-free probes (READCOMMITTEDLOCK); all forced seeks on
    # one of the two claim indexes, one of each kind per index.
    k_reads = [hints.replace(" ", "") for alias, hints in hinted if alias == "K"]
    assert len(k_reads) == 4, k_reads
    for flat in k_reads:
        assert "FORCESEEK" in flat and "READPAST" in flat
        assert ("INDEX(IX_MAILQUEUE_CLAIMBYACCOUNT)" in flat) != ("INDEX(IX_MAILQUEUE_CLAIMBYAPP)" in flat)
    picks = [flat for flat in k_reads if "UPDLOCK" in flat]
    assert len(picks) == 2
    for index in ("IX_MAILQUEUE_CLAIMBYACCOUNT", "IX_MAILQUEUE_CLAIMBYAPP"):
        (inner,) = [flat for flat in picks if f"INDEX({index})" in flat]
        for hint in ("FORCESEEK", "READPAST", "UPDLOCK", "ROWLOCK"):
            assert hint in inner, f"the per-pair read of {index} lacks {hint}: {inner}"
    target, returned = [hints.replace(" ", "") for alias, hints in hinted if alias == "Q"]
    for hint in ("FORCESEEK(PK_MAILQUEUE(ID))", "READPAST", "UPDLOCK", "ROWLOCK"):
        assert hint in target, f"the UPDATE target lacks {hint}: {target}"
    assert returned == "FORCESEEK(PK_MAILQUEUE(ID))", f"the result set's read of the leased rows: {returned}"
    # The ten priority ranges make each account's seek come out in ORDER BY order.
    assert "K.PRIORITY IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)" in claim
    assert "ORDER BY K.PRIORITY DESC, K.VISIBLEATUTC ASC, K.ID ASC" in claim


def test_claim_takes_only_live_rows_and_finalizes_nothing(claim):
    assert "K.ATTEMPTSREMAINING > 0" in claim
    assert "K.EXPIRESATUTC IS NULL OR K.EXPIRESATUTC > @NOW" in claim
    code = code_only(CLAIM.read_text(encoding="utf-8")).upper()
    status_writes = re.findall(r"Q\.STATUS = ([^,\n]+)", code)
    assert status_writes and all("''" in w for w in status_writes)
    text = CLAIM.read_text(encoding="utf-8")
    assert "N'Expired'" not in text and "N'Failed'" not in text, "the claim still finalizes mail"


def test_finalize_moves_expired_and_exhausted_mail_in_bounded_batches(finalize):
    assert "N'EXPIRED'" in finalize and "N'FAILED'" in finalize
    reads = mailqueue_reads(finalize)
    assert len(reads) == 2, reads
    for alias, hints in reads:
        flat = hints.replace(" ", "")
        for hint in ("READPAST", "UPDLOCK", "ROWLOCK"):
            assert hint in flat, f"{alias}: {hints}"
    assert finalize.count("SELECT TOP (@BATCHSIZE)") == 2
    assert "INDEX (IX_MAILQUEUE_FINALIZE)" in finalize and "INDEX (IX_MAILQUEUE_EXPIRY)" in finalize


@pytest.mark.parametrize("path", [CLAIM, FINALIZE], ids=lambda p: p.stem)
def test_catch_and_isolation_pattern(path):
    sql = squash(path.read_text(encoding="utf-8"))
    assert "SET NOCOUNT, XACT_ABORT ON" in sql
    assert "SET TRANSACTION ISOLATION LEVEL READ COMMITTED" in sql
    assert "SAVE TRANSACTION" not in sql and "ROLLBACK TRANSACTION CLAIMMAIL" not in sql
    assert "XACT_STATE() <> 0 ROLLBACK TRANSACTION" in sql
    assert "THROW;" in sql
    # Validation comes before any transaction is opened (ClaimMail's in mailq.CheckClaimRequest).
    first_check = sql.index("EXEC MAILQ.CHECKCLAIMREQUEST") if path == CLAIM else sql.index("THROW 5")
    assert first_check < sql.index("BEGIN TRANSACTION")


def test_claim_checks_run_before_anything_else_and_write_nothing(claim):
    """ClaimMail applies its defaults, then EXECs its checks with every parameter by
    name; the checks THROW (never RETURN a code nobody reads) and write nothing."""
    check = squash((SQL / "procedures" / "mailq.CheckClaimRequest.sql").read_text(encoding="utf-8"))
    body = claim[claim.index(" AS BEGIN "):]
    call = re.search(r"EXEC MAILQ.CHECKCLAIMREQUEST (.*?);", body).group(1)
    assert call == ("@BATCHSIZE = @BATCHSIZE, @LOCKTOKEN = @LOCKTOKEN, @LEASESECONDS = @LEASESECONDS, "
                    "@APPNAME = @APPNAME, @WORKERNAME = @WORKERNAME, @ACCOUNTNAMES = @ACCOUNTNAMES, "
                    "@RUNMODES = @RUNMODES")
    assert body.index("SET @RUNMODES = COALESCE(@RUNMODES, N'[\"PROD\"]')") < body.index("EXEC MAILQ.CHECKCLAIMREQUEST")
    assert "THROW 5" not in body and "RETURN" not in check
    assert not re.search(r"\b(INSERT|UPDATE|DELETE|MERGE)\b|BEGIN TRAN", check)
    assert re.findall(r"THROW (\d+)", check) == ["50130", "50131", "50132", "50103", "50115", "50148", "50241"]
    signature = re.search(r"PROCEDURE MAILQ.CHECKCLAIMREQUEST (.*?) AS BEGIN", check).group(1)
    assert signature == ("@BATCHSIZE INT, @LOCKTOKEN UNIQUEIDENTIFIER, @LEASESECONDS INT, @APPNAME NVARCHAR(4000), "
                         "@WORKERNAME NVARCHAR(4000), @ACCOUNTNAMES NVARCHAR(MAX), @RUNMODES NVARCHAR(MAX)")


def test_claim_catch_rolls_back_only_its_own_transaction(claim):
    assert "@OWNTRAN BIT = IIF(@@TRANCOUNT = 0, 1, 0)" in claim
    assert "IF @OWNTRAN = 1 BEGIN TRANSACTION" in claim
    assert "IF @OWNTRAN = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION" in claim


def test_rate_window_never_moves_backwards(claim):
    # The clock is read after the budget rows are locked ...
    lock = claim.index("MAILQ.RATEBUDGET AS B WITH (FORCESEEK, UPDLOCK, READPAST, ROWLOCK)")
    clock = claim.index("SET @NOW = SYSUTCDATETIME()")
    assert lock < clock, "@Now is read before the budget rows are locked"
    # The claim reads the clock once; the other reading is after the claim's
    # transaction, for LeaseSecondsRemaining only.
    claim_part, returned = claim.split("END CATCH;", 1)
    assert claim_part.count("SYSUTCDATETIME()") == 1
    assert returned.count("SYSUTCDATETIME()") == 1 and "@RETURNEDAT DATETIME2(3) = SYSUTCDATETIME()" in returned
    # ... and a stored window start counts (and is kept) when it is not older than ours.
    for unit in ("MINUTE", "HOUR", "DAY"):
        assert f"STARTUTC = @{unit}START" not in claim.replace(f"B.{unit}STARTUTC = IIF", ""), \
            f"a {unit} window is compared with '=': an older clock reading would reset it"
        assert f"{unit}STARTUTC >= @{unit}START" in claim
        assert f"B.{unit}STARTUTC = IIF(B.{unit}STARTUTC >= @{unit}START, B.{unit}STARTUTC, @{unit}START)" in claim


def _index_statements() -> list[str]:
    return re.findall(r"CREATE NONCLUSTERED INDEX.*?;", squash(INDEX.read_text(encoding="utf-8")))


def test_claim_index_definition():
    creates = _index_statements()
    assert len(creates) == 1, "one CREATE: the baseline builds it on a new, empty table"
    create = creates[0]
    assert "ON MAILQ.MAILQUEUE (ACCOUNTNAME ASC, RUNMODE ASC, PRIORITY DESC, VISIBLEATUTC ASC, ID ASC)" in create
    assert "INCLUDE (APPNAME, ATTEMPTSREMAINING, EXPIRESATUTC)" in create
    assert "WHERE STATUS IN (N'UNSENT', N'SENDING')" in create
    assert "ALLOW_PAGE_LOCKS" not in create, "page locks off breaks ALTER INDEX ... REORGANIZE"


def test_claim_predicate_implies_the_index_filter(claim):
    # A filtered index is used only when the query's predicate implies its
    # filter at compile time: same literal list, no parameter.
    filter_ = re.search(r"WHERE (STATUS IN \([^)]*\))", _index_statements()[0]).group(1)
    assert f"K.{filter_}" in claim


def test_fresh_install_creates_the_claim_objects_once_and_the_downgrade_drops_them():
    up = render("upgrade", "head")
    assert up.count("CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount") == 1
    assert up.count("CREATE OR ALTER PROCEDURE mailq.ClaimMail") == 1
    assert up.index("CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount") < up.index(
        "CREATE OR ALTER PROCEDURE mailq.ClaimMail")
    assert "IX_MailQueue_Claim " not in up and "IX_MailQueue_Claim\n" not in up
    assert "GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqSender" in up
    down = render("downgrade", "head:base")
    assert "DROP INDEX IF EXISTS IX_MailQueue_ClaimByAccount ON mailq.MailQueue" in down
    assert "DROP PROCEDURE IF EXISTS mailq.FinalizeMail" in down


def test_every_read_of_the_queue_in_the_claim_is_keyed_by_account_and_run_mode(claim):
    # Both hinted reads of k (the row-free probe and the claim's seek) are
    # equality on the index's first two keys: mail of a run mode the worker
    # does not serve lies outside every range sought.
    reads = re.findall(r"FROM MAILQ\.MAILQUEUE AS K WITH \([^;]*?WHERE (.*?)(?:\) AS C|\);)", claim)
    assert len(reads) == 4, reads
    for where in reads:
        assert where.startswith("K.ACCOUNTNAME = D.ACCOUNTNAME AND K.RUNMODE = D.RUNMODE AND "), where
    # The driving pairs: the accounts left crossed with the run modes served.
    assert "INSERT INTO @DRIVE (ACCOUNTNAME, RUNMODE) SELECT A.ACCOUNTNAME, M.RUNMODE FROM @ACCT AS A CROSS JOIN @MODES AS M;" in claim
    # At most @BatchSize pairs are sought (probe, then a random draw).
    assert "IF (SELECT COUNT(*) FROM @DRIVE) > @BATCHSIZE" in claim
    assert "SELECT TOP (@BATCHSIZE) R.ACCOUNTNAME, R.RUNMODE FROM @DRIVE AS R ORDER BY NEWID()" in claim


def test_run_modes_parameter_defaults_to_prod_and_is_validated(claim):
    assert "@RUNMODES NVARCHAR(MAX) = NULL AS" in claim, "@RunModes must be the LAST parameter"
    assert "SET @RUNMODES = COALESCE(@RUNMODES, N'[\"PROD\"]');" in claim
    check = squash((SQL / "procedures" / "mailq.CheckClaimRequest.sql").read_text(encoding="utf-8"))
    assert "THROW 50241," in check
    # the rule of CK_MailQueue_RunMode, binary comparison
    assert "COLLATE LATIN1_GENERAL_100_BIN2 NOT LIKE N'[A-Z]%'" in check
    assert "COLLATE LATIN1_GENERAL_100_BIN2 LIKE N'%[^A-Z0-9_-]%'" in check


def test_claim_stamps_dry_run_from_the_application_and_returns_it_after_run_mode(claim):
    assert "Q.DRYRUN = COALESCE( (SELECT AP.DRYRUN FROM MAILQ.APPLICATION AS AP WHERE AP.APPNAME = Q.APPNAME), CAST(0 AS BIT) )" in claim
    first = claim[claim.index("-- 4.") if "-- 4." in claim else claim.rindex("SELECT Q.ID, Q.MESSAGEID"):]
    # revision 0015 appended RunMode, DryRun; revision 0016 the three template columns after them
    assert re.search(r"Q\.DTSTAMP, Q\.RUNMODE, Q\.DRYRUN, C\.TEMPLATENAME, C\.TEMPLATEVERSION, Q\.TEMPLATEMODEL, "
                     r"CAST\(FLOOR\(DATEDIFF_BIG\(MILLISECOND, @RETURNEDAT, Q\.VISIBLEATUTC\) / 1000\.0\) AS INT\) "
                     r"AS LEASESECONDSREMAINING FROM MAILQ\.MAILQUEUE AS Q WITH \(FORCESEEK \(PK_MAILQUEUE \(ID\)\)\) "
                     r"INNER JOIN @CLAIMED", first)


def _passes(accounts: dict[str, int], modes: int, batch: int, yields, rng) -> tuple[dict, list[int]]:
    """A model of ClaimMail's pass loop (the SQL's formulas, line for line):
    returns what each pair took and the rows read per pass."""
    pairs = {(a, m): {"taken": 0, "cap": 0, "open": True} for a in accounts for m in range(modes)}
    if len(pairs) > batch:  # the random draw (the probe keeps all here: every pair has mail)
        keep = rng.sample(sorted(pairs), batch)
        pairs = {k: pairs[k] for k in keep}
    taken = {a: 0 for a in accounts}
    left, reads = batch, []
    for _ in range(3):
        if left <= 0:
            break
        open_ = [k for k, v in pairs.items() if v["open"] and accounts[k[0]] > taken[k[0]]]
        if not open_:
            break
        share = max(1, left // len(open_))
        for v in pairs.values():
            v["cap"] = 0
        for a in accounts:
            mine = [k for k in open_ if k[0] == a]
            rng.shuffle(mine)
            rest = accounts[a] - taken[a]
            for seq, k in enumerate(mine, 1):
                part = rest // len(mine) + (1 if seq <= rest % len(mine) else 0)
                pairs[k]["cap"] = min(part, share)
        # each account's caps never exceed its budget left
        for a in accounts:
            assert sum(v["cap"] for k, v in pairs.items() if k[0] == a) <= accounts[a] - taken[a]
        want = sum(v["cap"] for v in pairs.values())
        reads.append(want)
        assert want <= max(left, len(open_)) <= batch
        got_total = 0
        for k, v in pairs.items():
            if v["cap"] == 0:
                continue
            got = min(v["cap"], yields(k))
            got = min(got, left - got_total)  # the outer TOP (@Left)
            got_total += got
            v["taken"] += got
            if got < v["cap"]:
                v["open"] = False
        for a in accounts:
            taken[a] = sum(v["taken"] for k, v in pairs.items() if k[0] == a)
        left = batch - sum(taken.values())
    return taken, reads


def test_model_pair_caps_respect_budgets_and_the_batch():
    import random

    rng = random.Random(15)
    for _ in range(2000):
        n_acc = rng.randint(1, 6)
        accounts = {f"a{i}": rng.choice([1, 2, 3, 7, 50, 1000]) for i in range(n_acc)}
        modes = rng.randint(1, 4)
        batch = rng.choice([1, 2, 5, 10, 50])
        backlog = {(a, m): rng.choice([0, 1, 3, 100]) for a in accounts for m in range(modes)}
        taken, reads = _passes(accounts, modes, batch, lambda k: backlog[k], rng)
        assert sum(taken.values()) <= batch
        for a, t in taken.items():
            assert t <= accounts[a], (a, t, accounts[a])
        assert all(r <= batch for r in reads)


def test_model_one_account_one_mode_takes_the_batch_in_one_pass():
    import random

    taken, reads = _passes({"a": 1000}, 1, 50, lambda k: 10_000, random.Random(1))
    assert taken == {"a": 50} and reads == [50]
