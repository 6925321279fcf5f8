package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
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

// setup starts Kafka, Redis (master, replica, sentinel) and PostgreSQL,
// migrates and seeds the database, creates the topics and starts the
// replicas.
func (r *run) setup(ctx context.Context) error {
	b := r.cfg.Binaries
	r.logf("starting kafka, redis (master, replica, sentinel) and postgres on free loopback ports")
	r.net = newNetLayer()
	// A broker listener per replica slot, advertising the slot's proxy.
	var listeners []kafkaListener
	for i := 0; i < r.cfg.Replicas; i++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		l, err := r.net.add(replicaHost(i), depKafka, "kafka", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		listeners = append(listeners, kafkaListener{Name: fmt.Sprintf("R%d", i+1), Port: port, Advertised: l.addr()})
	}
	kafkaErr := make(chan error, 1)
	go func() {
		var err error
		r.kafka, err = startKafka(ctx, b.Java, b.KafkaLibs, b.KafkaLog4j, filepath.Join(r.work, "kafka"), r.logs, listeners)
		kafkaErr <- err
	}()
	var err error
	if r.redis, err = startRedisSet(ctx, b.RedisServer, filepath.Join(r.work, "redis"), r.logs); err != nil {
		return errors.Join(fmt.Errorf("redis: %w", err), <-kafkaErr)
	}
	if r.pg, err = startPostgres(ctx, b.PGBinDir, filepath.Join(r.work, "pg"), r.logs); err != nil {
		return errors.Join(fmt.Errorf("postgres: %w", err), <-kafkaErr)
	}
	if err := <-kafkaErr; err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	r.logf("redis master 127.0.0.1:%d, replica 127.0.0.1:%d, sentinel 127.0.0.1:%d; postgres 127.0.0.1:%d; kafka 127.0.0.1:%d",
		r.redis.nodes[0].port, r.redis.nodes[1].port, r.redis.sentinelPort, r.pg.port, r.kafka.port)
	if err := r.addProxies(); err != nil {
		return err
	}

	if out, err := r.coordinatorCmd(ctx, "migrate", "up"); err != nil {
		return fmt.Errorf("coordinator migrate up: %v: %s", err, lastLines(out, 5))
	}
	if r.pool, err = pgxpool.New(ctx, r.pg.dsn()+"&pool_max_conns=8"); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, sqlChaosSchema); err != nil {
		return fmt.Errorf("chaos schema: %w", err)
	}
	r.planPeriods(time.Now().UTC())
	if err := seedSubscribers(ctx, r.pool, r.cfg.Subscribers, append([]string{r.cronP}, r.periods...)); err != nil {
		return err
	}
	if err := r.addReservations(ctx); err != nil {
		return err
	}

	if r.kc, err = kgo.NewClient(kgo.SeedBrokers(r.kafka.brokers()...), kgo.ProducerBatchMaxBytes(4<<20),
		kgo.RecordDeliveryTimeout(20*time.Second), kgo.ProducerLinger(0)); err != nil {
		return err
	}
	adm := kadm.NewClient(r.kc)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Default topic configs (1 MiB records), as a real cluster would have.
	res, err := adm.CreateTopics(cctx, 3, 1, nil, topicBillrun, topicReaper, topicDLQ, topicEvents)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, t := range res.Sorted() {
		if t.Err != nil {
			return fmt.Errorf("create topic %s: %w", t.Topic, t.Err)
		}
	}

	if err := r.startInproc(ctx); err != nil {
		return err
	}
	r.logf("starting %d replicas of %s", r.cfg.Replicas, r.cfg.Binaries.Coordinator)
	for i := 0; i < r.cfg.Replicas; i++ {
		r.slots = append(r.slots, &replicaSlot{r: r, idx: i})
	}
	return nil
}

// Hosts of the network layer: replica slots, `coordinator lock` workers and
// in-process Locker workers.
func replicaHost(slot int) string { return fmt.Sprintf("r%d", slot+1) }
func lockHost(w int) string       { return fmt.Sprintf("lw%d", w) }
func inprocHost(w int) string     { return fmt.Sprintf("iw%d", w) }

// addProxies gives every host its proxies to Redis (the sentinel and both
// nodes) and, for replicas and in-process workers, to PostgreSQL. (The
// replicas' Kafka proxies exist already: the broker advertises them.)
func (r *run) addProxies() error {
	redisLinks := func(host string) error {
		if _, err := r.net.add(host, depRedis, "sentinel", fmt.Sprintf("127.0.0.1:%d", r.redis.sentinelPort)); err != nil {
			return err
		}
		for _, n := range r.redis.nodes {
			if _, err := r.net.add(host, depRedis, n.name, n.addr()); err != nil {
				return err
			}
		}
		return nil
	}
	pgLink := func(host string) error {
		_, err := r.net.add(host, depPostgres, "postgres", fmt.Sprintf("127.0.0.1:%d", r.pg.port))
		return err
	}
	for i := 0; i < r.cfg.Replicas; i++ {
		if err := errors.Join(redisLinks(replicaHost(i)), pgLink(replicaHost(i))); err != nil {
			return err
		}
	}
	for w := 0; w < r.cfg.LockWorkers; w++ {
		if err := redisLinks(lockHost(w)); err != nil {
			return err
		}
	}
	for w := 0; w < r.cfg.InprocWorkers; w++ {
		if err := errors.Join(redisLinks(inprocHost(w)), pgLink(inprocHost(w))); err != nil {
			return err
		}
	}
	return nil
}

// hostDSN is the PostgreSQL DSN host uses (through its proxy, if it has one).
func (r *run) hostDSN(host string) string {
	if ls := r.net.hostLinks(host, depPostgres); len(ls) > 0 {
		return "postgres://postgres@" + ls[0].addr() + "/postgres?sslmode=disable"
	}
	return r.pg.dsn()
}

// The contract's topics (no prefix: the broker is the verifier's own).
const (
	topicBillrun = "billing.billrun.requested"
	topicReaper  = "subscription.msisdn-reaper.requested"
	topicDLQ     = "coordinator.triggers.dlq"
	topicEvents  = "coordinator.ownership.events"
)

// baseEnv is the environment without any COORDINATOR_ variable of the
// caller's, so nothing of the shared services leaks into the run.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "COORDINATOR_") || k == "DATABASE_URL" || k == "REDIS_URL" || strings.HasPrefix(k, "CHAOS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// commonEnv is what every coordinator process gets; host ("" for none)
// names the proxies it reaches its dependencies through.
func (r *run) commonEnv(host string) []string {
	brokers := r.kafka.brokers()
	if ls := r.net.hostLinks(host, depKafka); host != "" && len(ls) > 0 {
		brokers = []string{ls[0].addr()}
	}
	env := baseEnv()
	if host != "" && len(r.net.hostLinks(host, depRedis)) > 0 {
		// A test hook of testhooks builds (cmd/coordinator/testhooks.go).
		env = append(env, "COORDINATOR_TEST_REDIS_ADDR_MAP="+r.net.addrMap(host))
	}
	dsn := r.pg.dsn()
	if host != "" {
		dsn = r.hostDSN(host)
	}
	return append(env,
		"COORDINATOR_DATABASE_URL="+dsn,
		"COORDINATOR_LOCK_REDIS_MODE=sentinel",
		"COORDINATOR_LOCK_REDIS_URL="+r.redis.URL(),
		"COORDINATOR_LOCK_WAIT_TIME="+lockWaitTime.String(),
		"COORDINATOR_KAFKA_BROKERS="+strings.Join(brokers, ","),
		"COORDINATOR_LOG_FORMAT=json",
		"COORDINATOR_LOG_LEVEL=info",
		// Round-2 settings, harmless where not yet read: every period the
		// verifier bills is closed and within this look-back.
		"COORDINATOR_BILLING_TZ=UTC",
		"COORDINATOR_BILLRUN_MAX_AGE_MONTHS=1200",
	)
}

func (r *run) replicaEnv(slot int) []string {
	return append(r.commonEnv(replicaHost(slot)),
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT="+replicaWatchdogTTL.String(),
		"COORDINATOR_KAFKA_CREATE_TOPICS=true",
		"COORDINATOR_HTTP_ADDR=127.0.0.1:0",
		"COORDINATOR_ADMIN_TOKEN="+r.token,
		"COORDINATOR_REAPER_SCHEDULE=@every "+reaperEvery.String(),
		"COORDINATOR_REAPER_LEASE=3s",
		"COORDINATOR_BILLRUN_SCHEDULE="+r.cronSpec,
		fmt.Sprintf("COORDINATOR_BILLRUN_BATCH_SIZE=%d", billrunBatchSize),
		fmt.Sprintf("COORDINATOR_BILLRUN_WORKERS=%d", billrunWorkers),
		"COORDINATOR_SHUTDOWN_TIMEOUT="+shutdownTimeout.String(),
		// A run.completed lost with a killed owner is re-published well
		// within the recovery phase.
		"COORDINATOR_EVENTS_REPUBLISH_AFTER="+eventsRepublishAfter.String(),
		// A killed replica's partitions move after 10 s; and a test hook of
		// `coordinator serve` (not the configuration contract): batches are
		// slowed a little so that faults land in the middle of runs.
		"COORDINATOR_KAFKA_SESSION_TIMEOUT="+kafkaSession.String(),
		"COORDINATOR_TEST_BILLRUN_BATCH_DELAY="+billrunBatchDelay.String(),
	)
}

// coordinatorCmd runs a one-shot coordinator command and returns its output.
func (r *run) coordinatorCmd(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.cfg.Binaries.Coordinator, args...)
	cmd.Env = r.commonEnv("")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// exercise runs the fault phase and the recovery phase and reads the
// history back.
func (r *run) exercise(ctx context.Context) error {
	replicaCtx, stopReplicas := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReplicas()
	var replicasWG sync.WaitGroup
	for _, s := range r.slots {
		replicasWG.Go(func() { s.loop(replicaCtx) })
	}
	if !waitFor(ctx, replicaReadyBound, 100*time.Millisecond, func() bool { return len(r.liveReplicas()) == len(r.slots) }) {
		var tails []string
		for _, s := range r.slots {
			s.mu.Lock()
			if s.cur != nil {
				tails = append(tails, s.cur.id+": "+strings.Join(s.cur.proc.tailLines(4), " | "))
			}
			s.mu.Unlock()
		}
		return fmt.Errorf("%w: the replicas did not all start within %s: %s", ErrSetup, replicaReadyBound, strings.Join(tails, " || "))
	}

	r.mu.Lock()
	r.hist.StartNS, r.hist.WallStart = Mono(), time.Now()
	r.hist.CronEvery = cronEvery
	r.mu.Unlock()
	r.logf("fault phase: %s, %d faults planned (seed %d)", r.cfg.Duration, len(r.plan), r.cfg.Seed)
	phase, endPhase := context.WithTimeout(ctx, r.cfg.Duration)
	defer endPhase()
	r.phase = phase
	r.workWG.Go(func() { r.triggerLoop(phase) })
	r.workWG.Go(func() { r.cronTicks(phase) })
	r.workWG.Go(func() { r.reservationFeeder(phase) })
	for w := 0; w < r.cfg.LockWorkers; w++ {
		r.workWG.Go(func() { r.lockWorker(phase, w) })
	}
	for _, iw := range r.inproc {
		r.workWG.Go(func() { iw.loop(phase) })
	}
	var faultsWG sync.WaitGroup
	faultsWG.Go(func() { r.runFaults(phase, r.plan) })
	faultsWG.Go(func() { r.runFaults(phase, r.netPlan) })
	faultsWG.Wait()
	<-phase.Done()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.logf("fault phase over: healing what is still broken, draining the workload")
	r.heal(ctx)
	drained := make(chan struct{})
	go func() { r.workWG.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(workloadDrainBound):
		r.logf("workload did not drain within %s; killing the remaining lock processes", workloadDrainBound)
		r.killLocks()
		<-drained
	}
	r.mu.Lock()
	r.hist.FaultsEndNS = Mono()
	r.mu.Unlock()

	r.recover(ctx)
	r.finalTreeCheck(ctx)

	r.logf("stopping the replicas (SIGTERM, %s bound)", shutdownTimeout+10*time.Second)
	stopReplicas()
	replicasWG.Wait()
	var stopWG sync.WaitGroup
	for _, s := range r.slots {
		stopWG.Go(func() { s.stop(shutdownTimeout + 10*time.Second) })
	}
	stopWG.Wait()
	return r.readHistory(ctx)
}

// recover is the quiet phase: no faults, no new triggers; it ends when every
// accepted bill run is COMPLETED and the reaper freed every expired
// reservation, or at the bound.
func (r *run) recover(ctx context.Context) {
	r.logf("recovery phase: waiting up to %s for every accepted bill run to complete", r.cfg.Recovery)
	start := time.Now()
	r.mu.Lock()
	why, _ := r.hist.acceptedPeriods()
	r.mu.Unlock()
	var pending []string
	var unacked int // COMPLETED, run.completed not yet acknowledged: a resumer re-publishes it
	done := waitFor(ctx, r.cfg.Recovery, time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := billRunStatuses(cctx, r.pool)
		if err != nil {
			return false
		}
		pending = pending[:0]
		for p := range why {
			if st[p] != "COMPLETED" {
				pending = append(pending, p)
			}
		}
		if unacked, err = unackedCompletions(cctx, r.pool); err != nil {
			return false
		}
		ps, err := loadPool(cctx, r.pool, reaperEvery)
		return err == nil && len(pending) == 0 && unacked == 0 && ps.StaleLeft == 0
	})
	r.mu.Lock()
	r.hist.CheckNS = Mono()
	r.mu.Unlock()
	if done {
		r.logf("recovered in %s", time.Since(start).Round(100*time.Millisecond))
	} else {
		r.logf("not recovered within %s: %d bill runs not COMPLETED, %d run.completed not acknowledged", r.cfg.Recovery, len(pending), unacked)
	}
}

// readHistory reads the product's tables, the helpers' rows, the events and
// the dead letters.
func (r *run) readHistory(ctx context.Context) error {
	r.logf("reading the history back")
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	h := &r.hist
	var err error
	if h.Sections, err = loadSections(cctx, r.pool); err != nil {
		return fmt.Errorf("read sections: %w", err)
	}
	if h.Writes, err = loadWrites(cctx, r.pool); err != nil {
		return fmt.Errorf("read writes: %w", err)
	}
	if h.Procs, err = loadProcs(cctx, r.pool, "order by started_ns"); err != nil {
		return fmt.Errorf("read procs: %w", err)
	}
	if h.BillRuns, err = loadBillRuns(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_runs: %w", err)
	}
	if h.BillRunLog, err = loadBillRunLog(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_runs changes: %w", err)
	}
	if h.Batches, err = loadBatches(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_run_batches: %w", err)
	}
	if h.FencedWrites, err = loadFencedWrites(cctx, r.pool); err != nil {
		return fmt.Errorf("read fenced writes: %w", err)
	}
	r.mu.Lock()
	periods := append([]string{r.cronP}, r.introduced...)
	r.mu.Unlock()
	if h.Invoices, err = loadInvoiceStats(cctx, r.pool, periods); err != nil {
		return fmt.Errorf("read invoices: %w", err)
	}
	if h.Pool, err = loadPool(cctx, r.pool, reaperEvery); err != nil {
		return fmt.Errorf("read msisdn_pool: %w", err)
	}
	h.Pool.StaleSeen = r.staleSeen
	if h.Events, err = readEvents(cctx, r.kafka.brokers()); err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	if h.DLQ, err = readDLQ(cctx, r.kafka.brokers()); err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	return nil
}

// teardown stops everything still running, by PID.
func (r *run) teardown() {
	r.killLocks()
	for _, iw := range r.inproc {
		iw.close()
	}
	for _, s := range r.slots {
		s.mu.Lock()
		inc := s.cur
		s.mu.Unlock()
		if inc != nil {
			inc.proc.stop(syscall.SIGKILL, 5*time.Second)
		}
	}
	if r.kc != nil {
		r.kc.Close()
	}
	if r.pool != nil {
		r.pool.Close()
	}
	// The data is throwaway: no graceful stops.
	if r.kafka != nil {
		r.kafka.halt(syscall.SIGKILL)
	}
	if r.pg != nil {
		r.pg.halt(syscall.SIGQUIT)
	}
	if r.redis != nil {
		r.redis.stop()
	}
	if r.net != nil {
		r.net.close()
	}
	for _, c := range r.closers {
		_ = c()
	}
}
