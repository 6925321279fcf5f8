package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config is one verifier run.
type Config struct {
	// Seed drives the fault schedule and the workload plan.
	Seed uint64
	// Duration is the fault phase: workload and faults. Setup before it and
	// the recovery phase after it come on top.
	Duration time.Duration
	// Recovery bounds the quiet phase after the faults stop, in which every
	// accepted bill run must end COMPLETED. Default 90s.
	Recovery time.Duration
	// Out is the report directory (report.json, report.md, logs/).
	Out string
	// Sabotage: the coordinator binary is the chaos_sabotage build.
	Sabotage bool
	// Faults are the enabled fault kinds. Default all.
	Faults []string
	// Replicas is the number of `coordinator serve` processes. Default 3.
	Replicas int
	// LockWorkers loop `coordinator lock` over LockKeys keys. Defaults 4, 2.
	LockWorkers int
	LockKeys    int
	// InprocWorkers are redislock.Locker workers inside the verifier, each
	// with proxies of its own, doing fenced writes over InprocKeys keys.
	// Defaults 4, 2.
	InprocWorkers int
	InprocKeys    int
	// Subscribers billed per period. Default 6000.
	Subscribers int
	// Binaries are the programs to run (FindBinaries).
	Binaries Binaries
	// Progress gets one line per step. Default os.Stderr.
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.Recovery == 0 {
		c.Recovery = 90 * time.Second
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.LockWorkers == 0 {
		c.LockWorkers = 4
	}
	if c.LockKeys == 0 {
		c.LockKeys = 2
	}
	if c.InprocWorkers == 0 {
		c.InprocWorkers = 4
	}
	if c.InprocKeys == 0 {
		c.InprocKeys = 2
	}
	if c.Subscribers == 0 {
		c.Subscribers = 6000
	}
	if len(c.Faults) == 0 {
		c.Faults = AllFaults
	}
	if c.Progress == nil {
		c.Progress = os.Stderr
	}
}

// Product settings the verifier runs the replicas and workers with.
const (
	lockWaitTime      = time.Second
	shutdownTimeout   = 10 * time.Second
	kafkaSession      = 10 * time.Second
	reaperEvery       = 5 * time.Second
	billrunBatchSize  = 25
	billrunWorkers    = 2
	billrunBatchDelay = 40 * time.Millisecond
	// eventsRepublishAfter plus the resume interval (15s) fit in the
	// recovery phase many times over.
	eventsRepublishAfter = 10 * time.Second
	replicaReadyBound    = 90 * time.Second
	workloadDrainBound   = 30 * time.Second
)

// Result is what a run produced.
type Result struct {
	Report    Report
	History   *History
	Anomalies []Anomaly
}

// run is the state of one verifier run.
type run struct {
	cfg   Config
	work  string // temporary directory (data of the services)
	logs  string // Out/logs
	token string

	redis *redisSet
	pg    *pgServer
	kafka *kafkaServer
	net   *netLayer
	pool  *pgxpool.Pool
	kc    *kgo.Client // producer of triggers
	slots []*replicaSlot

	plan     []FaultSpec
	netPlan  []FaultSpec
	periods  []string // Kafka/HTTP periods, newest first
	cronSpec string
	cronP    string

	mu         sync.Mutex
	hist       History
	locks      map[*lockInc]struct{} // running `coordinator lock` processes
	inproc     []*inprocWorker
	introduced []string
	nextPeriod int
	reserveN   int
	staleSeen  int64

	workWG sync.WaitGroup // triggers and lock workers
	// phase ends with the fault phase: no trigger is sent again after it.
	phase context.Context

	closers []func() error // closed last, at teardown
}

func (r *run) logf(format string, args ...any) {
	at := ""
	if r.hist.StartNS != 0 {
		at = fmt.Sprintf("[%s] ", r.hist.rel(Mono()))
	}
	fmt.Fprintf(r.cfg.Progress, "chaos: %s%s\n", at, fmt.Sprintf(format, args...))
}

// ErrSetup marks a run that could not start its services or the product:
// nothing was verified.
var ErrSetup = errors.New("setup failed")

// Run starts the services and the product, runs the workload and the faults
// for cfg.Duration, lets the system recover, checks the history and writes
// the report into cfg.Out. Everything it started is stopped before it
// returns. An error means the run could not be carried out (ErrSetup);
// anomalies are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	r := &run{cfg: cfg, locks: map[*lockInc]struct{}{}}
	var err error
	if r.work, err = os.MkdirTemp("", "coordinator-chaos-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(r.work)
	// The postgres OS user must reach its data directory inside.
	if err := os.Chmod(r.work, 0o755); err != nil {
		return nil, err
	}
	r.logs = filepath.Join(cfg.Out, "logs")
	if err := os.MkdirAll(r.logs, 0o755); err != nil {
		return nil, err
	}
	var tok [24]byte
	_, _ = rand.Read(tok[:])
	r.token = hex.EncodeToString(tok[:])
	r.plan = Plan(cfg.Seed, cfg.Duration, cfg.Faults, cfg.Sabotage)
	r.netPlan = PlanNet(cfg.Seed, cfg.Duration, cfg.Faults)

	defer r.teardown()
	if err := r.setup(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	if err := r.exercise(ctx); err != nil {
		return nil, err
	}
	anomalies := Check(&r.hist)
	rep := r.report(anomalies)
	if err := writeReports(cfg.Out, rep, &r.hist, r, anomalies); err != nil {
		return nil, err
	}
	return &Result{Report: rep, History: &r.hist, Anomalies: anomalies}, nil
}
