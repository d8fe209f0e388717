/*
delay.ReceiptDue: tasks made final whose receipt F108219 is not written yet.  The
transaction that makes a task final adds it; delay.WriteReceipts writes the
receipts (as MailqRunner) a batch at a time and removes them.
*/
IF OBJECT_ID(N'delay.ReceiptDue', N'U') IS NULL
    CREATE TABLE delay.ReceiptDue (TaskID BIGINT NOT NULL, CONSTRAINT PK_ReceiptDue PRIMARY KEY CLUSTERED (TaskID));
