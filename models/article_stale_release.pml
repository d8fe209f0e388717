/*
 * article_stale_release.pml -- the seed article's stale-lock release:
 *
 *   UPDATE MailQueue SET ThreadLock = NULL
 *    WHERE ThreadLock IS NOT NULL
 *      AND DateProcessed < DATEADD(minute, 15, GETDATE())
 *      AND Status != 'Sent'
 *
 * DateProcessed is the time the lock was taken, always in the past, so
 * "DateProcessed < now + 15 minutes" is true for EVERY lock: each claim frees
 * every lock, including one taken a moment ago by a worker that is still
 * sending.  The intended test is DateProcessed < DATEADD(minute, -15, ...).
 *
 * Time: a clock `now` in ticks (TIMEOUT ticks stand for the 15 minutes), up to
 * MAXT.  Each worker runs the article's claim (release, then select + update,
 * taken here as one atomic step, the most favourable reading: see
 * article_claim.pml for its statements), sends, and acknowledges by ID.
 *
 * Properties:
 *   P1 (always)       the release frees only a lock at least TIMEOUT old;
 *   P2 (-DTWO_HOLDERS) no two workers send the same row at once.
 * Variants:
 *   (default)         the article's predicate: spin violates P1 at once.
 *   -DFIXED           DateProcessed < DATEADD(minute, -15, GETDATE()): P1
 *                     holds (spin verifies it).
 *   -DFIXED -DTWO_HOLDERS   P2 still fails: a worker that stalls past the
 *                     timeout keeps sending after its lock was freed and the
 *                     row retaken -- nothing fences it (no lease check, the
 *                     acknowledgement is by ID only).  mailq-db's ClaimMail /
 *                     MarkSent fence (mailqueue.pml) is what closes this.
 */

#ifndef NW
#define NW 2
#endif
#ifndef TIMEOUT
#define TIMEOUT 2
#endif
#ifndef MAXT
#define MAXT 5
#endif
#define NOROW 255

byte now;        /* GETDATE(), in ticks                                  */
byte tl;         /* ThreadLock of the one row: 0 = NULL, else worker + 1 */
byte dp;         /* DateProcessed (time the lock was taken)              */
bit  sent;       /* Status = 'Sent'                                      */
bit  sending[NW];/* worker is sending the row                            */

#ifdef FIXED
#define STALE (dp + TIMEOUT < now)    /* DateProcessed < now - 15 minutes */
#else
#define STALE (dp < now + TIMEOUT)    /* DateProcessed < now + 15 minutes */
#endif

#if NW > 2
#define P2 (!(sending[0] && sending[1]) && !(sending[0] && sending[2]) && !(sending[1] && sending[2]))
#else
#define P2 (!(sending[0] && sending[1]))
#endif

proctype Worker(byte w)
{
	do
	:: atomic {
		/* the claim transaction: (1) the release ... */
		if
		:: tl != 0 && !sent && STALE ->
			assert(now >= dp + TIMEOUT);          /* P1: only stale locks */
			tl = 0
		:: else -> skip
		fi;
		/* ... (2)-(3) select + update: take the row if it is free */
		if
		:: tl == 0 && !sent -> tl = w + 1; dp = now; sending[w] = 1
		:: else -> skip
		fi }
		if
		:: sending[w] ->
			/* send; then UPDATE ... SET ThreadLock = NULL, Status = 'Sent'
			 * WHERE ID = @ID (by ID only: no fence) */
			atomic { sent = 1; tl = 0; sending[w] = 0 }
		:: else -> skip
		fi
	:: sent -> break
	od
}

active proctype Clock()
{
	do
	:: now < MAXT -> now++
	:: else -> break
	od
}

#ifdef TWO_HOLDERS
active proctype Monitor()
{
end:	atomic { !(P2) -> assert(P2) }
}
#endif

init
{
	byte i;
	atomic {
		for (i : 0 .. NW - 1) { run Worker(i) }
	}
}
