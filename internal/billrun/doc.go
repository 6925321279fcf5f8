// Package billrun runs a billing period's bill run with one owner across
// replicas: ADR-024's (docs/adr/024-distributed-lock-strategy.md) first consumer (billing-service's RunBillCommandHandler
// and BillRunBatchProcessor, re-thought). It is a kind of owned run (New
// defines it; its Worker has a Claim): the owned template takes the lock,
// calls Claim and Run, emits the ownership events and releases; this
// package claims, plans and runs the fenced batches.
//
// Files: config.go (Config, its defaults and checks), kind.go (the kind:
// decoding, flags, the Worker's capabilities), period.go and calendar.go
// (periods, and which may be billed), claim.go, plan.go, batch.go, retry.go,
// run.go (a run, and its end), progress.go (the progress total),
// complete.go (what COMPLETED proves: reconcile, repair, complete),
// completion.go (run.completed at least once), adjust.go (late usage,
// unbilled subscribers and adjustment runs), late.go (the late check kept
// per period, answered before the lock), status.go, metrics.go, seed.go
// (test and demo data), sql.go; testhooks.go, sabotage.go and sabotage_chaos.go by build tag
// (TestDocListsEveryFile keeps this list whole).
//
// # Billing periods
//
// A period starts and ends at midnight in the billing zone (Calendar;
// COORDINATOR_BILLING_TZ, default UTC). It is billable once closed (its end
// is past there): the open month and future months are refused as a trigger
// is decoded (Decode, Flags: owned.Reject period_not_closed, so a Kafka
// record goes to the DLQ, HTTP answers 422, the CLI exits 64), whatever
// force says, and by Claim as a backstop. A period more than MaxAgeMonths
// (COORDINATOR_BILLRUN_MAX_AGE_MONTHS, 24) before the current month needs
// force (period_too_old). The zone and the limit are the kind's Config
// (Calendar; internal/kinds maps COORDINATOR_BILLING_TZ and
// COORDINATOR_BILLRUN_MAX_AGE_MONTHS onto it); the schedule fires in the billing zone
// unless its spec names one, and a tick bills the month before the tick's
// there.
//
// The population of period P is fixed by the run's first claim, which records
// P's start and end instants in the billing zone, the zone and the claim time
// (cutoff_at) in bill_runs; every later claim keeps them. A subscriber is in
// it when created_at <= cutoff_at, activated_at is NULL or before end(P),
// deactivated_at is NULL or after start(P), and it is not deactivated by
// status alone (status other than ACTIVE with deactivated_at NULL counts as
// deactivated before any period). Its invoice is monthly_fee_cents *
// active_days / days_in_month rounded half up, plus the period's usage
// charges (stored apart in usage_cents); a day (in the recorded zone) counts
// when the subscriber was active for any part of it, so a full month is
// exactly the fee and a deactivation at midnight does not count the day it
// begins.
//
// # A run
//
// For a period P ("2026-11", see ParsePeriod):
//
//  0. Before the lock, the template asks AlreadyCompleted (claim.go): a
//     COMPLETED row with a kept late check for its fence (late.go), and no
//     adjustment run RUNNING, is answered run.already_completed (data
//     before_lock) from one statement, with the late usage; nothing is
//     acquired. COMPLETED is final (nothing here sets it back), so the
//     answer is Claim's. Anything else goes on to the lock.
//  1. The template acquires the ownership lock billrun:P in watchdog mode.
//     Contended: event ownership.already_owned naming the owner, outcome
//     already_owned.
//     Backend down: ownership.unavailable, outcome unavailable. Nothing runs.
//  2. Claim the bill_runs row in one statement (sqlClaim): a COMPLETED row is
//     left alone (run.already_completed, release, outcome already_completed);
//     otherwise fence = fence + 1, owner = this replica, status RUNNING,
//     lock_fence = the Redis lease's fencing token. The template's Begin stops
//     here, so an HTTP caller can answer 202 once ownership is proven;
//     Execute goes on with Run.
//  3. Plan batches: keyset steps of BatchSize over the population's ids
//     (the primary key, filtered by the cutoff read back from the claimed
//     row), never entering a range already in bill_run_batches
//     for P (resume). The planner streams batches to the
//     workers through a small channel: memory does not grow with the number
//     of subscribers.
//  4. Workers (Workers of them) run each batch as one statement (sqlBatch),
//     one round trip and one implicit transaction:
//     (a) SELECT ... FROM bill_runs WHERE period=P AND fence=F AND status='RUNNING' FOR SHARE,
//     taken before any subscriber is read — no row means the claim was
//     superseded: nothing is written and the batch reports fence lost;
//     (b) one INSERT ... SELECT of the range's invoices, amount = the
//     prorated monthly fee + the period's usage charges, ON CONFLICT
//     (subscriber_id, period) DO NOTHING RETURNING subscriber_id — subscribers minus inserted rows are
//     already_invoiced, with a sample of their ids;
//     (c) INSERT into bill_run_batches (range, fence, owner, counts); the
//     statement's end commits.
//  5. Complete (complete.go), once every planned batch committed: one
//     transaction, one snapshot (REPEATABLE READ), that holds the row
//     under the fence (FOR NO KEY UPDATE) reconciles the period in the
//     database (sqlReconcile: the population
//     at the cutoff, anti-joined with the period's invoices), bills any
//     member without an invoice under the same fence (sqlRepair: sqlBatch's
//     fence check and invoicing, ON CONFLICT DO NOTHING; counted as
//     repaired, logged with the id ranges), checks none is left, and marks
//     the row COMPLETED with the counts read back from the database
//     (sqlFinish), committing with synchronous_commit on; then run.completed
//     (with population, repaired, outside_population, empty_population), release
//     (ownership.released), outcome completed. A gap it cannot close rolls
//     back: FAILED, retryable, and it pages. Subscribers found already
//     invoiced are reported in one billrun.invoice_conflict event (count and
//     sample) and in the result's counts.
//
// # Progress
//
// A run tells the template (owned.Run) the batches earlier runs committed,
// each batch it commits with its subscribers, and its total: an estimate
// counted beside the first batches (sqlCountToPlan: the population less
// those of the committed batches, in batches), then the exact number once
// the planner has walked the whole population (progress.go). The total is
// stored in bill_runs.batches_total under the fence, so GET
// /v1/billruns/{period} shows the same progress on every replica (Status.
// Progress; percent 100 once COMPLETED). Each batch is a billrun.batch span
// when the run is traced.
//
// # Events
//
// Through the template's events.Emitter: Key = the lock key, Job
// "billrun", Replica, Trigger (the trigger's source), RequestID. Fence is the
// bill_runs claim fence once the period is claimed (data.lock_fence carries
// the Redis lease's token); ownership.acquired, emitted before the claim,
// carries the lease's token as Fence. ownership.already_owned names the
// Owner. run.completed, run.failed and ownership.lost carry the counts, the
// database's wherever the run reached its row (sqlFinish);
// ownership.lost its reason (lease_lost, fence_lost, shutdown); run.failed
// the error. billrun.invoice_conflict comes once per run with the
// already_invoiced count and a sample of subscriber ids, and once per
// escaped unique violation with sqlstate, constraint and id range.
//
// # States of a bill_runs row
//
//	            claim (fence+1)           all batches committed, reconciled
//	(no row) ─────────────────────▶ RUNNING ───────────────────────────────▶ COMPLETED
//	                                 │  ▲ │                                   (final: a later
//	       lease lost / shutdown /   │  │ │ a batch keeps failing, or a gap    claim answers
//	       fence superseded          │  │ │ the completion cannot close        already_completed)
//	                                 ▼  │ ▼
//	                       INTERRUPTED  │  FAILED
//	                                 └──┴───┘
//	                       a later claim (fence+1) resumes from the
//	                       batches in bill_run_batches
//
// A RUNNING row whose owner died (kill -9) stays RUNNING until the next claim:
// the next owner holds the Redis lock, so it takes the row over (fence+1).
// Every row that is not COMPLETED is listed to the resumer (the Worker's
// Incomplete), which claims it once its lock is free: nobody has to
// trigger the period again.
//
// # Why a stale owner cannot commit
//
// The Redis lease says who should run; Postgres decides what commits. The
// claim's upsert needs the bill_runs row lock, which conflicts with the FOR
// SHARE every batch statement takes on the same row. So a batch of fence F
// either commits before the claim of F+1 takes the row, or its fence check
// runs after that claim committed and finds no row. A process that was
// paused past its lease (GC pause, SIGSTOP, VM migration) and wakes up after
// a new owner claimed cannot commit a single batch: it ends lost. A batch
// holds FOR SHARE only while its one statement runs, in Postgres, whatever
// its client does meanwhile, so a paused client cannot block the new claim.
// (An adjustment is a transaction of several statements; a paused process
// inside it is ended by Postgres after IdleInTransactionTimeout.)
//
// # What happens on failure
//
//   - Lock contended: already_owned (exit 75), owner named; nothing runs.
//     The request is recorded for the resumer (owned), so the period is
//     finished even if the owner dies before completing it.
//   - Lock backend down: unavailable (exit 69); nothing runs. A Kafka trigger
//     is redelivered; a cron tick is recorded for the resumer.
//   - The claim meets a transient error (a dropped connection, a failover):
//     retried like a batch (MaxBatchAttempts, RetryBackoff); a claim that
//     committed unseen costs a fence. Still failing: failed, retryable.
//   - Lease lost mid-run (renewal found the lock gone, or Redis unreachable
//     until the local trust deadline): no new batch starts; in-flight batch
//     transactions are cancelled and roll back; the row is marked
//     INTERRUPTED if the fence is still ours; ownership.lost with reason
//     lease_lost; outcome lost (exit 76).
//   - Execute's ctx cancelled (shutdown): the same, reason shutdown, and the
//     lock is released at once.
//   - Fence superseded (a batch's fence check found no row, or the final
//     update did): lost, reason fence_lost; the row is left to its new owner.
//   - A claim under a lock fence below the row's lock_fence (this replica's
//     lock was lost without it noticing and a newer holder claimed the run):
//     refused, lost, reason fence_lost, naming both lock fences; the row is
//     left to the newer holder.
//   - Process killed (kill -9): committed batches stay committed, the
//     in-flight transaction rolls back (Postgres), the lock expires after the
//     watchdog timeout; the resumer of another replica (or a redelivered
//     trigger) claims fence+1 and resumes, skipping the committed ranges
//     (batches_skipped > 0), whether Kafka, cron or HTTP started the run.
//   - A batch fails transiently (Postgres restarted, connection lost,
//     serialization failure, deadlock): retried with exponential backoff
//     (RetryBackoff, doubling, capped at 32x) up to MaxBatchAttempts tries;
//     then no new batch starts, the row is FAILED with last_error, run.failed,
//     release, outcome failed (exit 1), marked retryable (owned.Retryable,
//     from postgres.IsTransient): the resumer resumes it with backoff. A
//     failure whose cause is not transient is permanent: it pages, and a
//     person triggers the period again once the cause is fixed.
//   - A unique violation (SQLSTATE 23505) escapes ON CONFLICT (another unique
//     index, an identity collision): recognised by its code, reported as a
//     billrun.invoice_conflict event (sqlstate, constraint, range) and counted
//     in unique_violations, then retried like a transient error (an identity
//     collision clears on retry); if it persists the run is FAILED and
//     last_error names the constraint. Never a generic error, never silent.
//   - Postgres unreachable when ending the run: the row stays RUNNING; the
//     resumer's next claim takes it over.
//   - Postgres lost commits it acknowledged (synchronous_commit=off and a
//     crash, a failover to an asynchronous replica) and the run went on
//     past them: the completion finds the lost batches' subscribers without
//     an invoice and bills them under its fence before COMPLETED (repaired;
//     CoordinatorBillRunRepaired). A resume plans the ranges whose batch
//     records were lost like any uncommitted range.
//   - The completion cannot bill the gap (its inserts refused, subscribers
//     still missing after the repair): the transaction rolls back, the row
//     is FAILED with last_error ("not completed"), the failure is
//     retryable (the resumer retries it) and pages
//     (coordinator_billrun_reconcile_failures_total,
//     CoordinatorBillRunUnreconciled).
//
// Resume never double-bills or skips: a committed range is skipped whole and
// ranges are never split across runs; ON CONFLICT DO NOTHING is only the
// backstop. A subscriber whose status changes after its range was committed
// is not revisited by the same period's run; one created after the cutoff
// is not in it.
//
// # Late usage and unbilled subscribers
//
// Usage of P that arrives after P is COMPLETED is the difference between the
// subscriber's usage charges and what its invoice (usage_cents) and earlier
// adjustments cover: an amount, so the order in which usage transactions
// commit does not matter. A subscriber of P with no invoice at all (created
// after the cutoff, or backdated into P after its batch) is unbilled. A
// trigger that finds P COMPLETED measures both and reports them, without
// reading P's invoices (late.go: the subscribers late at P's kept check and
// those changed since, by index; a completion keeps the first check, a
// period without one is checked in full once, under the lock): billrun.late_usage, the gauge
// coordinator_billrun_late_usage_subscribers{period}, and the counts
// late_usage_subscribers, late_usage_cents and unbilled_subscribers. An
// adjustment run (Request Adjust; `coordinator run billrun --period P
// --adjust`) takes the same lock, claims bill_run_adjustments (fence+1 per
// claim, refused to a stale lock fence, only once the bill run is
// COMPLETED) and, in one transaction that holds that row FOR SHARE under
// its fence, bills every unbilled subscriber as the bill run would
// (invoices.adjust_fence, exactly once by uidx_invoices_sub_period), inserts
// one invoice_adjustments row per subscriber with uncovered usage (unique
// subscriber, period, fence) and ends the claim COMPLETED. Repeating it
// finds nothing to do.
package billrun
