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

// The demo's full run is tested in internal/demo; here, the exit codes for
// what stops it before it starts anything.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "redis-server")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"missing redis-server", []string{"--redis-server", missing}, job.ExitUnavailable, "apt-get install redis-server"},
		{"missing postgres", []string{"--pg-bin-dir", filepath.Dir(missing)}, job.ExitUnavailable, "apt-get install postgresql"},
		{"bad size", []string{"--replicas", "0"}, job.ExitUsage, "usage: coordinator-demo"},
		{"stray argument", []string{"now"}, job.ExitUsage, "usage: coordinator-demo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), &stdout, &stderr, func(string) string { return "" }, tc.args)
			require.Equal(t, tc.code, code, stderr.String())
			require.Contains(t, stderr.String(), tc.stderr)
			if tc.code == job.ExitUnavailable {
				require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one clear line")
			}
			require.Empty(t, stdout.String())
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), &stdout, &stderr, func(string) string { return "" }, []string{"-h"}))
	require.Contains(t, stdout.String(), "-subscribers N")
	require.Contains(t, stdout.String(), "(default 100000)")
}
