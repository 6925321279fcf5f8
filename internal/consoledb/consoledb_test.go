package consoledb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/consoledb"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func record(i int, key string) owned.RunRecord {
	now := time.Now()
	return owned.RunRecord{Job: "billrun", Key: key, Outcome: job.OutcomeCompleted, Replica: "r1", Fence: int64(1_796_000_000_000_000 + i),
		LockFence: int64(1_796_000_000_000_000 + i), Trigger: job.Trigger{Source: job.SourceHTTP, RequestedBy: "ops", Principal: "ops"},
		Started: now.Add(-time.Second), Ended: now, Counts: map[string]int64{"invoices_created": int64(i), "repaired": 1},
		Timeline: []owned.ProgressPoint{{At: 100 * time.Millisecond, Batches: 1, Rows: 10}, {At: 900 * time.Millisecond, Batches: 4, Rows: 40}}}
}

func TestRunHistoryPagesByKeyset(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	w := consoledb.NewHistoryWriter(pg.Pool, 0, nil, nil)
	for i := range 120 {
		w.RunEnded(record(i, fmt.Sprintf("billrun:2026-%02d", 1+i%2)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.Stop(ctx)
	require.Zero(t, w.Dropped())

	s := consoledb.NewStore(pg.Pool)
	var all []console.Run
	before := int64(0)
	for page := 0; ; page++ {
		runs, err := s.Runs(ctx, "billrun", console.RunQuery{Before: before, Limit: 50})
		require.NoError(t, err)
		all = append(all, runs...)
		if len(runs) < 50 {
			require.Len(t, runs, 20, "the third page")
			break
		}
		before = runs[len(runs)-1].ID
	}
	require.Len(t, all, 120)
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i].ID, all[i-1].ID, "newest first, no run twice")
	}
	r := all[0]
	require.Equal(t, "completed", r.Outcome)
	require.Equal(t, int64(1_796_000_000_000_119), r.Fence, "fences beyond int4")
	require.Equal(t, "http", r.Trigger)
	require.Equal(t, "ops", r.Principal)
	require.Equal(t, int64(1), r.Counts["repaired"])
	require.Equal(t, []console.Point{{At: 100 * time.Millisecond, Batches: 1, Rows: 10}, {At: 900 * time.Millisecond, Batches: 4, Rows: 40}}, r.Timeline)
	one, err := s.Runs(ctx, "billrun", console.RunQuery{Key: "billrun:2026-02", Limit: 200})
	require.NoError(t, err)
	require.Len(t, one, 60)
	none, err := s.Runs(ctx, "msisdn-reaper", console.RunQuery{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, none)
}

// RunEnded is on a run's path: with Postgres away it never waits, and
// what does not fit the buffer is dropped and counted.
func TestHistoryWriterDropsRatherThanWaits(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	w := consoledb.NewHistoryWriter(pool, 4, nil, consoledb.NewMetrics(nil))
	start := time.Now()
	for i := range 1000 {
		w.RunEnded(record(i, "billrun:2026-01"))
	}
	require.Less(t, time.Since(start), time.Second, "RunEnded must not wait for Postgres")
	require.GreaterOrEqual(t, w.Dropped(), int64(1000-4-1-256))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.Stop(ctx)
}

// produce writes CloudEvents to topic, keyed by subject.
func produce(t *testing.T, cl *kgo.Client, topic string, events ...map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, e := range events {
		b, err := json.Marshal(e)
		require.NoError(t, err)
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(e["subject"].(string)), Value: b}).FirstErr())
	}
}

func ce(id, typ, key, replica string, data map[string]any) map[string]any {
	d := map[string]any{"key": key, "job": strings.SplitN(key, ":", 2)[0], "replica": replica}
	for k, v := range data {
		d[k] = v
	}
	return map[string]any{"specversion": "1.0", "id": id, "type": typ, "subject": key, "source": "urn:test",
		"time": time.Now().UTC().Format(time.RFC3339Nano), "data": d}
}

// The index holds every replica's events of a key, once each, in the order
// Kafka gave them; dead letters are counted by reason.
func TestIndexerKeepsEveryReplicasEventsInOrder(t *testing.T) {
	t.Parallel()
	pg, k := testenv.Postgres(t), testenv.Kafka(t)
	topic := k.Topic("coordinator.ownership.events")
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = adm.CreateTopic(ctx, 3, 1, nil, topic)
	require.NoError(t, err)
	group := "g_" + k.Suffix + "-console"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroups(ctx, group)
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	key := "billrun:2026-05"
	produce(t, cl, topic,
		ce("e1", "ownership.acquired", key, "r1", map[string]any{"fence": 7}),
		ce("e2", "ownership.already_owned", key, "r2", map[string]any{"owner": "r1", "reason": "already_owned"}),
		ce("e3", "run.completed", key, "r1", map[string]any{"fence": 8}),
		ce("e3", "run.completed", key, "r3", map[string]any{"fence": 8}), // a re-publication: same id
		ce("e4", "ownership.released", key, "r1", nil),
		ce("d1", "trigger.rejected", "billrun", "r2", map[string]any{"reason": "bad_period"}),
		ce("d2", "trigger.rejected", "billrun", "r1", map[string]any{"reason": "bad_period"}),
		ce("d3", "trigger.rejected", "billrun", "r1", map[string]any{"reason": "key_mismatch"}),
	)
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("not json")}).FirstErr())

	x, err := consoledb.NewIndexer(consoledb.IndexerConfig{Brokers: k.Brokers, Topic: topic, Group: group, Pool: pg.Pool})
	require.NoError(t, err)
	require.NoError(t, x.Start(ctx))
	defer x.Stop()
	s := consoledb.NewStore(pg.Pool)
	var got []console.Event
	require.Eventually(t, func() bool {
		got, err = s.Events(ctx, key, 100)
		return err == nil && len(got) == 4
	}, 45*time.Second, 100*time.Millisecond)
	var ids, replicas []string
	for _, e := range got {
		ids, replicas = append(ids, e.ID), append(replicas, e.Replica)
	}
	require.Equal(t, []string{"e1", "e2", "e3", "e4"}, ids)
	require.Equal(t, []string{"r1", "r2", "r1", "r1"}, replicas)
	require.Equal(t, "already_owned", got[1].Reason)
	require.Equal(t, "r1", got[1].Data["owner"])

	var dl []console.DeadLetters
	require.Eventually(t, func() bool {
		dl, err = s.DeadLetters(ctx, time.Now().Add(-time.Hour))
		return err == nil && len(dl) == 2
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, []console.DeadLetters{{Reason: "bad_period", Count: 2}, {Reason: "key_mismatch", Count: 1}}, dl)
	recent, err := s.RecentEvents(ctx, "billrun:", 10)
	require.NoError(t, err)
	require.Len(t, recent, 4)
}

func TestHeartbeatShowsRunsAndStopsAndTheJanitorPrunes(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := console.InFlight{Job: "billrun", Key: "billrun:2026-03", Replica: "r9", Fence: 3, Batches: 4, Total: 10, Percent: 40, ETAMS: 1500}
	hb, err := consoledb.NewHeartbeat(consoledb.HeartbeatConfig{Pool: pg.Pool, Replica: "r9", Version: "v1", Interval: 50 * time.Millisecond,
		Ready: func() bool { return true },
		Dependencies: func() []console.Dependency {
			return []console.Dependency{{Name: "redis", Checked: true, OK: false, Error: "refused"}}
		},
		Runs: func() []console.InFlight { return []console.InFlight{run} }})
	require.NoError(t, err)
	hb.Start(ctx)
	s := consoledb.NewStore(pg.Pool)
	reps, err := s.Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	require.Equal(t, "r9", reps[0].ID)
	require.True(t, reps[0].Ready)
	require.False(t, reps[0].Stopped)
	require.Equal(t, []console.InFlight{run}, reps[0].Runs)
	require.Equal(t, "refused", reps[0].Dependencies[0].Error)
	hb.Stop(ctx)
	reps, err = s.Replicas(ctx)
	require.NoError(t, err)
	require.True(t, reps[0].Stopped)
	require.False(t, reps[0].Ready)
	require.Empty(t, reps[0].Runs)

	// Retention: what is older goes, what is newer stays.
	w := consoledb.NewHistoryWriter(pg.Pool, 0, nil, nil)
	old, fresh := record(1, "billrun:2020-01"), record(2, "billrun:2026-01")
	old.Started, old.Ended = time.Now().Add(-49*time.Hour), time.Now().Add(-48*time.Hour)
	w.RunEnded(old)
	w.RunEnded(fresh)
	w.Stop(ctx)
	require.NoError(t, s.CreateSession(ctx, console.Session{IDHash: []byte("gone"), Principal: "ops", Read: true, CSRF: "x", Expires: time.Now().Add(-time.Minute)}))
	_, err = pg.Pool.Exec(ctx, `update replica_heartbeats set seen_at = now() - interval '2 days'`)
	require.NoError(t, err)
	j, err := consoledb.NewJanitor(consoledb.JanitorConfig{Pool: pg.Pool, Retention: 24 * time.Hour})
	require.NoError(t, err)
	n, err := j.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "the old run, the expired session, the gone replica")
	_, err = pg.Pool.Exec(ctx, `insert into ownership_events (id, topic_partition, topic_offset, type, run_key, event_time, data)
		values ('old', 0, 1, 'run.completed', 'billrun:2020-01', now() - interval '25 hours', '{}'),
		       ('new', 0, 2, 'run.completed', 'billrun:2026-01', now(), '{}')`)
	require.NoError(t, err)
	n, err = j.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the event past retention")
	evs, err := s.RecentEvents(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, "new", evs[0].ID)
	runs, err := s.Runs(ctx, "billrun", console.RunQuery{Limit: 10})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, "billrun:2026-01", runs[0].Key)
}

func TestSessionsExpire(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	s := consoledb.NewStore(pg.Pool)
	ctx := context.Background()
	require.NoError(t, s.CreateSession(ctx, console.Session{IDHash: []byte("a"), Principal: "ops", Read: true, Mutate: true, CSRF: "c", Expires: time.Now().Add(time.Hour)}))
	require.NoError(t, s.CreateSession(ctx, console.Session{IDHash: []byte("b"), Principal: "ops", Read: true, CSRF: "c", Expires: time.Now().Add(-time.Second)}))
	se, ok, err := s.LookupSession(ctx, []byte("a"))
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, se.Read && se.Mutate)
	_, ok, err = s.LookupSession(ctx, []byte("b"))
	require.NoError(t, err)
	require.False(t, ok, "expired")
	require.NoError(t, s.DeleteSession(ctx, []byte("a")))
	_, ok, err = s.LookupSession(ctx, []byte("a"))
	require.NoError(t, err)
	require.False(t, ok, "deleted")
}

// A record Postgres refuses (a NUL in text or JSON, which it never stores)
// is dropped alone: the events and runs that came with it are kept.
func TestAPoisonRecordIsDroppedAlone(t *testing.T) {
	t.Parallel()
	pg, k := testenv.Postgres(t), testenv.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	w := consoledb.NewHistoryWriter(pg.Pool, 0, nil, consoledb.NewMetrics(nil))
	for i := range 101 {
		r := record(i, "billrun:2026-07")
		if i == 50 {
			r.Error = "a NUL \x00 Postgres refuses"
		}
		w.RunEnded(r)
	}
	w.Stop(ctx)
	s := consoledb.NewStore(pg.Pool)
	runs, err := s.Runs(ctx, "billrun", console.RunQuery{Key: "billrun:2026-07", Limit: 200})
	require.NoError(t, err)
	require.Len(t, runs, 100, "every run but the refused one")

	topic := k.Topic("coordinator.ownership.events")
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	group := "g_" + k.Suffix + "-console"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroups(ctx, group)
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	key := "billrun:2026-08"
	var recs []*kgo.Record
	for i := range 21 {
		e := ce(fmt.Sprintf("p%d", i), "ownership.acquired", key, "r1", map[string]any{"fence": i})
		if i == 10 {
			e["data"].(map[string]any)["owner"] = "nul \x00 owner" // JSON "\u0000": jsonb refuses it
		}
		b, err := json.Marshal(e)
		require.NoError(t, err)
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: b})
	}
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	x, err := consoledb.NewIndexer(consoledb.IndexerConfig{Brokers: k.Brokers, Topic: topic, Group: group, Pool: pg.Pool,
		Metrics: consoledb.NewMetrics(nil)})
	require.NoError(t, err)
	require.NoError(t, x.Start(ctx))
	defer x.Stop()
	// p20 is last in the partition: once it is in, the rest was decided.
	require.Eventually(t, func() bool {
		var n int
		return pg.Pool.QueryRow(ctx, `select count(*) from ownership_events where id = 'p20'`).Scan(&n) == nil && n == 1
	}, 30*time.Second, 100*time.Millisecond, "the events after the refused one are indexed")
	got, err := s.Events(ctx, key, 100)
	require.NoError(t, err)
	require.Len(t, got, 20, "every event but the refused one")
	for _, e := range got {
		require.NotEqual(t, "p10", e.ID)
	}
}
