/*
 * mailqueue.pml -- the mailq-db mail protocol, checked with spin.
 *
 * Each transition below stands for one T-SQL statement (or one worker step)
 * and names it.  The database side mirrors sql/procedures/mailq.*.sql: every
 * procedure is one atomic step because each is one UPDATE statement (or a
 * transaction whose rows are locked before they are read), so its effect on a
 * row is indivisible; the worker side mirrors src/mailq_db/worker.
 *
 * Time is discrete and RELATIVE: instead of an absolute clock every deadline
 * is a countdown that the Clock process decrements (saturating at 0).  So
 * `vis[m] == 0` is "VisibleAtUtc <= SYSUTCDATETIME()", and the state space is
 * finite although time runs forever (needed for the liveness check).
 *
 * Bounds (override with spin -D...; see docs/models.md):
 *   NM mails, NW workers, LEASE ticks per lease, MARGIN ticks of safety margin,
 *   ATT attempts per mail, BACKOFF ticks of Retry backoff, BLOCK ticks an
 *   account stays blocked after Wait, EXPIRY ticks until ExpiresAtUtc (0 = no
 *   expiry), and the environment budgets WAITS (throttle answers), STALLS
 *   (ticks that pass while a worker sits between ClaimMail and its lease
 *   check), EXTENDS (ExtendLease calls per claim), REQUEUES (admin requeues).
 *
 * Switches:
 *   -DLIVE            compile the LTL liveness formula (use with pan -a -f)
 *   -DUNBOUNDED_ENV   no STALLS / WAITS budgets (liveness then needs EXPIRY>0)
 *   -DSTRICT_WINDOW   assert the NARROW duplicate window ("died or stalled
 *                     between SMTP acceptance and MarkSent" only); spin finds
 *                     the stall between the lease check and acceptance
 *   -DUNFENCED        acknowledge by ID only, as the seed article does
 *                     (UPDATE ... WHERE ID = @ID); spin finds a stale write
 *   -DNO_ADMIN        leave out CancelMail / RequeueMail / PurgeMail
 *   -DCLAIM_FINALIZES the claim of revisions 0001-0004: it took expired and
 *                     out-of-attempts rows in its TOP and finalized them in
 *                     the same statement (kept to compare; 0005 moved that to
 *                     mailq.FinalizeMail, the Finalizer process below)
 *   -DRATE            check the rate-window invariant instead of the mail
 *                     protocol (section "Rate windows" at the end): mails
 *                     charged to any window never exceed the limit, with NC
 *                     claimers racing at window boundaries.  Bounds: LIMIT,
 *                     NWIN windows, NC claimers.  -DOLD_WINDOW models the
 *                     claim of 0001-0004 (clock read before the budget row is
 *                     locked, a different window start resets the count and
 *                     is written back): spin finds a window charged twice.
 */

#ifndef NM
#define NM 1
#endif
#ifndef NW
#define NW 2
#endif
#ifndef LEASE
#define LEASE 3
#endif
#ifndef MARGIN
#define MARGIN 1
#endif
#ifndef ATT
#define ATT 2
#endif
#ifndef BACKOFF
#define BACKOFF 1
#endif
#ifndef BLOCK
#define BLOCK 1
#endif
#ifndef EXPIRY
#define EXPIRY 0
#endif
#ifndef WAITS
#define WAITS 1
#endif
#ifndef STALLS
#define STALLS 2
#endif
#ifndef EXTENDS
#define EXTENDS 1
#endif
#ifndef REQUEUES
#define REQUEUES 1
#endif

/* mailq.Mail.Status ('NONE' = row not inserted yet, 'PURGED' = row deleted) */
#define NONE      0
#define UNSENT    1
#define SENDING   2
#define SENT      3
#define FAILED    4
#define CANCELLED 5
#define EXPIRED   6
#define PURGED    7
#define FINAL(m)  (st[m] >= SENT)

/* worker phases */
#define IDLE      0   /* no mail: next step is ClaimMail                     */
#define HOLD      1   /* claimed, lease not yet checked against MARGIN       */
#define SEND      2   /* lease checked, SMTP transaction under way           */
#define ACCEPTED  3   /* SMTP server accepted the message; MarkSent pending  */

#define NOMAIL    255

/* Upper bound on successful claims of one mail: the initial attempts, the
 * attempts a requeue grants, and the refunds (Wait, ReleaseMail). */
#define MAXCLAIMS (ATT * (1 + REQUEUES) + WAITS + STALLS)

/* ---- the mailq.MailQueue row (one per mail) ---------------------------- */
byte st[NM];      /* Status                                              */
byte lock[NM];    /* ThreadLock (0 = NULL)                               */
byte vis[NM];     /* VisibleAtUtc - now: due time / lease expiry, >= 0   */
byte att[NM];     /* AttemptsRemaining                                   */
byte ex[NM];      /* ExpiresAtUtc - now (only meaningful when EXPIRY>0)  */
bit  dup[NM];     /* PossibleDuplicate                                   */
byte blk;         /* mailq.SendingAccount.BlockedUntilUtc - now (one account) */

/* ---- ghost state: never read by the protocol, only by the assertions ---- */
byte claims[NM];  /* successful claims of the mail                       */
byte holder[NM];  /* worker+1 that legitimately holds the lease, 0: none */
byte hp[NM];      /* phase the legitimate holder reached (HOLD..ACCEPTED)*/
bit  window[NM];  /* a lease was reclaimed from a holder inside the
                     documented duplicate window                        */
byte deliv[NM];   /* SMTP acceptances of the mail (saturates at 2)       */
byte waits = WAITS, stalls = STALLS, requeues = REQUEUES;
byte nhold;       /* workers in phase HOLD (for the STALLS budget)       */

/* ---- the workers' local knowledge -------------------------------------- */
byte ph[NW];      /* phase                                               */
byte held[NW];    /* the mail the worker holds                           */
byte dl[NW];      /* lease time left as the worker believes it           */

#define TOK(w) ((w) + 1)   /* the worker's @LockToken (see docs/models.md) */

/* A worker "believes it holds a valid lease" when it holds a mail and its own
 * view of the lease has time left. */
#define BELIEVES(w)  (ph[w] != IDLE && dl[w] > 0)
/* ... and the database would accept its token for that mail. */
#define DB_ACCEPTS(w) (st[held[w]] == SENDING && lock[held[w]] == TOK(w))
#define TWO(w, v) (BELIEVES(w) && BELIEVES(v) && held[w] == held[v])

#if NW > 2
#define NO_TWO_HOLDERS (!TWO(0,1) && !TWO(0,2) && !TWO(1,2))
#define BELIEF_SOUND ((!BELIEVES(0) || DB_ACCEPTS(0)) && (!BELIEVES(1) || DB_ACCEPTS(1)) && (!BELIEVES(2) || DB_ACCEPTS(2)))
#else
#define NO_TWO_HOLDERS (!TWO(0,1))
#define BELIEF_SOUND ((!BELIEVES(0) || DB_ACCEPTS(0)) && (!BELIEVES(1) || DB_ACCEPTS(1)))
#endif
/* attempts never go negative (a byte would wrap to 255) and refunds never
 * mint attempts: a refund only gives back the attempt its claim took */
#if NM > 1
#define ATT_SANE (att[0] <= ATT && att[1] <= ATT)
#else
#define ATT_SANE (att[0] <= ATT)
#endif
#define INVARIANT (NO_TWO_HOLDERS && BELIEF_SOUND && ATT_SANE)

/* ---- the token fence, shared by every acknowledging procedure ----------
 * mailq.MarkSent / MarkFailed / ExtendLease / ReleaseMail first EXEC
 * mailq.LockLeasedMail, which reads every listed row WITH (UPDLOCK, ROWLOCK)
 * and THROWs 50201 (no such mail), 50203 (not Sending) or 50202 (another
 * @LockToken) before anything is written (all-or-nothing over @IDList); then
 *   UPDATE q ... WHERE q.Status = 'Sending' AND q.ThreadLock = @LockToken. */
#ifdef UNFENCED
#define FENCE(w, m) (st[m] != NONE && st[m] != PURGED)   /* article: WHERE ID = @ID */
#else
#define FENCE(w, m) (st[m] == SENDING && lock[m] == TOK(w))
#endif

/* "a stale token never changes a mail": whoever passes the fence is the
 * worker the ghost state says holds the lease. */
inline fenced_write_ok(w, m) {
	assert(holder[m] == TOK(w))
}

/* The row leaves Sending: the attempt row is closed, the lease is gone. */
inline leave_sending(m) {
	lock[m] = 0; holder[m] = 0; hp[m] = 0
}

inline refund(m) {
	att[m] = att[m] + 1
}

/* mailq.ClaimMail (revision 0005): one pass UPDATE of mailq.MailQueue
 * joined to a per-account CROSS APPLY TOP (cap) ... WITH (INDEX
 * (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, UPDLOCK, ROWLOCK)
 * WHERE AccountName = a.AccountName AND Status IN ('UnSent', 'Sending') AND
 * VisibleAtUtc <= @Now AND AttemptsRemaining > 0 AND (ExpiresAtUtc IS NULL
 * OR ExpiresAtUtc > @Now), for the accounts in @Acct (not blocked:
 * BlockedUntilUtc <= @Now; budget left), applied to one row: an expired
 * lease is reclaimed through the same range.  Expired and out-of-attempts
 * rows are not claimable: the Finalizer (mailq.FinalizeMail) takes them.
 * Revision 0015 drives the apply by (account, run mode) pairs and adds
 * RunMode = d.RunMode to the seek: the model's mails are of the one run
 * mode its workers serve (a mail of another run mode is never read, so it
 * takes no step here), and the rate model (-DRATE) is unchanged because an
 * account's pairs share its budget (caps add up to at most what is left;
 * tests/static/test_claim_static.py models that arithmetic).  A dry-run
 * application's mail takes the same steps with no SMTP delivery; its
 * acknowledgement is MarkSent's, so the lease/fence properties are the
 * same and no property of this model changes. */
#ifdef CLAIM_FINALIZES
#define CLAIMABLE(m) (vis[m] == 0 && blk == 0 && (st[m] == UNSENT || st[m] == SENDING))
#else
#define CLAIMABLE(m) (vis[m] == 0 && blk == 0 && (st[m] == UNSENT || st[m] == SENDING) \
                      && att[m] > 0 && (EXPIRY == 0 || ex[m] > 0))
#endif

inline claim_row(w, m) {
	/* PossibleDuplicate = IIF(r.Status = 'Sending', 1, ...); the next
	 * statement of ClaimMail closes the old token's attempt 'Abandoned' */
	if
	:: st[m] == SENDING ->
		dup[m] = 1;
#ifdef STRICT_WINDOW
		if :: hp[m] == ACCEPTED -> window[m] = 1 :: else -> skip fi;
#else
		if :: hp[m] >= SEND -> window[m] = 1 :: else -> skip fi;
#endif
		leave_sending(m)
	:: else -> skip
	fi;
	if
	/* WillSend = IIF(AttemptsRemaining > 0 AND (ExpiresAtUtc IS NULL OR
	 * ExpiresAtUtc > @Now), 1, 0); Status = CASE WillSend = 1 'Sending',
	 * AttemptsRemaining <= 0 'Failed', ELSE 'Expired' */
	:: att[m] == 0 ->                               /* 'Failed'             */
		st[m] = FAILED; leave_sending(m); vis[m] = 0
	:: att[m] > 0 && EXPIRY > 0 && ex[m] == 0 ->    /* now >= ExpiresAtUtc  */
		st[m] = EXPIRED; leave_sending(m); vis[m] = 0
	:: else ->      /* 'Sending', ThreadLock = @LockToken, VisibleAtUtc =
	                   @LeaseUntil, AttemptsRemaining -= 1; attempt opened */
		assert(att[m] > 0);
		st[m] = SENDING; lock[m] = TOK(w); vis[m] = LEASE;
		att[m] = att[m] - 1;
		claims[m] = claims[m] + 1;
#ifndef UNBOUNDED_ENV
		assert(claims[m] <= MAXCLAIMS);          /* no endless reclaim loop */
#endif
		holder[m] = TOK(w); hp[m] = HOLD;
		held[w] = m; dl[w] = LEASE; ph[w] = HOLD; nhold++
	fi
}

/* SMTP acceptance of the message by the server = a delivery. */
inline deliver(m) {
	if
	:: deliv[m] > 0 ->
		/* a second delivery only inside the documented window, and the
		 * row carries PossibleDuplicate = 1 */
		assert(window[m] == 1);
		assert(dup[m] == 1)
	:: else -> skip
	fi;
	if :: deliv[m] < 2 -> deliv[m]++ :: else -> skip fi
}

/* The worker forgets everything (crash, or end of its work on the mail). */
inline drop(w) {
	nhold = nhold - (ph[w] == HOLD -> 1 : 0);
	ph[w] = IDLE; held[w] = NOMAIL; dl[w] = 0
}

proctype Worker(byte w)
{
	byte m = NOMAIL;
	byte ext = 0;

idle:
	/* mailq.ClaimMail @BatchSize = 1, @LockToken = TOK(w): one UPDATE TOP (1)
	 * WITH (READPAST, UPDLOCK, ROWLOCK) ... OUTPUT inserted.*; the claimer
	 * takes any one row that qualifies (priority order is abstracted away),
	 * or none. */
	atomic {
		m = NOMAIL;
		if
		:: CLAIMABLE(0) -> m = 0
#if NM > 1
		:: CLAIMABLE(1) -> m = 1
#endif
		:: else -> skip
		fi;
		if
		:: m != NOMAIL -> ext = 0; claim_row(w, m)
		:: else -> skip
		fi;
		if
		:: ph[w] == HOLD -> skip
		:: else -> m = NOMAIL
		fi
	}
	if
	:: m == NOMAIL -> goto idle
	:: else -> skip
	fi;

hold:
	/* worker: is at least MARGIN of the lease left before starting SMTP? */
	if
	:: atomic { drop(w) }; goto idle                          /* crash */
	:: atomic { dl[w] > MARGIN ->
		nhold--; ph[w] = SEND;
		if :: holder[m] == TOK(w) -> hp[m] = SEND :: else -> skip fi }
	:: atomic { dl[w] <= MARGIN ->
		/* mailq.ReleaseMail: UPDATE q SET Status = 'UnSent', VisibleAtUtc
		 * = @Now, AttemptsRemaining += 1, ThreadLock = NULL WHERE <fence> */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			st[m] = UNSENT; vis[m] = 0; refund(m); leave_sending(m)
		:: else -> skip                                                /* THROW */
		fi;
		drop(w) }; goto idle
	fi;

send:
	/* the SMTP transaction; its outcome decides the acknowledgement */
	if
	:: atomic { drop(w) }; goto idle                          /* crash */
	:: atomic {                               /* 250 after DATA: accepted */
		skip;
		deliver(m);
		ph[w] = ACCEPTED;
		if :: holder[m] == TOK(w) -> hp[m] = ACCEPTED :: else -> skip fi }
	:: atomic { skip;                        /* 4xx: MarkFailed 'Retry' */
		/* mailq.MarkFailed @Disposition = 'Retry': UPDATE o SET Status =
		 * CASE WHEN AttemptsRemaining > 0 THEN 'UnSent' ELSE 'Failed' END,
		 * VisibleAtUtc = backoff with jitter, ThreadLock = NULL
		 * WHERE <fence> */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			if
			:: att[m] > 0 -> st[m] = UNSENT; vis[m] = BACKOFF
			:: else -> st[m] = FAILED; vis[m] = 0
			fi;
			leave_sending(m)
		:: else -> skip
		fi;
		drop(w) }; goto idle
#ifndef UNBOUNDED_ENV
	:: atomic { waits > 0 -> waits--;
#else
	:: atomic { skip;
#endif
		/* throttled: mailq.MarkFailed @Disposition = 'Wait': UPDATE o SET
		 * Status = 'UnSent', VisibleAtUtc = @WaitUntil, AttemptsRemaining
		 * += 1 (refund), ThreadLock = NULL WHERE <fence>; then UPDATE
		 * mailq.SendingAccount SET BlockedUntilUtc = @WaitUntil */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			st[m] = UNSENT; vis[m] = BLOCK; refund(m); blk = BLOCK;
			leave_sending(m)
		:: else -> skip
		fi;
		drop(w) }; goto idle
	:: atomic { skip;                         /* 5xx: MarkFailed 'Stop' */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			st[m] = FAILED; vis[m] = 0; leave_sending(m)
		:: else -> skip
		fi;
		drop(w) }; goto idle
	:: ext < EXTENDS ->                   /* long batch: mailq.ExtendLease */
		atomic {
		ext++;
		/* UPDATE q SET VisibleAtUtc = @LeaseUntil WHERE <fence> */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			vis[m] = LEASE; dl[w] = LEASE
		:: else -> drop(w)                 /* told it lost the lease */
		fi };
		if
		:: ph[w] == IDLE -> goto idle
		:: else -> goto send
		fi
	fi;

accepted:
	if
	:: atomic { drop(w) }; goto idle                          /* crash */
	:: atomic { skip;
		/* mailq.MarkSent: UPDATE q SET Status = 'Sent', ThreadLock = NULL
		 * ... WHERE <fence>; accepted after the lease time passed as long
		 * as nobody reclaimed the row (the token still matches).  A
		 * repeat by the same token after 'Sent' succeeds without writing
		 * (LockLeasedMail @AcceptSentByToken = 1): no step of its own. */
		if
		:: FENCE(w, m) -> fenced_write_ok(w, m);
			st[m] = SENT; vis[m] = 0; leave_sending(m)
		:: else -> skip                       /* THROW: lease lost; logged */
		fi;
		drop(w) }; goto idle
	fi
}

/* Operators and jobs (mailq.CancelMail, RequeueMail, PurgeMail). */
proctype Admin()
{
	byte m;
	do
	:: atomic {
		select(m : 0 .. NM - 1);
		/* mailq.CancelMail: UPDATE ... SET Status = 'Cancelled'
		 * WHERE ID = @ID AND Status = 'UnSent' (a Sending mail: THROW) */
		if :: st[m] == UNSENT -> st[m] = CANCELLED; vis[m] = 0
		   :: else -> skip fi;
		m = 0 }
	:: requeues > 0 ->
		atomic {
		select(m : 0 .. NM - 1);
		/* mailq.RequeueMail: Failed/Cancelled/Expired -> UnSent with fresh
		 * attempts (bounded: an operator requeues finitely often) */
		if
		:: st[m] == FAILED || st[m] == CANCELLED || st[m] == EXPIRED ->
			requeues--; st[m] = UNSENT; vis[m] = 0; att[m] = ATT;
			ex[m] = EXPIRY
		:: else -> skip
		fi;
		m = 0 }
	:: atomic {
		select(m : 0 .. NM - 1);
		/* mailq.PurgeMail: DELETE TOP (n) ... WHERE Status IN (final) */
		if :: FINAL(m) && st[m] != PURGED -> st[m] = PURGED
		   :: else -> skip fi;
		m = 0 }
	:: break
	od
}

/* mailq.FinalizeMail, run by every worker on a timer (and by SQL Agent /
 * elastic jobs): one batch statement applied to one row.
 *   Out of attempts: Status IN ('UnSent', 'Sending') AND AttemptsRemaining = 0
 *     AND VisibleAtUtc <= @Now -> 'Failed' (IX_MailQueue_Finalize);
 *   expired: ExpiresAtUtc <= @Now AND (Status = 'UnSent' OR (Status =
 *     'Sending' AND VisibleAtUtc <= @Now)) -> 'Expired' (IX_MailQueue_Expiry).
 * A lease given up is flagged PossibleDuplicate; its attempt is closed.
 * Both statements take READPAST, UPDLOCK, ROWLOCK, so the Finalizer and a
 * claimer never act on one row at once: each step is atomic on the row. */
#define DEAD(m)    ((st[m] == UNSENT || st[m] == SENDING) && att[m] == 0 && vis[m] == 0)
#define EXPIRED_(m) (EXPIRY > 0 && ex[m] == 0 && (st[m] == UNSENT || (st[m] == SENDING && vis[m] == 0)))

/* A lease given up by the Finalizer ends its holder's lease exactly as a
 * reclaim does (ghost: inside the documented window if the holder was past
 * its lease check; a requeue can then lead to a second delivery). */
inline give_up_lease(m) {
	if
	:: st[m] == SENDING ->
		dup[m] = 1;
#ifdef STRICT_WINDOW
		if :: hp[m] == ACCEPTED -> window[m] = 1 :: else -> skip fi
#else
		if :: hp[m] >= SEND -> window[m] = 1 :: else -> skip fi
#endif
	:: else -> skip
	fi
}

inline finalize_row(m) {
	if
	:: DEAD(m) ->
		give_up_lease(m);
		st[m] = FAILED; leave_sending(m); vis[m] = 0
	:: !DEAD(m) && EXPIRED_(m) ->
		give_up_lease(m);
		st[m] = EXPIRED; leave_sending(m); vis[m] = 0
	:: else -> skip
	fi
}

proctype Finalizer()
{
	byte m;
	do
	:: atomic {
		select(m : 0 .. NM - 1);
		finalize_row(m);
		m = 0 }
	od
}

/* Time passes.  Between ClaimMail and the lease check only STALLS ticks may
 * pass in total (an environment assumption for liveness: a worker that is
 * stalled there forever releases the mail forever; see docs/models.md). */
#ifndef RATE
active proctype Clock()
{
	byte i;
	do
	:: atomic {
#ifndef UNBOUNDED_ENV
		(nhold == 0 || stalls > 0) ->
		if :: nhold > 0 -> stalls-- :: else -> skip fi;
#endif
		for (i : 0 .. NM - 1) {
			if :: vis[i] > 0 -> vis[i]-- :: else -> skip fi;
			if :: ex[i] > 0 -> ex[i]-- :: else -> skip fi
		}
		for (i : 0 .. NW - 1) {
			if :: dl[i] > 0 -> dl[i]-- :: else -> skip fi
		}
		if :: blk > 0 -> blk-- :: else -> skip fi;
		i = 0 }
	od
}
#endif

#ifndef RATE
/* The invariants, checked in every reachable state. */
active proctype Monitor()
{
	atomic { !(INVARIANT) -> assert(INVARIANT) }
}

init
{
	byte i;
	atomic {
		/* mailq.EnqueueMail: INSERT ... Status = 'UnSent', VisibleAtUtc =
		 * DateToProcess (now), AttemptsRemaining = @MaxAttempts */
		for (i : 0 .. NM - 1) {
			st[i] = UNSENT; att[i] = ATT; ex[i] = EXPIRY; vis[i] = 0
		}
		for (i : 0 .. NW - 1) {
			held[i] = NOMAIL; run Worker(i)
		}
#ifndef NO_ADMIN
		run Admin()
#endif
#ifndef CLAIM_FINALIZES
		;
		run Finalizer()
#endif
	}
}
#endif /* !RATE */

#ifdef LIVE
/* Every accepted mail reaches Sent, Failed, Cancelled or Expired (or is
 * purged after it did). */
#if NM > 1
ltl live { [] ((st[0] == UNSENT || st[0] == SENDING) -> <> (st[0] >= SENT))
        && [] ((st[1] == UNSENT || st[1] == SENDING) -> <> (st[1] >= SENT)) }
#else
ltl live { [] ((st[0] == UNSENT || st[0] == SENDING) -> <> (st[0] >= SENT)) }
#endif
#endif

/* ======================================================================
 * Rate windows (-DRATE): mails charged to any window never exceed the
 * account's limit, also with claimers racing at a window boundary.
 *
 * mailq.ClaimMail, revision 0005, per claimer and one account with a
 * per-minute limit (hour and day windows follow the same code):
 *   1. INSERT @Acct ... FROM mailq.RateBudget WITH (UPDLOCK, READPAST,
 *      ROWLOCK): take the budget row, or skip the account if another
 *      claimer holds it (READPAST);
 *   2. SET @Now = SYSUTCDATETIME(), read WHILE the row is held;
 *   3. count = IIF(MinuteStartUtc >= @MinuteStart, MinuteCount, 0): a stored
 *      window that is not older than ours is the current one;
 *   4. claim k <= LIMIT - count mails (however many are due: any k);
 *   5. UPDATE RateBudget SET MinuteCount = count + k, MinuteStartUtc =
 *      IIF(MinuteStartUtc >= @MinuteStart, MinuteStartUtc, @MinuteStart);
 *      commit (the row lock ends).
 * -DOLD_WINDOW, revisions 0001-0004: @Now is read BEFORE step 1, the count
 * applies only if MinuteStartUtc = @MinuteStart, and MinuteStartUtc =
 * @MinuteStart is written back, so a claimer whose clock reading is older
 * than the stored window resets it backwards.
 * Ghost: charged[w] = mails claimed with @Now in window w (what the attempt
 * rows record as StartedAtUtc).  The invariant is asserted at every charge.
 * ====================================================================== */
#ifdef RATE
#ifndef LIMIT
#define LIMIT 2
#endif
#ifndef NWIN
#define NWIN 3
#endif
#ifndef NC
#define NC 2
#endif

byte win;              /* the clock: the current window, 0 .. NWIN-1      */
byte bstart;           /* RateBudget.MinuteStartUtc (window number)       */
byte bcount;           /* RateBudget.MinuteCount                          */
byte budlock;          /* U lock on the budget row: claimer+1, 0: free    */
byte charged[NWIN];    /* ghost: mails claimed with @Now in window w      */

proctype RateClaimer(byte c)
{
	byte seen, count, k;
	do
	:: 
#ifdef OLD_WINDOW
		seen = win;                                /* @Now, before the lock */
#endif
		if
		:: atomic { budlock == 0 -> budlock = c + 1 }  /* UPDLOCK             */
		:: atomic { budlock != 0 -> skip }; goto next  /* READPAST: skip it   */
		fi;
#ifndef OLD_WINDOW
		seen = win;                                /* @Now, under the lock  */
		count = (bstart >= seen -> bcount : 0);
#else
		count = (bstart == seen -> bcount : 0);
#endif
		k = 0;
		do
		:: k + count < LIMIT -> k++
		:: break
		od;
		atomic {
#ifndef OLD_WINDOW
			if :: bstart < seen -> bstart = seen :: else -> skip fi;
#else
			bstart = seen;
#endif
			bcount = count + k;
			charged[seen] = charged[seen] + k;
			assert(charged[seen] <= LIMIT);
			budlock = 0                            /* commit               */
		}
next:		skip
	od
}

/* The clock moves on, at any moment, up to the last window explored. */
proctype RateClock()
{
	do
	:: atomic { win < NWIN - 1 -> win++ }
	od
}

init
{
	byte i;
	atomic {
		for (i : 0 .. NC - 1) { run RateClaimer(i) }
		run RateClock()
	}
}
#endif /* RATE */
