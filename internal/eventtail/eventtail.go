// Package eventtail is the console's live tail of the events topic: one
// Kafka client per replica reads every partition with no consumer group
// (so it steals nothing and sees the events of every replica), from the
// moment it started, and fans each event out to any number of subscribers
// (the console's event streams).
//
// A subscriber never slows the tail, the event sink or a run: each has a
// bounded buffer of its own, the fan-out only tries to put an event in it,
// and an event that does not fit is dropped for that subscriber alone and
// counted (its stream says so). The tail's client is separate from the
// sink's producer; they share nothing but the broker.
package eventtail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/console"
)

// Config configures the tail.
type Config struct {
	// Brokers and Topic (the events topic) are required.
	Brokers []string
	Topic   string
	// ClientOpts are extra franz-go options (TLS, SASL, client id).
	ClientOpts []kgo.Opt
	Log        *slog.Logger
}

// Tail reads the events topic and fans its records out.
type Tail struct {
	cfg  Config
	cl   *kgo.Client
	stop context.CancelFunc
	done chan struct{}
	once sync.Once

	mu   sync.RWMutex
	subs map[*subscription]struct{}

	received atomic.Int64
}

var _ console.Events = (*Tail)(nil)

// New checks cfg; Start connects.
func New(cfg Config) (*Tail, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return nil, errors.New("eventtail: Brokers and Topic are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Tail{cfg: cfg, done: make(chan struct{}), subs: map[*subscription]struct{}{}}, nil
}

// Start begins reading at the events of this instant: records timestamped
// from now on, in every partition, whenever the client learns of them.
func (t *Tail) Start(context.Context) error {
	from := kgo.NewOffset().AfterMilli(time.Now().Add(-time.Second).UnixMilli())
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(t.cfg.Brokers...),
		kgo.ConsumeTopics(t.cfg.Topic),
		kgo.ConsumeResetOffset(from),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}, t.cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("eventtail: client: %w", err)
	}
	t.cl = cl
	ctx, cancel := context.WithCancel(context.Background())
	t.stop = cancel
	go t.loop(ctx)
	return nil
}

// Stop ends the tail and closes every subscription's channel. Safe twice.
func (t *Tail) Stop() {
	t.once.Do(func() {
		if t.cl != nil {
			t.stop()
			<-t.done
			t.cl.Close()
		}
		t.mu.Lock()
		for s := range t.subs {
			s.closeLocked()
		}
		t.subs = map[*subscription]struct{}{}
		t.mu.Unlock()
	})
}

// Received is how many records the tail read.
func (t *Tail) Received() int64 { return t.received.Load() }

// Subscribers is how many subscriptions are open.
func (t *Tail) Subscribers() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.subs)
}

func (t *Tail) loop(ctx context.Context) {
	defer close(t.done)
	for {
		fetches := t.cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			t.cfg.Log.Warn("event_tail_fetch_failed", "topic", topic, "partition", p, "error", err)
		})
		fetches.EachRecord(func(r *kgo.Record) {
			t.received.Add(1)
			t.Publish(r.Value)
		})
	}
}

// Publish fans one CloudEvent out to every subscriber without waiting for
// any (the tail calls it per record; tests and benchmarks may too), on one
// line: a value spread over lines is compacted.
func (t *Tail) Publish(value []byte) {
	var head struct {
		Type    string `json:"type"`
		Subject string `json:"subject"`
	}
	if err := json.Unmarshal(value, &head); err != nil || head.Type == "" {
		return
	}
	// A stream message is one line of data: a producer's line breaks
	// (valid JSON whitespace) would tear it in two.
	if bytes.ContainsAny(value, "\r\n") {
		var one bytes.Buffer
		if json.Compact(&one, value) != nil {
			return
		}
		value = one.Bytes()
	}
	ev := console.TailEvent{JSON: value, Key: head.Subject, Type: head.Type}
	t.mu.RLock()
	defer t.mu.RUnlock()
	for s := range t.subs {
		select {
		case s.ch <- ev:
		default:
			s.dropped.Add(1)
		}
	}
}

// Subscribe implements console.Events.
func (t *Tail) Subscribe(buffer int) console.Subscription {
	s := &subscription{t: t, ch: make(chan console.TailEvent, max(buffer, 1))}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cl != nil && t.stop != nil {
		select {
		case <-t.done: // stopped: a closed subscription
			s.closeLocked()
			return s
		default:
		}
	}
	t.subs[s] = struct{}{}
	return s
}

type subscription struct {
	t       *Tail
	ch      chan console.TailEvent
	dropped atomic.Int64
	closed  bool
}

func (s *subscription) C() <-chan console.TailEvent { return s.ch }
func (s *subscription) Dropped() int64              { return s.dropped.Load() }

// Close ends the subscription; its channel is closed. Safe twice.
func (s *subscription) Close() {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	delete(s.t.subs, s)
	s.closeLocked()
}

func (s *subscription) closeLocked() {
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}
