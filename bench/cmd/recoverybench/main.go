// Command recoverybench measures recovery after an owner dies (issue 28,
// goal 3): the time from SIGKILL of the replica running a bill run to its
// run resumed (claimed again) on another replica, over many kills, for one or
// more builds of `coordinator` side by side in one run.
//
// Each trial is a deployment of its own: a database cloned from a seeded
// template, its own Redis key prefix, Kafka topic prefix and consumer group,
// and two replicas (`coordinator serve`) A and B on the defaults that matter
// here (lock watchdog TTL 30 s, resume interval 15 s). A bill run is started
// on A over HTTP (batches slowed with the testhooks build's
// COORDINATOR_TEST_BILLRUN_BATCH_DELAY, so that it outlives the trial), A is
// SIGKILLed at a random moment 2-20 s after its claim, and the trial waits for
// B's claim of the period (bill_runs.owner = B; started_at is the claim time,
// by Postgres' clock on this host). The lock's PTTL read right after the
// kill says when it expired: "after expiry" is the part of the recovery the
// coordinator controls (the TTL is the fail-safe wait for a silent owner).
//
// The builds are interleaved: lanes run trials in parallel, each lane
// alternating the builds, so load affects them alike.
//
// Usage: bench/recovery builds the binaries and runs this (bench/README.md).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type build struct{ name, bin string }

type options struct {
	builds      []build
	kills       int
	lanes       int
	subscribers int
	batchDelay  time.Duration
	out         string
	seed        uint64
	dbURL       string
	redisURL    string
	brokers     []string
}

// trial is one kill and what followed.
type trial struct {
	Build     string        `json:"build"`
	Lane      int           `json:"lane"`
	KillAfter time.Duration `json:"kill_after_claim_ns"`
	TTLAtKill time.Duration `json:"lock_ttl_at_kill_ns"`
	Recovery  time.Duration `json:"kill_to_resumed_ns"`
	AfterTTL  time.Duration `json:"expiry_to_resumed_ns"`
	ResumedBy string        `json:"resumed_by"`
	Trigger   string        `json:"resume_trigger"`
	FenceA    int64         `json:"fence_a"`
	FenceB    int64         `json:"fence_b"`
	Err       string        `json:"error,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "recoverybench:", err)
		os.Exit(1)
	}
}

func run() error {
	var o options
	var builds string
	flag.StringVar(&builds, "builds", "", "comma-separated NAME=BINARY (built with -tags testhooks), e.g. before=/tmp/a,after=/tmp/b")
	flag.IntVar(&o.kills, "kills", 20, "kills per build")
	flag.IntVar(&o.lanes, "lanes", 4, "trials in parallel")
	flag.IntVar(&o.subscribers, "subscribers", 2000, "subscribers seeded for the period")
	flag.DurationVar(&o.batchDelay, "batch-delay", 3*time.Second, "COORDINATOR_TEST_BILLRUN_BATCH_DELAY of the replicas (the run must outlive the trial)")
	flag.StringVar(&o.out, "out", "bench/results/recovery", "output prefix: PREFIX.md and PREFIX.json")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed of the kill delays")
	flag.Parse()
	for _, b := range strings.Split(builds, ",") {
		name, bin, ok := strings.Cut(b, "=")
		if !ok || name == "" || bin == "" {
			return fmt.Errorf("-builds: want NAME=BINARY, got %q", b)
		}
		o.builds = append(o.builds, build{name, bin})
	}
	o.dbURL = os.Getenv("COORDINATOR_TEST_DATABASE_URL")
	o.redisURL = os.Getenv("COORDINATOR_TEST_REDIS_URL")
	o.brokers = strings.Split(os.Getenv("COORDINATOR_TEST_KAFKA_BROKERS"), ",")
	if o.dbURL == "" || o.redisURL == "" || o.brokers[0] == "" {
		return errors.New(`no services: eval "$(scripts/services env)" first`)
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	tag := fmt.Sprintf("recov%d", time.Now().Unix()%1000000)
	template := tag + "_tmpl"
	// The latest month closed in UTC, the default billing zone.
	period := time.Now().UTC().AddDate(0, 0, -time.Now().UTC().Day()).Format("2006-01")
	fmt.Fprintf(os.Stderr, "seed %d; template database %s: %d subscribers for %s\n", o.seed, template, o.subscribers, period)
	defer dropDatabase(admin, template)
	if err := seedTemplate(ctx, o, admin, template, period); err != nil {
		return err
	}

	rng := rand.New(rand.NewPCG(o.seed, 1))
	type job struct {
		b     build
		delay time.Duration
	}
	// Job n runs in lane n%lanes, round n/lanes; a lane takes the builds in
	// turn, and lanes start on different builds, so every build runs in
	// every lane and at every moment of the run.
	queues := make([][]job, o.lanes)
	for n := range o.kills * len(o.builds) {
		lane, round := n%o.lanes, n/o.lanes
		b := o.builds[(round+lane)%len(o.builds)]
		queues[lane] = append(queues[lane], job{b, 2*time.Second + time.Duration(rng.Int64N(int64(18*time.Second)))})
	}
	started := time.Now()
	var mu sync.Mutex
	var trials []trial
	var wg sync.WaitGroup
	for lane, q := range queues {
		wg.Go(func() {
			for i, j := range q {
				name := fmt.Sprintf("%s_l%d_%d", tag, lane, i)
				tr := runTrial(ctx, o, admin, template, period, name, j.b, j.delay)
				tr.Lane = lane
				mu.Lock()
				trials = append(trials, tr)
				fmt.Fprintf(os.Stderr, "%s %-8s lane %d: kill %4.1fs after claim, lock ttl %4.1fs, resumed %6.2fs after the kill (%5.2fs after expiry, by %s via %s) %s\n",
					time.Now().Format("15:04:05"), tr.Build, lane, tr.KillAfter.Seconds(), tr.TTLAtKill.Seconds(),
					tr.Recovery.Seconds(), tr.AfterTTL.Seconds(), tr.ResumedBy, tr.Trigger, tr.Err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return report(o, trials, time.Since(started))
}

func dropDatabase(admin *pgxpool.Pool, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Exec(ctx, "drop database if exists "+name+" with (force)"); err != nil {
		fmt.Fprintf(os.Stderr, "drop database %s: %v\n", name, err)
	}
}

// dbURL is the services' URL with another database.
func dbURL(base, name string) string {
	i := strings.LastIndex(base, "/")
	rest := ""
	if q := strings.Index(base[i:], "?"); q >= 0 {
		rest = base[i+q:]
	}
	return base[:i+1] + name + rest
}

// seedTemplate creates the template database: migrated and seeded for period
// by the first build's own commands.
func seedTemplate(ctx context.Context, o options, admin *pgxpool.Pool, name, period string) error {
	if _, err := admin.Exec(ctx, "create database "+name); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "comment on database "+name+" is 'coordinator:disposable (bench/recovery)'"); err != nil {
		return err
	}
	env := append(os.Environ(), "COORDINATOR_DATABASE_URL="+dbURL(o.dbURL, name), "COORDINATOR_LOG_LEVEL=warn")
	for _, args := range [][]string{{"migrate", "up"},
		{"seed", "--subscribers", fmt.Sprint(o.subscribers), "--usage", "--period", period}} {
		cmd := exec.Command(o.builds[0].bin, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// replica is one `coordinator serve`.
type replica struct {
	id   string
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startReplica(b build, id string, env []string) (*replica, error) {
	// No schedules: the bill run is the one this trial starts.
	cmd := exec.Command(b.bin, "serve", "--billrun-schedule=", "--reaper-schedule=")
	cmd.Env = append(env, "COORDINATOR_REPLICA_ID="+id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &replica{id: id, cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	var last []string // the log's last lines, for an exit at start
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"http_addr"`
			}
			if r.addr == "" {
				last = append(last[max(len(last)-4, 0):], sc.Text())
			}
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "coordinator_started" {
				addr <- l.Addr
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case a := <-addr:
		r.addr = a
		return r, nil
	case <-r.done:
		return nil, fmt.Errorf("replica %s exited at start: %v: %s", id, cmd.ProcessState, strings.Join(last, " | "))
	case <-time.After(60 * time.Second):
		r.kill()
		return nil, fmt.Errorf("replica %s did not start in 60s", id)
	}
}

// kill sends SIGKILL to the replica (by its PID) and waits for it.
func (r *replica) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// runTrial is one deployment, one bill run, one kill.
func runTrial(ctx context.Context, o options, admin *pgxpool.Pool, template, period, name string, b build, delay time.Duration) (tr trial) {
	tr = trial{Build: b.name, KillAfter: delay}
	fail := func(err error) trial { tr.Err = err.Error(); return tr }
	if _, err := admin.Exec(ctx, "create database "+name+" template "+template); err != nil {
		return fail(err)
	}
	defer dropDatabase(admin, name)
	url := dbURL(o.dbURL, name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	defer deleteKafka(o.brokers, name)
	token := fmt.Sprintf("%016x%016x%016x%016x", rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64())
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COORDINATOR_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"COORDINATOR_DATABASE_URL="+url,
		"COORDINATOR_LOCK_REDIS_URL="+o.redisURL,
		"COORDINATOR_LOCK_KEY_PREFIX="+name,
		"COORDINATOR_KAFKA_BROKERS="+strings.Join(o.brokers, ","),
		"COORDINATOR_KAFKA_TOPIC_PREFIX="+name+".",
		"COORDINATOR_KAFKA_GROUP="+name,
		"COORDINATOR_HTTP_ADDR=127.0.0.1:0",
		"COORDINATOR_ADMIN_TOKEN="+token,
		"COORDINATOR_LOG_FORMAT=json",
		"COORDINATOR_LOG_LEVEL=info",
		"COORDINATOR_BILLRUN_WORKERS=1",
		"COORDINATOR_BILLRUN_BATCH_SIZE=50",
		"COORDINATOR_TEST_BILLRUN_BATCH_DELAY="+o.batchDelay.String(),
	)
	a, err := startReplica(b, name+"-a", env)
	if err != nil {
		return fail(err)
	}
	defer a.kill()
	bb, err := startReplica(b, name+"-b", env)
	if err != nil {
		return fail(err)
	}
	defer bb.kill()

	req, _ := http.NewRequest("POST", "http://"+a.addr+"/v1/billruns", strings.NewReader(`{"period":"`+period+`"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fail(fmt.Errorf("POST /v1/billruns: %s", resp.Status))
	}
	if err := pool.QueryRow(ctx, `select fence from bill_runs where period = $1 and owner = $2 and status = 'RUNNING'`,
		period, a.id).Scan(&tr.FenceA); err != nil {
		return fail(fmt.Errorf("A's claim: %w", err))
	}
	time.Sleep(delay)

	rc := redis.NewClient(mustRedisOptions(o.redisURL))
	defer rc.Close()
	lockKey := name + ":{billrun:" + period + "}:lock"
	a.kill()
	killed := time.Now()
	pttl, err := rc.PTTL(ctx, lockKey).Result()
	if err != nil || pttl <= 0 {
		return fail(fmt.Errorf("the lock %s at the kill: ttl %v, %v (the run ended before it?)", lockKey, pttl, err))
	}
	tr.TTLAtKill = pttl
	expiry := killed.Add(pttl)
	deadline := killed.Add(3 * time.Minute)
	for {
		var owner, trigger string
		var at time.Time
		var fence int64
		err := pool.QueryRow(ctx, `select owner, coalesce(trigger_source, ''), started_at, fence from bill_runs where period = $1`, period).
			Scan(&owner, &trigger, &at, &fence)
		if err == nil && owner != a.id {
			tr.ResumedBy, tr.Trigger, tr.FenceB = owner, trigger, fence
			tr.Recovery, tr.AfterTTL = at.Sub(killed), at.Sub(expiry)
			return tr
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("not resumed within 3 minutes of the kill (last: %v)", err))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// deleteKafka deletes the topics the trial's replicas created (prefix
// name.) and its consumer group.
func deleteKafka(brokers []string, name string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if listed, err := adm.ListTopics(ctx); err == nil {
		var mine []string
		for _, t := range listed.Names() {
			if strings.HasPrefix(t, name+".") {
				mine = append(mine, t)
			}
		}
		_, _ = adm.DeleteTopics(ctx, mine...)
	}
	_, _ = adm.DeleteGroups(ctx, name)
}

func mustRedisOptions(url string) *redis.Options {
	opts, err := redis.ParseURL(url)
	if err != nil {
		panic(err)
	}
	return opts
}

// pct is the p-th percentile (nearest rank) of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(p/100*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func report(o options, trials []trial, took time.Duration) error {
	var b strings.Builder
	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "Recovery after SIGKILL of the owner (bench/recovery): %d kills per build, %d lanes, lock TTL 30 s (default), resume interval 15 s (default), seed %d; %s, load %s, %s in all.\n\n",
		o.kills, o.lanes, o.seed, host, strings.Fields(string(load) + " ")[0], took.Round(time.Second))
	b.WriteString("| build | kills | kill → resumed p50 | p90 | max | expiry → resumed p50 | p90 | max | failed |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, bl := range o.builds {
		var rec, after []time.Duration
		failed := 0
		for _, t := range trials {
			if t.Build != bl.name {
				continue
			}
			if t.Err != "" {
				failed++
				continue
			}
			rec, after = append(rec, t.Recovery), append(after, t.AfterTTL)
		}
		slices.Sort(rec)
		slices.Sort(after)
		s := func(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %d |\n", bl.name, len(rec),
			s(pct(rec, 50)), s(pct(rec, 90)), s(pct(rec, 100)), s(pct(after, 50)), s(pct(after, 90)), s(pct(after, 100)), failed)
	}
	fmt.Print(b.String())
	if o.out == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.out+".md", []byte(b.String()), 0o644); err != nil {
		return err
	}
	j, err := json.MarshalIndent(trials, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out+".json", j, 0o644)
}
