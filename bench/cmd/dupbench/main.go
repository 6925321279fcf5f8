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
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
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
