package chaos

// Setting a run up (services, proxies, schema, topics, replicas), the
// environment of the coordinator processes, and the teardown.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
