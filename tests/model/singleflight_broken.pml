/*
 * singleflight_broken.pml -- two protocol mistakes spin must reject (run.sh checks
 * the same variants through -D flags, with three callers for the first):
 *
 *  - UNCONDITIONAL_CLEANUP + FORGET: finish() erases the key's entry (map_.erase(key))
 *    instead of its own node; a forgotten flight's late finish evicts its successor's
 *    entry and a third caller starts a second fn for the key ("at most one fn per key").
 *  - RELOCK_AFTER_CLAIM: a claimed follower, once signalled, retakes the group's mutex
 *    to read its outcome although the settler already counted it out of users_: it
 *    touches the group after close() may have returned (TOUCH: counted[i]; with -DCLOSE
 *    -DNO_COUNTED_CHECK the owner has destroyed the group: !destroyed).
 *
 *   spin -a -DPOLICY=1 singleflight_broken.pml && gcc -DSAFETY -o pan pan.c && ./pan
 */
#define UNCONDITIONAL_CLEANUP
#define RELOCK_AFTER_CLAIM
#define FORGET
#include "singleflight.pml"
