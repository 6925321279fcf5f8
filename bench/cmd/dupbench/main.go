// Command dupbench measures how fast replicas of `coordinator serve` drain
// duplicate bill-run triggers for COMPLETED periods (issue 28), old binary
// against new in one run, on the real Kafka, Redis and PostgreSQL of
// scripts/services.
//
// Scenarios (each variant gets databases, topics, a consumer group and lock
// keys of its own):
//
//   - single: one COMPLETED period of -single-subs subscribers (half with
//     usage); -dups triggers for it, all on one partition, one replica.
//     Drain = from the first produce to every offset committed.
//   - replay: -periods COMPLETED periods of -replay-subs subscribers; a
//     replay of -replay triggers over them (shuffled), then -probes triggers
//     for new periods (a small population each), each behind the backlog of
//     its partition (one every -probe-every from the end of the backlog's
//     produce); -replicas replicas. Drain as above; probe latency = from its
//     produce to its ownership.acquired (the event's own time).
//
// Every trigger's answer is counted on the events topic: the run is valid
// only if each duplicate got a run.already_completed and each probe a
// run.completed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/topics"
)

type opts struct {
	bins                map[string]string // variant -> binary
	variants            []string
	adminURL, redisURL  string
	brokers             []string
	scenarios           []string
	dups, oldDups       int
	singleSubs          int
	periods, replaySubs int
	replay, oldReplay   int
	probes, replicas    int
	probeEvery          time.Duration
	rounds              int
	workDir             string
	keep                bool
}

func main() {
	var o opts
	newBin := flag.String("new", "", "the coordinator binary under test")
	oldBin := flag.String("old", "", "the coordinator binary to compare with (empty: none)")
	flag.StringVar(&o.adminURL, "db", os.Getenv("COORDINATOR_TEST_DATABASE_URL"), "Postgres URL whose server gets the benchmark's databases")
	flag.StringVar(&o.redisURL, "redis", os.Getenv("COORDINATOR_TEST_REDIS_URL"), "Redis URL")
	brokers := flag.String("brokers", os.Getenv("COORDINATOR_TEST_KAFKA_BROKERS"), "Kafka brokers")
	scen := flag.String("scenarios", "single,replay", "scenarios to run")
	flag.IntVar(&o.dups, "dups", 2000, "single: duplicates for the new binary")
	flag.IntVar(&o.oldDups, "old-dups", 100, "single: duplicates for the old binary (each costs it a late-usage check over the period's invoices)")
	flag.IntVar(&o.singleSubs, "single-subs", 100000, "single: subscribers of the period")
	flag.IntVar(&o.periods, "periods", 100, "replay: COMPLETED periods")
	flag.IntVar(&o.replaySubs, "replay-subs", 10000, "replay: subscribers of each COMPLETED period")
	flag.IntVar(&o.replay, "replay", 10000, "replay: duplicates for the new binary")
	flag.IntVar(&o.oldReplay, "old-replay", 1000, "replay: duplicates for the old binary")
	flag.IntVar(&o.probes, "probes", 100, "replay: new periods triggered behind the backlog")
	flag.DurationVar(&o.probeEvery, "probe-every", 30*time.Millisecond, "replay: time between two probes (0: all at once, a burst of new bill runs)")
	flag.IntVar(&o.replicas, "replicas", 3, "replay: replicas")
	flag.IntVar(&o.rounds, "rounds", 1, "rounds per scenario (variants alternate)")
	flag.BoolVar(&o.keep, "keep", false, "keep the databases")
	flag.Parse()
	if *newBin == "" || o.adminURL == "" || o.redisURL == "" || *brokers == "" {
		log.Fatal("dupbench: -new, -db, -redis and -brokers are required (eval \"$(scripts/services env)\")")
	}
	o.bins = map[string]string{"new": *newBin}
	if *oldBin != "" {
		o.bins["old"] = *oldBin
		o.variants = append(o.variants, "old")
	}
	o.variants = append(o.variants, "new")
	o.brokers = strings.Split(*brokers, ",")
	o.scenarios = strings.Split(*scen, ",")
	var err error
	if o.workDir, err = os.MkdirTemp("", "dupbench"); err != nil {
		log.Fatal(err)
	}
	logf("work dir %s (replica logs)", o.workDir)
	ctx := context.Background()
	dropStale(ctx, o.adminURL)
	fmt.Printf("load average at start: %s\n", loadavg())
	for _, s := range o.scenarios {
		switch s {
		case "single":
			runSingle(ctx, o)
		case "replay":
			runReplay(ctx, o)
		default:
			log.Fatalf("dupbench: unknown scenario %q", s)
		}
	}
	fmt.Printf("load average at end: %s\n", loadavg())
}

// dropStale drops the databases an earlier run left behind (killed
// before its cleanup).
func dropStale(ctx context.Context, adminURL string) {
	admin, err := pgxpool.New(ctx, adminURL)
	must(err)
	defer admin.Close()
	rows, err := admin.Query(ctx, `select datname from pg_database where datname like 'dupbench\_%'`)
	must(err)
	var stale []string
	for rows.Next() {
		var db string
		must(rows.Scan(&db))
		stale = append(stale, db)
	}
	must(rows.Err())
	for _, db := range stale {
		logf("dropping %s, left by an earlier run", db)
		_, err := admin.Exec(ctx, "drop database if exists "+db+" with (force)")
		must(err)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s dupbench: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// latestClosed is the latest closed month in UTC.
func latestClosed() billrun.Period { return billrun.PeriodOf(time.Now().UTC()).Previous() }

func back(p billrun.Period, n int) billrun.Period {
	for range n {
		p = p.Previous()
	}
	return p
}

// world is one variant's installation: a database, lock keys, topics.
type world struct {
	o       opts
	variant string
	bin     string
	db      string
	dsn     string
	pool    *pgxpool.Pool
	env     []string
}

func newWorld(ctx context.Context, o opts, scenario, variant string) *world {
	w := &world{o: o, variant: variant, bin: o.bins[variant], db: fmt.Sprintf("dupbench_%s_%s_%d", scenario, variant, time.Now().Unix())}
	admin, err := pgxpool.New(ctx, o.adminURL)
	must(err)
	defer admin.Close()
	_, err = admin.Exec(ctx, "create database "+w.db)
	must(err)
	_, err = admin.Exec(ctx, "comment on database "+w.db+" is 'coordinator:disposable (bench/dupbench)'")
	must(err)
	w.dsn = withDB(o.adminURL, w.db)
	w.pool, err = pgxpool.New(ctx, w.dsn)
	must(err)
	w.env = append(os.Environ(),
		"COORDINATOR_DATABASE_URL="+w.dsn,
		"COORDINATOR_LOCK_REDIS_URL="+o.redisURL,
		"COORDINATOR_LOCK_KEY_PREFIX="+w.db,
		"COORDINATOR_BILLRUN_MAX_AGE_MONTHS=600",
		"COORDINATOR_LOG_FORMAT=json",
		"PGOPTIONS=-c client_min_messages=warning",
	)
	w.cli("migrate", "up")
	return w
}

func (w *world) close(ctx context.Context) {
	w.pool.Close()
	if w.o.keep {
		return
	}
	admin, err := pgxpool.New(ctx, w.o.adminURL)
	must(err)
	defer admin.Close()
	_, err = admin.Exec(ctx, "drop database if exists "+w.db+" with (force)")
	must(err)
}

func withDB(url, db string) string {
	i := strings.LastIndex(url, "/")
	rest := ""
	if q := strings.Index(url[i:], "?"); q >= 0 {
		rest = url[i+q:]
	}
	return url[:i+1] + db + rest
}

func (w *world) cli(args ...string) {
	cmd := exec.Command(w.bin, args...)
	cmd.Env = append(w.env, "COORDINATOR_LOG_LEVEL=warn")
	out, err := cmd.CombinedOutput()
	if err != nil {
		log.Fatalf("dupbench: %s %v: %v\n%s", w.bin, args, err, out)
	}
}

func (w *world) exec(ctx context.Context, sql string, args ...any) {
	_, err := w.pool.Exec(ctx, sql, args...)
	must(err)
}

// bill completes each period with the variant's own binary (the CLI).
func (w *world) bill(ps []billrun.Period) {
	for _, p := range ps {
		w.cli("run", "billrun", "--period", p.String())
	}
}

// deployment is one round's replicas of a world.
type deployment struct {
	w      *world
	prefix string
	group  string
	names  topics.Names
	bills  string
	procs  []*exec.Cmd
	exited chan string // a replica that ended, with its log
	kc     *kgo.Client
	adm    *kadm.Client
}

func (w *world) deploy(ctx context.Context, round, replicas int) *deployment {
	reg, err := kinds.Registry(config.Config{}) // the topics only
	must(err)
	d := &deployment{w: w, prefix: fmt.Sprintf("%s_r%d.", w.db, round), group: fmt.Sprintf("%s_r%d", w.db, round),
		exited: make(chan string, replicas)}
	d.names = topics.New(d.prefix, reg.Topics()...)
	d.bills = d.names.Topic(billrun.Topic)
	d.kc, err = kgo.NewClient(kgo.SeedBrokers(w.o.brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(200000))
	must(err)
	d.adm = kadm.NewClient(d.kc)
	for i := range replicas {
		id := fmt.Sprintf("%s-%d", w.variant, i+1)
		logPath := filepath.Join(w.o.workDir, fmt.Sprintf("%s_r%d_%s.log", w.db, round, id))
		f, err := os.Create(logPath)
		must(err)
		cmd := exec.Command(w.bin, "serve")
		cmd.Env = append(w.env,
			"COORDINATOR_REPLICA_ID="+id,
			"COORDINATOR_KAFKA_BROKERS="+strings.Join(w.o.brokers, ","),
			"COORDINATOR_KAFKA_TOPIC_PREFIX="+d.prefix,
			"COORDINATOR_KAFKA_GROUP="+d.group,
			"COORDINATOR_KAFKA_CREATE_TOPICS=true",
			"COORDINATOR_HTTP_ADDR=127.0.0.1:0",
			"COORDINATOR_ADMIN_TOKEN=dupbench-token-0123456789abcdef-0123456789",
			"COORDINATOR_REAPER_SCHEDULE=",
			"COORDINATOR_CRON_CATCHUP_WINDOW=0",
			"COORDINATOR_SHUTDOWN_TIMEOUT=20s",
		)
		cmd.Stdout, cmd.Stderr = f, f
		must(cmd.Start())
		d.procs = append(d.procs, cmd)
		go func() {
			_ = cmd.Wait()
			d.exited <- logPath
		}()
	}
	d.waitGroup(ctx, replicas)
	return d
}

// waitGroup waits until the group has n members and every trigger
// partition is assigned.
func (d *deployment) waitGroup(ctx context.Context, n int) {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case path := <-d.exited:
			b, _ := os.ReadFile(path)
			log.Fatalf("dupbench: a replica exited while starting: %s", b)
		default:
		}
		groups, err := d.adm.DescribeGroups(ctx, d.group)
		if err == nil {
			if g, ok := groups[d.group]; ok && g.State == "Stable" && len(g.Members) == n {
				assigned := 0
				for _, m := range g.Members {
					if a, ok := m.Assigned.AsConsumer(); ok {
						for _, t := range a.Topics {
							if t.Topic == d.bills {
								assigned += len(t.Partitions)
							}
						}
					}
				}
				if assigned > 0 {
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	log.Fatalf("dupbench: group %s never had %d members with the trigger topic assigned (logs in %s)", d.group, n, d.w.o.workDir)
}

func (d *deployment) stop() {
	for _, p := range d.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for range d.procs {
		<-d.exited
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = d.adm.DeleteGroup(ctx, d.group)
	_, _ = d.adm.DeleteGroup(ctx, d.group+"-console")
	_, _ = d.adm.DeleteTopics(ctx, d.names.All()...)
	d.kc.Close()
}

func trigger(topic string, p billrun.Period, id string) *kgo.Record {
	v, _ := json.Marshal(map[string]any{"period": p.String(), "request_id": id, "requested_by": "dupbench"})
	return &kgo.Record{Topic: topic, Key: []byte(p.String()), Value: v}
}

// produce sends recs (in order) and returns when Kafka acknowledged all.
func (d *deployment) produce(ctx context.Context, recs []*kgo.Record) {
	must(d.kc.ProduceSync(ctx, recs...).FirstErr())
}

// waitDrained waits until the group committed every offset of the trigger
// topic up to its end, and returns when it saw that.
func (d *deployment) waitDrained(ctx context.Context, bound time.Duration) time.Time {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		ends, err := d.adm.ListEndOffsets(ctx, d.bills)
		if err == nil {
			committed, err := d.adm.FetchOffsets(ctx, d.group)
			if err == nil {
				done := true
				ends.Each(func(o kadm.ListedOffset) {
					if o.Offset == 0 {
						return // the topic is the round's own: nothing was produced there
					}
					c, ok := committed.Lookup(o.Topic, o.Partition)
					if !ok || c.At < o.Offset {
						done = false
					}
				})
				if done {
					return time.Now()
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	log.Fatalf("dupbench: %s not drained within %s", d.group, bound)
	return time.Time{}
}

// event is what dupbench reads of an ownership event.
type event struct {
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	Data struct {
		Key        string `json:"key"`
		RequestID  string `json:"request_id"`
		Owner      string `json:"owner"`
		BeforeLock bool   `json:"before_lock"`
	} `json:"data"`
}

// events reads the events topic until want(events) or the bound.
func (d *deployment) events(ctx context.Context, bound time.Duration, want func([]event) bool) []event {
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.w.o.brokers...), kgo.ConsumeTopics(d.names.Events),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	must(err)
	defer cl.Close()
	var out []event
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			var e event
			if json.Unmarshal(r.Value, &e) == nil {
				out = append(out, e)
			}
		})
		if want(out) {
			return out
		}
	}
	return out
}

func count(evs []event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// seedSubscribers loads n subscribers: the first `always` active since
// before any period, the rest activated at from; usage of period p for every
// other one when p is set.
func (w *world) seedSubscribers(ctx context.Context, n, always int, from time.Time, usage *billrun.Period) {
	w.exec(ctx, `insert into subscribers (id, status, monthly_fee_cents, activated_at)
		select g, 'ACTIVE', 1000 + g % 500, case when g <= $2 then null else $3::timestamptz end from generate_series(1, $1) g`,
		n, always, from)
	if usage != nil {
		w.exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) select g, $2, g % 300 from generate_series(1, $1, 2) g`,
			n, usage.String())
	}
	w.exec(ctx, `analyze subscribers`)
	w.exec(ctx, `analyze usage_charges`)
}

func runSingle(ctx context.Context, o opts) {
	p := latestClosed()
	fmt.Printf("\n## single: duplicates of one COMPLETED period (%d subscribers), one replica\n\n", o.singleSubs)
	fmt.Println("| variant | round | triggers | drain | triggers/s | already_completed events | answered before the lock |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	worlds := map[string]*world{}
	for _, v := range o.variants {
		w := newWorld(ctx, o, "single", v)
		defer w.close(ctx)
		logf("%s: seeding %d subscribers, billing %s", v, o.singleSubs, p)
		w.seedSubscribers(ctx, o.singleSubs, o.singleSubs, time.Time{}, &p)
		w.bill([]billrun.Period{p})
		worlds[v] = w
	}
	for round := 1; round <= o.rounds; round++ {
		for _, v := range o.variants {
			w := worlds[v]
			n := o.dups
			if v == "old" {
				n = o.oldDups
			}
			d := w.deploy(ctx, round, 1)
			recs := make([]*kgo.Record, n)
			for i := range recs {
				recs[i] = trigger(d.bills, p, fmt.Sprintf("dup-%d", i))
			}
			logf("%s round %d: producing %d duplicates of %s", v, round, n, p)
			t0 := time.Now()
			d.produce(ctx, recs)
			t1 := d.waitDrained(ctx, 30*time.Minute)
			drain := t1.Sub(t0)
			evs := d.events(ctx, 2*time.Minute, func(evs []event) bool { return count(evs, "run.already_completed") >= n })
			before := 0
			for _, e := range evs {
				if e.Type == "run.already_completed" && e.Data.BeforeLock {
					before++
				}
			}
			d.stop()
			fmt.Printf("| %s | %d | %d | %.2f s | %.0f | %d | %d |\n", v, round, n, drain.Seconds(), float64(n)/drain.Seconds(),
				count(evs, "run.already_completed"), before)
		}
	}
}

func runReplay(ctx context.Context, o opts) {
	latest := latestClosed()
	completed := make([]billrun.Period, o.periods)
	for i := range completed {
		completed[i] = back(latest, i)
	}
	first := completed[len(completed)-1]
	probes := make([]billrun.Period, o.probes)
	for i := range probes {
		probes[i] = back(first, i+1)
	}
	from := first.Start(time.UTC)
	fmt.Printf("\n## replay: %d triggers over %d COMPLETED periods (%d subscribers each), %d replicas; %d new periods (10 subscribers each) behind the backlog, one every %s\n\n",
		o.replay, o.periods, o.replaySubs, o.replicas, o.probes, o.probeEvery)
	fmt.Println("| variant | round | duplicates | drain | triggers/s | probe acquired p50 | p99 | max | already_completed | probes completed |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	worlds := map[string]*world{}
	for _, v := range o.variants {
		w := newWorld(ctx, o, "replay", v)
		defer w.close(ctx)
		logf("%s: seeding %d subscribers, billing %d periods", v, o.replaySubs, o.periods)
		w.seedSubscribers(ctx, o.replaySubs, 10, from, nil)
		w.bill(completed)
		worlds[v] = w
	}
	rng := rand.New(rand.NewPCG(28, 3))
	for round := 1; round <= o.rounds; round++ {
		for _, v := range o.variants {
			w := worlds[v]
			n := o.replay
			if v == "old" {
				n = o.oldReplay
			}
			// Each round bills its probes anew: they must be new periods.
			w.exec(ctx, `delete from invoices where period < $1`, first.String())
			w.exec(ctx, `delete from bill_runs where period < $1`, first.String())
			w.exec(ctx, `delete from run_requests`)
			d := w.deploy(ctx, round, o.replicas)
			recs := make([]*kgo.Record, n)
			for i := range recs {
				recs[i] = trigger(d.bills, completed[rng.IntN(len(completed))], fmt.Sprintf("replay-%d", i))
			}
			logf("%s round %d: producing %d duplicates over %d periods, then %d probes", v, round, n, o.periods, o.probes)
			t0 := time.Now()
			d.produce(ctx, recs)
			// The probes arrive one at a time while the backlog drains, each
			// behind what is left of it on its partition.
			sent := make(map[string]time.Time, len(probes))
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i, p := range probes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := trigger(d.bills, p, fmt.Sprintf("probe-%d", i))
					at := time.Now()
					must(d.kc.ProduceSync(ctx, r).FirstErr())
					mu.Lock()
					sent[p.String()] = at
					mu.Unlock()
				}()
				time.Sleep(o.probeEvery)
			}
			wg.Wait()
			lastProbe := time.Now()
			t1 := d.waitDrained(ctx, 30*time.Minute)
			if lastProbe.After(t1) {
				logf("%s round %d: the last probe came %s after the backlog drained", v, round, lastProbe.Sub(t1))
			}
			drain := t1.Sub(t0)
			evs := d.events(ctx, 2*time.Minute, func(evs []event) bool {
				return count(evs, "run.already_completed") >= n && count(evs, "run.completed") >= len(probes)
			})
			var lat []time.Duration
			for _, e := range evs {
				if e.Type != "ownership.acquired" {
					continue
				}
				if at, ok := sent[strings.TrimPrefix(e.Data.Key, "billrun:")]; ok {
					lat = append(lat, e.Time.Sub(at))
				}
			}
			slices.Sort(lat)
			d.stop()
			fmt.Printf("| %s | %d | %d | %.2f s | %.0f | %s | %s | %s | %d | %d |\n", v, round, n, drain.Seconds(),
				float64(n+len(probes))/drain.Seconds(), pct(lat, 0.50), pct(lat, 0.99), pct(lat, 1), count(evs, "run.already_completed"),
				count(evs, "run.completed"))
		}
	}
}

func pct(d []time.Duration, q float64) string {
	if len(d) == 0 {
		return "-"
	}
	i := min(int(q*float64(len(d)-1)+0.5), len(d)-1)
	return d[i].Round(time.Millisecond).String()
}

func must(err error) {
	if err != nil {
		log.Fatalf("dupbench: %v", err)
	}
}
