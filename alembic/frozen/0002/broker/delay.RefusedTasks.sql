/*
delay.RefusedTasks: rows that were refused and never run (receipt 2), with the
reason: 50302 delay out of range, 50303 parameter too long, 50304 malformed
name, 50305 three- or four-part name, 50306 not on the allow-list, 50307 the
listed procedure was dropped, recreated or moved.
Columns:     TaskID, TargetName, DelaySeconds, CreatedAtUtc, RefusedAtUtc,
             RefusalNumber, RefusalMessage
Example:     SELECT TaskID, TargetName, RefusalMessage FROM delay.RefusedTasks;
*/
CREATE OR ALTER VIEW delay.RefusedTasks
AS
SELECT
    t.TaskID,
    t.TargetName,
    t.DelaySeconds,
    t.CreatedAtUtc,
    RefusedAtUtc = t.FinishedAtUtc,
    RefusalNumber = t.LastErrorNumber,
    RefusalMessage = t.LastErrorMessage
FROM delay.Task AS t
WHERE t.TaskState = N'Refused';
