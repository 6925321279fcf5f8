package trigger

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer's partitions (kafka.go): one worker per assigned partition
// handles its records strictly in order, retries a record that is not
// handled with backoff, and commits only what was handled.

// partWorker handles one partition's records in order.
type partWorker struct {
	c  *KafkaConsumer
	tp tp

	mu        sync.Mutex
	queue     []*kgo.Record
	hw        int64 // high watermark of the last fetch
	handled   int64 // offset of the last handled record, -1 before any
	first     int64 // offset of the first record received, -1 before any
	revoked   bool
	paused    bool // the partition's fetching is paused
	noCommit  bool
	wake      chan struct{}
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newPartWorker(c *KafkaConsumer, k tp) *partWorker {
	return &partWorker{c: c, tp: k, handled: -1, first: -1, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// enqueue queues a fetch for the worker. When records are already waiting
// (the worker is busy with an earlier fetch), the partition is paused until
// the worker drained its queue, so the poll loop never blocks on a busy
// worker and the queue holds at most two fetches. A partition is not paused
// for the first fetch that arrives while a record is in flight: that is the
// common case of a trigger arriving while the previous one commits, and
// pausing costs the next trigger on the partition up to FetchMaxWait (a
// resumed partition is fetched only after the broker's in-flight long poll).
func (w *partWorker) enqueue(recs []*kgo.Record, hw int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.revoked {
		return
	}
	if len(w.queue) > 0 && !w.paused {
		w.c.cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
		w.paused = true
	}
	if w.handled < 0 && w.first < 0 && len(recs) > 0 {
		w.first = recs[0].Offset
	}
	w.queue = append(w.queue, recs...)
	w.hw = hw
	// Every fetch, not only commits: a partition stuck on a record that
	// is never handled still shows how far behind it is.
	w.c.m.setLag(w.tp.topic, w.tp.partition, w.lagLocked())
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next returns the next record, resuming the partition when the queue is
// empty and waiting for more; false when the worker must end.
func (w *partWorker) next() (*kgo.Record, bool) {
	for {
		w.mu.Lock()
		if w.revoked {
			w.mu.Unlock()
			return nil, false
		}
		if len(w.queue) > 0 {
			r := w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
			w.mu.Unlock()
			return r, true
		}
		if w.paused {
			w.c.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
			w.paused = false
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.quit:
			return nil, false
		}
	}
}

func (w *partWorker) revoke() {
	w.mu.Lock()
	w.revoked = true
	w.queue = nil
	w.mu.Unlock()
	w.closeOnce.Do(func() { close(w.quit) })
}

func (w *partWorker) forbidCommit() {
	w.mu.Lock()
	w.noCommit = true
	w.mu.Unlock()
}

func (w *partWorker) highWatermark() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hw
}

func (w *partWorker) lag() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lagLocked()
}

// lagLocked counts the records after the last handled one, up to the high
// watermark of the last fetch; before any is handled, from the first record
// received (the one in flight included).
func (w *partWorker) lagLocked() int64 {
	if w.handled < 0 {
		if w.first < 0 {
			return 0
		}
		return max(w.hw-w.first, 0)
	}
	return max(w.hw-w.handled-1, 0)
}

func (w *partWorker) run() {
	defer close(w.done)
	for {
		rec, ok := w.next()
		if !ok {
			return
		}
		if !w.handleWithRetry(rec) {
			return
		}
	}
}

// handleWithRetry tries rec until it is handled (then commits it) or the
// worker must end (then nothing is committed and the record is redelivered).
func (w *partWorker) handleWithRetry(rec *kgo.Record) bool {
	c := w.c
	for attempt := 0; ; attempt++ {
		if c.handleCtx.Err() != nil {
			return false
		}
		if c.process(rec) {
			w.commit(rec)
			return true
		}
		c.m.retry(rec.Topic)
		d := backoff(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, attempt)
		c.log.Warn("trigger_not_handled_retrying", "topic", rec.Topic, "partition", rec.Partition,
			"offset", rec.Offset, "attempt", attempt+1, "backoff", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.quit:
			t.Stop()
			return false
		}
	}
}

func (w *partWorker) commit(rec *kgo.Record) {
	c := w.c
	w.mu.Lock()
	w.handled = rec.Offset
	lag := max(w.hw-rec.Offset-1, 0)
	noCommit := w.noCommit
	w.mu.Unlock()
	c.m.setLag(rec.Topic, rec.Partition, lag)
	if noCommit {
		return // the partition moved on; its new owner commits
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.cl.CommitRecords(ctx, rec); err != nil {
		// The record was handled; a redelivery finds it already owned or
		// completed, so this costs a duplicate, never a loss.
		c.log.Warn("trigger_commit_failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", err)
	}
}

// backoff is min·2^attempt capped at max.
func backoff(minD, maxD time.Duration, attempt int) time.Duration {
	d := minD
	for i := 0; i < attempt && d < maxD; i++ {
		d *= 2
	}
	return min(d, maxD)
}
