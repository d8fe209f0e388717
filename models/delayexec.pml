/*
 * delayexec.pml -- delayed execution, third design (issue 23), checked with spin.
 *
 * Mirrors sql/broker/: delay.Task is the queue; one dispatcher conversation's
 * timer wakes the readers (dbo.ProcessDelayQueue); time is whole units.
 *   inserter  (dbo.trg_tabDIYTable12402_ScheduleDelay, in the platform's
 *             transaction): INSERT the task row (uncommitted, X-locked), then
 *             read delay.Dispatcher.ArmedForUtc with READCOMMITTEDLOCK (waits
 *             while a reader holds that row); if the task is due more than one
 *             unit before it: delay.ArmDispatcher -- the arm lock (application
 *             lock, held to commit), the first committed Pending due time
 *             (READPAST), and the timer := the earliest of the three (BEGIN
 *             CONVERSATION TIMER replaces a timer, so never a later one).  The
 *             timer and the row become real at COMMIT; a ROLLBACK undoes both.
 *   reader    RECEIVE one message (its transaction does nothing else; a
 *             DialogTimer re-arms the timer to the safety tick in it);
 *             delay.RunDueTasks: claim (READPAST, UPDLOCK: uncommitted and
 *             running rows are skipped) every Claimed task whose lease passed
 *             and every Pending task that is due, with a new token and a lease;
 *             delay.RunTask per task: the run lock (an UPDATE of the row for
 *             this claim, held until the run's transaction ends, marking the
 *             lease 9999-12-31) and the run's session lock (the sweep tests
 *             it with APPLOCK_TEST, so a target that ends the transaction
 *             opened for it is still passed by), the target check (Held if it
 *             changed), the call, Done / retry / Failed;
 *             delay.ArmDispatcher at the end of the pass: the arm lock, WRITE
 *             delay.Dispatcher, then READ the first Pending due time with locks
 *             (an uncommitted row that may come first makes the reader's lock
 *             time out: it rolls back and polls), timer := the earliest of the
 *             first due time, the first lease, now + TICK.
 *   operator  ALTER of the target (its tasks are Held when checked, a run whose
 *             target changed meanwhile is rolled back and Held: the post-check
 *             in the run's transaction), then delay.AllowProcedure (Held ->
 *             Pending, due now, and the timer armed like an inserter's).
 *   clock     time moves on; a timer whose time has come puts a DialogTimer
 *             message on the queue.
 *
 * Bounds: NT = 2 tasks (one per inserter, inserted at any time up to MAXT - 2,
 * delays 0..2), NR readers, LEASE, TICK, HARD units of time; readers may die
 * mid-run (DIES), targets may fail (FAILS), be slow or commit (SLOW), the
 * target may be altered once, before or during a run (ALTERS).  Time moves on
 * only when no other step can be taken (a timeout-driven clock), so every step
 * that waits for time says so.  Locals are reset once dead (fewer states).
 *
 * Properties:
 *   - a task never runs twice at once (assert in the run's start);
 *   - the timer is never lost (monitor Wake, with DIES=0): every committed
 *     Pending task is due at most one unit before the timer (the tolerance of
 *     the inserter's test and of whole-second timers), or a message waits, or
 *     a reader is in a pass or polling; every claimed, not running task is
 *     covered the same way by its lease;
 *   - at the end (no step left: timeout), every task of a target that is
 *     listed is Done or Failed, and a task of a changed target is Held: no task
 *     is refused for a routine ALTER, and none is left behind (also with
 *     readers dying: the safety tick re-armed in the RECEIVE transaction).
 *
 * Switches (each makes spin find a counterexample; tests/models):
 *   -DREAD_BEFORE_WRITE  the reader reads the due index before writing
 *                        delay.Dispatcher: an inserter that read the old armed
 *                        time skips the timer and the reader misses its row
 *   -DREADPAST_MIN       the reader's first-due read skips uncommitted rows
 *                        (READPAST instead of waiting): the same lost wake-up
 *   -DREPLACE            an inserter sets the timer to its own due time, not the
 *                        earliest pending one: an earlier inserter's is lost
 *   -DNO_RUN_LOCK        the run does not hold its row and the sweep does not
 *                        read past it: a task runs twice at once
 *   -DNO_SESSION_LOCK    the run takes no session lock: a target that rolls
 *                        back the transaction opened for it (and the run's mark
 *                        with it) and runs on is claimed again by the sweep
 *   -DREFUSE_CHANGED     a changed target's tasks are refused (the second
 *                        design, finding B1): listed again, they never run
 *   -DNO_SAFETY_REARM    the RECEIVE transaction does not re-arm the safety
 *                        tick: a reader dying mid-pass leaves no timer
 *   -DNO_OUTCOME_TOKEN   a failed run's outcome, written after its rollback, is
 *                        not limited to its own claim: a sweep that claimed and
 *                        finished the task meanwhile is overwritten and a Done
 *                        task runs again
 */

#ifndef NT
#define NT 2
#endif
#ifndef NR
#define NR 2
#endif
#ifndef MAXT
#define MAXT 7       /* tasks are inserted until MAXT - 2, listed again until MAXT */
#endif
#ifndef TICK
#define TICK 3
#endif
#ifndef LEASE
#define LEASE 2
#endif
#ifndef MAXATT
#define MAXATT 2
#endif
#ifndef DIES
#define DIES 0
#endif
#ifndef FAILS
#define FAILS 1
#endif
#ifndef ALTERS
#define ALTERS 1
#endif
#ifndef SLOW
#define SLOW 1       /* 1: a target may outlive its lease */
#endif

#define NONE 255
#ifndef HARD
#define HARD 18      /* the end of time: far past the last due time, lease and tick */
#endif

/* delay.Task.TaskState */
#define ABSENT   0
#define UNCOMMIT 1   /* inserted, the inserting transaction still open */
#define PENDING  2
#define CLAIMED  3
#define HELD     4
#define DONE     5
#define FAILED   6
#define REFUSED  7

byte now;
byte timer = NONE;        /* the dispatcher conversation's timer               */
byte tmsg;                /* DialogTimer messages on dbo.DelayServiceQueue     */
byte rmsg;                /* MailqDelayRequest messages                        */
byte armedFor = NONE;     /* delay.Dispatcher.ArmedForUtc (NULL: never armed)  */
byte armlock;             /* holder + 1 of the arm lock; inserters NR+1..       */
byte disp;                /* reader + 1 holding delay.Dispatcher's row (X)    */
bit  changed;             /* the target was altered since it was listed        */
byte alters = ALTERS, dies = DIES, fails = FAILS;

byte st[NT], due[NT], tok[NT], lease[NT], runner[NT], att[NT];
byte token;               /* claim tokens: a new one per claim                 */
bit  slock[NT];           /* the run's session lock (APPLOCK_TEST in the sweep) */
byte running[NT];         /* ghost: runs of task t in progress                 */
bit  done[NT];            /* ghost: task t was Done once (it never runs again)  */
byte inpass;              /* ghost: readers in a pass or polling               */

/* the first committed Pending due time; an uncommitted row at or before it
   blocks a locking read of the due index (IX_Task_Due, ORDER BY NextRunAtUtc) */
#define PD(k)   (st[k] == PENDING -> due[k] : NONE)
#define FIRSTP  (PD(0) < PD(NT - 1) -> PD(0) : PD(NT - 1))
#define BLOCKS  ((st[0] == UNCOMMIT && due[0] <= FIRSTP) || \
                 (st[NT - 1] == UNCOMMIT && due[NT - 1] <= FIRSTP))

/* the end of a run: its locks go, the claim's lease local is dead */
#define ENDRUN(k)  running[k]--; runner[k] = 0; slock[k] = 0; v = 0

inline firstPending(v, readpast) {
    /* the first due time of committed Pending rows (READPAST skips the rest) */
    v = NONE;
    i = 0;
    do
    :: i < NT ->
        if
        :: st[i] == PENDING && due[i] < v -> v = due[i]
        :: else -> skip
        fi;
        i++
    :: else -> break
    od
}

inline setTimer(fire) {
    /* TIMEOUT is 1 at least: a time that has come fires at now + 1 */
    if
    :: fire <= now -> timer = now + 1
    :: else -> timer = fire
    fi
}

proctype Inserter(byte t) {
    byte a, fire, v, i, d;
    bit rearm = 0;
    /* the platform's INSERT: the row exists, uncommitted, X-locked */
    /* at which time (0 .. MAXT - 2), with which delay (0 .. 2) */
    do
    :: a < MAXT - 2 -> a++
    :: break
    od;
    if
    :: d = 0
    :: d = 1
    :: d = 2
    fi;
    atomic { now >= a -> st[t] = UNCOMMIT; due[t] = now + d; a = 0; d = 0 };
    /* trigger: ArmedForUtc WITH (READCOMMITTEDLOCK): waits for a reader's write */
    atomic { disp == 0 -> a = armedFor };
    if
    :: a == NONE || due[t] + 1 < a ->
        /* delay.ArmDispatcher as an inserter: the arm lock, held to commit */
        atomic { armlock == 0 -> armlock = NR + 1 + t };
        atomic {
            firstPending(v, 1);
#ifdef REPLACE
            fire = due[t];
#else
            fire = due[t];
            if :: v < fire -> fire = v :: else -> skip fi;
            if :: armedFor < fire -> fire = armedFor :: else -> skip fi;
#endif
            rearm = 1
        }
    :: else -> skip
    fi;
    /* a long platform transaction: the commit comes a unit of time later */
    if
    :: d = now; (now > d)
    :: skip
    fi;
    /* the platform's COMMIT (or ROLLBACK): the row and the timer together */
    if
    :: atomic {
            st[t] = PENDING;
            if :: rearm -> setTimer(fire); armlock = 0 :: else -> skip fi;
            a = 0; fire = 0; v = 0; i = 0; d = 0; rearm = 0     /* dead from here on */
        }
    :: atomic {
            st[t] = ABSENT;
            if :: rearm -> armlock = 0 :: else -> skip fi;
            a = 0; fire = 0; v = 0; i = 0; d = 0; rearm = 0
        }
    fi;
end_ins:
    skip
}

proctype Reader(byte r) {
    byte t, mine, v, i, fire, seen, cl;
    bit polling;
end_idle:
    do
    :: atomic {
        (tmsg > 0 || rmsg > 0) ->
        if
        :: tmsg > 0 ->
            tmsg--;
#ifndef NO_SAFETY_REARM
            /* the RECEIVE transaction re-arms the safety tick on the timer's conversation */
            setTimer(now + TICK);
#endif
        :: rmsg > 0 -> rmsg--
        fi;
        inpass++
       }
pass:
        /* delay.RunDueTasks: one claim transaction (READPAST, UPDLOCK, ROWLOCK) */
        atomic {
            mine = token + 1;
            t = 0;
            do
            :: t < NT ->
                if
#ifdef NO_RUN_LOCK
                :: st[t] == CLAIMED && lease[t] < now ->
#else
                :: st[t] == CLAIMED && lease[t] < now && runner[t] == 0 && slock[t] == 0 ->
#endif
                    tok[t] = mine; lease[t] = now + LEASE
                :: st[t] == PENDING && due[t] <= now ->
                    st[t] = CLAIMED; tok[t] = mine; lease[t] = now + LEASE
                :: else -> skip
                fi;
                t++
            :: else -> break
            od;
            /* NEWID(): a token is never reused (none is taken for an empty claim) */
            if :: (tok[0] == mine || tok[NT - 1] == mine) -> token++ :: else -> mine = 0 fi
        };
        /* a full batch wakes another reader (here: whenever two were claimed) */
        if
        :: (tok[0] == mine && tok[NT - 1] == mine && NT > 1) -> rmsg++
        :: else -> skip
        fi;
        /* delay.RunTask for each task of this claim */
        t = 0;
        do
        :: t < NT ->
            if
            :: atomic {
#ifdef NO_RUN_LOCK
                st[t] == CLAIMED && tok[t] == mine ->
#else
                st[t] == CLAIMED && tok[t] == mine && runner[t] == 0 ->
                v = lease[t];           /* the claim's lease, back on a rollback */
                lease[t] = NONE;        /* the run's mark: 9999-12-31 */
#endif
#ifndef NO_SESSION_LOCK
                slock[t] = 1;           /* the run's session lock (sp_getapplock, Session) */
#endif
                runner[t] = r + 1;
                assert(running[t] == 0);        /* never twice at once */
                assert(done[t] == 0);           /* never again once Done */
                running[t]++
               }
               /* delay.CheckTarget, then the call */
               if
               :: atomic { changed ->
#ifdef REFUSE_CHANGED
                     st[t] = REFUSED;
#else
                     st[t] = HELD;
#endif
                     ENDRUN(t) }
               :: atomic { !changed && dies > 0 ->
                     /* the reader's session ends mid-run: the run rolls back and
                        its locks go; the claim stays until its lease passes */
                     dies--; inpass--;
#ifndef NO_RUN_LOCK
                     lease[t] = v;
#endif
                     ENDRUN(t); t = 0; mine = 0;
                     goto end_idle }
               :: atomic { !changed && alters > 0 ->
                     /* ALTER lands while it runs: the post-check in the same
                        transaction rolls the target's work back and holds it */
                     alters--; changed = 1; st[t] = HELD; ENDRUN(t) }
               :: atomic { !changed && fails > 0 ->
                     fails--; att[t]++;
                     if
                     :: att[t] >= MAXATT -> st[t] = FAILED
                     :: else -> st[t] = PENDING; due[t] = now + 1
                     fi;
                     ENDRUN(t) }
               :: atomic { !changed -> st[t] = DONE; done[t] = 1; ENDRUN(t) }
               :: !changed && SLOW -> cl = v; v = now + LEASE;
                  /* a slow (or blocked) target outlives its claim's lease: the
                     other readers' sweeps pass its row by meanwhile */
                  (now > v || now == HARD);
                  if
                  :: atomic {
                      /* the post-check: an ALTER meanwhile rolls it back, Held */
                      if :: changed -> st[t] = HELD :: else -> st[t] = DONE; done[t] = 1 fi;
                      ENDRUN(t); cl = 0 }
                  :: fails > 0 ->
                      /* it fails at last (1222 after TargetLockTimeoutMs, say): the
                         session lock is released and the run rolled back first, so
                         its row is unlocked with the claim's (long passed) lease ... */
                      atomic { fails--; running[t]--; runner[t] = 0; slock[t] = 0;
#ifndef NO_RUN_LOCK
                               lease[t] = cl;
#endif
                               cl = 0 };
                      /* ... then the outcome, in a transaction of its own: only while
                         the row still carries this claim (a sweep may own it now) */
                      atomic {
#ifdef NO_OUTCOME_TOKEN
                          runner[t] == 0 ->     /* UPDATE ... WHERE TaskID: waits for a sweeper's run */
                          if :: true ->
#else
                          if :: tok[t] == mine && st[t] == CLAIMED ->
#endif
                                att[t]++;
                                if
                                :: att[t] >= MAXATT -> st[t] = FAILED
                                :: else -> st[t] = PENDING; due[t] = now + 1
                                fi
                          :: else -> skip
                          fi;
                          v = 0 }
                  fi
               :: !changed && SLOW ->
                  /* the target ends the transaction opened for it (266) and goes
                     on past the lease: its row is no longer held.  COMMIT keeps
                     the run's mark; ROLLBACK undoes it (the claim's lease is
                     back); the session lock stays either way.  Then it is
                     failed, not rerun. */
                  if
                  :: atomic { runner[t] = 0 }                   /* COMMIT */
                  :: atomic { runner[t] = 0; lease[t] = v }     /* ROLLBACK */
                  fi;
                  v = now + LEASE;
                  (now > v || now == HARD);
                  atomic { st[t] = FAILED; ENDRUN(t) }
               fi
            :: else -> skip     /* not ours any more (swept), or not claimed */
            fi;
            t++
        :: else -> break
        od;
        /* delay.ArmDispatcher at the end of the pass */
        if
        :: atomic { armlock == 0 -> armlock = r + 1 }
#ifdef READ_BEFORE_WRITE
           atomic { !BLOCKS -> firstPending(v, 0) };
           atomic { disp = r + 1 };
#else
           atomic { disp = r + 1 };
#endif
           if
#if !defined(READPAST_MIN) && !defined(READ_BEFORE_WRITE)
           :: atomic {
                /* an uncommitted row that may come first: the reader waits;
                   its lock times out (200 ms): it rolls back and polls */
                BLOCKS ->
                disp = 0; armlock = 0; polling = 1;
                t = 0; mine = 0; v = 0; i = 0; fire = 0 }
#endif
           :: atomic {
#if defined(READPAST_MIN) || defined(READ_BEFORE_WRITE)
                true ->
#else
                !BLOCKS ->      /* the inserter committed meanwhile, or none */
#endif
#ifndef READ_BEFORE_WRITE
                firstPending(v, 0);
#endif
                fire = now + TICK;
                if :: v < fire -> fire = v :: else -> skip fi;
                t = 0;
                do
                :: t < NT ->
                    if
                    :: st[t] == CLAIMED && runner[t] == 0 && lease[t] < fire -> fire = lease[t]
                    :: else -> skip
                    fi;
                    t++
                :: else -> break
                od;
                setTimer(fire);
                armedFor = timer;
                disp = 0; armlock = 0; polling = 0;
                t = 0; mine = 0; v = 0; i = 0; fire = 0 }
           fi
        :: atomic { armlock != 0 -> polling = 1; t = 0; mine = 0; v = 0; i = 0; fire = 0 }
                                                /* the arm lock timed out: poll */
        fi;
        if
        :: polling ->
            /* WAITFOR (RECEIVE), TIMEOUT 1000: the next unit of time, or a message */
            seen = now;
end_poll:
            atomic { (now != seen || now == HARD || tmsg > 0 || rmsg > 0) ->
                if
                :: tmsg > 0 -> tmsg--;
#ifndef NO_SAFETY_REARM
                    setTimer(now + TICK);       /* the same RECEIVE transaction */
#endif
                :: rmsg > 0 -> rmsg--
                :: else -> skip
                fi;
                polling = 0; seen = 0 };
            goto pass
        :: else -> atomic { inpass--; t = 0; mine = 0; v = 0; i = 0; fire = 0; seen = 0 }
        fi
    od
}

proctype Operator() {
    /* an ALTER of the target, then a db_owner lists it again (AllowProcedure:
       Held -> Pending due now, the timer armed like an inserter's) */
    byte t, v, i, fire, at;
    /* the ALTER at a time of its choosing (or none) */
    do
    :: at < MAXT - 2 -> at++
    :: break
    od;
    if
    :: atomic { alters > 0 && now >= at -> alters--; changed = 1; at = 0 }
    :: skip
    fi;
    /* listing it again, at a later time of its choosing, MAXT at the latest */
    do
    :: at < MAXT -> at++
    :: break
    od;
end_op:
    atomic { changed && now >= at && armlock == 0 ->
        changed = 0;
        t = 0;
        do
        :: t < NT ->
            if :: st[t] == HELD -> st[t] = PENDING; due[t] = now :: else -> skip fi;
            t++
        :: else -> break
        od;
        fire = now;
        setTimer(fire)
    }
}

active proctype Clock() {
    /* Time moves on only when nothing else can (maximal progress): a long
       transaction or a slow target is an explicit wait for time below. */
end_clock:
    do
    :: atomic { timeout && now < HARD ->
        now++;
        if
        :: timer != NONE && timer <= now -> tmsg++; timer = NONE
        :: else -> skip
        fi }
    od
}

#ifndef NO_WAKE_CHECK
#define LATE(at) (timer == NONE || (timer > (at) + 1 && timer > now + 1))
active proctype Wake() {
    /* the timer is never lost: checked in every state (with DIES = 0) */
end_wake:
    atomic {
        (inpass == 0 && tmsg == 0 && rmsg == 0 &&
         ((st[0] == PENDING && LATE(due[0])) ||
          (st[NT - 1] == PENDING && LATE(due[NT - 1])) ||
          (st[0] == CLAIMED && runner[0] == 0 && LATE(lease[0])) ||
          (st[NT - 1] == CLAIMED && runner[NT - 1] == 0 && LATE(lease[NT - 1]))))
        -> assert(false)
    }
}
#endif

active proctype Final() {
    /* nothing left to do and no timer to wait for: every task of a listed
       target ran (Done or Failed), every task of a changed one is Held; none is
       refused for an ALTER, none is left behind */
    byte t;
    atomic { timeout && inpass == 0 && st[0] != UNCOMMIT && st[NT - 1] != UNCOMMIT && (timer == NONE || now == HARD) };
    t = 0;
    do
    :: t < NT ->
        assert(st[t] == ABSENT || st[t] == DONE || st[t] == FAILED || (changed && st[t] == HELD));
        t++
    :: else -> break
    od
}

init {
    byte t, r;
    atomic {
        r = 0;
        do :: r < NR -> run Reader(r); r++ :: else -> break od;
        t = 0;
        do :: t < NT -> run Inserter(t); t++ :: else -> break od;
        run Operator()
    }
}
