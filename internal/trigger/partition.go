package trigger

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer's partitions (kafka.go). One worker per assigned partition.
// Its records are handled in lanes, one lane per record key: the records
// of one key (a bill run's period) strictly one at a time, in offset order;
// different keys at once, up to KafkaConfig.PartitionConcurrency. So a
// trigger is never held up by another key's work on its partition (a
// replay of duplicates, a long bill run), only by its own key's. A record
// that is not handled is retried in its lane with backoff, and the records
// of its key wait behind it.
//
// A key with one record pending goes first: its lane is started before the
// lanes of keys with a backlog (a replay's duplicates), which go round in
// turn among themselves, so a new period's trigger waits for a free
// handler, not for a turn behind every key of the replay.
//
// Offsets are committed in the background, one commit in flight at a time,
// up to the last record before which every record is handled: never past a
// record that is not (a redelivery after a crash repeats handled records,
// which their runs answer as already done), and without a round trip to
// Kafka per record.

// DefaultPartitionConcurrency is KafkaConfig.PartitionConcurrency's
// default: enough keys at once that a replay of duplicates over many periods
// keeps Postgres busy from one partition, few enough that a burst of new
// periods does not start more bill runs at once than a replica's pool
// serves well.
const DefaultPartitionConcurrency = 8

// Bounds of what one partition holds in its lanes: past them the worker
// takes no more fetched records, and the partition's fetching pauses.
const (
	maxLaneRecords = 10000
	maxLaneBytes   = 8 << 20
)

// partWorker handles one partition's records.
type partWorker struct {
	c  *KafkaConsumer
	tp tp

	mu       sync.Mutex
	queue    []*kgo.Record // fetched, not yet in a lane
	hw       int64         // high watermark of the last fetch
	handled  int64         // the last offset through which every record is handled, -1 before any
	last     *kgo.Record   // the record at handled (what a commit names)
	first    int64         // offset of the first record received, -1 before any
	revoked  bool
	paused   bool // the partition's fetching is paused
	noCommit bool

	lanes    map[string]*lane
	fresh    []*lane  // lanes of keys that had nothing pending, first record ready: started first
	ready    []*lane  // lanes with a record to handle and no handler, going round
	running  int      // handlers running
	order    []*entry // the records given to lanes, in offset order, until handled through
	buffered int      // records in lanes
	bytes    int      // their bytes

	committed int64 // offset committed (or given up on), -1 before any
	committer chan struct{}

	wake      chan struct{}
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// lane is one key's records, in offset order; recs[0] is in flight or
// waits for a handler (or for its retry's backoff).
type lane struct {
	key      string
	recs     []*entry
	busy     bool // a handler has recs[0], or its backoff runs
	attempts int  // tries of recs[0] so far
}

// entry is one record given to a lane.
type entry struct {
	rec     *kgo.Record
	handled bool
}

func newPartWorker(c *KafkaConsumer, k tp) *partWorker {
	return &partWorker{c: c, tp: k, handled: -1, first: -1, committed: -1, lanes: map[string]*lane{},
		committer: make(chan struct{}, 1), wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// enqueue queues a fetch for the worker. When records are already waiting
// (the lanes are full), the partition is paused until the worker took them,
// so the poll loop never blocks on a busy worker and the queue holds at most
// two fetches. A partition is not paused for the first fetch that arrives
// while the worker is busy: pausing costs the next trigger on the partition
// up to FetchMaxWait (a resumed partition is fetched only after the broker's
// in-flight long poll).
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
	w.poke()
}

// poke wakes the worker's loop.
func (w *partWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *partWorker) revoke() {
	w.mu.Lock()
	w.revoked = true
	w.queue = nil
	w.mu.Unlock()
	w.closeOnce.Do(func() { close(w.quit) })
}

// ended reports whether the worker's loop and its handlers are over.
func (w *partWorker) ended() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
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

// lagLocked counts the records after the last one through which all are
// handled, up to the high watermark of the last fetch; before any is
// handled, from the first record received.
func (w *partWorker) lagLocked() int64 {
	if w.handled < 0 {
		if w.first < 0 {
			return 0
		}
		return max(w.hw-w.first, 0)
	}
	return max(w.hw-w.handled-1, 0)
}

// run is the worker's loop: it moves fetched records into their lanes and
// starts a handler for each ready lane while fewer than the concurrency
// run. When the worker must end it starts nothing more, waits for the
// handlers in flight, commits what was handled and returns.
func (w *partWorker) run() {
	committed := make(chan struct{})
	go w.commitLoop(committed)
	defer func() {
		<-committed
		close(w.done)
	}()
	for {
		w.mu.Lock()
		if w.revoked {
			w.mu.Unlock()
			w.drain()
			return
		}
		w.fillLanesLocked()
		for w.running < w.c.cfg.PartitionConcurrency {
			l := w.nextLaneLocked()
			if l == nil {
				break
			}
			w.running++
			go w.handle(l, l.recs[0])
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.quit:
		}
	}
}

// nextLaneLocked takes the next lane to start: a fresh key with one record
// first, then the lanes going round; nil when none is ready. A fresh key
// whose backlog arrived behind its first record (a replayed period) joins
// the lanes going round instead.
func (w *partWorker) nextLaneLocked() *lane {
	for len(w.fresh) > 0 {
		l := w.fresh[0]
		w.fresh[0] = nil
		w.fresh = w.fresh[1:]
		if len(l.recs) == 1 {
			return l
		}
		w.ready = append(w.ready, l)
	}
	if len(w.ready) == 0 {
		return nil
	}
	l := w.ready[0]
	w.ready[0] = nil
	w.ready = w.ready[1:]
	return l
}

// fillLanesLocked moves queued records into their lanes, within the bounds,
// and resumes the partition's fetching once the queue is empty.
func (w *partWorker) fillLanesLocked() {
	n := 0
	for _, rec := range w.queue {
		if w.buffered >= maxLaneRecords || w.bytes >= maxLaneBytes {
			break
		}
		key := string(rec.Key)
		l, pending := w.lanes[key]
		if !pending {
			l = &lane{key: key}
			w.lanes[key] = l
		}
		e := &entry{rec: rec}
		l.recs = append(l.recs, e)
		w.order = append(w.order, e)
		w.buffered++
		w.bytes += len(rec.Key) + len(rec.Value)
		if !pending { // a key with nothing pending: its first record goes first
			l.busy = true
			w.fresh = append(w.fresh, l)
		}
		n++
	}
	clear(w.queue[:n])
	w.queue = w.queue[n:]
	if len(w.queue) == 0 && w.paused {
		w.c.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
		w.paused = false
	}
}

// handle tries e, the head of l: handled, it goes and the lane's next
// record is ready; not handled, it is tried again after a backoff (the
// records of its key wait, the other lanes go on). While the lane has more
// and no other lane waits, the handler goes on with its next record itself
// rather than hand it back to the worker's loop (two goroutine wake-ups
// per record, which on a busy machine cost more than answering a
// duplicate).
func (w *partWorker) handle(l *lane, e *entry) {
	c := w.c
	for {
		ok := c.handleCtx.Err() == nil && c.process(e.rec)
		w.mu.Lock()
		if !ok {
			w.notHandledLocked(l, e)
			w.running--
			w.mu.Unlock()
			w.poke()
			return
		}
		w.handledLocked(l, e)
		w.advanceLocked()
		if w.keepLocked(l) && c.handleCtx.Err() == nil {
			e = l.recs[0]
			w.mu.Unlock()
			continue
		}
		w.running--
		w.mu.Unlock()
		w.poke()
		return
	}
}

// keepLocked reports whether the handler of l may go on with l's next
// record: l is the only lane waiting (it is taken off the queue) and the
// worker is not ending.
func (w *partWorker) keepLocked(l *lane) bool {
	if w.revoked || len(w.fresh) > 0 || len(w.queue) > 0 || len(w.ready) != 1 || w.ready[0] != l {
		return false
	}
	w.ready[0] = nil
	w.ready = w.ready[:0]
	return true
}

// notHandledLocked schedules e, not handled, to be tried again in its lane
// after a backoff; nothing when the partition is gone or the consumer
// stops (the partition's next owner gets it).
func (w *partWorker) notHandledLocked(l *lane, e *entry) {
	c := w.c
	if w.revoked || c.handleCtx.Err() != nil {
		return
	}
	c.m.retry(e.rec.Topic)
	d := backoff(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, l.attempts)
	l.attempts++
	c.log.Warn("trigger_not_handled_retrying", "topic", e.rec.Topic, "partition", e.rec.Partition,
		"offset", e.rec.Offset, "attempt", l.attempts, "backoff", d)
	time.AfterFunc(d, func() {
		w.mu.Lock()
		if !w.revoked {
			w.ready = append(w.ready, l)
		}
		w.mu.Unlock()
		w.poke()
	})
}

// handledLocked takes e, handled, off the head of l: the lane goes round
// again (behind the fresh keys and the lanes already waiting) with its next
// record, or goes away with none.
func (w *partWorker) handledLocked(l *lane, e *entry) {
	e.handled = true
	l.recs[0] = nil
	l.recs = l.recs[1:]
	l.attempts = 0
	w.buffered--
	w.bytes -= len(e.rec.Key) + len(e.rec.Value)
	if len(l.recs) > 0 {
		w.ready = append(w.ready, l)
	} else {
		l.busy = false
		delete(w.lanes, l.key)
	}
}

// advanceLocked moves the handled-through offset past every handled record
// at the front of the order, and asks for a commit when it moved.
func (w *partWorker) advanceLocked() {
	var last *kgo.Record
	for len(w.order) > 0 && w.order[0].handled {
		last = w.order[0].rec
		w.order[0] = nil
		w.order = w.order[1:]
	}
	if last == nil {
		return
	}
	w.handled, w.last = last.Offset, last
	w.c.m.setLag(w.tp.topic, w.tp.partition, w.lagLocked())
	select {
	case w.committer <- struct{}{}:
	default:
	}
}

// drain ends the worker: records not started are dropped (the partition's
// next owner reads them from the committed offset), the handlers in flight
// are waited for.
func (w *partWorker) drain() {
	for {
		w.mu.Lock()
		w.ready, w.fresh = nil, nil
		running := w.running
		w.mu.Unlock()
		if running == 0 {
			return
		}
		<-w.wake
	}
}

// commitLoop commits the handled-through offset whenever it moved, one
// commit at a time; once the worker's loop ended (quit and drained), it
// commits a last time and closes finished.
func (w *partWorker) commitLoop(finished chan<- struct{}) {
	defer close(finished)
	for {
		select {
		case <-w.committer:
			w.commit()
		case <-w.quit:
			// The loop is draining the handlers in flight: commit as they
			// end, and a last time once none runs.
			for {
				w.mu.Lock()
				running := w.running
				w.mu.Unlock()
				w.commit()
				if running == 0 {
					return
				}
				select {
				case <-w.committer:
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}
}

// commit commits the handled-through offset if it is past the last commit.
func (w *partWorker) commit() {
	c := w.c
	w.mu.Lock()
	rec, noCommit := w.last, w.noCommit
	if rec == nil || rec.Offset <= w.committed {
		w.mu.Unlock()
		return
	}
	w.committed = rec.Offset
	w.mu.Unlock()
	if noCommit {
		return // the partition moved on; its new owner commits
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.cl.CommitRecords(ctx, rec); err != nil {
		// The records were handled; a redelivery finds them already owned
		// or completed, so this costs duplicates, never a loss.
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
