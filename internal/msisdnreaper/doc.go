// Package msisdnreaper is ADR-024's (docs/adr/024-distributed-lock-strategy.md) second consumer: subscription-service's
// MSISDN pool (FR-13) and the reaper that frees reservations whose hold has
// passed. Every replica ticks; the ownership lock msisdn-reaper:sweep decides
// which one sweeps.
//
// # The pool
//
//	         Reserve (FOR UPDATE SKIP LOCKED, hold on the DB clock)
//	 FREE ─────────────────────────────────────────▶ RESERVED
//	  ▲  ▲                                            │   │
//	  │  └──── Release (on purpose) ──────────────────┘   │ Allocate, only while
//	  │  └──── Sweep (reserved_until < now()) ────────┘   │ reserved_until >= now()
//	  │                                                   ▼
//	Replenish (new numbers, lock msisdn-pool:replenish)  ALLOCATED
//
// Replenish is a library call that takes its lock itself; internal/replenish
// runs it as a kind of owned run (Kafka, HTTP, CLI triggers), under a lease
// that Replenish then re-enters.
//
// Each transition is one statement whose WHERE clause is its precondition,
// so a refused transition changes nothing and returns a *TransitionError
// (ErrIllegalTransition; ErrReservationExpired when Allocate comes too
// late; ErrNotReservationHolder for another reservation's token),
// ErrNotFound or ErrPoolExhausted.
//
// Reserve gives each reservation a random token (column reservation_token,
// migration 00011) and Allocate and Release match it: a caller whose hold
// passed, was swept, and whose number another caller then reserved gets
// ErrNotReservationHolder from its late Allocate or Release, and the other
// caller keeps the number. reserved_by alone could not tell them apart (the
// same caller name may reserve twice). The sweep and Release clear the
// token; it stays on an ALLOCATED row so a retried Allocate succeeds. Allocate and the sweep have
// complementary preconditions on the same row lock: whichever locks the row
// first wins and the other re-checks the winner's row version, so a
// reservation allocated while a sweep runs is never freed, and a freed one is
// never allocated.
//
// # The sweep
//
// The sweep is a kind of owned run (SweepKind; its Worker is the Sweeper):
// the owned template takes msisdn-reaper:sweep with an explicit lease
// (Config.Lease, default 20 s), a bounded critical section that hard-expires,
// and emits the ownership events. The Sweeper then runs Config.Workers loops
// (default 2) of batch transactions, each one statement:
//
//	update msisdn_pool set state = 'FREE', ...
//	 where msisdn = any(array(select msisdn from msisdn_pool
//	                           where state = 'RESERVED' and reserved_until < now()
//	                           limit $1 for update skip locked))
//
// The database clock decides staleness, never the replica's. SKIP LOCKED lets
// workers (and a replica whose lease ran out while another took over) pass
// each other's rows, and passes rows a client is allocating right now. The
// sweep is correct without the lock; the lock makes it efficient (one
// replica works, the others report already_owned instead of racing).
//
// Before each batch a worker checks, in order: the local deadline
// (acquired + Lease - SafetyMargin), the shared halt, ctx, lease.Done(). A
// batch in flight always finishes, even past the lease's end (the sweep is
// correct without the lock); it is bounded by Lease from its own start, so
// a hung database cannot hold a tick forever.
//
// # Minimum hold (ShedLock's lockAtLeastFor)
//
// When the sweep ends before MinHold has passed since the lock was taken, the
// lock is not deleted yet: the run returns (event ownership.released with
// release "after_min_hold") and the template's timer deletes the lock at
// acquired + MinHold, so a replica whose tick comes a little later (clock skew, jitter)
// finds it held and reports already_owned instead of sweeping again. When
// the sweep ran longer than MinHold, the lock is released at once. The lock
// is taken with TTL max(Lease, MinHold*1.1 + 100ms), so that if the process
// ends before the timer, the lock still expires soon after MinHold. The lease
// is released, not left to run out, so min holds are not counted as lost
// leases. Keep the lock wait time (COORDINATOR_LOCK_WAIT_TIME) below
// MinHold, or a replica that waits will sweep (an empty table) once the hold
// ends.
//
// # Counts
//
// A sweep's freed is the sum of what its batch statements reported (the
// rows each UPDATE returned), never an assumption about a batch: a batch
// whose answer was lost (the connection broke after it committed) freed
// rows no count includes, and fails the sweep. A replenishment's added and
// existing are what its statements reported: the distinct numbers offered
// and those the INSERT inserted.
//
// # What happens on failure
//
//   - Lock backend unreachable: outcome unavailable, event
//     ownership.unavailable, nothing runs (fail closed, ADR-024 decision 7).
//   - Another replica holds the lock: outcome already_owned naming it.
//   - The lease's local deadline passes mid-sweep: no new batch starts;
//     outcome completed with Counts["deadline_reached"] = 1; the rows left
//     are freed by the next tick.
//   - The lease is lost before the deadline, or ctx is cancelled (shutdown):
//     no new batch starts, outcome lost, event ownership.lost with the reason.
//     Rows already freed stay freed (each batch committed on its own).
//   - A batch fails (Postgres down): the other workers stop at their next
//     boundary, outcome failed, event run.failed; the next tick retries.
//   - The process dies mid-sweep: committed batches stand, the in-flight one
//     rolls back, the lock expires with its lease, the next tick resumes.
package msisdnreaper
