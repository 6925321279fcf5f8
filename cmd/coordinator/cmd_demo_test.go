package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
)

// The demo's full run is tested in internal/demo; here, the command's exit
// codes for what stops it before it starts anything.
func TestDemoExitCodes(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "redis-server")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"missing redis-server", []string{"demo", "--redis-server", missing}, job.ExitUnavailable, "apt-get install redis-server"},
		{"missing postgres", []string{"demo", "--pg-bin-dir", filepath.Dir(missing)}, job.ExitUnavailable, "apt-get install postgresql"},
		{"bad size", []string{"demo", "--replicas", "0"}, job.ExitUsage, "usage: coordinator demo"},
		{"stray argument", []string{"demo", "now"}, job.ExitUsage, "usage: coordinator demo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := dispatch(context.Background(), cliIO{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}, tc.args)
			require.Equal(t, tc.code, code, stderr.String())
			require.Contains(t, stderr.String(), tc.stderr)
			if tc.code == job.ExitUnavailable {
				require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one clear line")
			}
			require.Empty(t, stdout.String())
		})
	}
}
