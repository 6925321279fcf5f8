// Package demo runs the coordinator's whole mission on one machine with
// nothing but local programs: a throwaway PostgreSQL cluster and a
// redis-server started from the installed binaries on free loopback ports,
// an in-process Kafka (franz-go's kfake), and three replicas in this
// process. cmd/coordinator-demo is its program; the production binary does
// not carry it. It seeds subscribers and stale MSISDN reservations, fires the
// same bill-run trigger from Kafka, HTTP and cron at the same instant,
// prints the ownership timeline as it reads it back from the events topic,
// then a summary, and stops everything it started.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/replica"
	"github.com/telco-platform/coordinator/internal/topics"
)

// Config is the demo's own settings.
type Config struct {
	// Subscribers to seed (5% SUSPENDED, 2% TERMINATED). Default 100000.
	Subscribers int64
	// StaleReservations are RESERVED MSISDNs whose hold has expired.
	// Default 10000; negative means none.
	StaleReservations int
	// Replicas in the process. Default 3.
	Replicas int
	// LockWaitTime is how long a replica waits for a held lock before it
	// answers already_owned. Default 500ms (the service's default is 5s).
	LockWaitTime time.Duration
	// Timeout bounds the whole demo after start-up. Default 100s.
	Timeout time.Duration
	// Binaries are the redis-server and PostgreSQL programs (FindBinaries).
	Binaries Binaries
	// OpenLocker builds each replica's Locker. Default: the Redis adapter
	// on the demo's redis-server.
	OpenLocker replica.OpenLocker
	// Out gets the timeline and the summary. Default os.Stdout.
	Out io.Writer
	// Log gets the replicas' log lines. Default: a file in the demo's
	// temporary directory, whose end is printed if the demo fails.
	Log io.Writer
	// LogLevel of the replicas' logs. Default info.
	LogLevel slog.Level
	// BatchSize is subscribers per bill-run batch. Default 1000.
	BatchSize int

	// batchPause makes every bill-run batch transaction take at least this
	// long, in the database (a test seam: the run outlasts the triggers).
	batchPause time.Duration
}

func (c Config) withDefaults() Config {
	if c.Subscribers == 0 {
		c.Subscribers = 100000
	}
	if c.StaleReservations == 0 {
		c.StaleReservations = 10000
	} else if c.StaleReservations < 0 {
		c.StaleReservations = 0 // none
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.LockWaitTime == 0 {
		c.LockWaitTime = 500 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = 100 * time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.OpenLocker == nil {
		c.OpenLocker = openRedisLocker
	}
	return c
}

// ErrCheckFailed: the demo ran but what it saw is not what the coordinator
// promises (not exactly one run.completed, wrong invoice count, ...).
var ErrCheckFailed = errors.New("demo: check failed")

// Run runs the demo. It returns nil when the mission was shown and checked;
// everything it started is stopped and its temporary directory removed
// before it returns, also when ctx is cancelled.
func Run(ctx context.Context, cfg Config) (err error) {
	cfg = cfg.withDefaults()
	if cfg.Subscribers < 1 || cfg.Replicas < 1 {
		return fmt.Errorf("demo: bad sizes: %d subscribers, %d stale reservations, %d replicas", cfg.Subscribers, cfg.StaleReservations, cfg.Replicas)
	}
	out := cfg.Out
	began := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}

	tmp, err := os.MkdirTemp("", "coordinator-demo-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		_ = os.RemoveAll(tmp)
	}()

	logW := cfg.Log
	if logW == nil {
		f, ferr := os.Create(tmp + "/replicas.log")
		if ferr != nil {
			return fmt.Errorf("demo: %w", ferr)
		}
		cleanups = append(cleanups, func() { _ = f.Close() })
		logW = &syncWriter{w: f}
		defer func() {
			if err != nil {
				if b, rerr := os.ReadFile(f.Name()); rerr == nil && len(b) > 0 {
					fmt.Fprintf(out, "\nlast lines of the replicas' log:\n%s\n", strings.ReplaceAll(lastLines(b, 25), " | ", "\n"))
				}
			}
		}()
	}

	// The latest month closed in the billing zone (UTC, the default): the open
	// month is never billable.
	period := billrun.PeriodOf(time.Now().UTC()).Previous()
	billKey := billrun.LockKey(period)
	fmt.Fprintf(out, "coordinator demo: %d replicas, %d subscribers, %d stale MSISDN reservations, bill run %s (the latest month closed in UTC)\n\n",
		cfg.Replicas, cfg.Subscribers, cfg.StaleReservations, period)

	// Dependencies.
	pg, dsn, err := startPostgres(ctx, cfg.Binaries.PGBinDir, tmp+"/pg")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = pg.Stop(syscall.SIGINT, 15*time.Second) })
	step("postgres   %s (throwaway cluster from %s, pid %d)", strings.TrimSuffix(strings.TrimPrefix(dsn, "postgres://postgres@"), "/postgres?sslmode=disable"), cfg.Binaries.PGBinDir, pg.PID())

	rd, redisURL, err := startRedis(cfg.Binaries.RedisServer, tmp+"/redis")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = rd.Stop(syscall.SIGINT, 10*time.Second) })
	step("redis      %s (%s, pid %d)", strings.TrimPrefix(redisURL, "redis://"), cfg.Binaries.RedisServer, rd.PID())

	reg, err := kinds.Config{}.Registry() // the kinds' topics
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	names := topics.New("", reg.Topics()...)
	var seeds []kfake.Opt
	for _, t := range names.All() {
		seeds = append(seeds, kfake.SeedTopics(names.Partitions(t), t))
	}
	kf, err := kfake.NewCluster(append(seeds, kfake.NumBrokers(1))...)
	if err != nil {
		return fmt.Errorf("demo: kfake: %w", err)
	}
	cleanups = append(cleanups, kf.Close)
	brokers := kf.ListenAddrs()
	step("kafka      %s (in-process kfake; topics %s)", strings.Join(brokers, ","), strings.Join(names.All(), ", "))

	// Schema and data.
	pool, err := postgres.Connect(ctx, dsn, 4)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, pool.Close)
	// The demo seeds only the throwaway cluster it started: mark it, and
	// hold the seeding to the check `coordinator seed` passes too.
	if err := postgres.MarkDisposable(ctx, pool, "coordinator demo"); err != nil {
		return err
	}
	if err := postgres.RequireDisposable(ctx, pool, "demo", false); err != nil {
		return err
	}
	active, err := prepare(ctx, pool, cfg, period)
	if err != nil {
		return err
	}
	step("seeded     %d subscribers (%d ACTIVE), %d MSISDNs with %d stale reservations", cfg.Subscribers, active,
		cfg.StaleReservations*2, cfg.StaleReservations)

	// The replicas. The bill-run cron fires once, at the instant the demo
	// also sends the Kafka record and the HTTP call.
	runCtx, cancelRun := context.WithTimeout(ctx, cfg.Timeout)
	defer cancelRun()
	fireAt := time.Now().Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
	token := randomHex(16)
	logger := slog.New(slog.NewTextHandler(logW, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redislock.SetLogger(logger)
	reps := make([]*replica.Replica, cfg.Replicas)
	for i := range reps {
		id := fmt.Sprintf("coordinator-%d", i+1)
		env := map[string]string{
			"COORDINATOR_DATABASE_URL":       dsn,
			"COORDINATOR_LOCK_REDIS_URL":     redisURL,
			"COORDINATOR_LOCK_WAIT_TIME":     cfg.LockWaitTime.String(),
			"COORDINATOR_KAFKA_BROKERS":      strings.Join(brokers, ","),
			"COORDINATOR_REPLICA_ID":         id,
			"COORDINATOR_HTTP_ADDR":          "127.0.0.1:0",
			"COORDINATOR_ADMIN_TOKEN":        token,
			"COORDINATOR_REAPER_SCHEDULE":    "@every 4s",
			"COORDINATOR_BILLRUN_SCHEDULE":   cronAt(fireAt),
			"COORDINATOR_BILLRUN_BATCH_SIZE": fmt.Sprint(cfg.BatchSize),
			"COORDINATOR_SHUTDOWN_TIMEOUT":   "15s",
		}
		rcfg, _, cerr := config.Load("demo", nil, func(k string) string { return env[k] })
		if cerr != nil {
			return fmt.Errorf("demo: replica config: %w", cerr)
		}
		// Each replica opens its own kinds (their Workers hold its pool).
		rkinds, err := kinds.Registry(rcfg)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		reps[i] = replica.New(replica.Config{Config: rcfg, Log: logger.With("replica", id), OpenLocker: cfg.OpenLocker,
			Kinds: rkinds, Version: "demo"})
	}
	stopReplicas := func() {
		var wg sync.WaitGroup
		for _, r := range reps {
			wg.Go(r.Stop)
		}
		wg.Wait()
	}
	cleanups = append(cleanups, stopReplicas)

	tl := newTimeline(out, fireAt, billKey)
	tlCtx, stopTimeline := context.WithCancel(context.Background())
	tlDone := make(chan error, 1)
	go func() { tlDone <- tl.run(tlCtx, brokers, names.Events) }()
	cleanups = append(cleanups, func() {
		stopTimeline()
		if terr := <-tlDone; terr != nil {
			fmt.Fprintf(out, "ownership timeline: %v\n", terr)
		}
	})

	for _, r := range reps {
		if err := r.Start(runCtx); err != nil {
			return err
		}
	}
	step("replicas   %s (HTTP %s)", ids(reps), httpAddrs(reps))
	step("firing     bill run %s from Kafka, HTTP and cron (every replica) at %s", period, fireAt.UTC().Format("15:04:05"))
	fmt.Fprintf(out, "\nownership timeline (read back from %s; times relative to the trigger instant):\n", names.Events)

	// Fire: the cron entries fire by themselves at fireAt.
	pause(runCtx, time.Until(fireAt))
	var fired sync.WaitGroup
	var httpLine, kafkaErr string
	fired.Go(func() { kafkaErr = produceTrigger(runCtx, brokers, names.Topic(billrun.Topic), period.String()) })
	fired.Go(func() { httpLine = postTrigger(runCtx, reps[0], token, period.String()) })
	fired.Wait()
	if kafkaErr != "" {
		return fmt.Errorf("demo: produce the Kafka trigger: %s", kafkaErr)
	}

	// Wait until every trigger is answered, the run released its lock, and
	// the reaper has swept the stale reservations.
	expected := cfg.Replicas + 2 // cron on every replica, one Kafka record, one HTTP call
	var s summary
	for {
		all, changed := tl.snapshot()
		s = summarise(all, billKey)
		if s.answeredTotal() >= expected && len(s.billCompleted) >= 1 && s.billReleased && s.freed >= int64(cfg.StaleReservations) {
			break
		}
		select {
		case <-changed:
		case <-runCtx.Done():
			fmt.Fprintf(out, "\n%s\n", httpLine)
			return fmt.Errorf("%w: gave up after %s: %d of %d triggers answered, %d run.completed, %d of %d stale reservations freed",
				ErrCheckFailed, cfg.Timeout, s.answeredTotal(), expected, len(s.billCompleted), s.freed, cfg.StaleReservations)
		}
	}
	tl.mute()
	fmt.Fprintf(out, "\n  %s\n", httpLine)
	// The open month is refused before anything runs: 422, period_not_closed.
	open := period.Next()
	openLine := postTrigger(runCtx, reps[0], token, open.String())
	fmt.Fprintf(out, "  the open month %s: %s\n\n", open, openLine)
	step("stopping   replicas (release locks, flush events)")
	stopReplicas()

	// Verify against Postgres, the authority.
	check, cerr := verify(ctx, pool, period)
	if cerr != nil {
		return cerr
	}
	all, _ := tl.snapshot()
	s = summarise(all, billKey)
	fmt.Fprintf(out, "\nsummary (events per replica for %s and the reaper):\n", billKey)
	s.print(out)
	fmt.Fprintf(out, "\n  triggers answered: %s\n", answeredLine(s.billAnswered))
	fmt.Fprintf(out, "  bill_runs %s: status=%s owner=%s fence=%d; invoices=%d for %d ACTIVE subscribers, duplicates=%d\n",
		period, check.status, check.owner, check.fence, check.invoices, active, check.duplicates)
	fmt.Fprintf(out, "  msisdn_pool: %d stale reservations left (of %d)\n", check.staleLeft, cfg.StaleReservations)
	fmt.Fprintf(out, "  took %.1fs in all\n", time.Since(began).Seconds())

	var problems []string
	if n := len(s.billCompleted); n != 1 {
		problems = append(problems, fmt.Sprintf("%d run.completed events for %s, want exactly 1", n, billKey))
	}
	if s.alreadyOwnedBad > 0 {
		problems = append(problems, fmt.Sprintf("%d already_owned events name no owner", s.alreadyOwnedBad))
	}
	if check.status != billrun.StatusCompleted || check.invoices != active || check.duplicates != 0 {
		problems = append(problems, "bill run not completed with one invoice per ACTIVE subscriber")
	}
	if check.staleLeft != 0 {
		problems = append(problems, fmt.Sprintf("%d stale reservations left", check.staleLeft))
	}
	if !strings.Contains(openLine, " answered 422 ") {
		problems = append(problems, "the open month "+open.String()+" was not refused with 422: "+openLine)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrCheckFailed, strings.Join(problems, "; "))
	}
	fmt.Fprintf(out, "\nOK: one owner, one run, every other trigger told who owns it.\n")
	fmt.Fprintf(out, "Stopping redis-server (pid %d), postgres (pid %d) and the in-process Kafka; removing %s.\n",
		rd.PID(), pg.PID(), tmp)
	return nil
}
