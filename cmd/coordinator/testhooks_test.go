//go:build testhooks

package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
)

// In a testhooks build a bad hook value stops start-up naming it (exit 64).
func TestBadTestHookValue(t *testing.T) {
	t.Parallel()
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://u@127.0.0.1:1/x", envTestBatchDelay: "slow"}
	code, _, errs := runCLI(t, env, "serve")
	require.Equal(t, job.ExitUsage, code, errs)
	require.Contains(t, errs, envTestBatchDelay)
	require.Contains(t, errs, "slow")
}

// A bad Redis address map stops start-up naming it; a good one routes a
// dial of a listed address to the address it maps to.
func TestRedisAddrMapHook(t *testing.T) {
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://u@127.0.0.1:1/x", envTestRedisAddrMap: "127.0.0.1:6379"}
	code, _, errs := runCLI(t, env, "serve")
	require.Equal(t, job.ExitUsage, code, errs)
	require.Contains(t, errs, envTestRedisAddrMap)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	t.Setenv(envTestRedisAddrMap, "127.0.0.1:1="+ln.Addr().String())
	dial, err := redisTestDialer(time.Second)
	require.NoError(t, err)
	require.NotNil(t, dial)
	c, err := dial(context.Background(), "tcp", "127.0.0.1:1")
	require.NoError(t, err, "127.0.0.1:1 is dialled at the mapped listener")
	require.NoError(t, c.Close())
}
