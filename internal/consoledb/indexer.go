package consoledb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// IndexerConfig configures the events indexer.
type IndexerConfig struct {
	// Brokers, Topic (the events topic) and Group are required. Group is
	// the indexers' own consumer group, shared by every replica, so each
	// record is indexed by one of them.
	Brokers []string
	Topic   string
	Group   string
	// ClientOpts are extra franz-go options (TLS, SASL, client id).
	ClientOpts []kgo.Opt
	// SessionTimeout is the group session (COORDINATOR_KAFKA_SESSION_TIMEOUT):
	// how long the group waits for a member that died before it
	// rebalances without it. Default franz-go's (45 s).
	SessionTimeout time.Duration
	// StopTimeout bounds Stop's leave of the group: a leave that waits
	// for a rebalance in flight (the group waiting out a dead member's
	// session) is cut off, and the group notices the indexer gone by its
	// session instead. Default DefaultStopTimeout.
	StopTimeout time.Duration
	Pool        *pgxpool.Pool
	Log         *slog.Logger
	Metrics     *Metrics
}

// Indexer writes every record of the events topic into ownership_events,
// with its partition and offset, and commits the offsets once they are
// written: at least once, and a record read twice (after a rebalance) is
// kept once by its event id. A group of its own means each record is
// written by one replica, whichever emitted the event; a new group starts
// at the oldest retained record.
type Indexer struct {
	cfg IndexerConfig
	cl  *kgo.Client
	// kill cancels the client's own context: its requests in flight (a
	// JoinGroup the broker holds) end at once.
	kill context.CancelFunc
	stop context.CancelFunc
	done chan struct{}
	once sync.Once
}

// DefaultStopTimeout is IndexerConfig.StopTimeout's default: well inside
// the replica's shutdown bound (COORDINATOR_SHUTDOWN_TIMEOUT, 30 s).
const DefaultStopTimeout = 5 * time.Second

// NewIndexer checks cfg; Start connects.
func NewIndexer(cfg IndexerConfig) (*Indexer, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" || cfg.Group == "" || cfg.Pool == nil {
		return nil, errors.New("consoledb: the indexer needs Brokers, Topic, Group and Pool")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	return &Indexer{cfg: cfg, done: make(chan struct{})}, nil
}

// Start joins the group and indexes in the background.
func (x *Indexer) Start(context.Context) error {
	clientCtx, kill := context.WithCancel(context.Background())
	opts := append([]kgo.Opt{
		kgo.WithContext(clientCtx),
		kgo.SeedBrokers(x.cfg.Brokers...),
		kgo.ConsumerGroup(x.cfg.Group),
		kgo.ConsumeTopics(x.cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}, x.cfg.ClientOpts...)
	if x.cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(x.cfg.SessionTimeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		kill()
		return fmt.Errorf("consoledb: indexer client: %w", err)
	}
	x.cl, x.kill = cl, kill
	ctx, cancel := context.WithCancel(context.Background())
	x.stop = cancel
	go x.loop(ctx)
	return nil
}

// Stop leaves the group (what was written is committed) and waits, at
// most StopTimeout for the leave: a leave behind a rebalance that waits for
// a dead member (a replica SIGKILLed) would otherwise take that member's
// whole session and hold the replica past its shutdown bound.
func (x *Indexer) Stop() {
	x.once.Do(func() {
		if x.cl == nil {
			close(x.done)
			return
		}
		x.stop()
		<-x.done
		ctx, cancel := context.WithTimeout(context.Background(), x.cfg.StopTimeout)
		if err := x.cl.LeaveGroupContext(ctx); err != nil {
			x.cfg.Log.Warn("events_index_leave_cut_short", "error", err, "timeout_ms", x.cfg.StopTimeout.Milliseconds(),
				"detail", "the group sees this member gone when its session ends")
		}
		cancel()
		x.kill() // requests still in flight end now
		x.cl.Close()
	})
}

func (x *Indexer) loop(ctx context.Context) {
	defer close(x.done)
	for {
		fetches := x.cl.PollRecords(ctx, 1000)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(t string, p int32, err error) {
			x.cfg.Log.Warn("events_index_fetch_failed", "topic", t, "partition", p, "error", err)
		})
		recs := fetches.Records()
		if len(recs) == 0 {
			continue
		}
		wait := retryFirst
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := x.insert(wctx, recs)
			if refused(err) {
				// Postgres refused the batch for what a record holds: each
				// is written alone, and only those it refuses are skipped.
				err = x.insertEach(wctx, recs)
			}
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			x.cfg.Metrics.failed("ownership_events")
			x.cfg.Log.Warn("events_index_write_failed", "records", len(recs), "retry_in_ms", wait.Milliseconds(), "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
				wait = min(2*wait, retryMax)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := x.cl.CommitRecords(cctx, recs...); err != nil && ctx.Err() == nil {
			x.cfg.Log.Warn("events_index_commit_failed", "error", err, "detail", "the records are read again and kept once")
		}
		cancel()
	}
}

// insertEach writes recs one by one: a record Postgres refuses for what it
// is (a NUL, which text and jsonb never hold) would stop the index for
// good, so it is skipped, counted and logged with its coordinates, and the
// others are kept. Any other error is returned: the batch is written again
// (an event written twice is kept once).
func (x *Indexer) insertEach(ctx context.Context, recs []*kgo.Record) error {
	for _, r := range recs {
		err := x.insert(ctx, []*kgo.Record{r})
		switch {
		case err == nil:
		case refused(err):
			x.cfg.Metrics.drop("ownership_events", 1)
			x.cfg.Log.Error("events_index_refused", "partition", r.Partition, "offset", r.Offset, "error", err)
		default:
			return err
		}
	}
	return nil
}

const sqlInsertEvent = `
insert into ownership_events (id, topic_partition, topic_offset, type, run_key, job, replica, event_time, reason, data)
values ($1, $2, $3, $4, $5, nullif($6, ''), nullif($7, ''), $8, nullif($9, ''), $10)
on conflict (id) do nothing`

// indexed is the part of a CloudEvent the table keeps in columns.
type indexed struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Time    time.Time       `json:"time"`
	Data    json.RawMessage `json:"data"`
}

func (x *Indexer) insert(ctx context.Context, recs []*kgo.Record) error {
	b := &pgx.Batch{}
	for _, r := range recs {
		var e indexed
		if err := json.Unmarshal(r.Value, &e); err != nil || e.ID == "" || e.Type == "" {
			x.cfg.Log.Warn("events_index_skipped", "partition", r.Partition, "offset", r.Offset, "detail", "not a CloudEvent with an id and a type")
			continue
		}
		var d struct {
			Job     string `json:"job"`
			Replica string `json:"replica"`
			Reason  any    `json:"reason"`
		}
		_ = json.Unmarshal(e.Data, &d)
		reason, _ := d.Reason.(string)
		if e.Time.IsZero() {
			e.Time = r.Timestamp
		}
		data := []byte(e.Data)
		if len(data) == 0 || data[0] != '{' {
			data = []byte("{}")
		}
		b.Queue(sqlInsertEvent, e.ID, r.Partition, r.Offset, e.Type, e.Subject, d.Job, d.Replica, e.Time, reason, data)
	}
	if b.Len() == 0 {
		return nil
	}
	res := x.cfg.Pool.SendBatch(ctx, b)
	var err error
	for range b.Len() {
		if _, err = res.Exec(); err != nil {
			break
		}
	}
	return errors.Join(err, res.Close())
}
