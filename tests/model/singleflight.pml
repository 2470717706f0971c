/*
 * singleflight.pml -- Promela model of the concurrency protocol of
 * singleflight::group (include/singleflight/group.hpp, detail/flight.hpp) for
 * one key: the group mutex, the per-waiter mutex + condition variable, the
 * claim / leave CAS on waiter::state, the wake_batch signalled after the group
 * mutex is released, and the users_ bookkeeping that close() waits for.
 *
 * Processes (each names the code it stands for; README.md has the full table):
 *   Caller(i)  x3 (or 2)  call_with() -> route() -> lead() / lead_inline() /
 *                         wait_outcome() / observe(); deliver()
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
 *
 * Locks. Every group-mutex critical section is one atomic { } and touches the
 * group state only there. A waiter's own mutex w.m guards only `signaled` and
 * `stop_fired` (two flags, set together with a notify under w.m, and tested
 * by cv.wait's predicate under w.m), so each w.m section is one atomic step
 * and a wait on w.cv is a blocking guard on the predicate: with notify always
 * sent under w.m right after setting the flag, this is exact (a lost wake-up
 * can only come from a flag nobody sets, which the Watchdog reports).
 * waiter::state is an atomic; each CAS is one step.
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
 * Broken variants (must be rejected):
 *   UNCONDITIONAL_CLEANUP  finish() erases the key's entry, not its own node
 *   RELOCK_AFTER_CLAIM     a claimed follower, once signalled, retakes the group
 *                          mutex to read its outcome (the settler counted it out)
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
#define C_AWAIT 2       /* await_signal(): claimed, signal on its way */
#define C_FN    3       /* inline leader running fn                   */
#define C_DONE  4

/* caller's next step */
#define PH_JOIN    1    /* wait_outcome() */
#define PH_OBSERVE 2    /* observe()      */
#define PH_LEAD    3    /* lead() / lead_inline() after the insert */
#define PH_EXIT    4    /* ticket decided under the lock, not accounted: exit_user() */
#define PH_DONE    5    /* lock released: signal the batch, request_stop, deliver */

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
bool wstarted[NF];      /* ghost: a Worker thread exists for f */
bool wdone[NF];         /* ghost: ...and has ended (joinable) */

/* detail::waiter, one per caller */
byte wf[NC];            /* its flight (guarded by mu_ while linked) */
bool wlinked[NC];       /* guarded by mu_ */
bool wobs[NC];          /* observer; guarded by mu_ */
byte wstate[NC];        /* std::atomic state */
bool signaled[NC];      /* guarded by w.m */
bool stop_fired[NC];    /* guarded by w.m (by mu_ for an inline leader) */
byte cst[NC];           /* ghost: C_* */
bool counted[NC];       /* ghost: this call counts in users_ */
bool entered[NC];       /* ghost: made its first call into the group */
bool obs_armed[NC];     /* route()'s wait_deadline is set */
bool obs_dl[NC];        /* ...and has passed */

/* the caller's stop_token and its stop_callback */
bool tok_fired[NC];
byte cbk[NC];
byte cbf[NC];
bool cb_running[NC];    /* a leave_on_stop is running on the Token's thread */

byte cl_state;          /* ghost: 0 idle, 1 draining, 2 returned */
bool destroyed;         /* ghost: ~group has run (after close() returned) */
bool forget_done;
bool timer_exited;

/* ---- properties -------------------------------------------------------------- */

#ifdef NO_COUNTED_CHECK
#define TOUCH(i)  assert(!destroyed)
#define TOUCHT(g) assert(!destroyed)
#else
/* a caller (or its leave_on_stop) touching the group must still count in users_ */
#define TOUCH(i)  assert(!destroyed && counted[i])
/* a task touching the group must still count in users_ */
#define TOUCHT(g) assert(!destroyed && tcounted[g])
#endif

#define RUNNING(g) ((seq_ >= g && !fn_done[g] && !fforgot[g]) -> 1 : 0)
#define FLIGHT_OK(g) \
  (fwaiters[g] <= NC && !(fsole[g] && freaders[g]) && (!fhome[g] || map_slot == g))
#define USERS \
  ((counted[0] -> 1 : 0) + (counted[1] -> 1 : 0) + (counted[2] -> 1 : 0) + \
   (tcounted[1] -> 1 : 0) + (tcounted[2] -> 1 : 0) + (tcounted[3] -> 1 : 0))

#define INV \
  ( (RUNNING(1) + RUNNING(2) + RUNNING(3) <= 1) \
 && (map_slot == 0 || !fn_done[map_slot]) \
 && FLIGHT_OK(1) && FLIGHT_OK(2) && FLIGHT_OK(3) \
 && users == USERS )

/* At a terminal state a caller is done, runs a hung fn (HUNG_OK judges it), or
   is blocked legitimately: unclaimed, token unfired, nothing signalled, and
   still something to wait for. Blocked in await_signal() is never legitimate. */
#ifdef DEADLINE
#define NO_DL(i) !obs_dl[i]
#else
#define NO_DL(i) true
#endif
#define CALLER_OK(i) \
  ( cst[i] == C_DONE || cst[i] == C_FN \
 || (cst[i] == C_BLK && wstate[i] == W_WAITING && !tok_fired[i] && !signaled[i] \
     && !stop_fired[i] && \
     ((!wobs[i] && fkind[wf[i]] == K_PENDING) || \
      (wobs[i] && !closed && !fn_done[wf[i]] && !fforgot[wf[i]] && NO_DL(i)))) )

/* caller j still wants flight g (waits for it, token unfired) */
#define WANTS(j, g) (((cst[j] == C_BLK && !wobs[j]) || cst[j] == C_FN) && wf[j] == g && !tok_fired[j])
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

#define SETTLED_MASK \
  (((seq_ >= 1 && fkind[1] != K_PENDING) -> 2 : 0) | \
   ((seq_ >= 2 && fkind[2] != K_PENDING) -> 4 : 0) | \
   ((seq_ >= 3 && fkind[3] != K_PENDING) -> 8 : 0))

/* ---- state transitions (under mu_, inside atomic) ------------------------------ */

/* waiter_list::claim_if for one waiter: obs == false is settle() (followers,
   counted out: exit_user() on their behalf), obs == true claim_observers()
   (observers stay users). A leaving waiter stays linked. */
inline claim(j, fl, obs, b) {
  if
  :: wlinked[j] && wf[j] == fl && wobs[j] == obs && wstate[j] == W_WAITING ->
       wstate[j] = W_CLAIMED; wlinked[j] = false;
       if
       :: !obs -> users--; counted[j] = false
       :: else -> skip
       fi;
       b = b | (1 << j)
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

/* wake_batch::signal_all(), after the group mutex is released: one waiter::signal()
   (a w.m critical section) per step. The waiter must still be there, claimed. */
inline signal_one(j, b) {
  if
  :: b & (1 << j) ->
       atomic {
         assert(wstate[j] == W_CLAIMED && !signaled[j] && cst[j] != C_DONE);
         signaled[j] = true;
         b = b - (1 << j)
       }
  :: else -> skip
  fi
}
inline signal_all(b) { signal_one(0, b); signal_one(1, b); signal_one(2, b) }

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
inline invoke_fn(fl, kk) {
  if
  :: kk = K_VALUE
#ifndef NO_FN_ERROR
  :: kk = K_ERROR
#endif
  :: skip ->
end_hang:
     fstop[fl] -> kk = K_ERROR
  fi
}

/* w.reset(as_observer) + f->list.push(w) (for the join and observe cases) */
inline reset_push(fl, obs) {
  wstate[i] = W_WAITING; signaled[i] = false; stop_fired[i] = false;
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
       wstate[i] = W_WAITING; signaled[i] = false; stop_fired[i] = false; wobs[i] = false;
#endif
#else
       /* lead_inline(): w.reset(false), not linked */
       wstate[i] = W_WAITING; signaled[i] = false; stop_fired[i] = false; wobs[i] = false;
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

/* cb.emplace(caller, wake_on_stop{&w}) then block(w): registering is seen only by
   the Token, so it is merged with the wait. block() returns when signalled or
   stopped (or, for an observer, at its wait_deadline). Then ~stop_callback and
   w.try_leave(). */
inline block_then_try_leave() {
  atomic {
    if
    :: tok_fired[i] -> stop_fired[i] = true       /* already stopped: runs inline */
    :: else -> cbk[i] = CB_WAKE; cbf[i] = f
    fi;
    cst[i] = C_BLK;
end_blk:
#ifdef DEADLINE
    (signaled[i] || stop_fired[i] || (wobs[i] && obs_dl[i])) ->
#else
    (signaled[i] || stop_fired[i]) ->
#endif
    cst[i] = C_RUN
  }
  atomic {
    !cb_running[i] -> cbk[i] = CB_NONE; cbf[i] = 0;
    if
    :: wstate[i] == W_WAITING -> wstate[i] = W_LEAVING; lv = true
    :: else -> lv = false; cst[i] = C_AWAIT
    fi
  }
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

proctype Worker(byte f; bool may_drop) {
  byte k, bat;
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

proctype Caller(byte i) {
  byte f, k, out, ph, arrg, bat, sub;
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
  :: ph == PH_DONE -> break

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
     :: ph == PH_JOIN && !lv ->
#ifndef RELOCK_AFTER_CLAIM
          /* claimed: await_signal(); the outcome; never the group's mutex again */
          atomic { signaled[i] -> cst[i] = C_RUN; out = fkind[f]; got_outcome(f); ph = PH_DONE }
#else
          /* BROKEN: after the signal, retake the group mutex to read the outcome */
          atomic { signaled[i] -> cst[i] = C_RUN };
          atomic { TOUCH(i); out = fkind[f]; got_outcome(f); ph = PH_DONE }
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
          /* claimed (fn returned, forget, close): still a user. await_signal,
             lock, closed ? closed : go round route() again */
          atomic {
            signaled[i] -> cst[i] = C_RUN;
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
     signal_all(bat);
     if
     :: stp -> fstop[f] = true; stp = false
     :: else -> skip
     fi;
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
            :: else -> cst[i] = C_AWAIT; ph = PH_JOIN     /* unlock; await_signal() */
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
     if
     :: ph == PH_JOIN && cst[i] == C_AWAIT ->
          atomic { signaled[i] -> cst[i] = C_RUN; out = fkind[f]; got_outcome(f); ph = PH_DONE }
     :: else -> skip
     fi
#endif

  od;
  /* lock released: wake_batch::signal_all(); request_stop; deliver() */
  signal_all(bat);
  if
  :: stp -> fstop[f] = true
  :: else -> skip
  fi;
  atomic {
    assert(out != K_PENDING);
    cst[i] = C_DONE;
    f = 0; k = 0; out = 0; arrg = 0; sub = 0; stp = false; isl = false; lv = false; own = false
  }
}

/* the caller's stop_token */
proctype Token(byte i) {
  byte kk, fl, bat;
  bool s;
  if
  :: skip
  :: atomic {
       tok_fired[i] = true;
       kk = cbk[i]; fl = cbf[i]; cbk[i] = CB_NONE; cbf[i] = 0;
       if
       :: kk == CB_WAKE -> stop_fired[i] = true; kk = 0   /* wake_on_stop: w.m only */
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
          signal_all(bat);
          atomic { if :: s -> fstop[fl] = true :: else -> skip fi; s = false; cb_running[i] = false; kk = 0; fl = 0 }
     :: else -> skip
     fi
  fi
}

#ifdef DEADLINE
/* timer_loop(): settle the head of the deadline list (the oldest pending flight)
   with timeout; unlock; signal; stop it. Also each observer's wait_deadline. */
proctype Timer() {
  byte fl, bat;
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
     signal_all(bat);
     atomic { fstop[fl] = true; fl = 0 }
  :: atomic { obs_armed[0] && !obs_dl[0] -> obs_dl[0] = true }
  :: atomic { obs_armed[1] && !obs_dl[1] -> obs_dl[1] = true }
  :: atomic { obs_armed[2] && !obs_dl[2] -> obs_dl[2] = true }
  od;
  timer_exited = true
}
#endif

#ifdef FORGET
#define FORGET_DONE forget_done
#else
#define FORGET_DONE true
#endif

#ifdef CLOSE
proctype Closer() {
  byte g, tostop, bat;
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
  signal_all(bat);
  atomic {
    if :: tostop & 2 -> fstop[1] = true :: else -> skip fi;
    if :: tostop & 4 -> fstop[2] = true :: else -> skip fi;
    if :: tostop & 8 -> fstop[3] = true :: else -> skip fi;
    tostop = 0
  }
  /* drain_cv_.wait(lk, users_ == 0) (exit_user() notifies once closed_) */
  atomic {
    cl_state = 1;
    users == 0 -> assert(!destroyed); timer_stop = true; cl_state = 0
  }
  /* join_threads(): the timer and every worker thread */
#ifdef DEADLINE
  timer_exited;
#endif
  atomic {
    (!wstarted[1] || wdone[1]) && (!wstarted[2] || wdone[2]) && (!wstarted[3] || wdone[3]) ->
    /* close() returns */
    assert(users == 0);
    assert(!(seq_ >= 1 && !fn_done[1]) && !(seq_ >= 2 && !fn_done[2]) &&
           !(seq_ >= 3 && !fn_done[3]));
    /* no leave_on_stop (which takes the group's mutex) is registered or running;
       a claimed caller's wake_on_stop may still be registered: it touches only
       the waiter, which lives in that caller's frame */
    assert(cbk[0] != CB_LEAVE && cbk[1] != CB_LEAVE && cbk[2] != CB_LEAVE);
    assert(!cb_running[0] && !cb_running[1] && !cb_running[2]);
    cl_state = 2
  }
  /* the owner destroys the group, at any moment after close() returned (but not
     before every call it made has been made: calling into a destroyed group is
     the owner's error, not the protocol's) */
  atomic { (entered[0] && entered[1] && (NCALLERS == 2 || entered[2]) && FORGET_DONE) -> destroyed = true }
}
#endif

#ifdef FORGET
proctype Forget() {
  byte fl, bat;
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

active proctype Monitor() {
end_mon:
  atomic { !(INV) -> assert(INV) }
}

/* Every execution is finite (the .nocycles runs check it), so "no caller waits
   forever" reduces to the terminal states, checked here. */
active proctype Watchdog() {
end_wd:
  timeout ->
    assert(CALLER_OK(0) && CALLER_OK(1) && CALLER_OK(2));
    assert(HUNG_OK(1) && HUNG_OK(2) && HUNG_OK(3));
    assert(cl_state != 1)       /* after close() every fn is stopped: the drain ends */
}

init {
  atomic {
    run Caller(0); run Caller(1);
    run Token(0); run Token(1);
#if NCALLERS == 3
    run Caller(2); run Token(2);
#else
    cst[2] = C_DONE; entered[2] = true;
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
