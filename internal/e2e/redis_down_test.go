package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// ownRedis is a throwaway redis-server of the test's own, on a fixed port so
// that it can be stopped and started again at the same address.
type ownRedis struct {
	t    *testing.T
	bin  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func startOwnRedis(t *testing.T) *ownRedis {
	r := &ownRedis{t: t, bin: testenv.Binary(t, testenv.EnvRedisServerBin, "/usr/bin/redis-server"), port: freePort(t)}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *ownRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *ownRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	require.NoError(r.t, r.cmd.Start())
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(r.cmd, r.done)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	defer c.Close()
	eventually(r.t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err() == nil
	}, func() string { return "own redis-server did not answer" })
}

// stop kills the server by PID and waits for it.
func (r *ownRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	r.cmd = nil
}

// Redis stopped: a trigger is not committed and ownership.unavailable is
// emitted (again, as the partition is retried); Redis back: the trigger is
// processed, nothing lost.
func TestRedisDownTriggerIsRetriedNotLost(t *testing.T) {
	t.Parallel()
	rds := startOwnRedis(t)
	d := newDeployment(t, rds.url())
	const period = "2026-08"
	key := "billrun:" + period
	d.seedSubscribers(500, period)
	d.startReplicas(3, nil, "--reaper-schedule=")

	rds.stop()
	partition, offset := d.produce(d.names.BillrunRequested, period, billRunTrigger(period, "while-down"))

	// At least two unavailable events: the record is tried again, not skipped.
	unavailable := d.events.waitFor(t, 45*time.Second, 2, "ownership.unavailable", ofType("ownership.unavailable", key))
	require.Equal(t, "while-down", unavailable[0].str("request_id"))
	require.Equal(t, unavailable[0].str("replica"), unavailable[1].str("replica"), "retried on the partition's owner")
	require.LessOrEqual(t, d.committed(d.names.BillrunRequested, partition), offset, "not committed while Redis is down")
	require.Empty(t, d.events.match(ofType("run.completed", key)))
	var rows int64
	require.NoError(t, d.pg.Pool.QueryRow(context.Background(), `select count(*) from invoices`).Scan(&rows))
	require.Zero(t, rows, "fail closed: nothing ran without the lock")

	rds.start()
	done := d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", key))
	require.Equal(t, "while-down", done[0].str("request_id"))
	d.requireInvoicesExact(period)
	eventually(t, 20*time.Second, func() bool { return d.committed(d.names.BillrunRequested, partition) == offset+1 },
		func() string { return fmt.Sprintf("committed %d", d.committed(d.names.BillrunRequested, partition)) })
}
