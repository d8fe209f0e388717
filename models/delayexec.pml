/*
 * delayexec.pml -- delayed execution through Service Broker, checked with spin.
 *
 * Mirrors sql/broker/dbo.ProcessDelayQueue.sql (pattern (a) of DESIGN.md):
 *   step 1  one transaction: WAITFOR (RECEIVE TOP (1) ...) from
 *           dbo.DelayServiceQueue, read delay.Task WITH (UPDLOCK, ROWLOCK),
 *           act on the message, COMMIT.  For a due DialogTimer: TaskState =
 *           'Running', Attempts += 1, LeaseUntilUtc, and the watchdog: BEGIN
 *           CONVERSATION TIMER (@TaskHandle) before the COMMIT.
 *           On failure: ROLLBACK (the message returns to the queue), then a
 *           second transaction RECEIVEs it again and only records the failure
 *           (delay.FinishTask 'Failed' / END CONVERSATION); if that fails too,
 *           the reader RETURNs.
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
 * Liveness (-DLIVE, pan -a -f): the conversation ends and the task is final.
 *
 * Switches:
 *   -DAPPLOCK_AFTER_COMMIT  take the run lock in step 2, after step 1's COMMIT,
 *                       as the first version of the procedure did: spin finds
 *                       the race (a watchdog firing in between declares the
 *                       runner lost and a second run starts; docs/models.md)
 *   -DNO_ATTEMPT_CHECK  leave out "a run starts only in its own attempt"
 *   -DFAILS=n           step-1 / recovery transactions that fail (env budget;
 *                       5 in a row disable the queue: spin finds it)
 *   -DDIES=n            readers that die mid-target;  -DERRS=n broker Errors
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
byte fails = FAILS, dies = DIES, errs = ERRS;

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
	bit dorun, got, err, retryable, iserr;
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
		if
		:: fails > 0 ->
			/* anything in step 1 raises (deadlock victim, bug, ...):
			 * ROLLBACK TRANSACTION; the message returns to the queue */
			fails--; rollback_receive();
			/* the recovery transaction: RECEIVE it again, record the
			 * failure, end the task; if that fails too: RETURN */
			if
			:: fails > 0 -> fails--; rollback_receive()
			:: else ->
				if :: iserr -> qerr = 0 :: else -> qtimer-- fi;
				if
				:: ts == SCHEDULED || ts == RUNNING || ts == RETRYING -> finish(FAILED)
				:: else -> conv = 0; armed = 0; qtimer = 0; qerr = 0
				fi;
				rb = 0                                   /* COMMIT */
			fi
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
				qtimer--;
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
			rb = 0                                           /* COMMIT */
		fi
	}
	if
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
		:: !conv -> skip   /* BEGIN CONVERSATION TIMER raises: logged only */
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
ltl ends { <> (!conv && (ts == DONE || ts == FAILED)) }
#endif
