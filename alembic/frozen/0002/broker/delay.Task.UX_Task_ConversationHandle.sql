/*
UX_Task_ConversationHandle: dbo.ProcessDelayQueue finds the task of a
DialogTimer message by its conversation handle: a seek, whatever the backlog.
Filtered: refused rows have no conversation.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'UX_Task_ConversationHandle' AND object_id = OBJECT_ID(N'delay.Task')
)
    CREATE UNIQUE NONCLUSTERED INDEX UX_Task_ConversationHandle
        ON delay.Task (ConversationHandle)
        WHERE ConversationHandle IS NOT NULL;
