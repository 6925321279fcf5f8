// Package job holds what every owned run shares: how a run was triggered,
// how it ended, and the exit code each ending maps to. The owned-run
// template (internal/owned) returns a Result for every kind; the CLI, the
// HTTP API and the Kafka consumer translate it for their callers.
package job

import (
	"errors"
	"fmt"
)

// Source is where a trigger came from.
type Source string

const (
	SourceKafka Source = "kafka"
	SourceCron  Source = "cron"
	SourceHTTP  Source = "http"
	SourceCLI   Source = "cli"
	// SourceResume is the resumer (internal/owned): a run accepted earlier
	// that did not complete, taken up again without a new trigger.
	SourceResume Source = "resume"
)

// Trigger identifies one request to run a job.
type Trigger struct {
	Source    Source `json:"trigger"`
	RequestID string `json:"request_id"`
	// RequestedBy is who asked, as the trigger says: a Kafka record's or
	// HTTP body's requested_by, else the admin token's name (HTTP), the
	// replica (cron) or the OS user (CLI).
	RequestedBy string `json:"requested_by,omitempty"`
	// Principal is who was authenticated: the admin token's name for HTTP;
	// empty where the coordinator authenticates nobody (Kafka, cron, CLI).
	Principal string `json:"principal,omitempty"`
}

// Outcome is how an owned run ended.
type Outcome string

const (
	OutcomeCompleted        Outcome = "completed"
	OutcomeAlreadyCompleted Outcome = "already_completed"
	OutcomeAlreadyOwned     Outcome = "already_owned"
	OutcomeUnavailable      Outcome = "unavailable"
	OutcomeLost             Outcome = "lost"
	OutcomeFailed           Outcome = "failed"
)

// Exit codes of `coordinator run` and `coordinator lock` (docs/contract.md).
const (
	ExitOK          = 0
	ExitFailed      = 1
	ExitUsage       = 64 // EX_USAGE
	ExitUnavailable = 69 // EX_UNAVAILABLE
	// ExitTempFail (EX_TEMPFAIL): try again later. The lock was owned by
	// another holder, or the run failed for a transient cause (Postgres
	// unreachable, say): the result's outcome tells which.
	ExitTempFail     = 75
	ExitAlreadyOwned = ExitTempFail
	ExitLost         = 76
)

// ExitCode is the process exit code of a result: its outcome's, except
// ExitUsage for a run that failed on its caller's input and ExitTempFail
// for one that failed for a transient cause (Retryable).
func (r Result) ExitCode() int {
	switch {
	case r.Outcome == OutcomeFailed && r.BadInput:
		return ExitUsage
	case r.Outcome == OutcomeFailed && r.Retryable:
		return ExitTempFail
	}
	return r.Outcome.ExitCode()
}

// ExitCode maps an outcome to the process exit code.
func (o Outcome) ExitCode() int {
	switch o {
	case OutcomeCompleted, OutcomeAlreadyCompleted:
		return ExitOK
	case OutcomeAlreadyOwned:
		return ExitAlreadyOwned
	case OutcomeUnavailable:
		return ExitUnavailable
	case OutcomeLost:
		return ExitLost
	default:
		return ExitFailed
	}
}

// Handled reports whether an outcome alone finishes a trigger of a kind
// that has no resumer: completed, already_completed, already_owned (the
// holder's run is the answer) and failed. Unavailable and lost are not: the
// trigger is redelivered. Result.Handled is the full rule.
func (o Outcome) Handled() bool { return o != OutcomeUnavailable && o != OutcomeLost }

// Result is the one JSON object `coordinator run` prints.
type Result struct {
	Job       string           `json:"job"`
	Key       string           `json:"key"`
	Outcome   Outcome          `json:"outcome,omitempty"` // empty only while a run is still going (HTTP 202)
	Replica   string           `json:"replica"`
	Owner     string           `json:"owner,omitempty"`
	Fence     int64            `json:"fence,omitempty"`
	RequestID string           `json:"request_id,omitempty"`
	Counts    map[string]int64 `json:"counts,omitempty"`
	Error     string           `json:"error,omitempty"`
	// DurationMS is the wall time of the run, lock wait included.
	DurationMS int64 `json:"duration_ms"`
	// Retryable says a failed run failed for a transient cause (a dropped
	// connection, a Postgres restart or failover, Redis unreachable, a
	// timeout): trying again may complete it. False for a permanent failure.
	Retryable bool `json:"retryable,omitempty"`
	// Deferred says the run did not complete and its request is recorded in
	// Postgres (run_requests) for the resumer: the trigger is finished with,
	// the resumer owes the completed run.
	Deferred bool `json:"deferred,omitempty"`
	// BadInput says a failed run failed on its caller's input (an error
	// wrapping ErrBadInput, e.g. an adjustment of a period whose bill run
	// has not COMPLETED): nothing ran that a retry would change. The CLI
	// exits 64 and HTTP answers 422 for it, not 1 and 500.
	BadInput bool `json:"bad_input,omitempty"`
	// Resumable says the kind has a resumer (its Worker has Incomplete:
	// owned.Worker).
	Resumable bool `json:"-"`
}

// Handled reports whether the trigger of this result is finished with, so a
// Kafka offset may be committed: the run completed (or had been), failed
// permanently, or was handed to the resumer (Deferred). A kind without a
// resumer keeps Outcome.Handled's rule, except that a retryable failure is
// retried too. Anything else (unavailable, lost, a retryable failure, an
// already_owned answer of a resumable kind, that could not be recorded) is
// tried again.
func (r Result) Handled() bool {
	switch {
	case r.Outcome == OutcomeCompleted, r.Outcome == OutcomeAlreadyCompleted, r.Deferred:
		return true
	case r.Outcome == OutcomeFailed:
		return !r.Retryable
	case r.Outcome == OutcomeAlreadyOwned:
		return !r.Resumable
	}
	return false
}

// ErrAtCapacity marks work refused because the replica already has as many
// runs in flight as it admits (COORDINATOR_MAX_RUNS_IN_FLIGHT): nothing
// ran; retry later or on another replica (HTTP 429).
var ErrAtCapacity = errors.New("at capacity")

// CapacityError is an ErrAtCapacity with the cap that was reached.
type CapacityError struct {
	// Limit is the cap, InFlight the runs in flight when the work came.
	Limit, InFlight int
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("at capacity: %d runs in flight, the cap is %d", e.InFlight, e.Limit)
}

func (e *CapacityError) Is(target error) bool { return target == ErrAtCapacity }

// ErrBadInput marks input that is wrong no matter how often it is retried
// (a malformed period, say). Triggers carrying it go to the dead-letter topic;
// the CLI exits 64.
var ErrBadInput = errors.New("bad input")

// BadInput wraps a message as ErrBadInput.
func BadInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}
