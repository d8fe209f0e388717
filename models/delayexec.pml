/*
 * delayexec.pml -- delayed execution through Service Broker, checked with spin.
 *
 * Mirrors sql/broker/dbo.ProcessDelayQueue.sql (pattern (a) of DESIGN.md):
 *   step 1  one transaction: WAITFOR (RECEIVE TOP (1) ...) from
 *           dbo.DelayServiceQueue, read delay.Task WITH (UPDLOCK, ROWLOCK),
 *           act on the message, COMMIT.  For a due DialogTimer: TaskState =
 *           'Running', Attempts += 1, LeaseUntilUtc, and the watchdog: BEGIN
 *           CONVERSATION TIMER (@TaskHandle) before the COMMIT.
 *           On failure: ROLLBACK (the message returns to the queue).  A
 *           transient failure (1205) the first time in this reader: nothing
 *           else, the next RECEIVE redelivers it.  Otherwise the RECOVERY
 *           transaction: RECEIVE ... WHERE conversation_handle = @Handle;
 *           nothing received (another reader took it) -> COMMIT, go on; else
 *           INSERT delay.Incident, END CONVERSATION, COMMIT -- it writes
 *           nothing that step 1 wrote, so a deterministic failure of step 1
 *           cannot repeat in it.  If it fails too: RAISERROR, the reader stops
 *           (activation starts another).  Then, in a transaction without
 *           RECEIVE, a Scheduled/Retrying task whose conversation it ended is
 *           failed (delay.FinishTask, which writes the platform table).
 *           The run lock, sp_getapplock 'mailq-db/delay/task/<id>' (Session,
 *           timeout 0), is taken inside step 1 before its COMMIT; held while
 *           the target runs, released after step 3 or by the session's end.
 *   step 2  the target through sp_executesql in its own transaction.
 *   step 3  a new transaction: BEGIN CONVERSATION TIMER (re-arms the lease),
 *           read the task WITH (UPDLOCK): still Running in this attempt ->
 *           delay.FinishTask 'Done' (receipt 1) / 'Retrying' + backoff timer /
 *           delay.FinishTask 'Failed' (GaveUp); otherwise keep what is there.
 *   watchdog  a DialogTimer on a Running task whose lease passed: the runner
 *           holds the applock -> alive, extend; else 'RunnerLost' -> Retrying
 *           (new timer) or Failed.
 *   EndDialog / Error messages: delay.FinishTask 'Failed' (ends the task's
 *           conversation) or END CONVERSATION.
 *   delay.FinishTask: sets the final state and the receipt, END CONVERSATION
 *           (which also drops the conversation's timer and queued messages).
 *
 * Time is abstract: an armed conversation timer may fire at any moment, so a
 * lease may expire at any point of a run (a stalled or slow reader).  One task
 * and its one conversation; NR concurrent readers (MAX_QUEUE_READERS).
 *
 * Invariants (assertions):
 *   - a task runs at most once per attempt, never two runs at once, and a
 *     run starts only while no later attempt has started (att == my);
 *   - the queue is never disabled: fewer than 5 consecutive rollbacks of a
 *     transaction that RECEIVEd (SQL Server's poison-message rule);
 *   - at most MAXATT attempts.
 * Liveness (-DLIVE, pan -a -f): the conversation ends and the task is final
 * (with delay.Reconcile running now and then, for a task whose conversation a
 * recovery ended while its runner died).
 *
 * Switches:
 *   -DAPPLOCK_AFTER_COMMIT  take the run lock in step 2, after step 1's COMMIT,
 *                       as the first version of the procedure did: spin finds
 *                       the race (a watchdog firing in between declares the
 *                       runner lost and a second run starts; docs/models.md)
 *   -DNO_ATTEMPT_CHECK  leave out "a run starts only in its own attempt"
 *   -DFAILS=n           step-1 / recovery transactions that fail transiently
 *                       (env budget; 5 in a row disable the queue: spin finds it)
 *   -DPOISON            every write to the platform table fails for this task
 *                       (a CHECK or trigger the platform added, a revoked
 *                       permission).  Since revision 0006 no RECEIVE
 *                       transaction writes that table (step 1 records the
 *                       final state in delay.Task and ends the conversation;
 *                       the receipt is written after its COMMIT, in a
 *                       statement of its own, and delay.Reconcile repairs a
 *                       receipt that failed), so POISON touches only the
 *                       follow-up and Reconcile's FinishTask
 *   -DOLD_RECOVERY      the recovery of revision 0004: no 1205 redelivery, no
 *                       @@ROWCOUNT check after its RECEIVE, and it calls
 *                       delay.FinishTask (the platform table) inside the
 *                       RECEIVE transaction: spin finds the queue disabled
 *                       under POISON, and a Running task failed by a recovery
 *   -DDIES=n            readers that die mid-target;  -DERRS=n broker Errors
 *   -DANY_MESSAGE_RECOVERY  the recovery of revisions 0006-0009: it took
 *                       whatever message of the conversation came first and
 *                       recorded it as the failed one.  Another reader may
 *                       have committed the failed timer meanwhile and started
 *                       the run; the next (lease) timer is then the first
 *                       one, and the recovery ended a healthy conversation:
 *                       spin finds it (assert: the message recovered is the
 *                       one that failed).  Since revision 0010 the recovery
 *                       compares message_id/message_sequence_number and
 *                       rolls a later message back instead
 *   -DCANCEL            dbo.CancelDelayExecution runs once, at any moment: it
 *                       takes the task's conversation group (and, like a
 *                       delay-0 request, its cancel lock) before the row, so
 *                       it is one atomic step against step 1 and step 3
 */

#ifndef NR
#define NR 2
#endif
#ifndef MAXATT
#define MAXATT 2
#endif
#ifndef FAILS
#define FAILS 2
#endif
#ifndef DIES
#define DIES 1
#endif
#ifndef ERRS
#define ERRS 1
#endif

/* delay.Task.TaskState */
#define SCHEDULED 1
#define RUNNING   2
#define RETRYING  3
#define DONE      4
#define FAILED    5
#define CANCELLED 6

byte ts = SCHEDULED;   /* TaskState                                          */
byte att;              /* Attempts                                           */
bit  conv = 1;         /* the task's conversation is open                     */
bit  armed = 1;        /* its conversation timer is set (the trigger set the
                          delay timer: BEGIN CONVERSATION TIMER in
                          dbo.trg_tabDIYTable12402_ScheduleDelay)              */
byte qtimer;           /* DialogTimer messages on dbo.DelayServiceQueue       */
bit  qerr;             /* an Error (or EndDialog) message on the queue        */
byte applock;          /* reader + 1 holding the task's run lock, 0: free     */
byte rb;               /* consecutive rollbacks of RECEIVE transactions       */
bit  incident;         /* a recovery recorded this task's conversation in
                          delay.Incident and ended it                          */
byte fails = FAILS, dies = DIES, errs = ERRS;
byte moved;            /* ghost, bit r: since reader r's step 1 failed on the
                          timer at the head of the conversation, some step 1
                          committed (removed) a timer message: the head is a
                          later message (message_sequence_number moved on)   */
#ifdef POISON
bit  poison = 1;       /* step 1 fails deterministically for this task        */
#else
bit  poison = 0;
#endif

/* ghost */
bit  ran[MAXATT + 1];  /* attempt n has started its target                   */
byte running;          /* targets running now                                */

/* delay.FinishTask: final state, receipt, END CONVERSATION @TaskHandle */
inline finish(state) {
	ts = state; conv = 0; armed = 0; qtimer = 0; qerr = 0
}

inline rollback_receive() {
	rb++;
	assert(rb < 5)               /* the queue would be disabled (poison) */
}

proctype Reader(byte r)
{
	bit dorun, got, err, retryable, iserr, failed, transient, redelivered, recovered;
	byte my;

endloop:	/* an idle reader waiting in WAITFOR (RECEIVE) is a valid end */
	/* ---- step 1: BEGIN TRAN; WAITFOR (RECEIVE TOP (1) ...) --------------
	 * RECEIVE locks the conversation group until COMMIT, so step 1 of two
	 * readers never interleaves on one conversation: one atomic step. */
	atomic {
		conv && (qtimer > 0 || qerr) ->
		dorun = 0; got = 0; err = 0; retryable = 1; my = 0; iserr = 0;
		if
		:: qtimer > 0 -> iserr = 0
		:: qerr -> iserr = 1
		fi;
		failed = 0; transient = 0; recovered = 0;
		if
		:: fails > 0 ->
			/* step 1 raises transiently (deadlock victim 1205, ...):
			 * ROLLBACK TRANSACTION; the message returns to the queue */
			fails--; failed = 1; transient = 1; rollback_receive();
			moved = moved & (255 - (1 << r))
#ifdef OLD_RECOVERY
		:: poison ->
			/* revision 0004 wrote the platform table (delay.FinishTask)
			 * inside step 1: the same write fails every time */
			failed = 1; rollback_receive()
#endif
		:: else ->
			if
			:: iserr ->
				/* EndDialog / Error: FinishTask 'Failed' (BrokerError) */
				qerr = 0;
				if
				:: ts == SCHEDULED || ts == RUNNING || ts == RETRYING -> finish(FAILED)
				:: else -> conv = 0; armed = 0; qtimer = 0
				fi
			:: else ->
				qtimer--; moved = 255;
				if
				:: ts == SCHEDULED || ts == RETRYING ->
					/* due: TaskState = 'Running', Attempts += 1,
					 * LeaseUntilUtc; BEGIN CONVERSATION TIMER (watchdog) */
					att++; assert(att <= MAXATT);
					ts = RUNNING; armed = 1; dorun = 1; my = att;
#ifndef APPLOCK_AFTER_COMMIT
					if :: applock == 0 -> applock = r + 1; got = 1
					   :: else -> got = 0 fi
#endif
				:: ts == RUNNING ->
					/* the watchdog: lease passed; sp_getapplock timeout 0 */
					if
					:: applock != 0 -> armed = 1           /* alive: extend */
					:: else ->                               /* RunnerLost */
						if
						:: att < MAXATT -> ts = RETRYING; armed = 1
						:: else -> finish(FAILED)
						fi
					fi
				:: else -> conv = 0; armed = 0; qtimer = 0  /* late timer */
				fi
			fi;
			rb = 0;                                          /* COMMIT */
			redelivered = 0
		fi
	}
	if
	:: failed ->
#ifndef OLD_RECOVERY
		if
		:: transient && !redelivered ->
			redelivered = 1; goto endloop   /* one ordinary redelivery */
		:: else -> skip
		fi;
#endif
		/* ---- RECOVERY: BEGIN TRAN; RECEIVE ... WHERE conversation_handle */
		atomic {
			redelivered = 0;
			if
			:: (iserr && qerr) || (!iserr && qtimer > 0) ->
				/* the message is still there: received again */
				if
				:: fails > 0 ->
					/* fails too: ROLLBACK, RAISERROR, the reader stops;
					 * activation starts another (endloop) */
					fails--; rollback_receive(); goto endloop
#ifdef OLD_RECOVERY
				:: poison ->
					/* delay.FinishTask writes the platform table: the
					 * same deterministic failure */
					rollback_receive(); goto endloop
				:: !poison ->
					if
					:: ts == SCHEDULED || ts == RUNNING || ts == RETRYING ->
						assert(ts != RUNNING); finish(FAILED)
					:: else -> conv = 0; armed = 0; qtimer = 0; qerr = 0
					fi;
					rb = 0
#else
#ifdef ANY_MESSAGE_RECOVERY
				:: else ->
					/* 0006-0009: whatever came first is taken for the
					 * failed message */
					assert(iserr || (moved & (1 << r)) == 0);
					conv = 0; armed = 0; qtimer = 0; qerr = 0;
					rb = 0; recovered = 1; incident = 1
#else
				:: fails == 0 && (iserr || (moved & (1 << r)) == 0) ->
					/* the very message step 1 failed on (message_id and
					 * message_sequence_number match):
					 * INSERT delay.Incident; END CONVERSATION; COMMIT */
					conv = 0; armed = 0; qtimer = 0; qerr = 0;
					rb = 0; recovered = 1; incident = 1
				:: fails == 0 && !iserr && (moved & (1 << r)) != 0 ->
					/* a later message: another reader took the failed
					 * one.  ROLLBACK: it goes back to the queue */
					rollback_receive()
#endif
#endif
				fi
			:: else ->
				/* nothing received: another reader owns the message */
#ifdef OLD_RECOVERY
				/* no @@ROWCOUNT check: FinishTask 'Failed' anyway */
				if
				:: !poison && (ts == SCHEDULED || ts == RUNNING || ts == RETRYING) ->
					assert(ts != RUNNING); finish(FAILED)
				:: else -> skip
				fi
#else
				skip
#endif
			fi
		}
		/* ---- RECOVERY FOLLOW-UP: no RECEIVE in this transaction; its
		 * failure (poison: FinishTask writes the platform table) is logged
		 * and left to delay.Reconcile */
		atomic {
			if
			:: recovered && !poison && (ts == SCHEDULED || ts == RETRYING) -> finish(FAILED)
			:: else -> skip
			fi
		}
		goto endloop
	:: dorun -> skip
	:: else -> goto endloop
	fi;

	/* ---- step 2: the run lock, then the target in its own transaction --- */
#ifdef APPLOCK_AFTER_COMMIT
	atomic {
		if :: applock == 0 -> applock = r + 1; got = 1
		   :: else -> got = 0 fi
	}
#endif
	if
	:: got ->
		atomic {
			/* EXEC sys.sp_executesql @Sql (the target starts) */
			/* no later attempt has started: the watchdog did not
			 * declare this runner lost (a broker Error may have finished
			 * the task meanwhile: see docs/models.md) */
#ifndef NO_ATTEMPT_CHECK
			assert(att == my);
#endif
			assert(!ran[my]);                    /* once per attempt        */
			ran[my] = 1;
			running++;
			assert(running == 1)                 /* never two at once       */
		}
		if
		:: atomic { running--; err = 0 }                     /* succeeds   */
		:: atomic { running--; err = 1 }     /* raises; ROLLBACK (it is 1) */
		:: atomic { running--; err = 1 }     /* dooms: XACT_STATE() = -1   */
		:: atomic { running--; err = 1; retryable = 0 }   /* 266: commits */
		:: atomic { dies > 0 -> dies--; running--;      /* the process dies: */
			applock = 0 };                 /* the session's lock goes */
			goto endloop                      /* activation starts a new reader */
		fi
	:: else ->
		err = 1           /* 50334: another session held the task's run lock */
	fi;

	/* ---- step 3: record the outcome ------------------------------------ */
	atomic {
		if
		:: !conv ->
			/* the conversation was ended (a recovery): no timer; the
			 * outcome is still recorded, without a retry */
			if
			:: ts == RUNNING && att == my ->
				if :: !err -> finish(DONE) :: else -> finish(FAILED) fi
			:: else -> skip
			fi
		:: else ->
			armed = 1;
			if
			:: ts != RUNNING || att != my -> skip   /* finished meanwhile */
			:: else ->
				if
				:: !err -> finish(DONE)             /* F108219 = 1 */
				:: err && retryable && my < MAXATT -> ts = RETRYING; armed = 1
				:: else -> finish(FAILED)           /* GaveUp */
				fi
			fi
		fi;
		/* sp_releaseapplock */
		if :: got && applock == r + 1 -> applock = 0 :: else -> skip fi
	}
	goto endloop
}

/* The conversation timer fires (at any time: a lease of any length). */
active proctype Timer()
{
end:	do
	:: atomic { armed && conv -> armed = 0; qtimer++; assert(qtimer <= 3) }
	od
}

#ifdef CANCEL
/* dbo.CancelDelayExecution -> delay.CancelTask: only a Scheduled or Retrying
 * task (50321 otherwise); FinishTask 'Cancelled' ends the conversation, so a
 * queued timer message goes with it.  50343 when the conversation is gone. */
active proctype Cancel()
{
end:	/* never cancellable (already running or final): 50321, a valid end */
	atomic { conv && (ts == SCHEDULED || ts == RETRYING) -> finish(CANCELLED) }
}
#endif

/* delay.Reconcile (an Agent job, or doctor): a task that is not final and
 * whose conversation is gone.  Recovered by an incident: failed (its
 * FinishTask writes the platform table, so under POISON it fails again and
 * the task stays for a later run).  Otherwise re-armed on a new conversation;
 * a Running task only when no runner holds its run lock (APPLOCK_TEST). */
active proctype Reconcile()
{
end:	do
	:: atomic { !conv && incident && !poison && (ts == SCHEDULED || ts == RETRYING
	            || (ts == RUNNING && applock == 0)) -> ts = FAILED }
	:: atomic { !conv && !incident && (ts == SCHEDULED || ts == RETRYING) -> conv = 1; armed = 1 }
	:: atomic { !conv && !incident && ts == RUNNING && applock == 0 ->
		if
		:: att < MAXATT -> ts = RETRYING; conv = 1; armed = 1
		:: else -> ts = FAILED
		fi }
	od
}

/* The broker delivers an Error message on the conversation. */
active proctype Broker()
{
end:	do
	:: atomic { errs > 0 && conv -> errs--; qerr = 1 }
	:: errs == 0 -> break
	od
}

init
{
	byte i;
	atomic {
		for (i : 0 .. NR - 1) { run Reader(i) }
	}
}

#ifdef LIVE
ltl ends { <> (!conv && (ts == DONE || ts == FAILED || ts == CANCELLED)) }
#endif
