//go:build testhooks

package main

import (
	"testing"

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
