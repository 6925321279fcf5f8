package console_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/eventtail"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// BenchmarkPages is the server time of each page with 10,000 runs of one
// kind in the history (and 10,000 indexed events): the handler called
// directly, the session looked up in Postgres like any request.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 200x ./internal/console/
func BenchmarkPages(b *testing.B) {
	s := newSiteOn(b, nil)
	ctx := context.Background()
	_, err := s.pool.Exec(ctx, `
insert into run_history (job, run_key, outcome, replica, fence, lock_fence, trigger_source, requested_by, principal,
                         started_at, ended_at, counts, timeline)
select 'billrun', 'billrun:' || to_char(date '2000-01-01' + (g % 300) * interval '1 month', 'YYYY-MM'),
       case when g % 10 = 0 then 'failed' else 'completed' end, 'r' || (g % 3), 1796000000000000 + g, 1796000000000000 + g,
       'http', 'ops', 'ops', now() - (10001 - g) * interval '1 minute', now() - (10001 - g) * interval '1 minute' + interval '3 second',
       jsonb_build_object('invoices_created', g, 'batches_committed', 40, 'repaired', 0),
       (select jsonb_agg(jsonb_build_array(i * 100, i, i * 100)) from generate_series(1, 40) i)
from generate_series(1, 10000) g`)
	require.NoError(b, err)
	_, err = s.pool.Exec(ctx, `
insert into ownership_events (id, topic_partition, topic_offset, type, run_key, job, replica, event_time, reason, data)
select 'e' || g, g % 3, g, (array['ownership.acquired','run.completed','ownership.released','ownership.already_owned'])[1 + g % 4],
       'billrun:' || to_char(date '2000-01-01' + (g % 300) * interval '1 month', 'YYYY-MM'), 'billrun', 'r' || (g % 3),
       now() - (10001 - g) * interval '1 second', null,
       jsonb_build_object('fence', g, 'trigger', 'http', 'request_id', md5(g::text))
from generate_series(1, 10000) g`)
	require.NoError(b, err)
	var mid int64
	require.NoError(b, s.pool.QueryRow(ctx, `select id from run_history order by id limit 1 offset 5000`).Scan(&mid))
	cookie := s.sessionCookie(b)
	for _, p := range []struct{ name, path string }{
		{"overview", "/ui/"},
		{"locks", "/ui/locks"},
		{"runs_first_page", "/ui/runs/billrun"},
		{"runs_page_at_5000", fmt.Sprintf("/ui/runs/billrun?before=%d", mid)},
		{"runs_of_one_key", "/ui/runs/billrun?key=2010-05"},
		{"run_page", "/ui/runs/billrun/2010-05"},
		{"events_page", "/ui/events?key=billrun:2010"},
	} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, p.path, nil)
				req.AddCookie(cookie)
				w := httptest.NewRecorder()
				s.con.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", p.path, w.Code, w.Body.String())
				}
			}
		})
	}
}

// benchStreams is how many event streams BenchmarkStreams opens.
var benchStreams = flag.Int("console-streams", 50, "event streams BenchmarkStreams opens")

// BenchmarkStreams measures the event sink and owned runs with no event
// stream open and with 50 (each a real loopback SSE connection reading
// every event through the tail), side by side in one run:
//
//   - sink: events emitted and acknowledged by Kafka per second;
//
//   - runs: owned runs through the template (in-memory lock, a Worker that
//     commits 10 batches), each emitting its events through the sink.
//
//     go test -run '^$' -bench BenchmarkStreams -benchtime 3x ./internal/console/
func BenchmarkStreams(b *testing.B) {
	k := testenv.Kafka(b)
	topic := k.Topic("coordinator.ownership.events")
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	require.NoError(b, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	_, err = adm.CreateTopic(ctx, 3, 1, nil, topic)
	require.NoError(b, err)
	defer func() { _, _ = adm.DeleteTopics(context.Background(), topic) }()

	tail, err := eventtail.New(eventtail.Config{Brokers: k.Brokers, Topic: topic})
	require.NoError(b, err)
	require.NoError(b, tail.Start(ctx))
	defer tail.Stop()
	s := newSiteOn(b, tail)
	sink, err := eventsink.New(eventsink.Config{Brokers: k.Brokers, Topic: topic})
	require.NoError(b, err)
	require.NoError(b, sink.Start(ctx))
	defer sink.Stop()

	// Each variant opens its streams, measures, then waits until the
	// streams have read everything before they close, so no variant pays
	// for the one before.
	for _, v := range []struct {
		what    string
		streams int
	}{{"sink", 0}, {"sink", *benchStreams}, {"runs", 0}, {"runs", *benchStreams}} {
		b.Run(fmt.Sprintf("%s_streams=%d", v.what, v.streams), func(b *testing.B) {
			var received atomic.Int64
			stop := s.openStreams(b, v.streams, &received)
			defer stop()
			require.Eventually(b, func() bool { return tail.Subscribers() == v.streams }, 30*time.Second, 10*time.Millisecond)
			switch v.what {
			case "sink":
				const n = 5000
				for b.Loop() {
					var acked sync.WaitGroup
					acked.Add(n)
					start := time.Now()
					for i := range n {
						sink.EmitAcked(ctx, events.Event{Type: events.RunCompleted, Key: fmt.Sprintf("billrun:bench-%d", i%64), Job: "billrun",
							Replica: "bench", Extra: map[string]any{"invoices_created": i}}, acked.Done)
					}
					acked.Wait()
					b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
				}
			case "runs":
				runner := benchRunner(b, sink)
				start, runs := time.Now(), 0
				for b.Loop() {
					for i := range 50 {
						res := runner.Run(ctx, benchKind, benchParams(i), benchTrigger)
						require.Equal(b, "completed", string(res.Outcome))
						runs++
					}
				}
				b.ReportMetric(float64(runs)/time.Since(start).Seconds(), "runs/s")
			}
			b.StopTimer()
			last := int64(-1)
			require.Eventually(b, func() bool { // drained: nothing more arrives
				n := received.Load()
				done := n == last
				last = n
				return done
			}, 60*time.Second, 500*time.Millisecond)
			if v.streams > 0 {
				b.ReportMetric(float64(received.Load())/float64(v.streams), "events/stream")
			}
		})
	}
}

// openStreams opens n event streams that read every message, counting the
// events; stop closes them.
func (s *site) openStreams(b *testing.B, n int, received *atomic.Int64) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var cookie *http.Cookie
	for i := range n {
		if i%console.MaxStreamsPerSession == 0 { // a session holds so many at most
			cookie = s.sessionCookie(b)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.srv.URL+"/ui/stream", nil)
		require.NoError(b, err)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(b, err)
		require.Equal(b, http.StatusOK, resp.StatusCode)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			// Read like a browser would, counting events by their
			// "event: ownership" lines.
			buf := make([]byte, 64<<10)
			for {
				n, err := resp.Body.Read(buf)
				received.Add(int64(bytes.Count(buf[:n], []byte("event: ownership\n"))))
				if err != nil {
					return
				}
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

var benchTrigger = job.Trigger{Source: "bench", RequestedBy: "bench"}

// benchKind is a kind whose Worker commits 10 batches at once; its
// params are the run's name.
var benchKind = owned.Define(owned.Def[string]{
	Spec:    owned.Spec{Name: "bench"},
	Decode:  func(owned.Input) (string, error) { return "", nil },
	LockKey: func(p string) string { return "bench:" + p },
	Open: func(owned.Deps) (owned.Worker[string], error) {
		return owned.Worker[string]{Run: func(_ context.Context, run *owned.Run, _ string) (owned.Report, error) {
			run.SetTotal(10)
			for range 10 {
				run.Committed(1, 100)
			}
			return owned.Report{Counts: map[string]int64{"rows": 1000}}, nil
		}}, nil
	},
})

// benchParams are the Params of run i of benchKind.
func benchParams(i int) owned.Params {
	p, err := owned.NewParams(benchKind, fmt.Sprint(i))
	if err != nil {
		panic(err)
	}
	return p
}

func benchRunner(b *testing.B, emit events.Emitter) *owned.Runner {
	reg, err := owned.NewRegistry(benchKind)
	require.NoError(b, err)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "bench"})
	b.Cleanup(func() { _ = l.Close() })
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}, Emit: emit})
	require.NoError(b, err)
	return r
}

// sessionCookie is a session of the read token, stored like a login's.
func (s *site) sessionCookie(b *testing.B) *http.Cookie {
	c := s.client(b)
	resp, _ := s.login(b, c, s.read)
	require.Equal(b, http.StatusSeeOther, resp.StatusCode)
	for _, ck := range resp.Cookies() {
		if ck.Name == console.CookieName {
			return ck
		}
	}
	b.Fatal("no session cookie")
	return nil
}
