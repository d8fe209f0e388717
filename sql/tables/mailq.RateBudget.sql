/*
mailq.RateBudget: one row per sending account: its budget in fixed UTC windows
(minute, hour, day), charged by mailq.ClaimMail in the claim's transaction; apart
from mailq.SendingAccount so the claim's UPDLOCK never blocks its readers.  A
window whose start is not the current one counts as empty.
*/
IF OBJECT_ID(N'mailq.RateBudget', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.RateBudget (
        AccountName NVARCHAR(128) NOT NULL,
        MinuteStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_MinuteStartUtc DEFAULT ('2000-01-01'),
        MinuteCount INT NOT NULL CONSTRAINT DF_RateBudget_MinuteCount DEFAULT (0),
        HourStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_HourStartUtc DEFAULT ('2000-01-01'),
        HourCount INT NOT NULL CONSTRAINT DF_RateBudget_HourCount DEFAULT (0),
        DayStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_DayStartUtc DEFAULT ('2000-01-01'),
        DayCount INT NOT NULL CONSTRAINT DF_RateBudget_DayCount DEFAULT (0),
        CONSTRAINT PK_RateBudget PRIMARY KEY CLUSTERED (AccountName),
        CONSTRAINT FK_RateBudget_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT CK_RateBudget_Counts CHECK (MinuteCount >= 0 AND HourCount >= 0 AND DayCount >= 0)
    );
END;
