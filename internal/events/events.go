// Package events defines the ownership events every replica emits, their
// CloudEvents 1.0 encoding, and sinks that jobs write to without knowing
// where the events go (Kafka, stderr, a test recorder).
package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Type is a CloudEvents type of the contract (docs/contract.md, docs/events.md).
type Type string

const (
	OwnershipAcquired      Type = "ownership.acquired"
	OwnershipAlreadyOwned  Type = "ownership.already_owned"
	OwnershipUnavailable   Type = "ownership.unavailable"
	OwnershipLost          Type = "ownership.lost"
	OwnershipReleased      Type = "ownership.released"
	RunCompleted           Type = "run.completed"
	RunAlreadyCompleted    Type = "run.already_completed"
	RunFailed              Type = "run.failed"
	BillrunInvoiceConflict Type = "billrun.invoice_conflict"
	BillrunLateUsage       Type = "billrun.late_usage"
	TriggerRejected        Type = "trigger.rejected"
)

// Topic is where events are published.
const Topic = "coordinator.ownership.events"

// Source is the CloudEvents source attribute of every event.
const Source = "urn:telco-platform:coordinator"

// Event is one ownership decision or run ending. Data fields beyond the
// named ones go in Extra (counts, reasons, samples).
type Event struct {
	ID        string
	Type      Type
	Time      time.Time
	Key       string // lock key; also the CloudEvents subject and the Kafka key
	Job       string
	Replica   string
	Trigger   string
	RequestID string
	// RequestedBy and Principal say who asked (job.Trigger); omitted when
	// empty.
	RequestedBy string
	Principal   string
	Fence       int64
	Owner       string
	Extra       map[string]any
	// TraceParent and TraceState are the W3C trace context of the run the
	// event reports (CloudEvents distributed-tracing extension); empty when
	// the run has none (tracing off and a trigger without traceparent).
	TraceParent, TraceState string
}

// CloudEvent is the structured-mode JSON form (CloudEvents 1.0).
type CloudEvent struct {
	SpecVersion     string         `json:"specversion"`
	ID              string         `json:"id"`
	Source          string         `json:"source"`
	Type            Type           `json:"type"`
	Subject         string         `json:"subject"`
	Time            time.Time      `json:"time"`
	DataContentType string         `json:"datacontenttype"`
	Data            map[string]any `json:"data"`
	// TraceParent and TraceState are the distributed-tracing extension
	// attributes.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// TraceID is the trace id inside a W3C traceparent ("" if malformed).
func TraceID(traceparent string) string {
	if len(traceparent) < 55 || traceparent[2] != '-' || traceparent[35] != '-' {
		return ""
	}
	return traceparent[3:35]
}

// Cloud returns the CloudEvents form, filling ID and Time when unset.
func (e Event) Cloud() CloudEvent {
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	data := make(map[string]any, 8+len(e.Extra))
	for k, v := range e.Extra {
		data[k] = v
	}
	data["key"] = e.Key
	data["job"] = e.Job
	data["replica"] = e.Replica
	data["trigger"] = e.Trigger
	data["request_id"] = e.RequestID
	if e.Fence != 0 {
		data["fence"] = e.Fence
	}
	if e.Owner != "" {
		data["owner"] = e.Owner
	}
	if e.RequestedBy != "" {
		data["requested_by"] = e.RequestedBy
	}
	if e.Principal != "" {
		data["principal"] = e.Principal
	}
	return CloudEvent{
		SpecVersion: "1.0", ID: e.ID, Source: Source, Type: e.Type, Subject: e.Key,
		Time: e.Time.UTC(), DataContentType: "application/json", Data: data,
		TraceParent: e.TraceParent, TraceState: e.TraceState,
	}
}

// MarshalJSON encodes the event as a structured CloudEvent.
func (e Event) MarshalJSON() ([]byte, error) { return json.Marshal(e.Cloud()) }

// NewID returns a random 128-bit hex id (event ids, request ids).
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Emitter takes events. Emit never blocks the work for long: sinks buffer or
// drop (and count) rather than stall an owned run.
type Emitter interface {
	Emit(ctx context.Context, e Event)
}

// Acker is an Emitter that can say when its destination acknowledged an
// event (the Kafka sink: the broker's ack of that record). onAcked is called
// at most once, and never for an event that was dropped; it runs on the
// sink's producer goroutine, so it must not block (start a goroutine).
type Acker interface {
	EmitAcked(ctx context.Context, e Event, onAcked func())
}

// EmitAcked emits e through em and, when em is an Acker, asks to be told of
// its acknowledgement; an emitter without one never calls onAcked.
func EmitAcked(ctx context.Context, em Emitter, e Event, onAcked func()) {
	if a, ok := em.(Acker); ok {
		a.EmitAcked(ctx, e, onAcked)
		return
	}
	em.Emit(ctx, e)
}

// EmitterFunc adapts a function to Emitter.
type EmitterFunc func(ctx context.Context, e Event)

func (f EmitterFunc) Emit(ctx context.Context, e Event) { f(ctx, e) }

// Multi sends every event to each emitter in turn.
type Multi []Emitter

func (m Multi) Emit(ctx context.Context, e Event) { m.EmitAcked(ctx, e, nil) }

// EmitAcked sends e to each emitter; onAcked (if not nil) is called once,
// when the first Acker among them acknowledges it.
func (m Multi) EmitAcked(ctx context.Context, e Event, onAcked func()) {
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if onAcked != nil {
		var once sync.Once
		acked := onAcked
		onAcked = func() { once.Do(acked) }
	}
	for _, em := range m {
		if a, ok := em.(Acker); ok && onAcked != nil {
			a.EmitAcked(ctx, e, onAcked)
			continue
		}
		em.Emit(ctx, e)
	}
}

// JSONLines writes each event as one CloudEvents JSON line (the `run`
// command's stderr stream).
type JSONLines struct {
	mu sync.Mutex
	w  io.Writer
}

// NewJSONLines returns an Emitter writing to w.
func NewJSONLines(w io.Writer) *JSONLines { return &JSONLines{w: w} }

func (j *JSONLines) Emit(_ context.Context, e Event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	_, _ = j.w.Write(append(b, '\n'))
}

// Recorder keeps events in memory; tests read them back.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *Recorder) Emit(_ context.Context, e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Events returns a copy of what was recorded.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// OfType returns the recorded events of type t.
func (r *Recorder) OfType(t Type) []Event {
	var out []Event
	for _, e := range r.Events() {
		if e.Type == t {
			out = append(out, e)
		}
	}
	return out
}
