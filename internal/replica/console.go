package replica

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/consoledb"
	"github.com/telco-platform/coordinator/internal/eventtail"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// consoleParts are the operator console's pieces (COORDINATOR_CONSOLE_*):
// the run history the template writes, the events index, the live tail,
// the heartbeat, the retention janitor and the /ui/ handler. All nil when
// the console is disabled.
type consoleParts struct {
	metrics   *consoledb.Metrics
	history   *consoledb.HistoryWriter
	tail      *eventtail.Tail
	indexer   *consoledb.Indexer
	heartbeat *consoledb.Heartbeat
	janitor   *consoledb.Janitor
	handler   *console.Console
	// api is the admin API once startHTTP built it (the heartbeat, which
	// starts first, reads its readiness; the action goes through it).
	api atomic.Pointer[httpapi.API]
}

// runHistory is the template's owned.RunHistory (nil: the console is off).
func (r *Replica) runHistory() owned.RunHistory {
	if !r.cfg.Console.Enabled {
		return nil
	}
	r.con.metrics = consoledb.NewMetrics(r.reg)
	r.con.history = consoledb.NewHistoryWriter(r.pool, 0, r.log, r.con.metrics)
	return r.con.history
}

// stopHistory writes the buffered run records, once every run has ended.
func (r *Replica) stopHistory(bound context.Context) {
	if r.con.history != nil {
		r.con.history.Stop(bound)
	}
}

// startConsole starts the tail, the indexer, the heartbeat and the janitor,
// and builds the /ui/ handler that startHTTP mounts.
func (r *Replica) startConsole(ctx context.Context) error {
	if !r.cfg.Console.Enabled {
		return nil
	}
	tailOpts, err := r.kafkaOpts(kgo.ClientID("coordinator-console-tail-" + r.cfg.ReplicaID))
	if err != nil {
		return err
	}
	tail, err := eventtail.New(eventtail.Config{Brokers: r.cfg.Kafka.Brokers, Topic: r.names.Events, ClientOpts: tailOpts, Log: r.log})
	if err != nil {
		return err
	}
	if err := tail.Start(ctx); err != nil {
		return err
	}
	r.con.tail = tail
	idxOpts, err := r.kafkaOpts(kgo.ClientID("coordinator-console-index-" + r.cfg.ReplicaID))
	if err != nil {
		return err
	}
	idx, err := consoledb.NewIndexer(consoledb.IndexerConfig{Brokers: r.cfg.Kafka.Brokers, Topic: r.names.Events,
		Group: r.cfg.Kafka.Group + "-console", ClientOpts: idxOpts, Pool: r.pool, Log: r.log, Metrics: r.con.metrics,
		// A dead replica's share of the index moves after the same session
		// as its triggers, and Stop leaves within a fraction of the bound.
		SessionTimeout: r.cfg.Kafka.SessionTimeout, StopTimeout: min(consoledb.DefaultStopTimeout, r.cfg.ShutdownTimeout/4)})
	if err != nil {
		return err
	}
	if err := idx.Start(ctx); err != nil {
		return err
	}
	r.con.indexer = idx
	jan, err := consoledb.NewJanitor(consoledb.JanitorConfig{Pool: r.pool, Retention: r.cfg.Console.Retention, Log: r.log})
	if err != nil {
		return err
	}
	jan.Start()
	r.con.janitor = jan

	var kinds []string
	for _, k := range r.rc.Kinds.Kinds() {
		kinds = append(kinds, k.Spec().Name)
	}
	var action console.Action
	if k, ok := r.rc.Kinds.Lookup(billrun.JobName); ok && k.Spec().HTTPPath != "" {
		action = console.Action{Kind: billrun.JobName, Path: k.Spec().HTTPPath, Field: "period",
			Label: "closed period (YYYY-MM)", Placeholder: "2026-11"}
	}
	store := consoledb.NewStore(r.pool)
	deps := console.Deps{Store: store, Sessions: store, Health: r.health, Events: tail, Trigger: r.trigger,
		InFlight: r.inFlight}
	if in, ok := r.locker.(ownership.Inspector); ok {
		deps.Locks = in
	}
	h, err := console.New(console.Config{Replica: r.cfg.ReplicaID, Tokens: r.cfg.HTTP.AdminTokenSet(), Kinds: kinds,
		Action: action, SessionTTL: r.cfg.Console.SessionTTL, HeartbeatInterval: r.cfg.Console.HeartbeatInterval,
		MaxStreams: r.cfg.Console.MaxStreams, Log: r.log, Registerer: r.reg}, deps)
	if err != nil {
		return failed(64, err)
	}
	r.con.handler = h
	hb, err := consoledb.NewHeartbeat(consoledb.HeartbeatConfig{Pool: r.pool, Replica: r.cfg.ReplicaID,
		Version: r.rc.Version, Interval: r.cfg.Console.HeartbeatInterval, Log: r.log, Metrics: r.con.metrics,
		Ready: func() bool {
			api := r.con.api.Load()
			return api != nil && len(api.NotReady()) == 0
		},
		Dependencies: r.dependencies, Runs: r.inFlight})
	if err != nil {
		return err
	}
	hb.Start(ctx)
	r.con.heartbeat = hb
	return nil
}

// stopConsole stops what startConsole started: the heartbeat marks the
// replica stopped.
func (r *Replica) stopConsole(bound context.Context) {
	c := &r.con
	if c.heartbeat != nil {
		c.heartbeat.Stop(bound)
	}
	if c.janitor != nil {
		c.janitor.Stop()
	}
	if c.indexer != nil {
		c.indexer.Stop()
	}
	if c.tail != nil {
		c.tail.Stop()
	}
}

// closeStreams ends the console's event streams before the HTTP server
// stops (a stream never goes idle on its own).
func (r *Replica) closeStreams() {
	if r.con.handler != nil {
		r.con.handler.Shutdown()
	}
}

// trigger is the console's action: the admin API's own answer.
func (r *Replica) trigger(ctx context.Context, principal, path string, body []byte) (int, string, []byte) {
	api := r.con.api.Load()
	if api == nil {
		return 503, "text/plain", []byte("the replica is starting")
	}
	return api.Trigger(ctx, principal, path, body)
}

// inFlight is this replica's runs in flight with their progress.
func (r *Replica) inFlight() []console.InFlight {
	if r.runner == nil {
		return nil
	}
	runs := r.runner.InFlight()
	out := make([]console.InFlight, 0, len(runs))
	for _, p := range runs {
		f := console.InFlight{Job: p.Job, Key: p.Key, Replica: p.Replica, Fence: p.Fence, Trigger: string(p.Trigger.Source),
			RequestedBy: p.Trigger.RequestedBy, Started: p.Started.UTC(), Batches: p.BatchesCommitted, Total: p.BatchesTotal,
			Rows: p.Rows, Percent: p.Percent, RowsPerSecond: p.RowsPerSecond, ETAMS: -1}
		if p.ETA >= 0 {
			f.ETAMS = p.ETA.Milliseconds()
		}
		out = append(out, f)
	}
	return out
}

// dependencies are this replica's latest dependency checks.
func (r *Replica) dependencies() []console.Dependency {
	if r.health == nil {
		return nil
	}
	return dependenciesOf(r.health.Snapshot())
}

func dependenciesOf(rs []health.Result) []console.Dependency {
	out := make([]console.Dependency, len(rs))
	for i, d := range rs {
		out[i] = console.Dependency{Name: d.Name, Checked: d.Checked, OK: d.OK, Error: d.Error, Since: d.Since.UTC().Truncate(time.Second)}
	}
	return out
}
