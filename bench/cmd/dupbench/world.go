package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The world a scenario runs in: its databases and topics, the replicas it
// deploys, the triggers it produces and the events it reads back.

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
