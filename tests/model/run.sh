#!/usr/bin/env bash
# tests/model/run.sh -- model-check the singleflight protocol with spin.
#
# For every configuration below: spin -a generates pan.c, gcc builds it, pan runs an
# exhaustive search (no bitstate, no hash compaction), and the result is compared with
# the expectation:
#   pass   errors: 0 (no assertion violation, no invalid end state)
#   fail   errors > 0, and the first violated assertion contains the expected text
# Prints states stored, transitions (states explored), memory, wall time and CPU time
# (user + system, what the row costs on an idle core) per run; exits non-zero on any
# mismatch.
#
#   bash tests/model/run.sh            default configurations (< ~90 s on 2 idle cores)
#   bash tests/model/run.sh --full     every configuration (also SINGLEFLIGHT_MODEL_FULL=1)
#   JOBS=1 bash tests/model/run.sh     one pan at a time
#   KEEP=1 ...                         keep the work directory (trails, pan output)
#   ONLY='regex' ...                   only the configurations whose name matches (grep -E)
#
# Needs spin and a C compiler (CC; default clang when installed, else gcc: at -O0 clang
# builds the async models' pan.c in ~3 s of CPU where gcc takes ~10 s, which outweighs
# its ~20% slower search at these sizes).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CC="${CC:-$(command -v clang >/dev/null 2>&1 && echo clang || echo gcc)}"
JOBS="${JOBS:-2}"
command -v spin >/dev/null || { echo "run.sh: spin not found" >&2; exit 2; }
command -v "$CC" >/dev/null || { echo "run.sh: $CC not found" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/sf-model.XXXXXX")"
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$work"' EXIT; else echo "work directory: $work"; fi

# Text of the violated assertion, for the expected failures.
NO_OVERLAP='(seq_>=1)&& !(fn_done[1]))&& !(fforgot[1])'   # Monitor: at most one fn per key
COUNTED='!(destroyed)&&counted[i]'                         # TOUCH: a caller counted out touches the group
DESTROYED='assertion violated  !(destroyed)'               # TOUCH (-DNO_COUNTED_CHECK): touches a destroyed group

# name | spin defines | pan compile flags | pan run flags | expect (pass|fail) | expected text
# W/G/L = ownership waiters/group/leader (POLICY=0/1/2); n3/n2 = callers.
# X = -DFIX_SUBMIT_WINDOW: the executor rows model the proposed fix of the executor-leader
# bug this model found (README.md, "What it found"); the *.asis.* rows keep group.hpp as
# it is and must fail.
X="-DFIX_SUBMIT_WINDOW"
XS="-DFIX_SUBMIT_WINDOW -DFIX_SUBMIT_STOP"
HUNG='!(fstop[1])&&(fkind[1]==0)'                          # Watchdog: HUNG_OK (a fn nobody stops)

# Async callers (-DASYNC, the last NASYNC callers are async_do/co_do nodes). FO models the
# fix of the fn-lifetime bug, FD also that of the stuck-batch bug, both found by this model
# and both in group.hpp now (README.md, "Async callers: what it found"); the *.asis.* rows
# model group.hpp as it was before those fixes and must fail.
FO="-DFIX_FN_OWNED"
FD="-DFIX_FN_OWNED -DFIX_DEFER_LEAD"
A1="-DASYNC -DNASYNC=1"
A2="-DASYNC -DNASYNC=2"
FN_IN_NODE='assertion violated  !(fbusy[i])'               # deliver(): the node's fn still runs
FN_MOVED='(fat==0)||(adel[(fat-1)]==0)'                   # executor: fn moved out of a freed node
UNDELIVERED='||(adel[0]==1))||'                          # Watchdog: ANODE_OK (an async caller never delivered)
EARLY='(counted[i]||ainside[i])'                           # TOUCHA: a stop callback locks a destroyed group

# Where user code runs (commit "Where user code runs: ..."): B = -DBLOCKING_CB, an async
# waiter's on_done may block inside the group (a retry with a blocking do_, or close()).
# The default rows model group.hpp now (stop first, then notify; the timer and an inline
# leader's stop hand async waiters to the delivery thread; a callback that blocks first
# runs the rest of its registered loop); the *.asis.* rows restore one part of the code
# before that commit each and must fail: OLD_NOTIFY_ORDER (notify, then stop),
# NO_DELIVERY_THREAD (the timer / leave_on_stop run callbacks), NO_DRAIN_OWN.
B="-DBLOCKING_CB"
BA="-DBLOCKING_CB -DBLOCKING_CB_AGAIN_ONLY"
CB_STUCK='(cbph[0]==0)||(cbph[0]==1)'                     # Watchdog: CB_OK (an on_done blocked for good)
TIMER_HELD='assertion violated (timer_stop||'             # Watchdog: TIMER_OK (a deadline that never fires)

# The claim/leave exchange and the broadcast word (the core cut: claim.hpp, signal.hpp,
# blocking_waiters.hpp). The pass rows above model the code as it is (a blocked waiter is
# unlinked before the CAS that claims it; it reads the word before it checks its state);
# these restore the order before the TSan fix, or break the word's order, and must fail.
ERASE_FREED='!(((edue&1)&&wfree[0]))'                     # Eraser: the settler unlinks a waiter whose storage is gone
ASLEEP='((cst[0]==1)&&(wslp[0]!=0))'                       # Watchdog: CALLER_OK (a claimed caller asleep for good)

# The close protocol of detail::worker_threads (worker_threads.pml; rows named wt.*): two
# objects whose jobs close each other and themselves, two outside closers, a post racing
# them; the broken rows restore the old second closer (returns without waiting) or let a
# library thread's close join, and must fail.
WT_JOINED='assertion violated (((wst[((0*2)+0)]==0)'      # JOINED: an outside close returned early
WT_HUNG='assertion violated (ended=='                     # Watchdog: a process never returns
WT_SELF='assertion violated (((o*2)+t)!='                # SELF: a thread joins itself

# Default mode (ctest model.spin): the most valuable configurations, < ~90 s on 2 idle cores.
configs=(
  "W.n2.inline.deadline.close|-DPOLICY=0 -DNCALLERS=2 -DDEADLINE -DCLOSE||-m200000|pass|"
  "W.n2.inline.forget.close|-DPOLICY=0 -DNCALLERS=2 -DFORGET -DCLOSE||-m200000|pass|"
  "L.n3.inline|-DPOLICY=2||-m200000|pass|"
  "W.n3.inline|-DPOLICY=0||-m200000|pass|"
  "G.n3.inline|-DPOLICY=1||-m200000|pass|"
  "W.n2.executor|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR $X||-m200000|pass|"
  "G.n3.broken.unconditional_cleanup|-DPOLICY=1 -DFORGET -DUNCONDITIONAL_CLEANUP -DNO_FN_ERROR||-m200000|fail|$NO_OVERLAP"
  "W.n2.broken.relock_after_claim|-DPOLICY=0 -DNCALLERS=2 -DRELOCK_AFTER_CLAIM||-m200000|fail|$COUNTED"
  "W.n2.broken.relock_after_claim.close|-DPOLICY=0 -DNCALLERS=2 -DRELOCK_AFTER_CLAIM -DCLOSE -DNO_COUNTED_CHECK||-m200000|fail|$DESTROYED"
  "W.n2.executor.asis.submit_window|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR||-m200000|fail|$COUNTED"
  "W.n2.executor.asis.submit_window.close|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DCLOSE -DNO_COUNTED_CHECK||-m200000|fail|$DESTROYED"
  "W.n2.executor.asis.submit_kept_unstopped|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DSUBMIT_FAIL $X||-m200000|fail|$HUNG"
  # the claim/leave exchange and the broadcast word
  "W.n2.inline.asis.claim_cas_first|-DPOLICY=0 -DNCALLERS=2 -DCLAIM_CAS_FIRST||-m200000|fail|$ERASE_FREED"
  "W.n2.inline.broken.signal_load_late|-DPOLICY=0 -DNCALLERS=2 -DSIGNAL_LOAD_LATE||-m200000|fail|$ASLEEP"
  # async callers
  "A.W.n2.a2|-DPOLICY=0 -DNCALLERS=2 $A2 $FD||-m200000|pass|"
  "A.G.n2.a2|-DPOLICY=1 -DNCALLERS=2 $A2 $FD||-m200000|pass|"
  "A.L.n2.a2|-DPOLICY=2 -DNCALLERS=2 $A2 $FD||-m200000|pass|"
  "A.W.n2.a1.broken.no_rearm_stop_check|-DPOLICY=0 -DNCALLERS=2 $A1 $FO -DNO_REARM_STOP_CHECK||-m200000|fail|$UNDELIVERED"
  "A.W.n2.a1.asis.fn_in_node|-DPOLICY=0 -DNCALLERS=2 $A1||-m200000|fail|$FN_IN_NODE"
  "A.W.n3.a2.asis.stuck_batch|-DPOLICY=0 $A2 $FO||-m200000|fail|$UNDELIVERED"
  # where user code runs: on_done may block (B)
  "A.W.n2.a1.close.blocking_cb|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DCLOSE $B||-m200000|pass|"
  "A.W.n2.a2.close.blocking_cb.asis.notify_first|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DCLOSE $B -DOLD_NOTIFY_ORDER||-m200000|fail|$CB_STUCK"
  "A.L.n2.a2.blocking_cb|-DPOLICY=2 -DNCALLERS=2 $A2 $FD $B||-m200000|pass|"
  "A.L.n2.a2.blocking_cb.asis.notify_first|-DPOLICY=2 -DNCALLERS=2 $A2 $FD $B -DOLD_NOTIFY_ORDER||-m200000|fail|$CB_STUCK"
  "A.L.n2.a1.blocking_cb|-DPOLICY=2 -DNCALLERS=2 $A1 $FD $B||-m200000|pass|"
  "A.L.n2.a1.blocking_cb.asis.stop_callback_notifies|-DPOLICY=2 -DNCALLERS=2 $A1 $FD $B -DNO_DELIVERY_THREAD||-m200000|fail|$CB_STUCK"
  "A.W.n2.a1.deadline.blocking_cb|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DDEADLINE $B||-m200000|pass|"
  "A.W.n2.a1.deadline.blocking_cb.asis.timer_notifies|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DDEADLINE $B -DNO_DELIVERY_THREAD||-m200000|fail|$TIMER_HELD"
  "A.W.n2.a2.deadline.blocking_cb.asis.notify_first|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE $B -DOLD_NOTIFY_ORDER -DNO_DELIVERY_THREAD||-m200000|fail|$CB_STUCK"
  # a batch without observers: an on_done that blocks holds back the waiters after it
  # (README.md, "Where user code runs", 5); -DSTRICT_BATCH asks for what README "Re-entrancy" says
  "A.W.n3.a2.no_stops.blocking_cb|-DPOLICY=0 $A2 $FD $B -DNO_STOPS||-m200000|pass|"
  # detail::worker_threads: the close protocol
  "wt.close|||-m200000|pass|"
  "wt.close.cross_only|-DCROSS_ONLY||-m200000|pass|"
  "wt.broken.second_no_wait|-DSECOND_NO_WAIT||-m200000|fail|$WT_JOINED"
  "wt.broken.lib_joins.cross|-DLIB_JOINS -DCROSS_ONLY||-m200000|fail|$WT_HUNG"
  "wt.broken.lib_joins.self|-DLIB_JOINS -DSELF_ONLY||-m200000|fail|$WT_SELF"
  "A.W.n3.a2.no_stops.blocking_cb.strict_batch|-DPOLICY=0 $A2 $FD $B -DNO_STOPS -DSTRICT_BATCH||-m200000|fail|$UNDELIVERED"
)

# Full mode (run.sh --full, or SINGLEFLIGHT_MODEL_FULL=1): everything.
if [[ "${SINGLEFLIGHT_MODEL_FULL:-0}" == 1 || "${1:-}" == --full ]]; then
  FULL=1
  for p in 0 1 2; do
    P=$(echo "WGL" | cut -c$((p + 1)))
    configs+=(
      "$P.n3.inline.forget|-DPOLICY=$p -DFORGET -DNO_FN_ERROR||-m200000|pass|"
      "$P.n2.executor.submit_fail.forget|-DPOLICY=$p -DNCALLERS=2 -DEXECUTOR -DSUBMIT_FAIL -DFORGET $XS|-DCOLLAPSE|-m200000|pass|"
    )
  done
  configs+=(
    # in the default set before the broadcast word (which made them 1.5-2.2x bigger)
    "W.n2.inline.deadline.forget.close|-DPOLICY=0 -DNCALLERS=2 -DDEADLINE -DFORGET -DCLOSE||-m200000|pass|"
    "A.W.n2.a2.close|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DCLOSE||-m200000|pass|"
    "A.W.n2.a2.deadline|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE||-m200000|pass|"
    "A.W.n2.a2.executor|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DEXECUTOR $X||-m200000|pass|"
    # the claim/leave exchange with three callers and an executor
    "W.n3.inline.asis.claim_cas_first|-DPOLICY=0 -DCLAIM_CAS_FIRST||-m200000|fail|$ERASE_FREED"
    "W.n2.executor.deadline.asis.claim_cas_first|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR $X -DDEADLINE -DCLAIM_CAS_FIRST||-m200000|fail|$ERASE_FREED"
    "G.n2.inline.deadline.forget.close|-DPOLICY=1 -DNCALLERS=2 -DDEADLINE -DFORGET -DCLOSE||-m200000|pass|"
    "L.n2.inline.deadline.forget.close|-DPOLICY=2 -DNCALLERS=2 -DDEADLINE -DFORGET -DCLOSE||-m200000|pass|"
    "W.n3.inline.close|-DPOLICY=0 -DCLOSE -DNO_FN_ERROR|-DCOLLAPSE|-m200000|pass|"
    "W.n2.executor.close|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DCLOSE -DNO_FN_ERROR $X||-m200000|pass|"
    "W.n2.executor.deadline|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DDEADLINE $X|-DCOLLAPSE|-m200000|pass|"
    "W.n2.executor.submit_fail.close|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DSUBMIT_FAIL -DCLOSE -DNO_FN_ERROR $XS|-DCOLLAPSE|-m200000|pass|"
    "W.n3.broken.unconditional_cleanup|-DPOLICY=0 -DFORGET -DUNCONDITIONAL_CLEANUP -DNO_FN_ERROR||-m200000|fail|$NO_OVERLAP"
    # no cycles at all: every execution is finite, so the Watchdog's terminal-state check
    # is the whole liveness argument (non-progress search without progress labels)
    "W.n2.nocycles|-DPOLICY=0 -DNCALLERS=2 -DDEADLINE -DFORGET -DCLOSE|-DNP|-l -m200000|pass|"
    "W.n2.executor.nocycles|-DPOLICY=0 -DNCALLERS=2 -DEXECUTOR -DSUBMIT_FAIL $XS|-DNP|-l -m200000|pass|"
    # async callers (-DCOLLAPSE: the same exhaustive search, compressed state vectors)
    "A.W.n2.a1|-DPOLICY=0 -DNCALLERS=2 $A1 $FD||-m200000|pass|"
    "A.W.n2.a1.close|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DCLOSE||-m200000|pass|"
    "A.W.n2.a2.forget|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DFORGET||-m200000|pass|"
    "A.G.n2.a2.close|-DPOLICY=1 -DNCALLERS=2 $A2 $FD -DCLOSE||-m200000|pass|"
    "A.L.n2.a2.close|-DPOLICY=2 -DNCALLERS=2 $A2 $FD -DCLOSE||-m200000|pass|"
    "A.W.n2.a2.deadline.close|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE -DCLOSE|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a2.forget.close|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DFORGET -DCLOSE|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a2.deadline.forget|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE -DFORGET|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a1.executor.submit_fail|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DEXECUTOR -DSUBMIT_FAIL $XS|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a2.defer|-DPOLICY=0 -DNCALLERS=2 $A2 $FD||-m200000|pass|"
    "A.W.n3.a1.fixed|-DPOLICY=0 $A1 $FD|-DCOLLAPSE|-m200000|pass|"
    "A.W.n3.a2.fixed|-DPOLICY=0 $A2 $FD|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a2.close.nocycles|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DCLOSE|-DNP|-l -m200000|pass|"
    "A.W.n2.a2.executor.asis.fn_in_node|-DPOLICY=0 -DNCALLERS=2 $A2 -DEXECUTOR $X||-m200000|fail|$FN_MOVED"
    "A.W.n2.a1.close.early_destroy|-DPOLICY=0 -DNCALLERS=2 $A1 $FO -DCLOSE -DASYNC_EARLY_DESTROY||-m200000|fail|$EARLY"
    # where user code runs: on_done may block (B)
    "A.W.n2.a2.close.blocking_cb|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DCLOSE $B||-m200000|pass|"
    "A.W.n2.a2.deadline.blocking_cb|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE $B|-DCOLLAPSE|-m200000|pass|"
    "A.W.n2.a2.deadline.blocking_cb.asis.timer_notifies|-DPOLICY=0 -DNCALLERS=2 $A2 $FD -DDEADLINE $B -DNO_DELIVERY_THREAD||-m200000|fail|$TIMER_HELD"
    "A.L.n2.a1.executor.blocking_cb|-DPOLICY=2 -DNCALLERS=2 $A1 $FD -DEXECUTOR $X $B||-m200000|pass|"
    "A.L.n2.a1.executor.blocking_cb.asis.notify_first|-DPOLICY=2 -DNCALLERS=2 $A1 $FD -DEXECUTOR $X $B -DOLD_NOTIFY_ORDER||-m200000|fail|$CB_STUCK"
    "A.W.n2.a1.executor.submit_fail.no_stops.blocking_cb|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DEXECUTOR -DSUBMIT_FAIL $XS $B -DNO_STOPS||-m200000|pass|"
    "A.W.n2.a1.executor.submit_fail.no_stops.blocking_cb.asis.notify_first|-DPOLICY=0 -DNCALLERS=2 $A1 $FD -DEXECUTOR -DSUBMIT_FAIL $XS $B -DNO_STOPS -DOLD_NOTIFY_ORDER||-m200000|fail|$CB_STUCK"
    "A.W.n3.a2.no_fn_error.blocking_cb_again|-DPOLICY=0 $A2 $FD $BA -DNO_FN_ERROR|-DCOLLAPSE|-m200000|pass|"
    "A.W.n3.a2.no_fn_error.blocking_cb_again.asis.no_drain_own|-DPOLICY=0 $A2 $FD $BA -DNO_FN_ERROR -DNO_DRAIN_OWN||-m200000|fail|$CB_STUCK"
  )
fi

if [[ -n "${ONLY:-}" ]]; then
  selected=()
  for c in "${configs[@]}"; do
    if grep -qE -- "$ONLY" <<<"${c%%|*}"; then selected+=("$c"); fi
  done
  configs=("${selected[@]}")
fi

run_one() {
  local line="$1"
  local name defs ccflags panflags expect text
  IFS='|' read -r name defs ccflags panflags expect text <<<"$line"
  local d="$work/$name"
  mkdir -p "$d"
  cp "$here"/*.pml "$d/"
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  # CPU seconds (user + system) of spin, cc and pan: on a busy machine the wall time
  # says little, the CPU time is what this row costs on an idle core
  local TIMEFORMAT='%3U %3S'
  { time (
    cd "$d"
    # shellcheck disable=SC2086
    local model=singleflight.pml
    [[ "$name" == wt.* ]] && model=worker_threads.pml
    spin -a $defs "$model" >spin.txt 2>&1 || { echo "spin -a failed" >>pan.txt; exit 1; }
    local safety="-DSAFETY"
    [[ "$ccflags" == *-DNP* ]] && safety=""
    # shellcheck disable=SC2086
    "$CC" -w -O0 $safety $ccflags -o pan pan.c >cc.txt 2>&1 || { echo "cc failed" >>pan.txt; exit 1; }
    # shellcheck disable=SC2086
    ./pan $panflags >pan.txt 2>&1 || true
  ) ; } 2>"$d/cpu.txt" || rc=1
  t1=$(date +%s.%N)
  local out="$d/pan.txt"
  local errors states mem verdict="ok"
  errors=$(grep -o 'errors: [0-9]*' "$out" | awk '{print $2}' | tail -1)
  states=$(grep 'states, stored' "$out" | awk '{print $1}' | tail -1)
  mem=$(grep 'total actual memory usage' "$out" | awk '{print $1}' | tail -1)
  if [[ $rc != 0 || -z "$errors" ]]; then
    verdict="MISMATCH (no result)"
  elif [[ "$expect" == pass && "$errors" != 0 ]]; then
    verdict="MISMATCH (expected errors: 0): $(grep -m1 -E 'violated|invalid end|cycle' "$out" | cut -c1-160)"
  elif [[ "$expect" == fail && "$errors" == 0 ]]; then
    verdict="MISMATCH (expected a violation)"
  elif [[ "$expect" == fail ]] && ! grep -m1 'assertion violated' "$out" | grep -qF -- "$text"; then
    verdict="MISMATCH (violated something else): $(grep -m1 -E 'violated|invalid end' "$out" | cut -c1-160)"
  fi
  local transitions
  transitions=$(grep 'transitions (= stored+matched)' "$out" | awk '{print $1}' | tail -1)
  local cpu
  cpu=$(awk 'NF == 2 { print $1 + $2 }' "$d/cpu.txt" | tail -1)
  printf '%-44s %-4s errors: %-2s stored: %-9s transitions: %-10s mem: %7s MB %6.1fs cpu %6.1fs  %s\n' \
    "$name" "$expect" "${errors:-?}" "${states:-?}" "${transitions:-?}" "${mem:-?}" \
    "$(echo "$t1 - $t0" | bc)" "${cpu:-0}" "$verdict"
}
export -f run_one
export work here CC

echo "spin models of singleflight ($(spin -V | head -1)); $([[ ${FULL:-0} == 1 ]] && echo full || echo default) mode, ${#configs[@]} configurations, $JOBS jobs"
start=$(date +%s)
printf '%s\n' "${configs[@]}" | xargs -d '\n' -P "$JOBS" -I{} bash -c 'run_one "$1"' _ {} | tee "$work/summary.txt"
echo "total: $(( $(date +%s) - start ))s wall, $(awk '{ for (i = 1; i < NF; i++) if ($i == "cpu") s += $(i + 1) } END { printf "%.0f", s }' "$work/summary.txt")s cpu"
if grep -q MISMATCH "$work/summary.txt"; then
  echo "run.sh: FAILED ($(grep -c MISMATCH "$work/summary.txt") mismatches)"
  exit 1
fi
echo "run.sh: all $(wc -l <"$work/summary.txt") configurations as expected"
