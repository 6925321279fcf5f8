// Package ownership is the port of ADR-024's DistributedLock
// (docs/adr/024-distributed-lock-strategy.md): it decides
// which replica owns a piece of scheduled work (a bill run for a period, an
// MSISDN reaper sweep) and tells the owner when it stops owning it.
//
// It imports no Redis, Kafka or Postgres package. Implementations:
// MemoryLocker here (unit tests, COORDINATOR_LOCK_ENABLED=false) and the
// Redis adapter in redislock. Both pass the conformance suite in
// ownershiptest, so they behave alike.
//
// # Using it
//
//	err := ownership.WithLock(ctx, locker, "billrun:2026-11", 0, func(ctx context.Context) error {
//		lease, _ := ownership.LeaseFromContext(ctx, "billrun:2026-11")
//		for batch := range batches {
//			if err := ctx.Err(); err != nil {
//				return err // lease lost (or shutdown): stop at the batch boundary
//			}
//			commitBatch(ctx, batch, lease.Fence()) // the fence guards every write
//		}
//		return nil
//	})
//	switch {
//	case errors.Is(err, ownership.ErrAlreadyOwned): // another replica runs it: emit already_owned
//	case errors.Is(err, ownership.ErrUnavailable):  // fail closed: nothing ran; retry later
//	case errors.Is(err, ownership.ErrLeaseLost):    // ran, but lost the lock midway
//	}
//
// # Leases
//
// Acquire(ctx, key, 0) takes a watchdog lease: the lock lives for the
// watchdog timeout (default 30s) and one renewal loop per Locker renews
// every such lease each third of it, for as long as the process holds it.
// Acquire(ctx, key, d) with d > 0 takes an explicit lease: the lock
// hard-expires after d, with no renewal.
//
// A Lease's life:
//
//	Acquire ──> HELD ──(reentrant Acquire through lease.Context: holds+1;
//	             │ │     Release of one hold: holds-1)
//	             │ │
//	             │ └─ last Release: compare-and-delete ──────────> RELEASED
//	             │
//	             └─── renewal or Release finds the lock gone or
//	                  taken over; no successful renewal before the
//	                  trust deadline; explicit lease's end; Close ──> LOST
//
//	RELEASED and LOST: Done is closed, Context is cancelled, and Err is
//	ErrReleased or ErrLeaseLost. A later Release returns ErrNotHeld.
//
// Every acquisition gets a fence, strictly increasing per key (reentrant
// holds share the outer one): max(last fence + 1, the clock in µs), so it
// keeps rising when the backend forgets (Redis FLUSHALL, a restart without
// persistence, a failover; a restarted process's MemoryLocker). Fences are
// large (~1.8e15 in 2026) and fit int64 and JSON doubles. Postgres, not the
// lock, is the last word: work writes its fence and every batch checks it,
// and a bill-run claim refuses a fence below the one it recorded, so a
// stale owner that lost its lease without noticing still cannot commit.
//
// The holder trusts a lease only until its local trust deadline:
// (time the acquire or last successful renewal was sent) + TTL -
// SafetyMargin(TTL), on the monotonic clock. So it stops before Redis can
// have expired the lock, whatever the network did.
//
// Acquire is reentrant only through a context that carries the lease
// (Lease.Context, or the ctx WithLock passes to its function): two
// goroutines of one process are two owners and exclude each other.
//
// # Waiting
//
// A held key makes Acquire wait, up to the Locker's wait time (default 5s)
// and ctx. Waiters of one process queue in FIFO order, and only the head
// asks the backend. Across processes (Redis), waiting Lockers queue per key
// in Redis: a release hands the lock to the oldest waiting Locker (reserved
// for it for 25ms) and wakes that Locker alone, on its own pub/sub channel
// (one subscription per process, not one per lock). A waiting head asks
// again at least every second, which renews its queue ticket; a waiter that
// gives up leaves the queue, one that died is skipped once its ticket lapses
// (3s), so nobody starves behind it.
//
// # What happens on failure
//
//   - Redis unreachable at Acquire: *AcquireError with Reason unavailable
//     (errors.Is ErrUnavailable) and the cause; the work does not run
//     (fail closed). The Redis client fails a dial within about a second.
//   - Key held elsewhere past the wait time: *AcquireError with Reason
//     already_owned (errors.Is ErrAlreadyOwned) and the owner's replica id.
//     ctx cancelled or past its deadline while waiting: the same, wrapping
//     ctx.Err(). Every AcquireError carries Code LOCK_ACQUISITION_FAILED
//     and the Key.
//   - Redis does not answer an acquire in time, or ctx ends while the
//     request is in flight: unavailable (the outcome is unknown, not
//     "owned"), and the lock the request may have written is deleted by its
//     token in the background.
//   - A Redis stall longer than the client's read timeout: go-redis sends
//     the script again and both copies may run. Every script gives the same
//     result run twice: no hold counted twice, no lock deleted under a
//     remaining hold, no "not held" for a release that succeeded.
//   - Replicas (Redis WAIT, COORDINATOR_LOCK_REDIS_WAIT_REPLICAS): an
//     acquisition the required replicas did not acknowledge fails closed
//     (unavailable) and is deleted; an unacknowledged renewal does not move
//     the trust deadline.
//   - A Redis whose eviction policy can evict lock keys: every Acquire is
//     unavailable, and `coordinator` refuses to start.
//   - Redis unreachable while a watchdog lease is held: renewals fail and
//     are retried each interval; if none succeeds before the trust
//     deadline, the lease is lost: Done closes, the context is cancelled,
//     Err is ErrLeaseLost. Work stops at its next checkpoint; the fence
//     stops anything that slips through.
//   - Lock deleted or taken over behind the holder's back: the next
//     renewal (within a third of the TTL) sees it and the lease is lost.
//   - The process dies: nobody renews; the lock expires after at most one
//     TTL and another replica takes it (its waiters wake at the expiry).
//   - Redis restarts empty: held leases are lost at the next renewal or
//     their trust deadline; the Locker reconnects, reloads its scripts and
//     resubscribes on its own, and new leases renew normally.
//   - Release of a lease no longer held: an error matching ErrNotHeld; the
//     compare-and-delete (owner token and fence) leaves the new owner's lock
//     untouched, and renewal of the old lease has already stopped.
//   - A lease lost while its lock may still exist in Redis (renewals failed
//     but may have landed, an explicit lease's end): the lock is deleted by
//     its token once the holder has had its safety margin to stop, best
//     effort; so is a lock a late renewal extended after the trust deadline.
//   - A Release whose context ends while a renewal batch is in flight does
//     not wait for it; a Release that fails leaves its lock to be deleted by
//     token in the background (the TTL is the backstop).
//   - Locker.Close: every lease still held is lost (Done closes); the locks
//     in Redis are not deleted and expire on their own (a caller may keep a
//     lock past its process on purpose, as the reaper's minimum hold does).
//   - A bad key (empty, over MaxKeyLength, outside [A-Za-z0-9._:/-]):
//     ErrInvalidKey, before any backend call.
//
// # What it does not promise
//
// Survival of asynchronous replication (a failover can lose a lock: WAIT
// narrows the window, fencing keeps the data right), safety across clock
// steps on the Redis host (Redis expires by its wall clock), or across a
// suspended or frozen holder (timers run on CLOCK_MONOTONIC, which stops
// during suspend: only the fence protects until the holder resumes and
// notices). docs/lock.md says why and what to configure
// (noeviction, min-replicas-to-write, min-replicas-max-lag).
//
// # Metrics
//
// NewMetrics registers coordinator_lock_acquisitions_total{outcome},
// coordinator_lock_acquire_wait_seconds, coordinator_lock_hold_seconds,
// coordinator_lock_renewals_total{outcome}, coordinator_lock_leases_lost_total
// and coordinator_lock_leases_held. A nil *Metrics records nothing.
package ownership
