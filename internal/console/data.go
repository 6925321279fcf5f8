package console

import (
	"context"
	"time"

	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// The console reads through these interfaces only. internal/consoledb
// implements Store and Sessions on Postgres, internal/eventtail Events on
// the events topic; the replica passes its Locker (Locks), health monitor
// (Health), runner (InFlight) and admin API (Trigger).

// Store is what the console reads from the shared database: the run
// history, the indexed events, the replicas' heartbeats, the requests the
// resumer still owes, and the dead-lettered triggers.
type Store interface {
	// Runs lists a kind's runs newest first (keyset: ids below q.Before).
	Runs(ctx context.Context, job string, q RunQuery) ([]Run, error)
	// Events lists every indexed event of a lock key in the order Kafka
	// gave them, at most limit (the oldest first).
	Events(ctx context.Context, key string, limit int) ([]Event, error)
	// Replicas are the replicas' latest heartbeats.
	Replicas(ctx context.Context) ([]Replica, error)
	// Pending are the runs accepted and not completed (run_requests).
	Pending(ctx context.Context) ([]Pending, error)
	// DeadLetters counts the triggers dead-lettered since, by reason.
	DeadLetters(ctx context.Context, since time.Time) ([]DeadLetters, error)
	// RecentEvents lists the newest indexed events whose key starts with
	// prefix ("" every key), newest first.
	RecentEvents(ctx context.Context, prefix string, limit int) ([]Event, error)
	// Failures lists the runs of every kind that ended failed or lost
	// since, newest first.
	Failures(ctx context.Context, since time.Time, limit int) ([]Run, error)
}

// Sessions keeps the console's logins. Only the SHA-256 of a session id is
// handed over; the id itself lives in the browser's cookie only.
type Sessions interface {
	CreateSession(ctx context.Context, s Session) error
	// LookupSession returns the session unless it is missing or expired.
	LookupSession(ctx context.Context, idHash []byte) (Session, bool, error)
	DeleteSession(ctx context.Context, idHash []byte) error
}

// Locks lists the held locks (ownership.Inspector).
type Locks interface {
	Locks(ctx context.Context) ([]ownership.LockInfo, error)
}

// Health is this replica's view of its dependencies (health.Monitor).
type Health interface {
	Snapshot() []health.Result
}

// Events is the live tail of the events topic (eventtail.Tail).
type Events interface {
	// Subscribe returns a subscription with a buffer of its own; events
	// that do not fit are dropped for it alone and counted.
	Subscribe(buffer int) Subscription
}

// Subscription is one reader of the live tail.
type Subscription interface {
	// C delivers the events (raw CloudEvents JSON and its parsed form).
	C() <-chan TailEvent
	// Dropped is how many events did not fit this subscription's buffer.
	Dropped() int64
	Close()
}

// TailEvent is one event of the live tail.
type TailEvent struct {
	// JSON is the record's value, a structured CloudEvent, on one line
	// (no CR or LF: it is one message's data line as it is).
	JSON []byte
	// Key is its subject (lock key), Type its type.
	Key, Type string
}

// TriggerFunc starts a run of the kind whose POST path is path, as the
// admin API would for principal (mutate scope checked by the console), and
// returns the API's answer: status, content type and body.
type TriggerFunc func(ctx context.Context, principal, path string, body []byte) (status int, contentType string, answer []byte)

// InFlightFunc lists this replica's runs in flight, fresher than its
// heartbeat.
type InFlightFunc func() []InFlight

// RunQuery selects a page of a kind's history.
type RunQuery struct {
	// Key, if set, keeps one lock key's runs.
	Key string
	// Before, if set, keeps the runs with ids below it (the next page).
	Before int64
	// Limit is the page size.
	Limit int
}

// Run is one row of the run history.
type Run struct {
	ID                                         int64
	Job, Key, Outcome, Replica                 string
	Fence, LockFence                           int64
	Trigger, RequestID, RequestedBy, Principal string
	Started, Ended                             time.Time
	Counts                                     map[string]int64
	Error                                      string
	Timeline                                   []Point
}

// Duration is how long the run held its lock.
func (r Run) Duration() time.Duration { return r.Ended.Sub(r.Started) }

// Point is a run's progress At after its work began.
type Point struct {
	At            time.Duration
	Batches, Rows int64
}

// Event is one indexed event.
type Event struct {
	ID                      string
	Partition               int32
	Offset                  int64
	Type, Key, Job, Replica string
	Time                    time.Time
	Reason                  string
	Data                    map[string]any
}

// Replica is one replica's latest heartbeat.
type Replica struct {
	ID, Version string
	Started     time.Time
	// Age is how long ago it was seen, by the database's clock.
	Age          time.Duration
	Stopped      bool
	Ready        bool
	Dependencies []Dependency
	Runs         []InFlight
}

// Dependency is one dependency check of a replica.
type Dependency struct {
	Name    string    `json:"name"`
	Checked bool      `json:"checked"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	Since   time.Time `json:"since"`
}

// InFlight is one run in flight and its progress.
type InFlight struct {
	Job         string    `json:"job"`
	Key         string    `json:"key"`
	Replica     string    `json:"replica"`
	Fence       int64     `json:"fence"`
	Trigger     string    `json:"trigger"`
	RequestedBy string    `json:"requested_by,omitempty"`
	Started     time.Time `json:"started"`
	Batches     int64     `json:"batches"`
	// Total is the batches in all; 0 while not known.
	Total int64 `json:"total"`
	Rows  int64 `json:"rows"`
	// Percent is -1 while the total is not known.
	Percent       float64 `json:"percent"`
	RowsPerSecond float64 `json:"rows_per_s"`
	// ETAMS is the time left in milliseconds; -1 while not known.
	ETAMS int64 `json:"eta_ms"`
}

// Pending is a run accepted and not completed: the resumer's next attempt,
// or permanent (it pages).
type Pending struct {
	Job, Key, Outcome, Error string
	Attempts                 int
	Permanent                bool
	AcceptedAt, NextAttempt  time.Time
	Source, RequestedBy      string
}

// DeadLetters is how many triggers were dead-lettered for Reason.
type DeadLetters struct {
	Reason string
	Count  int64
}

// Session is one console login.
type Session struct {
	IDHash    []byte
	Principal string
	// Read and Mutate are the token's scopes at login.
	Read, Mutate bool
	// CSRF is the session's form token.
	CSRF    string
	Expires time.Time
}
