/*
 * article_claim.pml -- the seed article's claim transaction, statement by
 * statement, under SQL Server's default READ COMMITTED (locking):
 *
 *   BEGIN TRANSACTION
 *   UPDATE MailQueue SET ThreadLock = NULL                     -- (1) release
 *    WHERE ThreadLock IS NOT NULL
 *      AND DateProcessed < DATEADD(minute, 15, GETDATE()) AND Status != 'Sent'
 *   SELECT TOP 10 * INTO #tmpRows FROM MailQueue                -- (2) select
 *    WHERE ThreadLock IS NULL AND ... ORDER BY Priority DESC
 *   UPDATE MailQueue SET ThreadLock = '<MY GUID>', ...          -- (3) update
 *     FROM #tmpRows r WHERE r.ID = MailQueue.ID AND ThreadLock IS NULL ...
 *   COMMIT TRANSACTION
 *   SELECT * FROM MailQueue WHERE ThreadLock = '<MY GUID>'      -- (4) my rows
 *   ... send ...
 *   UPDATE MailQueue SET ThreadLock = NULL, Status = 'Sent' WHERE ID = @ID
 *
 * Locking as SQL Server does it without hints: the SELECT takes a shared lock
 * per row and drops it after the read (it waits while another transaction
 * holds the row's exclusive lock); an UPDATE takes an update lock per row,
 * converts it to an exclusive lock on rows it changes and keeps those until
 * COMMIT.  No rollback happens in this model.
 *
 * Property: no two workers process the same row at once.
 *
 * Variants (spin -D...):
 *   (default)        the article as printed: spin finds two workers holding
 *                    one row -- statement (1) frees the lock another worker
 *                    took a moment ago (DateProcessed < now + 15 min is true
 *                    for every past time), see article_stale_release.pml.
 *   -DNO_RELEASE     statements (2)-(4) alone: spin verifies them.  The
 *                    UPDATE's re-check of ThreadLock IS NULL, made under the
 *                    update lock on the live row, turns a lost race into "0
 *                    rows for me"; what remains is blocking (the SELECT waits
 *                    for the other claimer's COMMIT) and wasted batches.
 *   -DTEMP_RECHECK   the re-check reads the copy in #tmpRows instead of the
 *                    live row (the unqualified ThreadLock in the article's
 *                    UPDATE exists in both tables): a snapshot taken before
 *                    the race -- spin finds two workers taking one row, even
 *                    with -DNO_RELEASE.
 * NR rows, NW workers; each worker claims TOP 1 per round.
 */

#ifndef NR
#define NR 2
#endif
#ifndef NW
#define NW 2
#endif
#define NOROW 255
#define SENT 1

byte tl[NR];     /* ThreadLock: 0 = NULL, else worker + 1                */
byte st[NR];     /* Status: 0 = 'UnSent', SENT                            */
byte xl[NR];     /* worker + 1 holding the row's exclusive lock, 0: none  */
byte proc[NW] = NOROW; /* the row a worker is processing (sending), or NOROW    */

#define FREE_OR_MINE(r, w) (xl[r] == 0 || xl[r] == (w) + 1)

#if NW > 2
#define NOT_TWO (!(proc[0] != NOROW && (proc[0] == proc[1] || proc[0] == proc[2])) && !(proc[1] != NOROW && proc[1] == proc[2]))
#else
#define NOT_TWO (!(proc[0] != NOROW && proc[0] == proc[1]))
#endif

proctype Worker(byte w)
{
	byte r, tmp, tmpTl;
	do
	:: /* BEGIN TRANSACTION */
#ifndef NO_RELEASE
		/* (1) the stale-lock release: a scan, row by row under an update
		 * lock; every locked row not yet Sent qualifies (its DateProcessed
		 * is in the past, so it is < now + 15 minutes) */
		r = 0;
		do
		:: r < NR -> atomic { FREE_OR_MINE(r, w) ->
				if
				:: tl[r] != 0 && st[r] != SENT -> tl[r] = 0; xl[r] = w + 1
				:: else -> skip
				fi }; r++
		:: else -> break
		od;
#endif
		/* (2) SELECT TOP 1 INTO #tmpRows ... ORDER BY Priority DESC: row 0
		 * has the highest priority; a shared lock per row, released after
		 * the read; an exclusively locked row is waited for */
		tmp = NOROW; r = 0;
		do
		:: r < NR -> atomic { FREE_OR_MINE(r, w) ->
				if
				:: tl[r] == 0 && st[r] != SENT -> tmp = r; tmpTl = tl[r]; r = NR
				:: else -> r++
				fi }
		:: else -> break
		od;
		/* (3) UPDATE ... FROM #tmpRows r WHERE r.ID = MailQueue.ID AND
		 * ThreadLock IS NULL: update lock on the live row, then the
		 * predicate, then the exclusive lock kept until COMMIT */
		if
		:: tmp != NOROW -> atomic { FREE_OR_MINE(tmp, w) ->
#ifdef TEMP_RECHECK
				if :: tmpTl == 0 && st[tmp] != SENT -> tl[tmp] = w + 1; xl[tmp] = w + 1
#else
				if :: tl[tmp] == 0 && st[tmp] != SENT -> tl[tmp] = w + 1; xl[tmp] = w + 1
#endif
				   :: else -> skip
				fi }
		:: else -> skip
		fi;
		/* COMMIT TRANSACTION: the exclusive locks go */
		atomic {
			r = 0;
			do
			:: r < NR -> if :: xl[r] == w + 1 -> xl[r] = 0 :: else -> skip fi; r++
			:: else -> break
			od;
			/* (4) SELECT * FROM MailQueue WHERE ThreadLock = '<MY GUID>' */
			if
			:: tmp != NOROW && tl[tmp] == w + 1 -> proc[w] = tmp
			:: else -> skip
			fi;
			r = 0; tmpTl = 0
		}
		if
		:: proc[w] != NOROW ->
			/* send, then: UPDATE MailQueue SET ThreadLock = NULL, Status =
			 * 'Sent' WHERE ID = @ID -- autocommit, by ID only */
			atomic { FREE_OR_MINE(proc[w], w) ->
				tl[proc[w]] = 0; st[proc[w]] = SENT; proc[w] = NOROW }
		:: else -> skip
		fi;
		tmp = NOROW
	od
}

active proctype Monitor()
{
	atomic { !(NOT_TWO) -> assert(NOT_TWO) }
}

init
{
	byte i;
	atomic {
		for (i : 0 .. NW - 1) { proc[i] = NOROW }
		for (i : 0 .. NW - 1) { run Worker(i) }
	}
}
