package localsvc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/localsvc"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A throwaway redis-server: ready when it says so, answering on its port,
// gone by its PID when stopped.
func TestRedis(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, testenv.EnvRedisServerBin, "/usr/bin/redis-server")
	port, err := localsvc.FreePort()
	require.NoError(t, err)
	p, err := localsvc.Start(exec.Command(bin, localsvc.RedisArgs(port, t.TempDir())...), localsvc.RedisReady, time.Minute, nil)
	require.NoError(t, err)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer c.Close()
	require.NoError(t, c.Ping(context.Background()).Err(), "answers once ready")
	require.NoError(t, p.Stop(syscall.SIGTERM, 30*time.Second))
	require.ErrorIs(t, syscall.Kill(p.PID(), 0), syscall.ESRCH, "gone")
}

// A throwaway PostgreSQL cluster: initialised, started, and accepting
// connections at PostgresDSN once ready.
func TestPostgres(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, testenv.EnvPGBinDir, "/usr/lib/postgresql/15/bin")
	dir, err := os.MkdirTemp("", "localsvc-pg-") // not t.TempDir: the server may run as another user
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data, err := localsvc.InitPostgres(context.Background(), bin, dir)
	require.NoError(t, err)
	port, err := localsvc.FreePort()
	require.NoError(t, err)
	cmd, err := localsvc.PostgresCommand(bin, data, port, "synchronous_commit=off")
	require.NoError(t, err)
	p, err := localsvc.Start(cmd, localsvc.PostgresReady, time.Minute, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(syscall.SIGQUIT, 30*time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, localsvc.PostgresDSN(port))
	require.NoError(t, err)
	defer c.Close(ctx)
	var fsync string
	require.NoError(t, c.QueryRow(ctx, "show fsync").Scan(&fsync))
	require.Equal(t, "off", fsync, "nothing here is meant to survive")
	require.NoError(t, p.Stop(syscall.SIGINT, 30*time.Second))
}

// A child that exits before it is ready is an error with its last words; one
// that never says it is ready is killed after the bound.
func TestStartReportsWhatWentWrong(t *testing.T) {
	t.Parallel()
	_, err := localsvc.Start(exec.Command("sh", "-c", "echo no config here; exit 3"), "ready", time.Minute, nil)
	require.ErrorContains(t, err, "exited at start")
	require.ErrorContains(t, err, "no config here")

	_, err = localsvc.Start(exec.Command("sh", "-c", "echo starting; exec sleep 60"), "ready", 200*time.Millisecond, nil)
	require.ErrorContains(t, err, "not ready within 200ms")
	require.ErrorContains(t, err, "starting")
}

// Ports are drawn below the ephemeral range, where an outgoing connection
// cannot take them first.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	var lo, hi int
	_, err = fmt.Sscan(string(b), &lo, &hi)
	require.NoError(t, err)
	for range 20 {
		port, err := localsvc.FreePort()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, 20000)
		require.Less(t, port, lo)
	}
}
