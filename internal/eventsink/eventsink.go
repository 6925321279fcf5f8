// Package eventsink publishes ownership events to Kafka: CloudEvents 1.0
// structured JSON, keyed by lock key, through franz-go's idempotent
// producer.
//
// Emit never blocks the work. Events go into a bounded buffer that a
// background pump hands to the Kafka client, at most MaxInFlight at a time
// and at most one per key (lock key): the next event of a key leaves only
// once Kafka acknowledged the one before, so events of one key are
// published in the order they were emitted, retries included. Events of
// other keys pass a key that waits.
// If Kafka is unreachable the events wait; once the buffer is full the
// oldest waiting event is dropped, counted in coordinator_events_dropped_total
// and logged. (The events already handed to the client, at most MaxInFlight
// and one per key, are not dropped: the idempotent producer delivers them
// once Kafka is back. So during a long outage those and the newest
// waiting ones survive.) coordinator_events_buffered shows what waits (buffer plus
// in flight), which never exceeds BufferSize.
//
// What happens on failure: a record the client gives up on (only records to
// a topic the broker keeps saying does not exist, since the idempotent
// producer retries everything else without limit) goes back to the head of
// the buffer and is tried again; the later events of its key are still
// waiting behind it, so none overtakes it. Stop flushes within StopTimeout
// and then counts whatever is still waiting as dropped.
package eventsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
)

// ContentType is the header every record carries.
const ContentType = "application/cloudevents+json"

// Kafka is an events.Emitter that publishes to Kafka, and an events.Acker.
type Kafka struct {
	cfg Config
	cl  *kgo.Client
	log *slog.Logger
	// produce is cl.Produce; tests wrap it to inject faults.
	produce func(context.Context, *kgo.Record, func(*kgo.Record, error))

	mu       sync.Mutex
	ring     []*kgo.Record // waiting records; head at ring[head], n of them
	head, n  int
	inflight int
	// keysInFlight are the keys with a record in the client's hands: at
	// most one per key, so a record that fails and is retried is never
	// overtaken by a later one of its key.
	keysInFlight map[string]bool
	stopped      bool
	closed       bool // client closed; counts are final
	started      bool
	changed      chan struct{} // closed and replaced whenever n or inflight changes
	dropped      int64
	lastWarn     time.Time
	published    int64

	wake     chan struct{}
	quit     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// New builds the sink. Nothing is contacted until Start.
func New(cfg Config) (*Kafka, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.ProducerLinger(cfg.Linger),
		kgo.MaxBufferedRecords(cfg.MaxInFlight + 1),
	}, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("eventsink: kafka client: %w", err)
	}
	return &Kafka{
		cfg: cfg, cl: cl, log: cfg.Log, produce: cl.Produce,
		ring:         make([]*kgo.Record, cfg.BufferSize),
		keysInFlight: map[string]bool{},
		changed:      make(chan struct{}),
		wake:         make(chan struct{}, 1),
		quit:         make(chan struct{}),
		done:         make(chan struct{}),
	}, nil
}

// Start begins publishing in the background. Kafka need not be reachable:
// events wait in the buffer until it is.
func (k *Kafka) Start(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.started {
		return errors.New("eventsink: already started")
	}
	if k.stopped {
		return errors.New("eventsink: stopped")
	}
	k.started = true
	go k.pump()
	return nil
}

// Emit encodes e as a CloudEvent and queues it. It never blocks beyond a
// mutex: when the buffer is full the oldest waiting event is dropped. A
// span in ctx becomes the parent of the record's publish span (kotel, when
// tracing is on); ctx's cancellation is not the record's.
func (k *Kafka) Emit(ctx context.Context, e events.Event) { k.EmitAcked(ctx, e, nil) }

// ackKey carries an event's onAcked in its record's Context, which the
// record keeps through the client and a retry.
type ackKey struct{}

// EmitAcked is Emit, and onAcked (if not nil) is called once Kafka
// acknowledged the event (events.Acker): on the producer's goroutine, so it
// must not block. A dropped event (buffer full, sink stopped) never calls it.
func (k *Kafka) EmitAcked(ctx context.Context, e events.Event, onAcked func()) {
	if e.ID == "" {
		e.ID = events.NewID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	value, err := json.Marshal(e)
	if err != nil {
		k.log.Error("event_encode_failed", "event_id", e.ID, "type", string(e.Type), "error", err)
		k.cfg.Metrics.drop(1)
		return
	}
	rec := &kgo.Record{
		Topic:   k.cfg.Topic,
		Key:     []byte(e.Key),
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte(ContentType)}},
	}
	if ctx != nil && trace.SpanContextFromContext(ctx).IsValid() {
		rec.Context = context.WithoutCancel(ctx)
	}
	if onAcked != nil {
		if rec.Context == nil {
			rec.Context = context.Background()
		}
		rec.Context = context.WithValue(rec.Context, ackKey{}, onAcked)
	}
	k.mu.Lock()
	if k.stopped {
		k.dropLocked(1, "sink stopped", e.Type)
		k.mu.Unlock()
		return
	}
	if k.n+k.inflight >= k.cfg.BufferSize {
		old := k.popLocked()
		k.dropLocked(1, "buffer full", eventType(old))
	}
	k.pushLocked(rec)
	k.mu.Unlock()
	k.poke()
}

// Buffered returns how many events wait (buffered plus in flight).
func (k *Kafka) Buffered() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n + k.inflight
}

// Dropped returns how many events this sink dropped.
func (k *Kafka) Dropped() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dropped
}

// Flush waits until every event emitted so far is acknowledged by Kafka, or
// ctx ends (the error then says how many still wait).
func (k *Kafka) Flush(ctx context.Context) error {
	for {
		k.mu.Lock()
		waiting, ch := k.n+k.inflight, k.changed
		k.mu.Unlock()
		if waiting == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("eventsink: flush: %d events still waiting: %w", waiting, ctx.Err())
		}
	}
}

// Stop flushes within StopTimeout, then closes the client; events still
// waiting are counted as dropped. Emit after Stop drops. Safe twice.
func (k *Kafka) Stop() {
	k.stopOnce.Do(func() {
		k.mu.Lock()
		started := k.started
		k.mu.Unlock()
		if started {
			ctx, cancel := context.WithTimeout(context.Background(), k.cfg.StopTimeout)
			if err := k.Flush(ctx); err != nil {
				k.log.Warn("event_flush_incomplete", "error", err)
			}
			cancel()
		}
		k.mu.Lock()
		k.stopped = true
		k.mu.Unlock()
		close(k.quit)
		if started {
			<-k.done
		}
		k.cl.Close()
		k.mu.Lock()
		k.closed = true
		if k.inflight > 0 { // the client gave up on them; late promises are ignored
			k.dropLocked(k.inflight, "sink stopped", "")
			k.inflight = 0
			k.signalLocked()
		}
		if k.n > 0 {
			n := k.n
			for k.n > 0 {
				k.popLocked()
			}
			k.dropLocked(n, "sink stopped", "")
		}
		k.mu.Unlock()
	})
}

// pump hands waiting records to the client, MaxInFlight at a time and at
// most one per key (see takeLocked).
func (k *Kafka) pump() {
	defer close(k.done)
	for {
		k.mu.Lock()
		var recs []*kgo.Record
		if !k.stopped {
			recs = k.takeLocked()
		}
		k.mu.Unlock()
		// The client never holds more than MaxInFlight records and its
		// buffer is one larger, so Produce does not block here.
		for _, rec := range recs {
			k.produce(context.Background(), rec, k.promise)
		}
		if len(recs) > 0 {
			continue // more may be ready
		}
		select {
		case <-k.wake:
		case <-k.quit:
			return
		}
	}
}

// scanLimit bounds how many waiting records one pass of the pump looks at
// to find ones whose key has no record in flight.
const scanLimit = 1024

// takeLocked takes the waiting records the client may have now: in buffer
// order, up to MaxInFlight in flight, skipping every record whose key has a
// record in flight or an earlier record skipped in this pass (so records of
// one key leave in order, one at a time, and a key whose record waits on a
// retry holds up only itself). Skipped records stay where they were.
func (k *Kafka) takeLocked() []*kgo.Record {
	var (
		out, kept []*kgo.Record
		blocked   map[string]bool
	)
	for scanned := 0; k.n > 0 && k.inflight+len(out) < k.cfg.MaxInFlight && scanned < scanLimit; scanned++ {
		r := k.ring[k.head]
		k.ring[k.head] = nil
		k.head = (k.head + 1) % len(k.ring)
		k.n--
		key := string(r.Key)
		if k.keysInFlight[key] || blocked[key] {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[key] = true
			kept = append(kept, r)
			continue
		}
		k.keysInFlight[key] = true
		out = append(out, r)
	}
	for i := len(kept) - 1; i >= 0; i-- {
		k.head = (k.head - 1 + len(k.ring)) % len(k.ring)
		k.ring[k.head] = kept[i]
		k.n++
	}
	if len(out) > 0 {
		k.inflight += len(out)
		k.signalLocked()
	}
	return out
}

func (k *Kafka) promise(rec *kgo.Record, err error) {
	k.mu.Lock()
	if !k.closed {
		k.inflight--
		delete(k.keysInFlight, string(rec.Key))
	}
	switch {
	case err == nil:
		k.published++
		k.cfg.Metrics.ok()
	case k.closed:
		// Stop already counted it.
	case k.stopped:
		k.dropLocked(1, "sink stopped", eventType(rec))
	default:
		k.cfg.Metrics.failed()
		if k.warnDue() {
			k.log.Warn("event_publish_failed", "topic", rec.Topic, "lock_key", string(rec.Key), "error", err)
		}
		// Back to the head of the buffer: the records of its key that
		// follow it are all still waiting (one per key in flight), so it
		// goes out before them.
		retry := &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Context: rec.Context}
		if k.n+k.inflight >= k.cfg.BufferSize {
			k.dropLocked(1, "buffer full", eventType(rec))
		} else {
			k.pushFrontLocked(retry)
		}
	}
	k.signalLocked()
	k.mu.Unlock()
	k.poke()
	if err == nil && rec.Context != nil {
		if onAcked, ok := rec.Context.Value(ackKey{}).(func()); ok {
			onAcked()
		}
	}
}

func (k *Kafka) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *Kafka) pushLocked(r *kgo.Record) {
	k.ring[(k.head+k.n)%len(k.ring)] = r
	k.n++
	k.signalLocked()
}

func (k *Kafka) pushFrontLocked(r *kgo.Record) {
	k.head = (k.head - 1 + len(k.ring)) % len(k.ring)
	k.ring[k.head] = r
	k.n++
	k.signalLocked()
}

func (k *Kafka) popLocked() *kgo.Record {
	r := k.ring[k.head]
	k.ring[k.head] = nil
	k.head = (k.head + 1) % len(k.ring)
	k.n--
	k.signalLocked()
	return r
}

func (k *Kafka) signalLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
	k.cfg.Metrics.setBuffered(k.n + k.inflight)
}

func (k *Kafka) dropLocked(n int, reason string, typ events.Type) {
	k.dropped += int64(n)
	k.cfg.Metrics.drop(n)
	if k.warnDue() {
		k.log.Warn("events_dropped", "reason", reason, "count", n, "type", string(typ), "dropped_total", k.dropped)
	}
}

// warnDue rate-limits warnings to one a second, so a long outage does not
// flood the log.
func (k *Kafka) warnDue() bool {
	now := time.Now()
	if now.Sub(k.lastWarn) < time.Second {
		return false
	}
	k.lastWarn = now
	return true
}

// eventType reads the CloudEvents type back from a record, for log lines.
func eventType(r *kgo.Record) events.Type {
	if r == nil {
		return ""
	}
	var ce struct {
		Type events.Type `json:"type"`
	}
	_ = json.Unmarshal(r.Value, &ce)
	return ce.Type
}
