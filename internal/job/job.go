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
)

// Trigger identifies one request to run a job.
type Trigger struct {
	Source      Source `json:"trigger"`
	RequestID   string `json:"request_id"`
	RequestedBy string `json:"requested_by,omitempty"`
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

// Exit codes of `coordinator run` and `coordinator lock` (DESIGN.md contract).
const (
	ExitOK           = 0
	ExitFailed       = 1
	ExitUsage        = 64 // EX_USAGE
	ExitUnavailable  = 69 // EX_UNAVAILABLE
	ExitAlreadyOwned = 75 // EX_TEMPFAIL
	ExitLost         = 76
)

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

// Handled reports whether a trigger with this outcome is finished with, so a
// Kafka offset may be committed. Unavailable (the lock backend was down) and
// lost (ownership ended mid-run, e.g. on shutdown) are not: the trigger is
// redelivered, and a redelivery resumes or finds the run already completed,
// so nothing is lost.
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
}

// ErrBadInput marks input that is wrong no matter how often it is retried
// (a malformed period, say). Triggers carrying it go to the dead-letter topic;
// the CLI exits 64.
var ErrBadInput = errors.New("bad input")

// BadInput wraps a message as ErrBadInput.
func BadInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}
