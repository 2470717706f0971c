/*
 * worker_threads.pml -- the close protocol of detail::worker_threads
 * (include/singleflight/detail/worker_threads.hpp), the threads every layer owns.
 *
 * Two objects (0 and 1), each with a thread running a job from the start (slot 0); a third
 * thread of object 0 (slot 1) is started by an outside poster racing the closers, or its job
 * is refused. Each job may close the other object and its own, in either order. Two outside
 * closers close object 0 at once; then the owner destroys both objects (an outside close
 * each). A critical section under the object's mutex is an atomic block; a condition
 * variable wait is a blocking guard (notify_all under the mutex: no lost wake-up).
 *
 * The protocol (close):
 *   closing = true;
 *   a library thread (a thread of any object) returns at once;
 *   any other thread: repeat { claim every unclaimed thread (joining += n), join them with
 *   the mutex released, joining -= n } until none is unclaimed and joining == 0.
 * Checked:
 *   SELF      no thread joins itself (assert at the join);
 *   JOINED    an outside close returns only once every thread of its object is joined;
 *   Watchdog  every process returns (no deadlock: in a state where nothing can move, the
 *             count of finished processes is the total).
 * Broken variants (run.sh, rows wt.broken.*), each must fail:
 *   -DSECOND_NO_WAIT  a closer that finds nothing to claim returns without waiting for the
 *                     joins others make (the code before this protocol): JOINED fails;
 *   -DLIB_JOINS       a library thread's close joins like an outside one; with -DCROSS_ONLY
 *                     (jobs close only the other object) the two jobs join each other: the
 *                     Watchdog fails; with -DSELF_ONLY (jobs close only their own object)
 *                     a job joins itself: SELF fails.
 */

#define NO 2
#define NT 2
#define ID(o, t) ((o) * NT + (t))
#define OUTSIDE 255

byte wst[NO * NT];  /* 0 not started, 1 started (unclaimed), 2 claimed by a joiner, 3 joined */
bool fin[NO * NT];  /* its loop has returned: a join returns */
bool closing[NO];
byte joining[NO];
byte ended = 0;        /* processes that returned */
byte outside_done = 0; /* the outside closers and the poster */
bool refused = false;

#define UNCLAIMED(o) (wst[ID(o, 0)] == 1 || wst[ID(o, 1)] == 1)
#define DONE(i) (wst[i] == 0 || wst[i] == 3)
#define ALL_JOINED(o) (DONE(ID(o, 0)) && DONE(ID(o, 1)))

/* join_all: the outside closer's loop. `me`: the caller's thread id (OUTSIDE when none). */
inline join_all(jo, jme) {
  do
  :: atomic {
       UNCLAIMED(jo) ->
       mine0 = (wst[ID(jo, 0)] == 1);
       mine1 = (wst[ID(jo, 1)] == 1);
       if :: mine0 -> wst[ID(jo, 0)] = 2; joining[jo]++ :: else -> skip fi;
       if :: mine1 -> wst[ID(jo, 1)] = 2; joining[jo]++ :: else -> skip fi
     }
     if
     :: mine0 -> assert(jme != ID(jo, 0)); fin[ID(jo, 0)]; atomic { wst[ID(jo, 0)] = 3; joining[jo]-- }
     :: else -> skip
     fi;
     if
     :: mine1 -> assert(jme != ID(jo, 1)); fin[ID(jo, 1)]; atomic { wst[ID(jo, 1)] = 3; joining[jo]-- }
     :: else -> skip
     fi;
     mine0 = false;
     mine1 = false
#ifdef SECOND_NO_WAIT
  :: atomic { !UNCLAIMED(jo) -> break }
#else
  :: atomic { !UNCLAIMED(jo) && joining[jo] == 0 -> break }
#endif
  od
}

inline close(co, cme, clib) {
  closing[co] = true;
#ifdef LIB_JOINS
  join_all(co, cme);
  assert(ALL_JOINED(co))
#else
  if
  :: clib -> skip
  :: else -> join_all(co, cme); assert(ALL_JOINED(co))
  fi
#endif
}

proctype worker(byte o; byte t) {
  bool mine0 = false, mine1 = false;
  /* the job: closes the other object and / or its own, in either order */
#if defined(CROSS_ONLY)
  close(1 - o, ID(o, t), true);
#elif defined(SELF_ONLY)
  close(o, ID(o, t), true);
#else
  if
  :: skip
  :: close(1 - o, ID(o, t), true)
  fi;
  if
  :: skip
  :: close(o, ID(o, t), true)
  fi;
  if
  :: skip
  :: close(1 - o, ID(o, t), true)
  fi;
#endif
  ended++;
  /* the loop: queued jobs (none) run, then the thread exits once its object closes */
  closing[o];
  fin[ID(o, t)] = true
}

proctype closer() {
  bool mine0 = false, mine1 = false;
  close(0, OUTSIDE, false);
  outside_done++;
  ended++
}

/* post(): a job for object 0, refused once it is closed (to the poster, on its path). */
proctype poster() {
  atomic {
    if
    :: !closing[0] -> wst[ID(0, 1)] = 1; run worker(0, 1)
    :: else -> refused = true
    fi
  }
  outside_done++;
  ended++
}

active proctype watchdog() {
  /* workers (2, or 3 when the post was taken), 2 closers, the poster, the owner */
  timeout -> assert(ended == (refused -> 6 : 7))
}

init {
  bool mine0 = false, mine1 = false;
  atomic {
    wst[ID(0, 0)] = 1;
    wst[ID(1, 0)] = 1;
    run worker(0, 0);
    run worker(1, 0);
    run closer();
    run closer();
    run poster()
  }
  outside_done == 3;
  /* the destructors: an outside close each */
  close(0, OUTSIDE, false);
  close(1, OUTSIDE, false);
  assert(ALL_JOINED(0) && ALL_JOINED(1));
  ended++
}
