// Package owned is the extension point for kinds of owned runs: what a kind
// is (Kind), the kinds a process serves (Registry), and the one template
// that runs every kind (Runner). A kind does its work; the template does the
// rest the same way for all of them; transports (Kafka, cron, HTTP, the CLI)
// iterate over the Registry and never name a kind.
//
// # A kind
//
// A kind package describes its kind in a Def[P], P being its runs' typed
// parameters, and Define makes the Kind every transport sees:
//
//	owned.Define(owned.Def[Request]{
//		Spec:    owned.Spec{Name: "billrun", Topic: ..., HTTPPath: ...},
//		Decode:  func(in owned.Input) (Request, error) { ... },  // every source, the CLI included
//		Encode:  func(r Request) ([]byte, map[string]any) { ... },
//		Flags:   func(fs *flag.FlagSet) func([]string) (map[string]any, error) { ... },
//		LockKey: func(r Request) string { return "billrun:" + r.Period.String() },
//		Open:    func(d owned.Deps) (owned.Worker[Request], error) { ... },
//	})
//
// Params, what transports carry, are opaque: the template hands them back
// to the kind that made them as its P, so no kind casts and no kind
// panics on another's. Input is judged once, by Decode: the CLI's flags
// become a trigger's fields (Flags only maps them) and Decode judges them
// like a Kafka record's or an HTTP body's. Everything else a kind can ask
// of the template is a field of Def or of the Worker that Open returns,
// and nowhere else: Worker.Lease (explicit lease, minimum hold), Claim (a
// fenced claim in the kind's store), AlreadyCompleted (a look before
// the lock that answers already_completed for work nothing undoes),
// Schedule and Tick (cron), Status with
// Def.StatusID (GET HTTPPath/{id}), Observe (metrics of its own),
// Incomplete (resumable: its incomplete runs, for the resumer),
// Completions (its store records Kafka's acknowledgement of
// run.completed, so the resumer re-publishes one lost with a crash: at
// least once, same id); Def.RecordLockKey names a rejected record's key. A
// Worker that declares one half of a pair (Status without StatusID, a
// Schedule without Tick, AlreadyCompleted without Claim) is refused when
// it is opened. A RejectError
// marked Unprocessable is answered 422 over HTTP.
//
// A kind's settings are a Config of its own package, given when the kind
// is made: internal/kinds maps the process's configuration onto them, and
// nothing below it reads internal/config. ownedtest.CheckKind is the
// conformance check a kind runs against itself; example_kind_test.go is a
// complete kind.
//
// The kind's name is its entry in the registry of lock-key namespaces:
// kind "billrun" locks "billrun:2026-11", and no other kind may lock under
// "billrun:". The Registry refuses two kinds with one name, command, topic
// or path; the Runner refuses a key outside the kind's namespace.
//
// # A run
//
//	Begin:   Worker.AlreadyCompleted ──✓──▶ already_completed, before_lock (nothing acquired)
//	           │ cannot tell
//	           ▼
//	         acquire key ──✗──▶ already_owned (owner named) | unavailable | failed    (nothing ran)
//	           │ ownership.acquired
//	           ▼
//	         Claim (Worker.Claim) ──✗──▶ already_completed | lost | failed    (released)
//	           │ the claim's fence on every later event
//	           ▼
//	Execute: Worker.Run under the lease ──▶ completed | lost | failed
//	           │ run.completed | ownership.lost | run.failed, with the Report's counts
//	           ▼
//	         release (at acquired + MinHold, if later) ── ownership.released
//
// Begin and Execute are separate so that an HTTP caller can answer 202
// once the run is owned and claimed; Run is both. The work's context is the
// lease's (cancelled when the lease is lost), also cancelled with cause
// ErrShutdown when the caller's context ends.
//
// # What happens on failure
//
// Every accepted trigger ends in a completed run or in a failure that
// pages. For a resumable kind, the template records the request of a run
// that did not complete in run_requests (requests.go) before the Result
// reaches the transport (Result.Deferred), and the Resumer (resumer.go)
// finishes it.
//
//   - Lock contended: already_owned naming the owner (exit 75); the other
//     replica's lock is untouched; nothing runs. A resumable kind's request
//     is recorded (the holder may still die before it completes), then a
//     Kafka trigger is committed.
//   - Lock backend unreachable or the wait budget spent: unavailable (exit
//     69), fail closed; a Kafka trigger is retried, not committed; a cron
//     tick's request is recorded for the resumer.
//   - The work returns an error: failed (exit 1); the lock is released. The
//     error is classified (IsRetryable; a kind marks its store's transient
//     errors with Retryable): transient (connection refused or reset, admin
//     shutdown, serialization failure, deadlock, timeouts, the lock backend
//     unavailable) or permanent. run.failed says which (retryable). A
//     transient failure is recorded and resumed; a permanent one is
//     recorded permanent (it pages) and its Kafka trigger committed.
//   - The lease is lost mid-run, or the caller shuts down: the kind stops at
//     its next checkpoint; lost (exit 76) with reason lease_lost or
//     shutdown (or the kind's own, through Lost). A lease still held is
//     released. A resumable kind's request is recorded and resumed, then a
//     Kafka trigger is committed; otherwise it is not committed, so a
//     redelivery resumes. An error that comes back after the work's
//     context was cancelled is taken as lost: the safe side.
//   - Recording a request fails (Postgres down): the Result is not
//     Deferred and a Kafka trigger is retried in place.
//   - The owner dies (kill -9): nothing is recorded at the time; the
//     resumer finds the run in the kind's own store (Incomplete: a bill run
//     RUNNING with its lock expired) and resumes it, whatever started it.
//   - The work finished although its context was cancelled meanwhile (every
//     step committed under a fence): completed, as the kind says.
//   - Release fails: logged; the lock expires with its TTL.
//
// # The resumer
//
// Every replica runs one (the replica's resumer component). Every
// ResumeInterval it adopts each resumable kind's incomplete runs into
// run_requests, sets coordinator_incomplete_runs and
// coordinator_incomplete_run_oldest_age_seconds, and runs the due requests
// whose lock is not held, ResumerConfig.Concurrency (2) at a time and
// without holding up the next scan, through Runner.Run (the replica
// passes its dispatcher's Run) with trigger source job.SourceResume and the
// request's id: lock, claim, the kind's own resume. Completed: the request
// goes. Lost or a transient failure: attempts+1, next try after the
// interval doubled per attempt (at most 1h); MaxAttempts spent: permanent.
// already_owned or unavailable: tried at the next scan, not counted.
//
// On a ticker of its own, the resumer also re-publishes the run.completed
// of every kind with Completions's completions left unacknowledged for
// RepublishAfter (a bill run's owner killed with the event in its sink's
// buffer), with the id the kind stored with the completion
// (Run.CompletionEventID) and data.republished_by; the kind marks them once
// the sink acknowledged the copy.
//
//	accepted ─▶ run ─┬─ completed ──────────────▶ (request deleted)
//	                 ├─ failed, permanent ──────▶ permanent: pages
//	                 └─ lost, transient failure, already_owned
//	                        ▼
//	                  run_requests ─▶ resumer ─┬─ completed ─▶ (deleted)
//	                        ▲                  └─ lost, transient: backoff,
//	                        └──────────────────── attempts+1 (max: permanent)
//
// # Where the next pieces slot in
//
// The template owns the outcome mapping (classify), the events (Run.send)
// and the phases (acquire, Claim, Run, release), and hands each kind a *Run;
// the requester and principal (job.Trigger.RequestedBy, Principal) reach
// every event from Run.send, and a kind's Claim records them from Run.Trigger
// (bill_runs.requested_by, principal).
//
// # Progress and tracing
//
// A kind reports progress on its *Run (SetTotal, Resumed, Committed: two
// atomic adds a batch); the template turns it into a <job>_progress log
// record every RunnerConfig.ProgressInterval (ProgressLog, or RunnerConfig.Progress: the
// CLI's terminal bar) and the coordinator_run_progress_* gauges of the runs
// in flight (progress.go). With RunnerConfig.Tracer set, the run is a span ("run
// <job>", child of the trigger's trace context in Begin's ctx) with
// lock.acquire, run.claim, lock.release and one "event <type>" span per
// event beneath it, and the kind's own spans through Run.StartSpan
// (tracing.go). Every event carries the run's W3C traceparent, and the
// run's logger its trace_id; with tracing off no span starts, and the
// trigger's own traceparent, if any, is what the events carry.
package owned
