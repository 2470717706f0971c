/*
 * singleflight.pml -- Promela model of the concurrency protocol of
 * singleflight::group (include/singleflight/group.hpp and detail/*.hpp since the
 * core cut) for one key, so one shard: the shard mutex, the flight's broadcast word
 * (detail/group/signal.hpp, blocking_waiters.hpp), the claim / leave exchange on
 * waiter::state (claim.hpp: a blocked waiter is unlinked before the CAS that claims
 * it), the wake_batch notified after the mutex is released (wake_batch.hpp,
 * notification.hpp), and the users_ bookkeeping that close() waits for.
 *
 * Processes (each names the code it stands for; README.md has the full table):
 *   Caller(i)  x3 (or 2)  call_with() -> route() -> lead() / lead_inline() /
 *                         wait_outcome() / observe() (blocking_calls.hpp); deliver()
 *   Token(i)              the caller's std::stop_token: fires once or never;
 *                         request_stop() runs the registered callback
 *                         (wake_on_stop / leave_on_stop) on the firing thread
 *   Worker(f)             task_impl::run() -> run_task(), or ~task_impl ->
 *                         task_dropped() (-DEXECUTOR); its thread is joined by close()
 *   Timer                 timer_loop() (-DDEADLINE), plus observe()'s wait_until
 *   Closer                close() == close_until(nullopt) from outside fn (-DCLOSE),
 *                         then the owner destroys the group (ghost `destroyed`)
 *   Forget                forget(key), once (-DFORGET)
 *   Monitor / Watchdog    safety invariants in every state / checks in terminal states
 *   Eraser                (-DCLAIM_CAS_FIRST only) the rest of claim_if after the CAS: erase()
 * With -DASYNC, each of the last NASYNC callers is an async caller (async_do / co_do):
 *   ANode(i)              the async_do thread: start(), attach(first), lead_async()
 *   Agent(i)              go_again() -> attach() on the thread that notified it
 *   AToken(i)             its stop_token; request_stop() runs async_stopped()
 *   Delivery              delivery_loop(): the group's delivery thread, which notifies
 *                         the async waiters that timer_loop() and leave_on_stop hand it
 *                         (queue_delivery); joined by close() after the timer
 *
 * The order of effects (group.hpp "Where user code runs"): a step that settles flights
 * requests stop on every one of them before it notifies any waiter (close_until,
 * timer_loop, call_with, async_stopped, leave_on_stop, lead_async); the timer and
 * leave_on_stop run no callback (their async waiters go to Delivery); a notification
 * loop with observers is registered with a user count of its own (notify, loop_record),
 * and a callback of that loop that blocks inside the group first runs the rest of the
 * loop and the flights it deferred (drain_own, run_loop). -DBLOCKING_CB lets on_done
 * block (a retry with a blocking do_, or close()); -DOLD_NOTIFY_ORDER,
 * -DNO_DELIVERY_THREAD and -DNO_DRAIN_OWN restore the code before that commit.
 *
 * Locks. Every shard-mutex critical section is one atomic { } and touches the
 * group state only there. Blocked waiters have no lock of their own: each sleeps on
 * its flight's word (flight_signal, fsig[f]): await() reads the word, then checks
 * its own state (claimed?) and its stop flag, then futex-waits "while the word is
 * what I read" (the compare and the enqueue are one step, as in the kernel); a
 * settle that claims blocked waiters bumps the word under the mutex (add_blocked)
 * and, after unlocking, clears the flight's wake_pending and wakes every sleeper
 * (wake_blocked: one broadcast per flight); a caller's stop (wake_on_stop) sets its
 * flag, bumps and wakes. A claimed waiter reads its outcome with no lock and may
 * return at once, so the settler must not touch it after the CAS: claim_if unlinks
 * a blocked waiter first (ghost wfree: its storage is gone). waiter::state is an
 * atomic; each CAS is one step. Spurious futex wake-ups are not modelled (they
 * only wake a waiter that then looks again).
 *
 * Every group-touching step asserts TOUCH(who): the group has not been
 * destroyed, and (for callers, tasks and the leave_on_stop callback) the
 * thread still counts in users_ -- the invariant close() relies on.
 *
 * Configuration macros (spin -D...):
 *   NCALLERS=3|2     callers (default 3)
 *   POLICY=0|1|2     ownership::waiters | group | leader
 *   NO_FN_ERROR      fn never throws (returns a value, or hangs until stopped)
 *   EXECUTOR         executor mode (thread_executor-like Worker per flight)
 *   SUBMIT_FAIL      executor mode: task creation throws, the executor throws
 *                    (keeping the task or not), drops it inside submit, or drops it later
 *   DEADLINE         options.timeout > 0
 *   CLOSE            a concurrent close(), then destruction of the group
 *   FORGET           a concurrent forget(key)
 *   FIX_SUBMIT_WINDOW  the proposed fix for the executor-leader bug (README.md):
 *                    lead() links the leader's waiter only after re-locking
 *   FIX_SUBMIT_STOP  the proposed fix for the kept-task bug (README.md): a flight
 *                    settled by a failed submit also has its token stopped
 *   NO_COUNTED_CHECK drop the "still counted in users_" half of TOUCH (to show
 *                    the destroyed-group half catches the same hazards alone)
 *   ASYNC            the last NASYNC callers (default 1) are async callers (async_do /
 *                    co_do): ANode(i) + AToken(i) + Agent(i) instead of Caller + Token
 *   FIX_FN_OWNED     the proposed fix for the fn-lifetime bug (README.md): a node going
 *                    round again that leads hands fn to a runner that owns it, so
 *                    delivering the node (on_done; delete, or resuming the coroutine)
 *                    while fn runs frees nothing in use
 *   FIX_DEFER_LEAD   the proposed fix for the stuck-batch bug (README.md): a notifier
 *                    re-attaches every async observer of its batch first and runs the
 *                    fns of the flights they started only after the whole batch
 *   ASYNC_EARLY_DESTROY  the owner may destroy the group once every async_do has made
 *                    its first locked step (not: has returned) -- the blocking callers'
 *                    rule; async_do's immediate-cancel race breaks it (README.md)
 *   BLOCKING_CB      (with ASYNC) the on_done of a notified async waiter (delivered by
 *                    a notification loop, by Delivery, or after going round again) may
 *                    commit to block inside the group, standing for a retry with a
 *                    blocking do_ for the same key or a close(): first until the fn of
 *                    its own flight has returned, then, unless the group is closed, for
 *                    the flight it then finds for the key (until it settles if pending,
 *                    until its fn returns if winding down); see CB_WAIT
 *   BLOCKING_CB_AGAIN_ONLY  (with BLOCKING_CB) only the on_done of a node delivered
 *                    after going round again may block (a smaller state space for the
 *                    three-caller rows about the notification loop's own work)
 *   NO_STOPS         no caller's token ever fires (a smaller state space, for the rows
 *                    that need three callers)
 *   STRICT_BATCH     (with BLOCKING_CB) no waiter may stay claimed and unnotified behind
 *                    an on_done that blocks, in any batch (what README "Re-entrancy" says:
 *                    "first notifies the rest of that thread's batch"); notification.hpp does
 *                    that only for batches with observers, so this must fail (README.md)
 * The code before "Where user code runs" (must fail with -DBLOCKING_CB):
 *   OLD_NOTIFY_ORDER   every settling step notifies its waiters first and requests stop
 *                      after (wake.signal_all(), then request_stop / stop_all)
 *   NO_DELIVERY_THREAD timer_loop() and leave_on_stop notify async waiters themselves,
 *                      on the timer thread / inside the stop callback
 *   NO_DRAIN_OWN       a callback that blocks inside the group does not first run the
 *                      rest of its notification loop and the flights deferred in it
 * The claim/leave exchange and the broadcast word (must fail):
 *   CLAIM_CAS_FIRST    claim_if claims a blocked waiter by the CAS first and unlinks it
 *                      after (the order before the TSan fix): the claimed waiter may see
 *                      its claim and return (its waiter, in its frame, gone) while the
 *                      settler, still holding the mutex, unlinks it. The settler's
 *                      remaining writes to the waiter are a process of their own (Eraser)
 *                      and, while they are due, only the claimed caller and its token
 *                      move (provided clauses: the settler holds the mutex)
 *   SIGNAL_LOAD_LATE   await() checks its state first and reads the word after: a
 *                      claim and its broadcast in between are lost (the waiter sleeps on
 *                      the new value)
 *   WAKE_PENDING_LATE  wake_blocked() wakes first and clears wake_pending after: a second
 *                      settle of the same flight in between skips its own wake
 * Broken variants (must be rejected):
 *   UNCONDITIONAL_CLEANUP  finish() erases the key's entry, not its own node
 *   RELOCK_AFTER_CLAIM     a claimed follower, once signalled, retakes the group
 *                          mutex to read its outcome (the settler counted it out)
 *   NO_REARM_STOP_CHECK    an async observer going round again does not read its
 *                          stop flag after rearm() (a stop that came while it was
 *                          claimed is lost)
 */

#ifndef POLICY
#define POLICY 0
#endif
#define P_WAITERS 0
#define P_GROUP   1
#define P_LEADER  2

#define NC 3
#ifndef NCALLERS
#define NCALLERS 3
#endif
#define NF 4            /* flight ids 1..3 (seq_): each caller leads at most once */

/* detail::outcome_kind */
#define K_PENDING   0
#define K_VALUE     1
#define K_ERROR     2   /* fn_error */
#define K_CANCELLED 3
#define K_CLOSED    4
#define K_TIMEOUT   5
#define K_DROPPED   6

/* waiter::state */
#define W_WAITING 0
#define W_CLAIMED 1
#define W_LEAVING 2

/* registered stop_callback of a caller's token */
#define CB_NONE  0
#define CB_WAKE  1      /* wake_on_stop  */
#define CB_LEAVE 2      /* leave_on_stop */

/* ghost: where a caller is */
#define C_RUN   0
#define C_BLK   1       /* block(): in wait_outcome() or observe()   */
#define C_FN    3       /* inline leader running fn                   */
#define C_DONE  4
#define C_SIG   5       /* (ASYNC) outcome decided; signalling its batch (may run a go-again) */

/* caller's next step */
#define PH_JOIN    1    /* wait_outcome() */
#define PH_OBSERVE 2    /* observe()      */
#define PH_LEAD    3    /* lead() / lead_inline() after the insert */
#define PH_EXIT    4    /* ticket decided under the lock, not accounted: exit_user() */
#define PH_DONE    5    /* lock released: signal the batch, request_stop, deliver */

#define K_KEEP      9   /* (async) attach: unlock, copy key and fn into the node, go round */

/* async callers: the last NASYNC of the NCALLERS */
#ifdef ASYNC
#ifndef NASYNC
#define NASYNC 1
#endif
#define AS(j) ((j) >= NCALLERS - NASYNC && (j) < NCALLERS)
#else
#define AS(j) false
#endif

/* executor submission (lead()) */
#define S_OK      0
#define S_NOTASK  1     /* make_unique threw: handed_off == false */
#define S_KEPT    2     /* the executor threw but kept the task */
#define S_DROPIN  3     /* the executor destroyed the task inside submit() */

/* ---- group state: guarded by mu_ ------------------------------------------- */
byte map_slot;          /* map_: the flight the key's entry points to; 0 = none */
byte seq_;
byte users;             /* users_ */
bool closed;
bool timer_stop;

/* detail::flight<T>, indexed by seq (1..3) */
byte fkind[NF];
byte fwaiters[NF];
bool fn_done[NF];
bool fhome[NF];         /* home != nullptr */
bool flive[NF];         /* on live_ */
bool fsubmitting[NF];
bool fdropin[NF];       /* dropped_in_submit */
bool fstop[NF];         /* f->stop.request_stop() called (not guarded by mu_) */
byte fleader[NF];       /* ghost */
bool fforgot[NF];       /* ghost: forget() detached it */
bool fsole[NF];         /* ghost: the leader kept the value (ticket::sole) */
bool freaders[NF];      /* ghost: another caller copies f->value */
bool tcounted[NF];      /* ghost: the task of flight f counts in users_ */
byte fwq[NF];           /* wake_pending: _pid + 1 of the process whose batch will wake f
                           (wake_batch::add_blocked queued it), 0 when false */
bool wstarted[NF];      /* ghost: a Worker thread exists for f */
bool wdone[NF];         /* ghost: ...and has ended (joinable) */

/* detail::waiter, one per caller */
byte wf[NC];            /* its flight (guarded by mu_ while linked) */
bool wlinked[NC];       /* guarded by mu_ */
bool wobs[NC];          /* observer; guarded by mu_ */
byte wstate[NC];        /* std::atomic state */
bool stop_fired[NC];    /* blocking_waiter::stop_fired, an atomic (under mu_ for an inline leader) */
byte wslp[NC];          /* the flight whose word waiter i sleeps on (futex queue); 0: awake */
bool wchg[NC];          /* flight_signal's word, as waiter i sees it: it has changed since
                           waiter i read it in await() (the 32-bit word never wraps here, so
                           "changed" is exactly "was bumped"; fewer states than its value) */
bool wfree[NC];         /* ghost: call_with returned after a claim: waiter i's storage is gone */
byte cst[NC];           /* ghost: C_* */
bool counted[NC];       /* ghost: this call counts in users_ */
bool entered[NC];       /* ghost: made its first call into the group */
bool obs_armed[NC];     /* route()'s wait_deadline is set */
bool obs_dl[NC];        /* ...and has passed */

/* the caller's stop_token and its stop_callback */
bool tok_fired[NC];
byte cbk[NC];
byte cbf[NC];
byte cb_running[NC];    /* 1: a leave_on_stop (or async_stopped) is running on the token's
                           thread; 2: a wake_on_stop is (between its bump and its wake) */

#ifdef ASYNC
/* group::async_node (index = caller index; wf/wlinked/wobs/wstate/counted are shared
   with the blocking waiters above) */
bool stop_flag[NC];     /* n->stop_flag (seq_cst atomic) */
bool acb[NC];           /* n->cb engaged: the stop callback async_stopped is registered */
bool wisl[NC];          /* n->is_leader; guarded by mu_ */
bool haskey[NC];        /* n->has_key: key and fn live in the (callback) node */
bool ob_linked[NC];     /* on the timer's list of async observers' bounds (-DDEADLINE) */
byte ares[NC];          /* n->result */
byte again[NC];         /* notify handshake with Agent(j): 0 idle, 1 go again, 2 done */
byte adel[NC];          /* ghost: times delivered (on_done called / coroutine resumed) */
byte aarr[NC];          /* ghost: flights settled when async_do arrived */
bool ainside[NC];       /* ghost: async_do still running on the caller's thread */
bool fbusy[NC];         /* ghost: a thread runs fn out of node j's storage */
bool lcounted[NF];      /* ghost: lead_async's thread for flight f counts in users_ */
byte wafter[NC];        /* ghost: the waiters linked to the same flight before j (list order) */
#ifndef NO_DELIVERY_THREAD
/* the delivery thread (timer_loop / leave_on_stop -> queue_delivery -> delivery_loop) */
byte dq;                /* delivery_q_: async waiters queued, as a mask (guarded by mu_) */
bool delivery_stop;     /* delivery_stop_ (guarded by mu_) */
bool delivery_exited;   /* ghost: delivery_loop returned (joinable) */
byte dlv_cb;            /* ghost: j + 1 while Delivery runs async waiter j's on_done */
#endif
#ifdef BLOCKING_CB
/* a blocking on_done (CB_WAIT): where it is, and what it waits for */
#define CBP_DRAIN 1     /* chosen to block; its thread first runs the rest of its loop */
#define CBP_OWN   2     /* waits for the fn of its own flight cbw[j] to return */
#define CBP_JOIN  3     /* retry joined the pending flight cbw[j]: waits until it settles */
#define CBP_OBS   4     /* retry observes the winding-down flight cbw[j]: waits for its fn */
byte cbph[NC];
byte cbw[NC];
byte hb[NC];            /* ghost: the waiters held back, unnotified, behind j's blocked on_done */
bool fstarted[NF];      /* ghost: a thread entered flight f's fn (invoke_fn) */
#endif
#endif

/* notify(): registered notification loops (loop_record), each holding one user count */
byte loopc;

byte cok;               /* claim(): the CAS won (a temporary, 0 between steps) */
#ifdef CLAIM_CAS_FIRST
#ifdef ASYNC
#error "CLAIM_CAS_FIRST is modelled for blocking callers only"
#endif
/* claimed blocked waiters the settler has still to unlink (it holds the mutex meanwhile):
   while any is due, only the Eraser, those callers and their tokens move */
byte edue;
byte pown[24];          /* _pid -> 1 + the index of the caller a Caller/Token process is */
#define PROV provided (edue == 0 || (pown[_pid] != 0 && (edue & (1 << (pown[_pid] - 1))) != 0))
#define PROV_MONITOR provided (edue == 0)
/* a claimed observer's relock waits for the settler's unlock */
#define ERASED(i) (edue & (1 << i)) == 0 ->
#else
#define PROV
#define PROV_MONITOR
#define ERASED(i)
#endif

byte cl_state;          /* ghost: 0 idle, 1 draining, 2 returned */
bool destroyed;         /* ghost: ~group has run (after close() returned) */
bool forget_done;
bool timer_exited;

/* A wake batch (a process's local `bat`), as a mask: bit j (1 << j): waiter j is claimed
   and not yet notified; 8: the loop is registered (notify with observers); 16 << j: the
   go-again of j started a flight whose fn runs after the loop (FIX_DEFER_LEAD); 256 << j:
   on_done of j blocks once the rest of the loop has run (BLOCKING_CB, drain_own); 2048 <<
   j: the same for the on_done that Agent(j) runs after going round again. */
#if defined(BLOCKING_CB) && !defined(NO_DRAIN_OWN)
#define BATCH short
#else
#define BATCH byte
#endif

/* ---- properties -------------------------------------------------------------- */

#ifdef NO_COUNTED_CHECK
#define TOUCH(i)  assert(!destroyed)
#define TOUCHT(g) assert(!destroyed)
#define TOUCHA(i) assert(!destroyed)
#define TOUCHL(g) assert(!destroyed)
#else
/* a caller (or its leave_on_stop) touching the group must still count in users_ */
#define TOUCH(i)  assert(!destroyed && counted[i])
/* a task touching the group must still count in users_ */
#define TOUCHT(g) assert(!destroyed && tcounted[g])
/* an async caller's stop callback (or async_do itself) taking the group's mutex: the
   node counts in users_, or async_do has not returned yet (the owner's contract:
   ~group does not run concurrently with any member call) */
#define TOUCHA(i) assert(!destroyed && (counted[i] || ainside[i]))
/* lead_async's thread, back from the hand-off: it counts in users_ until then */
#define TOUCHL(g) assert(!destroyed && lcounted[g])
#endif

#define RUNNING(g) ((seq_ >= g && !fn_done[g] && !fforgot[g]) -> 1 : 0)
#define FLIGHT_OK(g) \
  (fwaiters[g] <= NC && !(fsole[g] && freaders[g]) && (!fhome[g] || map_slot == g))
#ifdef ASYNC
#define LUSERS ((lcounted[1] -> 1 : 0) + (lcounted[2] -> 1 : 0) + (lcounted[3] -> 1 : 0))
#else
#define LUSERS 0
#endif
#define USERS \
  ((counted[0] -> 1 : 0) + (counted[1] -> 1 : 0) + (counted[2] -> 1 : 0) + \
   (tcounted[1] -> 1 : 0) + (tcounted[2] -> 1 : 0) + (tcounted[3] -> 1 : 0) + LUSERS + loopc)

#define INV \
  ( (RUNNING(1) + RUNNING(2) + RUNNING(3) <= 1) \
 && (map_slot == 0 || !fn_done[map_slot]) \
 && FLIGHT_OK(1) && FLIGHT_OK(2) && FLIGHT_OK(3) \
 && users == USERS )

/* At a terminal state a caller is done, runs a hung fn (HUNG_OK judges it), or
   is asleep on its flight's word legitimately: unclaimed, token unfired, and still
   something to wait for. Asleep while claimed is a lost wake-up: never legitimate
   (a blocked waiter is woken before any callback of its batch runs, so no blocking
   callback can hold it back). */
#ifdef DEADLINE
#define NO_DL(i) !obs_dl[i]
#else
#define NO_DL(i) true
#endif
#define CALLER_OK(i) \
  ( cst[i] == C_DONE || cst[i] == C_FN || cst[i] == C_SIG \
 || (cst[i] == C_BLK && wslp[i] != 0 && wstate[i] == W_WAITING && !tok_fired[i] \
     && !stop_fired[i] && \
     ((!wobs[i] && fkind[wf[i]] == K_PENDING) || \
      (wobs[i] && !closed && !fn_done[wf[i]] && !fforgot[wf[i]] && NO_DL(i)))) )

/* caller j still wants flight g (waits for it, token unfired) */
#ifdef ASYNC
#define AWANTS(j, g) (AS(j) && wlinked[j] && !wobs[j] && wf[j] == g && wstate[j] == W_WAITING && !tok_fired[j])
#else
#define AWANTS(j, g) false
#endif
#define WANTS(j, g) \
  ((((cst[j] == C_BLK && !wobs[j]) || cst[j] == C_FN) && wf[j] == g && !tok_fired[j]) || AWANTS(j, g))
#if POLICY == P_WAITERS
#define OWNED(g) (WANTS(0, g) || WANTS(1, g) || WANTS(2, g))
#elif POLICY == P_LEADER
#define OWNED(g) WANTS(fleader[g], g)
#else
#define OWNED(g) true
#endif
/* a fn still running at a terminal state hangs until stopped: legitimate only
   if its token was never stopped, the flight is pending and the policy says
   someone still wants it ("the last waiter leaving stops the work") */
#define HUNG_OK(g) \
  ( !(seq_ >= g && !fn_done[g]) || (!fstop[g] && fkind[g] == K_PENDING && OWNED(g)) )

/* At a terminal state an async caller has been delivered exactly once, or waits
   legitimately: linked, unclaimed, token unfired, and still something to wait for.
   (With -DDEADLINE a linked async observer is always due for the timer.) */
#ifdef ASYNC
#define ANODE_OK(j) \
  ( !AS(j) || adel[j] == 1 || QUEUED_OK(j) || (wstate[j] == W_CLAIMED && HELD(j)) \
 || (wlinked[j] && wstate[j] == W_WAITING && !tok_fired[j] && \
     ((!wobs[j] && fkind[wf[j]] == K_PENDING) || \
      (wobs[j] && !closed && !fn_done[wf[j]] && !fforgot[wf[j]]))) )
#else
#define ANODE_OK(j) true
#endif

/* A blocking on_done (-DBLOCKING_CB) at a terminal state: not blocked; still waiting for
   its thread to run the rest of its notification loop (that thread is judged where it
   stands); or joined to a pending flight whose fn has started and not returned (HUNG_OK
   judges that fn: someone else still wants it). Blocked on a settled flight's fn, or on
   a flight whose fn never starts, is a deadlock. */
#ifdef BLOCKING_CB
#define CB_OK(j) \
  ( cbph[j] == 0 || cbph[j] == CBP_DRAIN || \
    (cbph[j] == CBP_JOIN && fkind[cbw[j]] == K_PENDING && fstarted[cbw[j]] && !fn_done[cbw[j]]) )
/* waiter k is held back (claimed, unnotified) behind an on_done that blocks legitimately
   in a batch without observers (CB_HOLD) */
#define HOLDS(j, k) (((hb[j] >> k) & 1) && cbph[j] == CBP_JOIN && CB_OK(j))
#ifndef STRICT_BATCH
#define HELD(k) (HOLDS(0, k) || HOLDS(1, k) || HOLDS(2, k))
#else
#define HELD(k) false   /* README "Re-entrancy": the rest of the batch is notified first */
#endif
#else
#define CB_OK(j) true
#define HELD(k) false
#endif

/* An async waiter still queued for the delivery thread at a terminal state: only behind
   an on_done that Delivery runs and that blocks legitimately (what delivery_loop says:
   "a callback that blocks delays the next deliveries of this thread, never a deadline"). */
#if defined(ASYNC) && defined(BLOCKING_CB) && !defined(NO_DELIVERY_THREAD)
#define QUEUED_OK(j) \
  ( (dq & (1 << j)) != 0 && dlv_cb != 0 && cbph[dlv_cb - 1] == CBP_JOIN && CB_OK(dlv_cb - 1) )
#else
#define QUEUED_OK(j) false
#endif

/* Every deadline fires: at a terminal state, while the timer runs, no flight is pending
   and no async observer's bound is waiting (the timer could act: it is not held up). */
#ifdef DEADLINE
#ifdef ASYNC
#define OB_WAITING (ob_linked[0] || ob_linked[1] || ob_linked[2])
#else
#define OB_WAITING false
#endif
#define TIMER_OK \
  ( timer_stop || \
    !((seq_ >= 1 && fkind[1] == K_PENDING) || (seq_ >= 2 && fkind[2] == K_PENDING) || \
      (seq_ >= 3 && fkind[3] == K_PENDING) || OB_WAITING) )
#else
#define TIMER_OK true
#endif

#define SETTLED_MASK \
  (((seq_ >= 1 && fkind[1] != K_PENDING) -> 2 : 0) | \
   ((seq_ >= 2 && fkind[2] != K_PENDING) -> 4 : 0) | \
   ((seq_ >= 3 && fkind[3] != K_PENDING) -> 8 : 0))

/* ---- state transitions (under mu_, inside atomic) ------------------------------ */

/* waiter_list::claim_if for one waiter: obs == false is settle() (followers,
   counted out: exit_user() on their behalf), obs == true claim_observers()
   (observers stay users). An async waiter: the CAS, then unlinked; a leaving one
   stays linked (it unlinks itself). A blocked waiter: unlinked first, then the CAS
   (it may run off as soon as it sees the claim); a leaving one finds itself
   unlinked. A claimed blocked waiter goes into the batch as its flight
   (add_blocked: bump the word; queue the flight for one broadcast unless another
   batch's broadcast is still due, fwq); an async one as itself (bit j). */
/* flight_signal::bump(): the word changes for every blocked waiter of fl in await() (for
   one already asleep the change only matters once it is woken and reads it again) */
#define BUMP1(k, fl) if :: cst[k] == C_BLK && wf[k] == fl -> wchg[k] = true :: else -> skip fi
inline bump(fl) {
  BUMP1(0, fl); BUMP1(1, fl); BUMP1(2, fl)
}
inline add_blocked(fl) {
  bump(fl);
  if :: fwq[fl] == 0 -> fwq[fl] = _pid + 1 :: else -> skip fi
}
#ifndef CLAIM_CAS_FIRST
#define CLAIM_BLOCKED(j, fl) \
  assert(!wfree[j]); wlinked[j] = false; \
  if :: wstate[j] == W_WAITING -> wstate[j] = W_CLAIMED; cok = true :: else -> cok = false fi
#else
/* BROKEN (the order before the TSan fix): the CAS, then the unlink, which the
   Eraser process does as the settler's next step while the mutex is still held */
#define CLAIM_BLOCKED(j, fl) \
  if :: wstate[j] == W_WAITING -> wstate[j] = W_CLAIMED; cok = true; wlinked[j] = false; edue = edue | (1 << j) \
     :: else -> cok = false fi
#endif
inline claim(j, fl, obs, b) {
  if
  :: wlinked[j] && wf[j] == fl && wobs[j] == obs && !AS(j) ->
       CLAIM_BLOCKED(j, fl);
       if
       :: cok ->
            if :: !obs -> users--; counted[j] = false :: else -> skip fi;
            add_blocked(fl); cok = false
       :: else -> skip
       fi
#ifdef ASYNC
  :: wlinked[j] && wf[j] == fl && wobs[j] == obs && AS(j) && wstate[j] == W_WAITING ->
       wstate[j] = W_CLAIMED; wlinked[j] = false;
       assert(adel[j] == 0);
       if :: obs -> ob_linked[j] = false :: else -> skip fi;   /* unlink_wait_deadline */
       if
       :: !obs -> users--; counted[j] = false
       :: else -> skip
       fi;
       b = b | (1 << j)
#endif
  :: else -> skip
  fi
}
inline claim_all(fl, obs, b) {
  claim(0, fl, obs, b); claim(1, fl, obs, b); claim(2, fl, obs, b)
}

inline settle(fl, kk, b) {
  assert(fkind[fl] == K_PENDING);
  fkind[fl] = kk;
  claim_all(fl, false, b)
}

/* leave(f, is_leader); stp: whether f's token must be stopped */
inline leave(fl, isl, stp, b) {
  fwaiters[fl]--;
  stp = false;
  if
  :: fkind[fl] == K_PENDING &&
     ((POLICY == P_WAITERS && fwaiters[fl] == 0) || (POLICY == P_LEADER && isl)) ->
       settle(fl, K_CANCELLED, b);
       stp = true
  :: else -> skip
  fi
}

/* finish(f, k) */
inline finish(fl, kk, b) {
  fn_done[fl] = true;
  if
  :: fkind[fl] == K_PENDING -> settle(fl, kk, b)
  :: else -> skip
  fi;
#ifndef UNCONDITIONAL_CLEANUP
  if
  :: fhome[fl] -> assert(map_slot == fl); map_slot = 0; fhome[fl] = false
  :: else -> skip
  fi;
#else
  /* BROKEN: map_.erase(key) */
  if
  :: map_slot != 0 -> fhome[map_slot] = false; map_slot = 0
  :: else -> skip
  fi;
  fhome[fl] = false;
#endif
  flive[fl] = false;
  claim_all(fl, true, b)
}

/* the caller's own exit_user() (drain_cv_ notify: the Closer waits on users == 0) */
inline exit_self() { users--; counted[i] = false }
inline exit_task(fl) { users--; tcounted[fl] = false }

#ifdef ASYNC
/* deliver(n) for async caller j: n->cb.reset() (done by the caller of this), then
   complete(): on_done runs and the callback node is deleted, or the coroutine is
   resumed (and the co_do expression's temporaries -- key, fn -- go away). Exactly
   once; never while the node is linked or counted; never while a thread still runs
   fn out of the node (FIX_FN_OWNED: the runner owns fn). */
inline a_complete(j) {
  assert(adel[j] == 0 && ares[j] != K_PENDING && !wlinked[j] && !counted[j]);
#ifndef FIX_FN_OWNED
  assert(!fbusy[j]);
#endif
  adel[j] = 1
}

/* waiter::notify for async caller j (async_node::on_notify), by the thread that claimed
   it, after the group mutex is released (see signal_all). An observer goes round again
   (go_again -> attach) on this very thread: Agent(j) runs it while this process waits
   (a_request, A_WAIT), so this process's later steps happen only once that is over,
   exactly as in the C++ (the go-again may start a flight and run its fn inline, here).
   Otherwise deliver() (a_deliver_claimed): wait for a stop callback in flight (it lost
   its CAS and returns), then on_done. */
inline a_request(j, b) {
  assert(wstate[j] == W_CLAIMED && !wlinked[j] && adel[j] == 0);
  again[j] = 1; b = b - (1 << j)
}
#ifdef FIX_DEFER_LEAD
/* ...or it leads: run its fn after the batch */
#define A_DEFER(j, b) :: atomic { again[j] == 3 -> b = b | (16 << j) }
#else
#define A_DEFER(j, b)
#endif
#if defined(BLOCKING_CB) && !defined(NO_DRAIN_OWN)
/* ...or its on_done (delivered after going round again) blocks: it first runs the rest of
   this loop (drain_own), so carry on and let it block at the end (Agent(j) waits at 5) */
#define A_DRAIN(j, b) :: atomic { again[j] == 5 -> b = b | (2048 << j) }
#else
#define A_DRAIN(j, b)
#endif
#define A_WAIT(j, b) if :: atomic { again[j] == 2 -> again[j] = 0 } A_DEFER(j, b) A_DRAIN(j, b) fi
inline a_deliver_claimed(j, b) {
  assert(wstate[j] == W_CLAIMED && !wlinked[j] && adel[j] == 0);
  if
  :: ares[j] == K_PENDING ->
       /* published by the settle that claimed it */
       ares[j] = fkind[wf[j]];
       assert(ares[j] != K_PENDING && (aarr[j] & (1 << wf[j])) == 0);
       if :: ares[j] == K_VALUE -> freaders[wf[j]] = true :: else -> skip fi
  :: else -> skip                         /* the timer's timeout for an observer */
  fi;
  acb[j] = false;                         /* deliver(): cb.reset() */
  a_complete(j);
  b = b - (1 << j)
}

#endif

#ifdef BLOCKING_CB
/* on_done of async caller j, once delivered (-DBLOCKING_CB), commits to one of: return at
   once; or block inside the group, standing for a retry with a blocking do_ for the same
   key, or for close(): first until the fn of its own flight has returned (CBP_OWN: what
   close() waits for, and what the retry waits for while that flight is still the key's
   entry); then, unless the group is closed (the retry gets closed_error), for the flight
   it finds for the key (route()): until it settles if pending (joined, CBP_JOIN), until
   its fn returns if winding down (observed, CBP_OBS); none: it would lead, and returns.
   The retry does not count as a waiter here (lenient: a flight it joined may still be
   cancelled by the others leaving; it only waits less). A blocking do_ and close() first
   run what their thread holds back (drain_own): see signal_all. CB_WAIT(j, g, fin): g,
   an extra guard for the first wait; fin, a statement run with the last step (a cpp
   macro: Promela inlines take no statements as arguments). */
#define CB_WAIT(j, g, fin) \
  if \
  :: cbph[j] == 0 -> fin \
  :: cbph[j] != 0 -> \
end_cbown: \
     atomic { \
       (g) && fn_done[cbw[j]] -> \
       if \
       :: closed || map_slot == 0 -> cbph[j] = 0; cbw[j] = 0; fin \
       :: else -> cbw[j] = map_slot; cbph[j] = (fkind[map_slot] == K_PENDING -> CBP_JOIN : CBP_OBS) \
       fi \
     }; \
     if \
     :: cbph[j] == CBP_JOIN -> \
end_cbjoin: atomic { fkind[cbw[j]] != K_PENDING -> cbph[j] = 0; cbw[j] = 0; fin } \
     :: cbph[j] == CBP_OBS -> \
end_cbobs: atomic { fn_done[cbw[j]] -> cbph[j] = 0; cbw[j] = 0; fin } \
     :: cbph[j] == 0 -> skip \
     fi \
  fi
/* drain_own() finds only registered loops (notify(): a batch with observers, bit 8): in
   a batch without observers an on_done that blocks does so right where it is, and the
   waiters after it in the batch stay claimed, unnotified, until it returns (their own
   stop cannot free them). README: "a callback that blocks delays the rest"; hb[j]
   records them for the Watchdog (HELD). */
#define CB_HOLD(j, b) if :: (b & 8) -> skip :: else -> hb[j] = b & 7 fi
#ifdef NO_DRAIN_OWN
/* BROKEN: the callback blocks right where it was notified, registered loop or not */
#define CB_CHOOSE(j, b) if :: skip :: cbph[j] = CBP_OWN; cbw[j] = wf[j]; CB_HOLD(j, b) fi
#else
/* in a registered loop it first runs the rest of the loop (and the flights deferred in
   it), then blocks */
#define CB_CHOOSE(j, b) \
  if \
  :: skip \
  :: cbw[j] = wf[j]; \
     if \
     :: (b & 8) -> cbph[j] = CBP_DRAIN; b = b | (256 << j) \
     :: else -> cbph[j] = CBP_OWN; hb[j] = b & 7 \
     fi \
  fi
#endif
#ifdef BLOCKING_CB_AGAIN_ONLY
/* only the on_done of a node delivered after going round again may block (Agent) */
#undef CB_CHOOSE
#define CB_CHOOSE(j, b) skip
#endif
#define CB_NOW(j) ; cb_now(j)
inline cb_now(j) {
  if
  :: cbph[j] == CBP_OWN -> CB_WAIT(j, true, hb[j] = 0)
  :: else -> skip
  fi
}
#else
#define CB_CHOOSE(j, b) skip
#define CB_NOW(j)
#endif

/* notify(g, wake): a batch with observers is a notification loop registered in the group
   (loop_record) with a user count of its own (++users_ under the group's mutex, before
   the loop; the observers in the batch still count, so the group is alive). Merged with
   the first notification of the loop: nothing between them can tell (users_ > 0 either
   way). The loop unregisters (--users_, a step of its own, touching the group) after
   the batch and everything deferred in it have run. */
#define HAS_OBS(b) (((b & 1) && wobs[0]) || ((b & 2) && wobs[1]) || ((b & 4) && wobs[2]))
#define OBS_COUNTED(b) \
  (((b & 1) && wobs[0] && counted[0]) || ((b & 2) && wobs[1] && counted[1]) || \
   ((b & 4) && wobs[2] && counted[2]))
#define LOOP_REG(b) \
  if \
  :: (b & 8) == 0 && HAS_OBS(b) -> \
       assert(!destroyed && OBS_COUNTED(b)); users++; loopc++; b = b | 8 \
  :: else -> skip \
  fi;
inline loop_exit(b) {
  if
  :: b & 8 -> atomic { assert(!destroyed && loopc > 0); users--; loopc--; b = b - 8 }
  :: else -> skip
  fi
}

/* flight_signal::wake_all(): every thread asleep on fl's word wakes */
inline wake_all(fl) {
  if :: wslp[0] == fl -> wslp[0] = 0 :: else -> skip fi;
  if :: wslp[1] == fl -> wslp[1] = 0 :: else -> skip fi;
  if :: wslp[2] == fl -> wslp[2] = 0 :: else -> skip fi
}
/* wake_batch::wake_blocked(), after the mutex is released and before any async waiter of
   the batch is notified: for each flight this process's batch queued, clear wake_pending,
   then broadcast. All of them in one step (each broadcast only wakes: nothing the
   sleepers do depends on the order); a second settle that bumps a flight in between
   either still sees wake_pending (and this wake follows its bump) or queues its own. */
#define OWN(g) (fwq[g] == _pid + 1)
/* an empty batch: no async waiter, no flight to wake */
#define NOTHING_TO_WAKE(b) (b == 0 && !OWN(1) && !OWN(2) && !OWN(3))
#ifndef WAKE_PENDING_LATE
inline wake_one(g) {
  if :: OWN(g) -> fwq[g] = 0; wake_all(g) :: else -> skip fi
}
inline wake_blocked() {
  if
  :: OWN(1) || OWN(2) || OWN(3) -> atomic { wake_one(1); wake_one(2); wake_one(3) }
  :: else -> skip
  fi
}
#else
/* BROKEN: broadcast first, clear wake_pending after (fwq = _pid + 101 in between) */
#define WOKE(g) (fwq[g] == _pid + 101)
inline wake_one(g) {
  if :: OWN(g) -> fwq[g] = _pid + 101; wake_all(g) :: else -> skip fi
}
inline clear_one(g) {
  if :: WOKE(g) -> fwq[g] = 0 :: else -> skip fi
}
inline wake_blocked() {
  if
  :: OWN(1) || OWN(2) || OWN(3) ->
       atomic { wake_one(1); wake_one(2); wake_one(3) };
       atomic { clear_one(1); clear_one(2); clear_one(3) }
  :: else -> skip
  fi
}
#endif
#ifdef ASYNC
/* the waiters linked to flight fl, as a mask (taken when j links: who is before it) */
#define LINKED_TO(fl) \
  (((wlinked[0] && wf[0] == fl) -> 1 : 0) | ((wlinked[1] && wf[1] == fl) -> 2 : 0) | \
   ((wlinked[2] && wf[2] == fl) -> 4 : 0))
/* in the order they were claimed: oldest link first (claim_if walks the list from the
   head, wake_batch::add appends), since a go-again can run a whole fn inside the loop */
#define NEXT(j, b) ((b & (1 << j)) && (wafter[j] & b & 7) == 0)
#if defined(BLOCKING_CB) && !defined(NO_DRAIN_OWN)
/* The end of a loop in which on_done callbacks chose to block (bits 256 << j, 2048 << j):
   they have run the rest of it (drain_own) and now block, one after the other (all waits
   are on conditions that stay true once true, so their order does not matter). One whose
   node went round again runs in Agent(j) (again[j]: 5 -> 6, then it sets 2). */
#define CB_ARM(j, b) \
  if \
  :: b & (256 << j) -> cbph[j] = CBP_OWN \
  :: b & (2048 << j) -> cbph[j] = CBP_OWN; assert(again[j] == 5); again[j] = 6 \
  :: else -> skip \
  fi
inline cb_block(j, b) {
  if
  :: b & (2048 << j) ->
end_cbagent: atomic { again[j] == 2 -> again[j] = 0; b = b - (2048 << j) }
  :: b & (256 << j) -> CB_WAIT(j, true, b = b - (256 << j))
  :: else -> skip
  fi
}
inline cb_drained(b) {
  if
  :: (b & 16128) != 0 ->
       atomic { CB_ARM(0, b); CB_ARM(1, b); CB_ARM(2, b) };
       cb_block(0, b); cb_block(1, b); cb_block(2, b)
  :: else -> skip
  fi
}
#else
#define cb_drained(b) skip
#endif
/* wake_batch::signal_all(): the blocked waiters first (wake_blocked), then each async
   waiter in claim order */
inline signal_all(b) {
  wake_blocked();
  do
  :: atomic { NEXT(0, b) && AS(0) && !wobs[0] && !cb_running[0] -> LOOP_REG(b) a_deliver_claimed(0, b); CB_CHOOSE(0, b) } CB_NOW(0)
  :: atomic { NEXT(0, b) && AS(0) && wobs[0] && again[0] == 0 -> LOOP_REG(b) a_request(0, b) };
     end_notify0: A_WAIT(0, b)
  :: atomic { NEXT(1, b) && AS(1) && !wobs[1] && !cb_running[1] -> LOOP_REG(b) a_deliver_claimed(1, b); CB_CHOOSE(1, b) } CB_NOW(1)
  :: atomic { NEXT(1, b) && AS(1) && wobs[1] && again[1] == 0 -> LOOP_REG(b) a_request(1, b) };
     end_notify1: A_WAIT(1, b)
  :: atomic { NEXT(2, b) && AS(2) && !wobs[2] && !cb_running[2] -> LOOP_REG(b) a_deliver_claimed(2, b); CB_CHOOSE(2, b) } CB_NOW(2)
  :: atomic { NEXT(2, b) && AS(2) && wobs[2] && again[2] == 0 -> LOOP_REG(b) a_request(2, b) };
     end_notify2: A_WAIT(2, b)
  :: (b & 7) == 0 -> break
  od
#ifdef FIX_DEFER_LEAD
  /* then run the fns of the flights its go-agains started (Agent(j) waits at 3) */
  ;
  do
  :: atomic { (b & 16) -> again[0] = 4; b = b - 16 }; end_defer0: atomic { again[0] == 2 -> again[0] = 0 }
  :: atomic { (b & 32) -> again[1] = 4; b = b - 32 }; end_defer1: atomic { again[1] == 2 -> again[1] = 0 }
  :: atomic { (b & 64) -> again[2] = 4; b = b - 64 }; end_defer2: atomic { again[2] == 2 -> again[2] = 0 }
  :: (b & 112) == 0 -> break
  od
#endif
  ;
  cb_drained(b);
  loop_exit(b)
}

#ifndef NO_DELIVERY_THREAD
/* timer_loop / leave_on_stop: wake.split(async); wake.signal_all() (blocked threads
   only: no user code); queue_delivery(async) (under the group's mutex; the delivery
   thread notifies them). Their batches hold no observers (settle claims none; the
   timer turns a timed-out async observer into a plain waiter). */
inline signal_split(b) {
  wake_blocked();
  if
  :: (b & 7) != 0 ->
       atomic {
         assert(!destroyed && !delivery_stop && !HAS_OBS(b));
         dq = dq | (b & 7); b = b - (b & 7)
       }
  :: else -> skip
  fi
}
#else
/* BROKEN: the timer / the stop callback notifies its async waiters itself */
#define signal_split(b) signal_all(b)
#endif
#else
/* no async waiters: a batch is its flights' broadcasts (notify(): no observers, no loop) */
#define signal_all(b) wake_blocked()
#define signal_split(b) wake_blocked()
#endif

/* a caller receives f's outcome: settled, and not settled before it arrived
   (guarantee 2); a value someone copies was not kept by the leader (sole) */
inline got_outcome(fl) {
  assert(fkind[fl] != K_PENDING);
  assert((arrg & (1 << fl)) == 0);
  if
  :: out == K_VALUE -> freaders[fl] = true
  :: else -> skip
  fi
}

/* invoke_fn: a value, a throw, or (committed) hang until the flight is stopped */
#ifdef BLOCKING_CB
#define FNS(fl) fstarted[fl] = true;
#else
#define FNS(fl)
#endif
inline invoke_fn(fl, kk) {
  if
  :: atomic { FNS(fl) kk = K_VALUE }
#ifndef NO_FN_ERROR
  :: atomic { FNS(fl) kk = K_ERROR }
#endif
  :: atomic { FNS(fl) skip } ->
end_hang:
     fstop[fl] -> kk = K_ERROR
  fi
}

/* w.reset(as_observer) + f->list.push(w) (for the join and observe cases) */
inline reset_push(fl, obs) {
  wstate[i] = W_WAITING; stop_fired[i] = false;
#ifdef ASYNC
  wafter[i] = LINKED_TO(fl);
#endif
  wobs[i] = obs; wf[i] = fl; wlinked[i] = true
}

/* route(): under the lock */
inline route() {
  if
  :: closed -> out = K_CLOSED; ph = PH_EXIT
  :: !closed && tok_fired[i] -> out = K_CANCELLED; ph = PH_EXIT    /* after an observe */
  :: !closed && !tok_fired[i] && map_slot == 0 ->
       /* lead(): insert, waiters = 1, link_live (and link_deadline) */
       seq_++;
       f = seq_;
       assert(f < NF);
       fkind[f] = K_PENDING; fwaiters[f] = 1; fhome[f] = true; map_slot = f;
       flive[f] = true;
       fleader[f] = i;
       wf[i] = f;
#ifdef EXECUTOR
       users++; tcounted[f] = true;            /* the task is a user */
       fsubmitting[f] = true;
#ifndef FIX_SUBMIT_WINDOW
       reset_push(f, false);                   /* w.reset(false); push; unlock */
#else
       wstate[i] = W_WAITING; stop_fired[i] = false; wobs[i] = false;
#endif
#else
       /* lead_inline(): w.reset(false), not linked */
       wstate[i] = W_WAITING; stop_fired[i] = false; wobs[i] = false;
#endif
       ph = PH_LEAD
  :: !closed && !tok_fired[i] && map_slot != 0 && fkind[map_slot] == K_PENDING ->
       f = map_slot;
       fwaiters[f]++;
       reset_push(f, false);
       isl = false;
       ph = PH_JOIN
  :: !closed && !tok_fired[i] && map_slot != 0 && fkind[map_slot] != K_PENDING ->
       f = map_slot;
#ifdef DEADLINE
       obs_armed[i] = true;
#endif
       reset_push(f, true);
       ph = PH_OBSERVE
  fi;
  if
  :: ph == PH_EXIT -> exit_self(); ph = PH_DONE     /* call_with(): !accounted */
  :: else -> skip
  fi
}

/* wait_outcome() / observe() after unlocking: cb.emplace(caller, wake_on_stop{&w, f})
   (registering is seen only by the Token, so it is merged with the first step), then
   w.await(f, deadline): read the word, then look at the waiter's own state (claimed?)
   and stop flag (and an observer's wait deadline), then futex-wait while the word is
   what it read; then ~stop_callback (waits for a wake_on_stop running elsewhere) and,
   unless claimed, w.try_leave(). A claimed follower reads f->kind with no lock and
   returns from call_with at once: its waiter is gone (wfree). */
#ifdef DEADLINE
#define DL_PASSED (wobs[i] && obs_dl[i])
#else
#define DL_PASSED false
#endif
#ifndef RELOCK_AFTER_CLAIM
#define CLAIMED_FOLLOWER \
  if :: !lv && ph == PH_JOIN -> out = fkind[f]; got_outcome(f); ph = PH_DONE; wfree[i] = true \
     :: else -> skip fi
#else
#define CLAIMED_FOLLOWER skip
#endif
/* await() ends when the waiter is claimed (true), its stop fired or its deadline passed
   (false); then ~stop_callback (a wake_on_stop is one step: nothing to wait for) and,
   unless claimed, try_leave(); a claimed follower takes its outcome. Merged with the
   check that ends await(): a claim or a token firing just before or just after it gives
   the same outcomes, and both orders are explored. */
#define AWAIT_DONE (wstate[i] == W_CLAIMED || stop_fired[i] || DL_PASSED)
#define AWAIT_END \
  assert(!cb_running[i]); cbk[i] = CB_NONE; cbf[i] = 0; cst[i] = C_RUN; \
  if \
  :: wstate[i] == W_WAITING -> wstate[i] = W_LEAVING; lv = true \
  :: else -> lv = false \
  fi; \
  CLAIMED_FOLLOWER
inline block_then_try_leave() {
  do
  :: atomic {
       if
       :: cst[i] != C_BLK ->
            /* cb.emplace(caller, wake_on_stop{&w, f}) */
            if
            :: tok_fired[i] -> stop_fired[i] = true   /* already stopped: w.stop() runs inline
                                                         (its bump and wake only disturb others) */
            :: else -> cbk[i] = CB_WAKE; cbf[i] = f
            fi;
            cst[i] = C_BLK
#ifndef SIGNAL_LOAD_LATE
       :: else ->
            /* f.signal.wait(seen, deadline): the compare and the enqueue are one step */
            if
            :: wchg[i] -> skip
            :: else ->
                 wslp[i] = f;
end_sleep:       (wslp[i] == 0 || DL_PASSED) -> wslp[i] = 0
            fi
       fi;
       /* await(): read the word, then the checks */
       wchg[i] = false;
       if
       :: AWAIT_DONE -> AWAIT_END; break
       :: else -> skip
       fi
     }
#else
       :: else ->
            /* BROKEN: the word is read after the checks (merged with the futex wait: the
               word has not changed in between, the compare passes) */
            wchg[i] = false; wslp[i] = f;
end_sleep_late: (wslp[i] == 0 || DL_PASSED) -> wslp[i] = 0
       fi
     };
     atomic {
       if
       :: AWAIT_DONE -> AWAIT_END; break
       :: else -> skip
       fi
     }
#endif
  od
}

/* lead_inline() after fn returned, under the lock: finish, the ticket, and
   call_with()'s exit_user(). mv: the value was moved into the flight. */
inline leader_finish() {
  lv = (k == K_VALUE && fkind[f] == K_PENDING && !mv);     /* sole && local */
  finish(f, k, bat);
  out = (stop_fired[i] -> K_CANCELLED : fkind[f]);
  if
  :: lv -> fsole[f] = true; assert(fkind[f] == K_VALUE && (arrg & (1 << f)) == 0)
  :: !lv && out != K_CANCELLED -> got_outcome(f)
  :: else -> skip
  fi;
  exit_self();
  mv = false; lv = false
}

/* ---- processes ---------------------------------------------------------------- */

proctype Worker(byte f; bool may_drop) PROV {
  byte k;
  BATCH bat;
  if
  :: atomic {
       /* task_impl::run() -> run_task() */
       TOUCHT(f);
       if
       :: fn_done[f] -> k = 9                          /* failed at submission */
       :: !fn_done[f] && fkind[f] != K_PENDING ->
            finish(f, fkind[f], bat); exit_task(f); k = 9  /* stopped while queued */
       :: !fn_done[f] && fkind[f] == K_PENDING -> k = 0
       fi
     };
     if
     :: k == 0 ->
          invoke_fn(f, k);
          atomic { TOUCHT(f); finish(f, k, bat); exit_task(f) }
     :: else -> skip
     fi
  :: may_drop ->
       /* ~task_impl without run(): task_dropped() (submitting is false here) */
       atomic {
         TOUCHT(f);
         if
         :: fn_done[f] -> skip
         :: else -> finish(f, K_DROPPED, bat); exit_task(f)
         fi
       }
  fi;
  signal_all(bat);
  /* thread_executor's thread: lock threads_mu_ (a group member); close() joins it */
  atomic { assert(!destroyed); k = 0; wdone[f] = true }
}

proctype Caller(byte i) PROV {
  byte f, k, out, ph, arrg, sub;
  BATCH bat;
  bool stp, isl, lv, mv, own;

  /* call_with(): the first critical section */
  atomic {
    assert(!destroyed);
    entered[i] = true;
    if
    :: closed -> out = K_CLOSED; ph = PH_DONE
    :: !closed && tok_fired[i] -> out = K_CANCELLED; ph = PH_DONE
    :: else ->
         users++; counted[i] = true;
         arrg = SETTLED_MASK;
         route()
    fi
  }
  do
  :: ph == PH_DONE ->
#ifdef ASYNC
     cst[i] = C_SIG;
#endif
     break

  :: ph == PH_JOIN || ph == PH_OBSERVE ->
     /* wait_outcome() / observe(): unlock, block, try_leave */
     block_then_try_leave();
     if
     :: ph == PH_JOIN && lv ->
          /* own stop first: lock, unlink, leave; call_with(): exit_user() */
          atomic {
            TOUCH(i);
            wlinked[i] = false;
            out = K_CANCELLED;
            leave(f, isl, stp, bat);
            exit_self();
            ph = PH_DONE
          }
     :: ph == PH_DONE -> skip          /* a claimed follower (CLAIMED_FOLLOWER) */
     :: ph == PH_JOIN && !lv ->
#ifndef RELOCK_AFTER_CLAIM
          /* claimed: the outcome was read in the same step (CLAIMED_FOLLOWER) */
          assert(false)
#else
          /* BROKEN: once it sees its claim, retake the group mutex to read the outcome */
          atomic { TOUCH(i); out = fkind[f]; got_outcome(f); ph = PH_DONE; wfree[i] = true }
#endif
     :: ph == PH_OBSERVE && lv ->
          /* lock; erase; stop_fired ? cancelled : timeout; rejected: exit_user() */
          atomic {
            TOUCH(i);
            wlinked[i] = false;
            out = (stop_fired[i] -> K_CANCELLED : K_TIMEOUT);
            exit_self();
            ph = PH_DONE
          }
     :: ph == PH_OBSERVE && !lv ->
          /* claimed (fn returned, forget, close): still a user. Lock (held by the
             settler until it has unlinked us: ERASED), closed ? closed : go round
             route() again */
          atomic {
            ERASED(i)
            TOUCH(i);
            if
            :: closed -> out = K_CLOSED; exit_self(); ph = PH_DONE
            :: else -> route()
            fi
          }
     fi

  :: ph == PH_LEAD ->
#ifndef EXECUTOR
     /* lead_inline(): unlocked; cb.emplace(caller, leave_on_stop) -- runs here if
        the token already fired (it takes the lock itself) */
     atomic {
       if
       :: tok_fired[i] ->
            TOUCH(i);
            if
            :: stop_fired[i] || fkind[f] != K_PENDING -> skip
            :: else -> stop_fired[i] = true; leave(f, true, stp, bat)
            fi
       :: else -> cbk[i] = CB_LEAVE; cbf[i] = f
       fi;
       cst[i] = C_FN
     }
     /* leave_on_stop's epilogue: request_stop, then signal the blocked threads and hand
        the async waiters to the delivery thread (this thread runs fn next) */
#ifndef OLD_NOTIFY_ORDER
     if
     :: stp -> fstop[f] = true; stp = false
     :: else -> skip
     fi;
     signal_split(bat);
#else
     signal_split(bat);
     if
     :: stp -> fstop[f] = true; stp = false
     :: else -> skip
     fi;
#endif
     invoke_fn(f, k);
     /* ~stop_callback (waits for a running leave_on_stop); lock */
     atomic {
       !cb_running[i] -> cbk[i] = CB_NONE; cbf[i] = 0;
       cst[i] = C_RUN;
       TOUCH(i);
       mv = (k == K_VALUE && fkind[f] == K_PENDING &&
             ((wlinked[0] && wf[0] == f && !wobs[0]) || (wlinked[1] && wf[1] == f && !wobs[1]) ||
              (wlinked[2] && wf[2] == f && !wobs[2])));
       if
       :: !mv -> leader_finish()
       :: else -> skip
       fi
     }
     /* followers exist: unlock, move the value into f->value, lock again */
     if
     :: mv -> atomic { TOUCH(i); leader_finish() }
     :: else -> skip
     fi;
     ph = PH_DONE
#else
     /* lead(), executor: unlocked; make the task and submit it */
#ifdef SUBMIT_FAIL
     if
     :: sub = S_OK; run Worker(f, true)
     :: sub = S_NOTASK
     :: sub = S_KEPT; run Worker(f, true)
     :: sub = S_DROPIN; atomic { TOUCHT(f); fdropin[f] = true }   /* task_dropped() in submit */
     fi;
#else
     sub = S_OK; run Worker(f, false);
#endif
     atomic {
       if :: sub == S_OK || sub == S_KEPT -> wstarted[f] = true :: else -> skip fi;
       /* lk.lock(): the leader is back in the group */
       TOUCH(i);
       fsubmitting[f] = false;
       if
       :: (sub == S_NOTASK || sub == S_KEPT || fdropin[f]) && !fn_done[f] ->
            own = (wstate[i] == W_WAITING);
            if
            :: own -> wstate[i] = W_LEAVING; wlinked[i] = false
            :: else -> skip
            fi;
            if
            :: fkind[f] == K_PENDING -> settle(f, (sub == S_DROPIN -> K_DROPPED : K_ERROR), bat)
#ifdef FIX_SUBMIT_STOP
                 ; stp = true      /* proposed fix: stop f (a kept task may be running fn) */
#endif
            :: else -> skip
            fi;
            if
            :: sub == S_NOTASK || fdropin[f] -> finish(f, fkind[f], bat); exit_task(f)
            :: else -> skip
            fi;
            if
            :: own -> out = fkind[f]; got_outcome(f); exit_self(); ph = PH_DONE
            :: else -> out = fkind[f]; got_outcome(f); ph = PH_DONE  /* claimed: take it */
            fi
#ifdef FIX_SUBMIT_WINDOW
       :: else ->
            if
            :: fkind[f] != K_PENDING ->
                 /* settled while submitting (not linked, so not claimed): take it */
                 out = fkind[f]; got_outcome(f); exit_self(); ph = PH_DONE
            :: else -> reset_push(f, false); isl = true; ph = PH_JOIN
            fi
#else
       :: else -> isl = true; ph = PH_JOIN               /* wait_outcome(is_leader) */
#endif
       fi
     };
#endif

  od;
  /* lock released: request_stop, then notify(t.wake) (stop first: a notified waiter may
     block on this very fn); deliver() */
#ifndef OLD_NOTIFY_ORDER
  if
  :: stp -> fstop[f] = true
  :: else -> skip
  fi;
  signal_all(bat);
#else
  signal_all(bat);
  if
  :: stp -> fstop[f] = true
  :: else -> skip
  fi;
#endif
  atomic {
    assert(out != K_PENDING);
    cst[i] = C_DONE;
    f = 0; k = 0; out = 0; arrg = 0; sub = 0; stp = false; isl = false; lv = false; own = false
  }
}

/* the caller's stop_token */
proctype Token(byte i) PROV {
  byte kk, fl;
  BATCH bat;
  bool s;
  if
  :: skip
  :: atomic {
       tok_fired[i] = true;
       kk = cbk[i]; fl = cbf[i]; cbk[i] = CB_NONE; cbf[i] = 0;
       if
       :: kk == CB_WAKE ->
            /* wake_on_stop: w->stop(*f): the flag, the bump, the broadcast, in that
               order, as one step (a waiter that read the word before the bump finds it
               changed or is woken; one that reads it after sees the flag) */
            stop_fired[i] = true; bump(fl); wake_all(fl); kk = 0; fl = 0
       :: kk == CB_LEAVE -> cb_running[i] = true
       :: else -> skip
       fi
     };
     if
     :: kk == CB_LEAVE ->
          /* leave_on_stop: lock; leave unless settled or already left */
          atomic {
            TOUCH(i);
            if
            :: stop_fired[i] || fkind[fl] != K_PENDING -> skip
            :: else -> stop_fired[i] = true; leave(fl, true, s, bat)
            fi
          };
          /* unlock; request_stop; signal the blocked threads; queue the async waiters
             for the delivery thread (the leader's thread waits in ~stop_callback for
             this callback: an on_done run here that waits for that fn never returns) */
#ifndef OLD_NOTIFY_ORDER
          if
          :: NOTHING_TO_WAKE(bat) ->
               atomic { if :: s -> fstop[fl] = true :: else -> skip fi; s = false; cb_running[i] = false; kk = 0; fl = 0 }
          :: else ->
               atomic { if :: s -> fstop[fl] = true :: else -> skip fi; s = false };
               signal_split(bat);
               atomic { cb_running[i] = false; kk = 0; fl = 0 }
          fi
#else
          signal_split(bat);
          atomic { if :: s -> fstop[fl] = true :: else -> skip fi; s = false; cb_running[i] = false; kk = 0; fl = 0 }
#endif
     :: else -> skip
     fi
  fi
}


#ifdef ASYNC
/* ---- async callers (group::async_do / co_do) ------------------------------------
 *
 * ANode(i)   the async_do / co_await caller's thread: start() (registers the stop
 *            callback), attach(first = true), and -- when it starts the flight --
 *            lead_async(): hand_off() runs the sync fn inline (run_task) or submits a
 *            task (-DEXECUTOR); async_do returns at the end.
 * Agent(i)   go_again() -> attach(first = false) for node i, on the thread of whoever
 *            notified it as a claimed observer (that thread waits for it: see
 *            signal_all). May lead and run fn there.
 * AToken(i)  the caller's stop_token: fires once or never; request_stop() runs
 *            async_stopped() on the firing thread while the callback is registered.
 * Delivery (on_notify / deliver) is a step of whichever process notifies the node.
 */

#ifdef NO_REARM_STOP_CHECK
#define STOPPED(first) (first && stop_flag[i])      /* BROKEN: no check after rearm() */
#else
#define STOPPED(first) stop_flag[i]
#endif

/* attach(n, key, fn, first): the locked part (one critical section). A go-again
   (first == false) has done n->rearm() just before. Sets imm (an immediate outcome,
   or K_KEEP) or ph (PH_LEAD / PH_JOIN / PH_OBSERVE: linked). */
inline a_attach(first) {
  imm = 0; ph = 0;
  if
  :: closed -> imm = K_CLOSED
  :: !closed && STOPPED(first) -> imm = K_CANCELLED
  :: !closed && !STOPPED(first) && map_slot == 0 ->
       /* lead_async(): insert, waiters = 1, link_live (and link_deadline); the node is
          the leader's waiter, linked now; this thread and the task count as users */
       seq_++;
       f = seq_;
       assert(f < NF);
       fkind[f] = K_PENDING; fwaiters[f] = 1; fhome[f] = true; map_slot = f;
       flive[f] = true;
       fleader[f] = i;
       if :: first -> users++; counted[i] = true :: else -> skip fi;
       wf[i] = f; wobs[i] = false; wisl[i] = true; wafter[i] = 0; wlinked[i] = true;
       users++; lcounted[f] = true;          /* this thread, until the hand-off is over */
       users++; tcounted[f] = true;          /* hand_off(): the task */
#ifdef EXECUTOR
       fsubmitting[f] = true;
#endif
       fat = (haskey[i] -> i + 1 : 0);       /* fn lives in the node (kept, or going again) */
       ph = PH_LEAD
  :: !closed && !STOPPED(first) && map_slot != 0 && fkind[map_slot] == K_PENDING ->
       /* join */
       f = map_slot;
       fwaiters[f]++;
       if :: first -> users++; counted[i] = true :: else -> skip fi;
       wafter[i] = LINKED_TO(f);
       wf[i] = f; wobs[i] = false; wisl[i] = false; wlinked[i] = true;
       ph = PH_JOIN
  :: !closed && !STOPPED(first) && map_slot != 0 && fkind[map_slot] != K_PENDING && !haskey[i] ->
       /* a winding-down fn, and the key and fn are the caller's: unlock, keep them
          in the node, lock, go round (the next locked step) */
       haskey[i] = true; imm = K_KEEP
  :: !closed && !STOPPED(first) && map_slot != 0 && fkind[map_slot] != K_PENDING && haskey[i] ->
       /* observe: wait for the winding-down fn to return */
       f = map_slot;
       if :: first -> users++; counted[i] = true :: else -> skip fi;
       wafter[i] = LINKED_TO(f);
       wf[i] = f; wobs[i] = true; wisl[i] = false; wlinked[i] = true;
#ifdef DEADLINE
       ob_linked[i] = true;                  /* link_wait_deadline() */
#endif
       ph = PH_OBSERVE
  fi;
  if
  :: imm != 0 && imm != K_KEEP ->
       /* immediate: a failed claim means the stop callback is leaving (cancelled) */
       if
       :: wstate[i] == W_WAITING -> wstate[i] = W_CLAIMED
       :: else -> imm = K_CANCELLED
       fi;
       ares[i] = imm
  :: else -> skip
  fi
}

#ifndef ASYNC_EARLY_DESTROY
#define ANODE_ENTERED entered[i] = true;    /* async_do has returned */
#else
#define ANODE_ENTERED
#endif
#define ANODE_RET \
  ainside[i] = false; ANODE_ENTERED \
  f = 0; k = 0; bat = 0; sub = 0; fat = 0; imm = 0; ph = 0; stp = false
/* the end of lead_async(): async_do returns (ANode), or go_again() does and the
   notifier carries on (Agent) */
#define LEAD_RET \
  if :: ag -> again[i] = 2 :: else -> ainside[i] = false; ANODE_ENTERED skip fi; \
  f = 0; k = 0; bat = 0; sub = 0; fat = 0; imm = 0; ph = 0; stp = false

/* lead_async() after the locked insert: hand_off(), then exit_user() for this thread */
inline a_lead_rest(gate) {
#ifndef EXECUTOR
  /* hand_off() without an executor: unlock; run_task(f, fn) right here */
  atomic {
    gate ->
    TOUCHT(f);
    assert(!fn_done[f]);
    if
    :: fkind[f] != K_PENDING ->
         finish(f, fkind[f], bat); exit_task(f); k = 9       /* stopped meanwhile: not run */
    :: else ->
         k = 0;
         if :: fat != 0 -> fbusy[fat - 1] = true :: else -> skip fi
    fi
  };
  if
  :: k == 0 ->
       invoke_fn(f, k);
       atomic {
         if :: fat != 0 -> fbusy[fat - 1] = false :: else -> skip fi;
         TOUCHT(f); finish(f, k, bat); exit_task(f)
       }
  :: else -> skip
  fi;
  signal_all(bat);                       /* run_task's wake (may be this very node) */
  /* hand_off(): lk.lock(); lead_async(): exit_user() for this thread; unlock; then
     (nothing below touches the group) return to the caller of lead_async */
  atomic { TOUCHL(f); users--; lcounted[f] = false; LEAD_RET }
#else
  /* hand_off() with an executor: unlocked, make the task (moving fn into it: out of
     the node when it lives there) and submit it */
  atomic {
    gate ->
#ifndef FIX_FN_OWNED
    assert(fat == 0 || adel[fat - 1] == 0);    /* the node holding fn still exists */
#endif
    skip
  };
#ifdef SUBMIT_FAIL
  if
  :: sub = S_OK; run Worker(f, true)
  :: sub = S_NOTASK
  :: sub = S_KEPT; run Worker(f, true)
  :: sub = S_DROPIN; atomic { TOUCHT(f); fdropin[f] = true }
  fi;
#else
  sub = S_OK; run Worker(f, false);
#endif
  atomic {
    if :: sub == S_OK || sub == S_KEPT -> wstarted[f] = true :: else -> skip fi;
    TOUCHL(f);
    fsubmitting[f] = false;
    if
    :: (sub == S_NOTASK || sub == S_KEPT || fdropin[f]) && !fn_done[f] ->
         if
         :: fkind[f] == K_PENDING ->
              settle(f, (sub == S_DROPIN -> K_DROPPED : K_ERROR), bat); stp = true
         :: else -> skip
         fi;
         if
         :: sub == S_NOTASK || fdropin[f] -> finish(f, fkind[f], bat); exit_task(f)
         :: else -> skip
         fi
    :: else -> skip
    fi;
    users--; lcounted[f] = false           /* lead_async(): exit_user() for this thread */
  };
  /* unlock; request_stop, then notify (a kept task may be running fn) */
#ifndef OLD_NOTIFY_ORDER
  if
  :: NOTHING_TO_WAKE(bat) -> atomic { if :: stp -> fstop[f] = true; stp = false :: else -> skip fi; LEAD_RET }
  :: else ->
       atomic { if :: stp -> fstop[f] = true; stp = false :: else -> skip fi };
       signal_all(bat);
       atomic { LEAD_RET }
  fi
#else
  signal_all(bat);
  atomic { if :: stp -> fstop[f] = true; stp = false :: else -> skip fi; LEAD_RET }
#endif
#endif
}

proctype ANode(byte i) PROV {
  byte f, k, sub, fat, imm, ph;
  BATCH bat;
  bool stp, ag = false;
  /* start(): cb.emplace(caller, async_on_stop) -- if the token already fired,
     async_stopped() runs right here: sets the flag, wins try_leave (nobody else
     knows the node), locks, finds the node unlinked and returns */
  atomic {
    if
    :: tok_fired[i] -> assert(!destroyed); stop_flag[i] = true; wstate[i] = W_LEAVING
    :: else -> acb[i] = true
    fi
  };
  /* attach(first = true) */
  atomic {
    TOUCHA(i);
#ifdef ASYNC_EARLY_DESTROY
    entered[i] = true;                     /* the blocking callers' rule: first lock taken */
#endif
    aarr[i] = SETTLED_MASK; a_attach(true)
  }
  if
  :: imm == K_KEEP -> atomic { TOUCHA(i); a_attach(true) }
  :: else -> skip
  fi;
  /* async_do returns (ANODE_RET) right after: with the deliver, the unlock that
     linked the node, or lead_async's last unlock (nothing in between touches the group) */
  if
  :: atomic {
       imm != 0 && !cb_running[i] ->
       /* immediate: deliver() on this thread (cb.reset waits for a callback in flight) */
       acb[i] = false; a_complete(i); ANODE_RET
     }
  :: atomic { ph == PH_JOIN || ph == PH_OBSERVE -> ANODE_RET }
  :: ph == PH_LEAD -> a_lead_rest(true)
  fi
}

/* on_done of a node delivered after going round again runs on the notifier's thread
   (-DBLOCKING_CB: it may block, see CB_WAIT); the notifier waits for again[i] == 2 */
#ifdef BLOCKING_CB
#ifdef NO_DRAIN_OWN
#define AG_CHOOSE if :: again[i] = 2 :: cbph[i] = CBP_OWN; cbw[i] = wf[i] fi
#define AG_BLOCK ; if :: cbph[i] != 0 -> CB_WAIT(i, true, again[i] = 2) :: else -> skip fi
#else
/* drain_own: the notifier first runs the rest of its loop, then sets again[i] = 6 */
#define AG_CHOOSE if :: again[i] = 2 :: cbph[i] = CBP_DRAIN; cbw[i] = wf[i]; again[i] = 5 fi
#define AG_BLOCK ; if :: cbph[i] != 0 -> CB_WAIT(i, again[i] == 6, again[i] = 2) :: else -> skip fi
#endif
#else
#define AG_CHOOSE again[i] = 2
#define AG_BLOCK
#endif
inline ag_block(i) { skip AG_BLOCK }

proctype Agent(byte i) PROV {
  byte f, k, sub, fat, imm, ph;
  BATCH bat;
  bool stp, ag = true;
  /* idle (imm == 0 && ph == 0) at end_idle; ANODE_OK judges a node left undelivered */
end_idle:
  do
  :: atomic {
       again[i] == 1 && imm == 0 && ph == 0 ->
       /* go_again() -> attach(first = false): lock; rearm(); then the stop flag */
       TOUCH(i);
       assert(wstate[i] == W_CLAIMED && !wlinked[i] && adel[i] == 0 && haskey[i]);
       wstate[i] = W_WAITING;
       a_attach(false);
       assert(imm != K_KEEP);
       if
       :: ph == PH_JOIN || ph == PH_OBSERVE -> again[i] = 2; f = 0; ph = 0; fat = 0   /* unlock; return */
#ifdef FIX_DEFER_LEAD
       :: ph == PH_LEAD -> again[i] = 3        /* the notifier runs fn after its batch */
#endif
       :: else -> skip
       fi
     }
  :: atomic {
       imm != 0 && !cb_running[i] ->
       /* immediate, not first: unlock; cb.reset() (waits for a stop callback in
          flight); lock; exit_user(); unlock; deliver() */
       acb[i] = false;
       TOUCH(i); users--; counted[i] = false;
       a_complete(i); imm = 0;
       AG_CHOOSE
     }
     ag_block(i)
  :: ph == PH_LEAD ->
#ifdef FIX_DEFER_LEAD
       a_lead_rest(again[i] == 4)
#else
       a_lead_rest(true)
#endif
  od
}

/* the async caller's stop_token; request_stop() runs async_stopped() (when registered) */
proctype AToken(byte i) PROV {
  byte fl;
  BATCH bat;
  bool s, reg, won;
  if
  :: skip
  :: atomic {
       tok_fired[i] = true;
       reg = acb[i];
       if
       :: reg -> cb_running[i] = true; stop_flag[i] = true   /* stop_flag.store(true) */
       :: else -> skip
       fi
     };
     if
     :: reg ->
          /* try_leave() */
          atomic {
            assert(adel[i] == 0);
            if
            :: wstate[i] == W_WAITING -> wstate[i] = W_LEAVING; won = true
            :: else -> won = false; cb_running[i] = false; reg = false   /* claimed: return */
            fi
          };
          if
          :: won ->
               atomic {
                 TOUCHA(i);
                 assert(adel[i] == 0);
                 if
                 :: !wlinked[i] ->
                      /* not attached (yet, or between rounds): the attaching thread answers */
                      won = false; cb_running[i] = false; reg = false
                 :: else ->
                      wlinked[i] = false;
                      fl = wf[i];
                      if
                      :: wobs[i] -> ob_linked[i] = false           /* unlink_wait_deadline */
                      :: else -> leave(fl, wisl[i], s, bat)
                      fi;
                      users--; counted[i] = false                  /* exit_user() */
                 fi
               };
               if
               :: won ->
                    /* no longer a user: stop the flight, then notify the others, then
                       deliver cancelled (the callback resets its own stop_callback: no
                       wait) */
#ifndef OLD_NOTIFY_ORDER
                    if
                    :: NOTHING_TO_WAKE(bat) ->
                         atomic {
                           if :: s -> fstop[fl] = true; s = false :: else -> skip fi;
                           ares[i] = K_CANCELLED; acb[i] = false; a_complete(i);
                           cb_running[i] = false; fl = 0; won = false; reg = false
                         }
                    :: else ->
                         atomic { if :: s -> fstop[fl] = true; s = false :: else -> skip fi };
                         signal_all(bat);
                         atomic {
                           ares[i] = K_CANCELLED; acb[i] = false; a_complete(i);
                           cb_running[i] = false; fl = 0; won = false; reg = false
                         }
                    fi
#else
                    signal_all(bat);
                    atomic {
                      if :: s -> fstop[fl] = true; s = false :: else -> skip fi;
                      ares[i] = K_CANCELLED; acb[i] = false; a_complete(i);
                      cb_running[i] = false; fl = 0; won = false; reg = false
                    }
#endif
               :: else -> skip
               fi
          :: else -> skip
          fi
     :: else -> skip
     fi
  fi
}
#endif

#if defined(ASYNC) && !defined(NO_DELIVERY_THREAD)
/* delivery_loop(): takes the queued async waiters (any order: the queue's batches are
   not modelled) and notifies them (notify(): no observers in them, so only deliver()),
   without the group's mutex; returns once asked to stop and the queue is empty. Its
   on_done callbacks may block (-DBLOCKING_CB): that delays the deliveries behind them,
   never a deadline. */
#if defined(BLOCKING_CB) && !defined(BLOCKING_CB_AGAIN_ONLY)
#define DLV_CHOOSE(j) ; if :: skip :: cbph[j] = CBP_OWN; cbw[j] = wf[j]; dlv_cb = j + 1 fi
#define DLV_BLOCK(j) ; if :: cbph[j] != 0 -> CB_WAIT(j, true, dlv_cb = 0) :: else -> skip fi
#else
#define DLV_CHOOSE(j)
#define DLV_BLOCK(j)
#endif
/* (an inline: its labels are made unique per expansion, a proctype's are not) */
inline dlv_one(j, b) {
  atomic {
    (dq & (1 << j)) && !cb_running[j] ->
    dq = dq - (1 << j); b = 1 << j; a_deliver_claimed(j, b) DLV_CHOOSE(j)
  } DLV_BLOCK(j)
}
proctype Delivery() PROV {
  BATCH b;
end_delivery:
  do
  :: dlv_one(0, b)
  :: dlv_one(1, b)
  :: dlv_one(2, b)
  :: atomic { delivery_stop && dq == 0 -> delivery_exited = true }; break
  od
}
#endif

#ifdef DEADLINE
#ifdef ASYNC
inline async_ob_timeout(j, b) {
  assert(!destroyed && adel[j] == 0);
  ob_linked[j] = false;
  if
  :: wstate[j] == W_WAITING ->
       assert(wlinked[j] && wobs[j]);
       wstate[j] = W_CLAIMED; wlinked[j] = false; wobs[j] = false; ares[j] = K_TIMEOUT;
       users--; counted[j] = false;
       b = b | (1 << j)
  :: else -> skip
  fi
}
#endif

/* timer_loop(): settle the head of the deadline list (the oldest pending flight)
   with timeout; unlock; signal; stop it. Also each observer's wait_deadline. */
proctype Timer() PROV {
  byte fl;
  BATCH bat;
end_timer:
  do
  :: atomic { timer_stop -> break }
  :: atomic {
       !timer_stop &&
       ((seq_ >= 1 && fkind[1] == K_PENDING) || (seq_ >= 2 && fkind[2] == K_PENDING) ||
        (seq_ >= 3 && fkind[3] == K_PENDING)) ->
       assert(!destroyed);
       if
       :: seq_ >= 1 && fkind[1] == K_PENDING -> fl = 1
       :: else ->
            if
            :: seq_ >= 2 && fkind[2] == K_PENDING -> fl = 2
            :: else -> fl = 3
            fi
       fi;
       settle(fl, K_TIMEOUT, bat)
     };
     /* unlock; stop_all(to_stop), then signal the blocked threads and queue the async
        waiters for the delivery thread (the timer runs no callback) */
#ifndef OLD_NOTIFY_ORDER
     atomic { fstop[fl] = true; fl = 0 };
     signal_split(bat)
#else
     signal_split(bat);
     atomic { fstop[fl] = true; fl = 0 }
#endif
  :: atomic { obs_armed[0] && !obs_dl[0] -> obs_dl[0] = true }
  :: atomic { obs_armed[1] && !obs_dl[1] -> obs_dl[1] = true }
  :: atomic { obs_armed[2] && !obs_dl[2] -> obs_dl[2] = true }
#ifdef ASYNC
  /* an async observer's bound ran out (abstract time: at any moment): claimed with
     timeout unless its stop callback is leaving (then it unlinks itself) */
  :: atomic { !timer_stop && ob_linked[0] -> async_ob_timeout(0, bat) }; signal_split(bat)
  :: atomic { !timer_stop && ob_linked[1] -> async_ob_timeout(1, bat) }; signal_split(bat)
  :: atomic { !timer_stop && ob_linked[2] -> async_ob_timeout(2, bat) }; signal_split(bat)
#endif
  od;
  timer_exited = true
}
#endif

#ifdef FORGET
#define FORGET_DONE forget_done
#else
#define FORGET_DONE true
#endif

#ifdef DEADLINE
#define TIMER_JOINED timer_exited
#else
#define TIMER_JOINED true
#endif

#ifdef CLOSE
proctype Closer() PROV {
  byte g, tostop;
  BATCH bat;
  atomic {
    assert(!destroyed);
    closed = true;
    g = 1;
    do
    :: g < NF ->
         if
         :: flive[g] ->
              if
              :: fkind[g] == K_PENDING -> settle(g, K_CLOSED, bat); tostop = tostop | (1 << g)
              :: else -> skip
              fi;
              claim_all(g, true, bat)
         :: else -> skip
         fi;
         g++
    :: else -> break
    od;
    g = 0
  }
  /* unlock; stop_all(to_stop), then notify(wake) */
#ifndef OLD_NOTIFY_ORDER
  atomic {
    if :: tostop & 2 -> fstop[1] = true :: else -> skip fi;
    if :: tostop & 4 -> fstop[2] = true :: else -> skip fi;
    if :: tostop & 8 -> fstop[3] = true :: else -> skip fi;
    tostop = 0
  }
  signal_all(bat);
#else
  signal_all(bat);
  atomic {
    if :: tostop & 2 -> fstop[1] = true :: else -> skip fi;
    if :: tostop & 4 -> fstop[2] = true :: else -> skip fi;
    if :: tostop & 8 -> fstop[3] = true :: else -> skip fi;
    tostop = 0
  }
#endif
  /* drain_cv_.wait(lk, users_ == 0) (exit_user() notifies once closed_) */
  atomic {
    cl_state = 1;
    users == 0 -> assert(!destroyed); timer_stop = true; cl_state = 0
  }
  /* join_threads(): the timer first, then the delivery thread (which notifies what is
     queued first), then every worker thread */
#if defined(ASYNC) && !defined(NO_DELIVERY_THREAD)
  atomic { TIMER_JOINED -> delivery_stop = true };
#define DELIVERY_JOINED delivery_exited &&
#else
#define DELIVERY_JOINED
#ifdef DEADLINE
  timer_exited;
#endif
#endif
  atomic {
    DELIVERY_JOINED
    (!wstarted[1] || wdone[1]) && (!wstarted[2] || wdone[2]) && (!wstarted[3] || wdone[3]) ->
    /* close() returns */
    assert(users == 0 && loopc == 0);
    assert(!(seq_ >= 1 && !fn_done[1]) && !(seq_ >= 2 && !fn_done[2]) &&
           !(seq_ >= 3 && !fn_done[3]));
    /* no leave_on_stop (which takes the group's mutex) is registered or running;
       a claimed caller's wake_on_stop may still be registered: it touches only
       the waiter, which lives in that caller's frame */
    assert(cbk[0] != CB_LEAVE && cbk[1] != CB_LEAVE && cbk[2] != CB_LEAVE);
#ifndef ASYNC
    /* (a wake_on_stop may still be running: it touches only its waiter and flight) */
    assert(cb_running[0] != 1 && cb_running[1] != 1 && cb_running[2] != 1);
#else
    /* an async caller's stop callback may still be delivering cancelled (it no longer
       counts), or wait for the lock while its async_do is still running: not blocking */
    assert(cb_running[0] != 1 || AS(0)); assert(cb_running[1] != 1 || AS(1)); assert(cb_running[2] != 1 || AS(2));
    /* every async caller has its outcome decided: none is linked */
    assert(!wlinked[0] && !wlinked[1] && !wlinked[2]);
#ifndef NO_DELIVERY_THREAD
    assert(dq == 0);                  /* the delivery thread notified everything queued */
#endif
#endif
    cl_state = 2
  }
  /* the owner destroys the group, at any moment after close() returned (but not
     before every call it made has been made: calling into a destroyed group is
     the owner's error, not the protocol's) */
  atomic { (entered[0] && entered[1] && (NCALLERS == 2 || entered[2]) && FORGET_DONE) -> destroyed = true }
}
#endif

#ifdef FORGET
proctype Forget() PROV {
  byte fl;
  BATCH bat;
  atomic {
    assert(!destroyed);
    if
    :: map_slot != 0 ->
         fl = map_slot;
         map_slot = 0;
         fhome[fl] = false;
         fforgot[fl] = true;
         claim_all(fl, true, bat);
         fl = 0
    :: else -> skip
    fi;
    forget_done = true
  }
  signal_all(bat)
}
#endif

#ifdef CLAIM_CAS_FIRST
/* the rest of claim_if for the blocked waiters a settler claimed: erase(*w) (w->prev,
   w->next, w->linked and its neighbours' links), still under the mutex. The waiter's
   storage must still exist. */
active proctype Eraser() {
end_eraser:
  do
  :: atomic {
       edue != 0 ->
       assert(!((edue & 1) && wfree[0]) && !((edue & 2) && wfree[1]) && !((edue & 4) && wfree[2]));
       edue = 0
     }
  od
}
#endif

active proctype Monitor() PROV_MONITOR {
end_mon:
  atomic { !(INV) -> assert(INV) }
}

/* Every execution is finite (the .nocycles runs check it), so "no caller waits
   forever" reduces to the terminal states, checked here. */
active proctype Watchdog() {
end_wd:
  timeout ->
    assert(CB_OK(0) && CB_OK(1) && CB_OK(2));     /* no on_done blocked for good */
    assert(TIMER_OK);                             /* no deadline held up */
    assert(CALLER_OK(0) && CALLER_OK(1) && CALLER_OK(2));
#ifdef ASYNC
    assert(ANODE_OK(0) && ANODE_OK(1) && ANODE_OK(2));
#endif
    assert(HUNG_OK(1) && HUNG_OK(2) && HUNG_OK(3));
    assert(cl_state != 1)       /* after close() every fn is stopped: the drain ends */
}

#ifdef NO_STOPS
#define RUN_TOKEN(P, j)
#else
#define RUN_TOKEN(P, j) run P(j);
#endif
#ifdef ASYNC
inline start_caller(j) {
  if
  :: AS(j) ->
       cst[j] = C_DONE; ainside[j] = true;
       run ANode(j); RUN_TOKEN(AToken, j) run Agent(j)
  :: else -> run Caller(j); RUN_TOKEN(Token, j) skip
  fi
}
#else
inline start_caller(j) { run Caller(j); RUN_TOKEN(Token, j) skip }
#endif

init {
#ifdef CLAIM_CAS_FIRST
  byte p0;
#endif
  atomic {
#ifdef ASYNC
    start_caller(0); start_caller(1);
#if NCALLERS == 3
    start_caller(2);
#else
    cst[2] = C_DONE; entered[2] = true;
#endif
#ifndef NO_DELIVERY_THREAD
    run Delivery();
#endif
#else
#ifndef CLAIM_CAS_FIRST
    run Caller(0); run Caller(1);
    RUN_TOKEN(Token, 0) RUN_TOKEN(Token, 1)
#if NCALLERS == 3
    run Caller(2); RUN_TOKEN(Token, 2)
#endif
#else
    p0 = run Caller(0); pown[p0] = 1; p0 = run Caller(1); pown[p0] = 2;
    p0 = run Token(0); pown[p0] = 1; p0 = run Token(1); pown[p0] = 2;
#if NCALLERS == 3
    p0 = run Caller(2); pown[p0] = 3; p0 = run Token(2); pown[p0] = 3;
#endif
#endif
#if NCALLERS == 3
#else
    cst[2] = C_DONE; entered[2] = true;
#endif
#endif
#ifdef DEADLINE
    run Timer();
#endif
#ifdef CLOSE
    run Closer();
#endif
#ifdef FORGET
    run Forget();
#endif
  }
}
