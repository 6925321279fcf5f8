package trigger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/topics"
)

// Handler runs decoded triggers; *Dispatcher is the production one. An
// error means the trigger was not taken (the dispatcher is shutting down):
// it is retried, not committed.
type Handler interface {
	Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error)
}

// KafkaConfig configures the trigger consumer.
type KafkaConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Group is the consumer group. Default "coordinator".
	Group string
	// Kinds are the kinds whose trigger topics are consumed: each kind's
	// Spec().Topic, under the deployment's prefix. Required.
	Kinds *owned.Registry
	// Topics applies the deployment's prefix and names the DLQ. Default
	// topics.New("").
	Topics topics.Names
	// Replica is this replica's id (client id, event replica). Required.
	Replica string
	// MaxRecordBytes bounds a trigger value; larger ones go to the DLQ.
	// Default 64 KiB.
	MaxRecordBytes int
	// MaxDecompressBatchBytes bounds what one fetched batch may decompress
	// to (franz-go's own default is 1 GiB, so a compressed bomb could run
	// every replica out of memory in turn). A batch over it is not read:
	// its coordinates go to the DLQ (reason batch_too_large) and the
	// partition moves past it. Default DefaultMaxDecompressBatchBytes (8 MiB).
	MaxDecompressBatchBytes int
	// RetryBackoffMin and RetryBackoffMax bound the exponential backoff
	// between tries of a record that was not handled. Defaults 250ms, 10s.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// RevokeWait bounds how long a partition revoke waits for the record in
	// flight on that partition before letting the rebalance go on. Default 5s.
	RevokeWait time.Duration
	// DrainTimeout bounds how long Stop waits for records in flight before
	// cancelling them. Default 25s.
	DrainTimeout time.Duration
	// PartitionConcurrency bounds the records of one partition handled at
	// once: records of different keys (a bill run's period) are handled
	// concurrently, those of one key strictly in order (partition.go).
	// Default DefaultPartitionConcurrency; 1 handles one record at a time.
	PartitionConcurrency int
	// LeaveTimeout bounds Stop's leave of the group once the records are
	// drained: a leave behind a rebalance that waits for a dead member (a
	// replica SIGKILLed) would otherwise take that member's whole session
	// (45 s by default, above the shutdown bound). Cut off, the group sees
	// this member gone by its session instead. Default 5s.
	LeaveTimeout time.Duration
	// FetchMaxWait is the broker's long-poll bound. Default 100ms (low, so a
	// partition resumed after a busy spell is fetched again quickly).
	FetchMaxWait time.Duration
	// ClientOpts are extra franz-go options (TLS, SASL, metrics, tests).
	ClientOpts []kgo.Opt
	// Tracing traces the client (kotel) and each record's handling; nil:
	// off, and a record's traceparent header is still handed to its run.
	Tracing *telemetry.KafkaTracing
}

func (c KafkaConfig) withDefaults() KafkaConfig {
	if c.Group == "" {
		c.Group = "coordinator"
	}
	if c.Topics.IsZero() {
		c.Topics = topics.New("")
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if c.MaxDecompressBatchBytes <= 0 {
		c.MaxDecompressBatchBytes = DefaultMaxDecompressBatchBytes
	}
	if c.RetryBackoffMin <= 0 {
		c.RetryBackoffMin = 250 * time.Millisecond
	}
	if c.RetryBackoffMax <= 0 {
		c.RetryBackoffMax = 10 * time.Second
	}
	c.RetryBackoffMax = max(c.RetryBackoffMax, c.RetryBackoffMin)
	if c.RevokeWait <= 0 {
		c.RevokeWait = 5 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 25 * time.Second
	}
	if c.PartitionConcurrency <= 0 {
		c.PartitionConcurrency = DefaultPartitionConcurrency
	}
	if c.LeaveTimeout <= 0 {
		c.LeaveTimeout = 5 * time.Second
	}
	if c.FetchMaxWait <= 0 {
		c.FetchMaxWait = 100 * time.Millisecond
	}
	return c
}

func (c KafkaConfig) validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("trigger: KafkaConfig.Brokers is empty")
	case c.Replica == "":
		return errors.New("trigger: KafkaConfig.Replica is empty")
	case c.Kinds == nil || len(c.Kinds.Topics()) == 0:
		return errors.New("trigger: KafkaConfig.Kinds has no kind with a trigger topic")
	}
	return nil
}

// KafkaConsumer consumes the trigger topics in the consumer group and hands
// each record to the Handler.
//
// Per partition, one worker hands records to lanes, one per record key
// (partition.go): the records of one key (a bill run's period) are handled
// strictly in order, one at a time; those of different keys at once, up to
// PartitionConcurrency. The poll loop never waits for a worker: it queues a
// fetch for the worker and, once records wait behind full lanes, pauses the
// partition until the worker took them, so heartbeats, rebalances and the
// other partitions keep going while a long bill run executes. An offset is
// committed (in the background, one commit at a time) only once its record
// and every record before it on the partition are handled
// (job.Result.Handled): completed or already completed, failed
// permanently, handed to the resumer (Deferred: the request is recorded in
// Postgres), or rejected to the DLQ. A record that is not handled (lock
// backend unavailable, a run lost or failed transiently that could not be
// recorded, DLQ unreachable) is retried in its lane with exponential
// backoff, and the records of its key wait behind it; nothing is committed
// past it.
//
// Revoke or loss of a partition: the worker takes no new record from it and
// queued ones are dropped (the new owner gets them from the committed
// offset). The record in flight is not cancelled: the ownership lock, not the
// partition, decides who works, and cancelling a bill run because Kafka
// moved a partition would only make the next owner resume it. The revoke
// callback waits up to RevokeWait for it, so it is committed when it ends in
// time; otherwise the run goes on holding its lock, its offset stays
// uncommitted, and the partition's new owner sees the redelivered trigger
// and answers already_completed, or already_owned after recording the
// request for the resumer (a resumable kind), which finishes the run if
// its owner then loses it.
type KafkaConsumer struct {
	cfg  KafkaConfig
	h    Handler
	emit events.Emitter
	log  *slog.Logger
	m    *Metrics
	cl   *kgo.Client

	// byTopic maps each consumed (prefixed) topic to its kind.
	byTopic map[string]owned.Kind
	topics  []string

	// handleCtx is the context of every Handler call: not the Start ctx
	// (a shutdown signal must not abort an owned run midway), cancelled by
	// Stop after DrainTimeout.
	handleCtx    context.Context
	cancelHandle context.CancelFunc
	pollCtx      context.Context
	cancelPoll   context.CancelFunc
	// killClient cancels the client's own context: its requests in flight
	// (a JoinGroup the broker holds) end at once.
	killClient context.CancelFunc

	mu      sync.Mutex
	workers map[tp]*partWorker
	// left are the workers of revoked partitions whose runs outlived
	// RevokeWait: still runs in flight on this replica, which Stop drains
	// like its own partitions' (not cancelled at once).
	left    map[*partWorker]struct{}
	stopped bool

	startOnce sync.Once
	stopOnce  sync.Once
	pollDone  chan struct{}
}

type tp struct {
	topic     string
	partition int32
}

// NewKafkaConsumer builds the consumer. Nothing is contacted until Start.
func NewKafkaConsumer(cfg KafkaConfig, h Handler, emit events.Emitter, log *slog.Logger, m *Metrics) (*KafkaConsumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("trigger: NewKafkaConsumer: nil Handler")
	}
	if emit == nil {
		emit = events.EmitterFunc(func(context.Context, events.Event) {})
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &KafkaConsumer{cfg: cfg, h: h, emit: emit, log: log, m: m, workers: map[tp]*partWorker{}, left: map[*partWorker]struct{}{}, pollDone: make(chan struct{}),
		byTopic: map[string]owned.Kind{}}
	for _, k := range cfg.Kinds.Kinds() {
		if t := k.Spec().Topic; t != "" {
			name := cfg.Topics.Topic(t)
			c.byTopic[name] = k
			c.topics = append(c.topics, name)
			reasons := append(append(owned.SharedRejectReasons(), ReasonBatchTooLarge), k.RejectReasons()...)
			m.topic(name, reasons)
		}
	}
	c.handleCtx, c.cancelHandle = context.WithCancel(context.Background())
	c.pollCtx, c.cancelPoll = context.WithCancel(context.Background())
	return c, nil
}

// Start creates the client, joins the group and consumes in the background.
// It returns once the client exists; Kafka being down is not an error here
// (the client keeps trying). ctx ending stops the poll loop like Stop does,
// but only Stop waits and leaves the group.
func (c *KafkaConsumer) Start(ctx context.Context) error {
	err := errors.New("trigger: consumer already started")
	c.startOnce.Do(func() {
		var clientCtx context.Context
		clientCtx, c.killClient = context.WithCancel(context.Background())
		opts := append([]kgo.Opt{
			kgo.WithContext(clientCtx),
			kgo.SeedBrokers(c.cfg.Brokers...),
			kgo.ClientID("coordinator-" + c.cfg.Replica),
			kgo.ConsumerGroup(c.cfg.Group),
			kgo.ConsumeTopics(c.topics...),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(),
			kgo.FetchMaxWait(c.cfg.FetchMaxWait),
			kgo.FetchMaxPartitionBytes(int32(max(c.cfg.MaxRecordBytes*4, 1<<20))),
			kgo.MaxDecompressBatchBytes(c.cfg.MaxDecompressBatchBytes),
			kgo.OnPartitionsAssigned(c.assigned),
			kgo.OnPartitionsRevoked(c.revoked),
			kgo.OnPartitionsLost(c.revoked),
			kgo.ProducerLinger(0),
		}, append(c.cfg.Tracing.Opts(), c.cfg.ClientOpts...)...)
		var cl *kgo.Client
		cl, err = kgo.NewClient(opts...)
		if err != nil {
			err = fmt.Errorf("trigger: kafka client: %w", err)
			c.killClient()
			close(c.pollDone)
			return
		}
		c.cl = cl
		stop := context.AfterFunc(ctx, c.cancelPoll)
		go func() {
			defer stop()
			c.poll()
		}()
		c.log.Info("trigger_consumer_started", "group", c.cfg.Group, "topics", c.topics, "dlq", c.cfg.Topics.DLQ)
	})
	return err
}

// Stop stops taking records, waits up to DrainTimeout for the records in
// flight, those of revoked partitions whose runs outlived RevokeWait too
// (then cancels them: a cancelled bill run ends lost and is not
// committed), commits what was handled, and leaves the group. Safe twice.
func (c *KafkaConsumer) Stop() {
	c.stopOnce.Do(func() {
		c.startOnce.Do(func() { close(c.pollDone) }) // never started: nothing to stop, and no later Start
		c.cancelPoll()
		<-c.pollDone
		c.mu.Lock()
		c.stopped = true
		ws := make([]*partWorker, 0, len(c.workers))
		for _, w := range c.workers {
			w.revoke()
			ws = append(ws, w)
		}
		for w := range c.left {
			ws = append(ws, w)
		}
		c.mu.Unlock()
		if !waitWorkers(ws, c.cfg.DrainTimeout) {
			c.log.Warn("trigger_consumer_drain_timeout", "timeout_ms", c.cfg.DrainTimeout.Milliseconds())
			c.cancelHandle()
			waitWorkers(ws, 0)
		}
		c.cancelHandle()
		if c.cl != nil {
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaveTimeout)
			if err := c.cl.LeaveGroupContext(ctx); err != nil {
				c.log.Warn("trigger_consumer_leave_cut_short", "error", err, "timeout_ms", c.cfg.LeaveTimeout.Milliseconds(),
					"detail", "the group sees this member gone when its session ends; records not committed are read again")
			}
			cancel()
			c.killClient()
			c.cl.Close()
		}
		c.log.Info("trigger_consumer_stopped")
	})
}

// Lag returns, per "topic/partition", how many records follow the last one
// handled (as of the last fetch's high watermark).
func (c *KafkaConsumer) Lag() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.workers))
	for k, w := range c.workers {
		out[k.topic+"/"+strconv.Itoa(int(k.partition))] = w.lag()
	}
	return out
}

// waitWorkers waits for every worker to end; d <= 0 waits without bound.
func waitWorkers(ws []*partWorker, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	for _, w := range ws {
		select {
		case <-w.done:
		case <-timeout:
			return false
		}
	}
	return true
}

func (c *KafkaConsumer) poll() {
	defer close(c.pollDone)
	for {
		fetches := c.cl.PollFetches(c.pollCtx)
		if c.pollCtx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("trigger_fetch_error", "topic", topic, "partition", partition, "error", err)
			}
		})
		skips := tooLargeBatches(fetches)
		if fetches.NumRecords() == 0 && len(fetches.Errors()) > 0 {
			// Errors only (a broker down, say): do not spin on them.
			t := time.NewTimer(c.cfg.RetryBackoffMin)
			select {
			case <-t.C:
			case <-c.pollCtx.Done():
			}
			t.Stop()
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			c.mu.Lock()
			w := c.workers[tp{p.Topic, p.Partition}]
			c.mu.Unlock()
			if w == nil {
				// Not (or no longer) ours: the owner reads it from the
				// committed offset.
				return
			}
			w.enqueue(p.Records, p.HighWatermark)
		})
		for _, e := range skips {
			c.skipBatch(e)
		}
	}
}

// tooLargeBatches returns the batches franz-go refused to decompress
// (over MaxDecompressBatchBytes). franz-go stops fetching such a partition
// until its offset is set past the batch.
func tooLargeBatches(fetches kgo.Fetches) []*kgo.ErrDecompressTooLarge {
	var out []*kgo.ErrDecompressTooLarge
	fetches.EachError(func(_ string, _ int32, err error) {
		if e, ok := errors.AsType[*kgo.ErrDecompressTooLarge](err); ok {
			out = append(out, e)
		}
	})
	return out
}

// skipBatch moves a partition past a batch that could not be decompressed:
// its worker gets, behind the records already queued, a record standing
// for the batch (offset: the batch's last) that is dead-lettered with the
// batch's coordinates and committed like any rejected record; fetching
// resumes after the batch at once. If the replica dies before that record
// is committed, the partition's next owner meets the batch again and does
// the same.
func (c *KafkaConsumer) skipBatch(e *kgo.ErrDecompressTooLarge) {
	c.mu.Lock()
	w := c.workers[tp{e.Topic, e.Partition}]
	c.mu.Unlock()
	if w == nil {
		return // not ours: its owner meets the batch from the committed offset
	}
	c.log.Error("trigger_batch_too_large", "topic", e.Topic, "partition", e.Partition, "offset", e.Offset,
		"next_offset", e.NextOffset, "limit_bytes", c.cfg.MaxDecompressBatchBytes)
	marker := &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: e.NextOffset - 1, LeaderEpoch: e.Epoch,
		Context: context.WithValue(context.Background(), skippedBatchKey{}, e)}
	w.enqueue([]*kgo.Record{marker}, max(w.highWatermark(), e.NextOffset))
	c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: e.Epoch, Offset: e.NextOffset}}})
}

type skippedBatchKey struct{}

// skippedBatch returns the batch rec stands for, if it is skipBatch's marker.
func skippedBatch(rec *kgo.Record) (*kgo.ErrDecompressTooLarge, bool) {
	if rec.Context == nil {
		return nil, false
	}
	e, ok := rec.Context.Value(skippedBatchKey{}).(*kgo.ErrDecompressTooLarge)
	return e, ok
}

func (c *KafkaConsumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	cl.ResumeFetchPartitions(assigned) // a pause left from an earlier assignment must not stick
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	for topic, parts := range assigned {
		for _, p := range parts {
			k := tp{topic, p}
			if c.workers[k] != nil {
				continue
			}
			w := newPartWorker(c, k)
			c.workers[k] = w
			go w.run()
		}
	}
	c.log.Info("trigger_partitions_assigned", "partitions", fmt.Sprint(assigned))
}

// revoked handles revoked and lost partitions alike: see KafkaConsumer.
func (c *KafkaConsumer) revoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.mu.Lock()
	var ws []*partWorker
	for topic, parts := range revoked {
		for _, p := range parts {
			k := tp{topic, p}
			if w := c.workers[k]; w != nil {
				delete(c.workers, k)
				w.revoke()
				ws = append(ws, w)
			}
			c.m.deleteLag(topic, p)
		}
	}
	c.mu.Unlock()
	if !waitWorkers(ws, c.cfg.RevokeWait) {
		c.log.Warn("trigger_revoke_left_run_in_flight", "partitions", fmt.Sprint(revoked),
			"reason", "the run keeps its lock; the partition's next owner sees the trigger again")
	}
	for _, w := range ws {
		w.forbidCommit()
	}
	c.mu.Lock()
	for w := range c.left { // forget the left workers that ended since
		if w.ended() {
			delete(c.left, w)
		}
	}
	for _, w := range ws {
		if !w.ended() {
			c.left[w] = struct{}{}
		}
	}
	c.mu.Unlock()
	cl.ResumeFetchPartitions(revoked)
	c.log.Info("trigger_partitions_revoked", "partitions", fmt.Sprint(revoked))
}

// process handles one record; it reports whether the record is handled
// (and may be committed).
func (c *KafkaConsumer) process(rec *kgo.Record) bool {
	if e, ok := skippedBatch(rec); ok {
		return c.rejectBatch(rec, e)
	}
	k, ok := c.byTopic[rec.Topic]
	if !ok {
		return c.reject(rec, nil, owned.Reject(owned.ReasonUnknownTopic, "record from topic %s", rec.Topic))
	}
	req, err := DecodeRecord(k, rec.Key, rec.Value, c.cfg.MaxRecordBytes)
	if err != nil {
		return c.reject(rec, k, err)
	}
	t := job.Trigger{Source: job.SourceKafka, RequestID: cmp.Or(req.RequestID, derivedID(rec)), RequestedBy: req.RequestedBy}
	ctx, end := c.traceRecord(rec, t)
	res, err := c.run(ctx, k, req.Params, t, rec)
	end(res)
	if err != nil {
		c.log.Warn("trigger_handler_error", "topic", rec.Topic, "offset", rec.Offset, "request_id", t.RequestID, "error", err)
		return false
	}
	if res.Outcome == job.OutcomeFailed && res.BadInput {
		// Decoded, but refused by the run itself (an adjustment of a period
		// whose bill run has not COMPLETED): as wrong on every redelivery as a
		// record that does not decode, so it goes to the DLQ like one.
		return c.reject(rec, k, owned.Reject(owned.ReasonBadInput, "%s",
			strings.TrimPrefix(res.Error, job.ErrBadInput.Error()+": ")))
	}
	return res.Handled()
}

// run calls the Handler, recovering a panic (a bug in a kind's run) as an
// error: the record is not handled, so it is retried in its lane, and the
// replica, with its other runs, goes on. Unrecovered, the panic would end
// the process, then every replica the partition moves to in turn.
func (c *KafkaConsumer) run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger, rec *kgo.Record) (res job.Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("trigger_handler_panicked", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"request_id", t.RequestID, "error", fmt.Sprint(v), "stack", string(debug.Stack()))
			res, err = job.Result{}, fmt.Errorf("trigger: handler panicked: %v", v)
		}
	}()
	return c.h.Run(ctx, k, p, t)
}

// derivedID is the request id of a record that has none: the same on every
// redelivery.
func derivedID(rec *kgo.Record) string {
	return fmt.Sprintf("kafka-%s-%d-%d", rec.Topic, rec.Partition, rec.Offset)
}
