package trigger_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// throwawayRedis is a redis-server of the test's own, which it may stop and
// start again on the same port.
type throwawayRedis struct {
	t    *testing.T
	bin  string
	port int
	cmd  *exec.Cmd
}

func startThrowawayRedis(t *testing.T) *throwawayRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	r := &throwawayRedis{t: t, bin: testenv.Binary(t, testenv.EnvRedisServerBin, "/usr/bin/redis-server"), port: port}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *throwawayRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(r.t, r.cmd.Start())
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", r.addr())
		if err == nil {
			_ = c.Close()
			return
		}
		require.True(r.t, time.Now().Before(deadline), "redis-server did not start: %v", err)
		pause(20 * time.Millisecond)
	}
}

// stop kills the server (by its PID) and waits for it to exit.
func (r *throwawayRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

func (r *throwawayRedis) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func TestRedisDownTriggerIsRetriedNotCommittedThenProcessed(t *testing.T) {
	t.Parallel()
	kb := setupKafka(t)
	rs := startThrowawayRedis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	_, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 20})
	require.NoError(t, err)

	rc, err := redislock.NewClient("redis://"+rs.addr()+"/0", "single")
	require.NoError(t, err)
	defer rc.Close()
	locker, err := redislock.New(rc, redislock.Config{Owner: "r1", WaitTime: 200 * time.Millisecond, WatchdogTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer locker.Close()
	runner := billrun.New(pg.Pool, locker, kb.rec, billrun.Config{ReplicaID: "r1", BatchSize: 5})
	d := trigger.NewDispatcher(trigger.DispatcherConfig{BillRuns: runner, Replica: "r1"})
	defer d.Shutdown(ctx)
	kb.consumer(t, d, nil)

	rs.stop() // the lock backend goes away
	rec := kb.produce(t, kb.names.BillrunRequested, "2026-05", `{"period":"2026-05","request_id":"outage-1"}`)

	deadline := time.Now().Add(60 * time.Second)
	for len(kb.rec.OfType(events.OwnershipUnavailable)) < 2 {
		require.True(t, time.Now().Before(deadline), "no repeated ownership.unavailable")
		pause(20 * time.Millisecond)
	}
	u := kb.rec.OfType(events.OwnershipUnavailable)[0]
	require.Equal(t, "billrun:2026-05", u.Key)
	require.Equal(t, "outage-1", u.RequestID)
	require.Equal(t, int64(-1), kb.committed(t, rec), "not committed while Redis is down")
	require.Empty(t, kb.rec.OfType(events.OwnershipAcquired))

	rs.start() // Redis is back: the retried trigger goes through
	for len(kb.rec.OfType(events.RunCompleted)) < 1 {
		require.True(t, time.Now().Before(deadline), "the trigger was never processed after Redis came back")
		pause(20 * time.Millisecond)
	}
	kb.waitCommitted(t, rec, rec.Offset+1)
	st, err := runner.Status(ctx, billrun.Period{Year: 2026, Month: 5})
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	var invoices int
	require.NoError(t, pg.Pool.QueryRow(ctx, "select count(*) from invoices where period = '2026-05'").Scan(&invoices))
	require.Equal(t, 20, invoices, "every ACTIVE subscriber invoiced once")
}
