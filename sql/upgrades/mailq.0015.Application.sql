/*
Revision 0015: per-application dry-run (issue 16, point 3), added in place to
mailq.Application:
    DryRun  BIT NOT NULL, default 0 (DF_Application_DryRun): 1 = the
            application's mails go through claim, lease and acknowledgement
            and are recorded as DryRun (status Sent, DryRun = 1, event
            'DryRun'), reaching no server.  Set by mailq.UpsertApplication
            @DryRun.  Every existing application keeps sending (0).
One small row per application changes (a metadata-only ADD where the
edition allows it); no mail row is touched.  Guarded, re-runnable, dynamic
SQL for the schema model (see mailq.0012.SendingAccount.sql).  Downgrade:
DOWNGRADE_0015_APP in alembic/versions/0015_*.py (refused with 50244 while
an application is in dry-run: 0014's claim would send its mail for real).
*/
IF COL_LENGTH(N'mailq.Application', N'DryRun') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.Application
          ADD DryRun BIT NOT NULL CONSTRAINT DF_Application_DryRun DEFAULT (0);';
