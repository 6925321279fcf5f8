package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Stream timing.
const (
	// streamPing keeps proxies from closing an idle stream, and is when the
	// session is checked again (a logout ends its streams).
	streamPing = 15 * time.Second
	// streamProgressEvery is how often a progress stream sends the runs in
	// flight.
	streamProgressEvery = time.Second
	// streamWriteTimeout bounds one write: a client that reads nothing is
	// dropped instead of holding a goroutine.
	streamWriteTimeout = 10 * time.Second
	// streamBurst bounds the events written before one flush.
	streamBurst = 256
)

// MaxStreamsPerSession bounds the event streams one session holds open at
// once (a page holds one; a browser opens at most six per host over
// HTTP/1.1): a script or a reload loop cannot take all of
// Config.MaxStreams from the other operators.
const MaxStreamsPerSession = 10

// stream is GET /ui/stream, Server-Sent Events:
//
//	event: ownership   data: one CloudEvent (ownership and run events of every replica)
//	event: progress    data: the runs in flight (with ?progress=1)
//	event: dropped     data: {"dropped": N} this stream's events lost so far (its reader fell behind)
//
// ?key=K keeps the events whose lock key starts with K; ?events=0 sends
// none (the overview's progress bars only). Each stream has a bounded
// buffer of its own (Config.StreamBuffer): the tail never waits for it.
func (c *Console) stream(w http.ResponseWriter, r *http.Request, s Session) {
	q := r.URL.Query()
	key := strings.TrimSpace(q.Get("key"))
	wantEvents := q.Get("events") != "0"
	wantProgress := q.Get("progress") == "1"
	if !c.holdStream(s.IDHash) {
		c.metrics.refused("too_many_streams")
		w.Header().Set("Retry-After", "10")
		http.Error(w, fmt.Sprintf("this session has %d event streams open, its limit: close a console tab", MaxStreamsPerSession),
			http.StatusTooManyRequests)
		return
	}
	defer c.releaseStream(s.IDHash)
	if n := c.streams.Add(1); n > int64(c.cfg.MaxStreams) {
		c.streams.Add(-1)
		c.metrics.refused("too_many_streams")
		w.Header().Set("Retry-After", "10")
		http.Error(w, fmt.Sprintf("this replica has %d event streams open, its limit", c.cfg.MaxStreams), http.StatusServiceUnavailable)
		return
	}
	defer c.streams.Add(-1)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	var events <-chan TailEvent
	var sub Subscription
	if wantEvents && c.deps.Events != nil {
		sub = c.deps.Events.Subscribe(c.cfg.StreamBuffer)
		defer sub.Close()
		events = sub.C()
	}
	write := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// writeEvents writes ev and whatever else is waiting (up to a burst)
	// with one flush: a busy tail costs a stream one write per burst, not
	// one per event.
	bucket := newTokenBucket(c.cfg.StreamRate, time.Now())
	var limited int64
	writeEvents := func(ev TailEvent) (open bool, ok bool) {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		for n := 0; ; n++ {
			if key == "" || strings.HasPrefix(ev.Key, key) {
				if !bucket.take(time.Now()) {
					limited++
				} else if !writeMessage(w, ev.JSON) {
					return true, false
				}
			}
			if n == streamBurst {
				break
			}
			select {
			case ev, open = <-events:
				if !open {
					return false, rc.Flush() == nil
				}
				continue
			default:
			}
			break
		}
		return true, rc.Flush() == nil
	}
	hello, _ := json.Marshal(map[string]any{"replica": c.cfg.Replica, "key": key, "events": wantEvents && c.deps.Events != nil})
	if !write("retry: 3000\nevent: hello\ndata: %s\n\n", hello) {
		return
	}
	ping := time.NewTicker(c.cfg.streamCheck)
	defer ping.Stop()
	var progress <-chan time.Time
	if wantProgress {
		t := time.NewTicker(streamProgressEvery)
		defer t.Stop()
		progress = t.C
		if !c.writeProgress(r.Context(), write) {
			return
		}
	}
	var reported int64
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.closing:
			write("event: bye\ndata: {\"reason\":\"replica stopping\"}\n\n")
			return
		case ev, open := <-events:
			if open {
				var ok bool
				if open, ok = writeEvents(ev); !ok {
					return
				}
			}
			if !open { // the tail stopped (shutdown)
				write("event: bye\ndata: {}\n\n")
				return
			}
		case <-progress:
			if !c.writeProgress(r.Context(), write) {
				return
			}
		case <-ping.C:
			if _, ok := c.current(r); !ok { // logged out or expired
				write("event: bye\ndata: {\"reason\":\"session ended\"}\n\n")
				return
			}
			if !write(": ping\n\n") {
				return
			}
		}
		if sub != nil {
			if d := sub.Dropped() + limited; d > reported {
				c.metrics.dropped.Add(float64(d - reported))
				reported = d
				if !write("event: dropped\ndata: {\"dropped\":%d}\n\n", d) {
					return
				}
			}
		}
	}
}

// holdStream counts a stream of the session; false when it has
// MaxStreamsPerSession already.
func (c *Console) holdStream(session []byte) bool {
	c.perSessionMu.Lock()
	defer c.perSessionMu.Unlock()
	if c.perSession[string(session)] >= MaxStreamsPerSession {
		return false
	}
	c.perSession[string(session)]++
	return true
}

func (c *Console) releaseStream(session []byte) {
	c.perSessionMu.Lock()
	defer c.perSessionMu.Unlock()
	if c.perSession[string(session)]--; c.perSession[string(session)] <= 0 {
		delete(c.perSession, string(session))
	}
}

func (c *Console) writeProgress(ctx context.Context, write func(string, ...any) bool) bool {
	runs := c.progress(ctx)
	if runs == nil {
		runs = []InFlight{}
	}
	b, err := json.Marshal(runs)
	if err != nil {
		return false
	}
	return write("event: progress\ndata: %s\n\n", b)
}

var (
	ownershipHead = []byte("event: ownership\ndata: ")
	messageEnd    = []byte("\n\n")
)

// writeMessage writes one ownership message (no formatting: the event's
// JSON is one line already).
func writeMessage(w http.ResponseWriter, data []byte) bool {
	if _, err := w.Write(ownershipHead); err != nil {
		return false
	}
	if _, err := w.Write(data); err != nil {
		return false
	}
	_, err := w.Write(messageEnd)
	return err == nil
}

// tokenBucket bounds the events a stream sends per second (Config.StreamRate):
// a person reads no faster, and the fan-out's cost then stays bounded
// whatever the event rate; what is over is dropped and the stream told.
type tokenBucket struct {
	rate, tokens float64
	at           time.Time
}

func newTokenBucket(perSecond int, now time.Time) *tokenBucket {
	return &tokenBucket{rate: float64(perSecond), tokens: float64(perSecond), at: now}
}

func (b *tokenBucket) take(now time.Time) bool {
	b.tokens = min(b.rate, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
