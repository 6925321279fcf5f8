// Package trigger turns Kafka records and cron ticks (and, through httpapi,
// HTTP calls) into owned runs of any registered kind through one
// dispatcher and the owned-run template. It names no kind and knows nothing
// of SQL: kinds own their parameters, their storage and their work.
//
//	Kafka record --DecodeRecord--> KafkaConsumer --Handler--> Dispatcher --> owned.Runner --> the kind's Worker
//	cron tick (a kind's Scheduler) ---------------------------^      ^
//	HTTP call (httpapi) ----------------------------------------------'
//
// # Kafka triggers
//
// KafkaConsumer reads every kind's trigger topic (owned.Spec.Topic, under
// the deployment's prefix) in the consumer group (default "coordinator")
// with auto-commit off. Each partition has one worker that handles its
// records in lanes by record key: one key's records in order, one at a
// time, different keys at once (KafkaConfig.PartitionConcurrency), so a
// trigger never waits for another key's work (partition.go); a key with
// one record pending is started before the keys with a backlog, which go
// round in turn (a new period's trigger is not queued behind a replay). An
// offset is committed, in the background, only once its record and every
// record before it are handled. Handled means the result says so (job.Result.Handled: completed,
// already_completed, failed permanently, or Deferred: the run did not
// complete and its request is recorded in Postgres for the resumer, which
// owes the completed run; for a kind without a resumer, already_owned too)
// or the record was rejected to the DLQ.
//
// DecodeRecord checks what every trigger shares and rejects, with a
// reason: values over MaxRecordBytes (too_large), anything that is not one
// JSON object (malformed_json), request ids or requesters that would not
// print cleanly (bad_request_id, bad_requested_by). The kind's Decode reads
// the rest and rejects with reasons of its own (billrun: missing_period,
// bad_period, key_mismatch). A missing request_id is derived from the
// record: kafka-TOPIC-PARTITION-OFFSET, the same on every redelivery.
//
// # What happens on failure
//
//   - Bad input: the record is copied to coordinator.triggers.dlq (original
//     key, value and headers, plus reason, reason-detail, source-topic,
//     source-partition, source-offset, value-size, value-sha256,
//     value-truncated), a trigger.rejected event is emitted, the offset is
//     committed and the next record is processed. The copy is bounded
//     whatever the record's size (the first 64 KiB of the value, 4 KiB of
//     the key, headers up to 64 KiB), so it never exceeds the producer's
//     record limit. If the DLQ cannot be written (ACLs, topic missing), the
//     record is retried like an unavailable one and
//     coordinator_trigger_dlq_write_failures_total counts the failures.
//   - A compressed batch that would decompress past MaxDecompressBatchBytes
//     (franz-go's ErrDecompressTooLarge, which stops the partition): the
//     records before it are handled, then the batch's coordinates go to the
//     DLQ (reason batch_too_large, no key or value), its last offset is
//     committed, and fetching resumes after it (SetOffsets).
//   - Lock backend unavailable: the job emits ownership.unavailable; the
//     offset is not committed; the worker retries the same record with
//     exponential backoff (RetryBackoffMin..RetryBackoffMax) while records
//     behind it wait. The same for a run lost, failed for a transient cause
//     or answered already_owned whose request could not be recorded for the
//     resumer (Postgres down); once recorded, the offset is committed.
//   - The replica dies: nothing past the last handled record was committed,
//     so the group redelivers; the job's lock and its Postgres fence decide
//     whether the redelivery resumes, finds the run owned, or finds it done.
//   - A partition is revoked or lost: its worker takes no new record and
//     drops its queue. The record in flight is not cancelled (the lock, not
//     the partition, decides who works); the revoke waits up to RevokeWait
//     for it and commits it if it ends in time. Otherwise it keeps running
//     under its lock, is never committed by this replica, and the new
//     partition owner sees it again and answers already_completed, or
//     already_owned, recording the request for the resumer before it
//     commits: if the run then ends lost, the resumer finishes it.
//   - Shutdown: KafkaConsumer.Stop stops fetching, waits up to DrainTimeout
//     for records in flight, then cancels them (a run then ends lost and is
//     not committed), and leaves the group. Dispatcher.Shutdown refuses new
//     work (ErrShuttingDown, outcome unavailable: not committed, HTTP 503),
//     waits for runs in flight within its ctx, then cancels them and waits
//     for them to release. The replica stops the consumer first, then the
//     dispatcher, under one bound.
//
// # Cron
//
// Cron fires every kind's schedule (owned.Worker.Schedule) on every replica (the lock
// decides who works). Each tick's params are the kind's Tick at the tick's
// scheduled time. A tick waits a random jitter first (CronConfig.Jitter,
// COORDINATOR_CRON_JITTER); a tick that finds the previous one of its job
// still running is skipped; a tick that panics is recovered, logged with its
// stack and counted, and the replica goes on. A tick whose run is not
// finished with (job.Result.Handled: it neither completed, nor failed for
// good, nor was recorded for the resumer, e.g. with Postgres down) is run
// again with backoff, the same trigger, until it is, bounded by the
// schedule's next tick (retryTickUntilDurable; cron_tick_retry,
// cron_tick_dropped, or cron_tick_superseded when the next tick does the
// same work). At Start, each schedule's
// latest tick within CronConfig.CatchUpWindow (COORDINATOR_CRON_CATCHUP_WINDOW)
// before the start is run once, as a tick the replica may have missed while
// down: through the dispatcher like any tick, so the lock and the kind's
// claim answer already_owned or already_completed when another replica ran
// it. @every specs have no fixed ticks and are not caught up.
//
// The poll loop never waits for a worker: once records wait behind a busy
// worker its partition is paused, so heartbeats and the other partitions go
// on during a long bill run. A partition is not paused otherwise, which keeps
// the path from a produced trigger to its ownership.acquired event short (see
// bench/notes/trigger.md).
package trigger
