package config

import (
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every variable the configuration asks the environment for, defaults and
// fallbacks included, is in Variables (so `coordinator lock` keeps it from
// its command): a setting that reads a new variable cannot be missed.
func TestVariablesAreWhatTheConfigurationReads(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	getenv := func(name string) string { read[name] = true; return "" }
	b := Bind(flag.NewFlagSet("t", flag.ContinueOnError), getenv)
	_, err := b.Config()
	require.NoError(t, err)
	require.NotEmpty(t, read)
	vars := Variables()
	for name := range read {
		require.Contains(t, vars, name, "read by the configuration, missing from Variables")
		require.True(t, IsVariable(name), name)
	}
	// The fallbacks are found by asking the defaults, not listed by hand.
	require.Contains(t, vars, "DATABASE_URL")
	require.Contains(t, vars, "REDIS_URL")
	require.Contains(t, vars, "COORDINATOR_DATABASE_URL_FILE")
	require.True(t, slices.IsSorted(vars))
	for _, name := range vars {
		if !strings.HasPrefix(name, "COORDINATOR_") {
			require.Contains(t, []string{"DATABASE_URL", "REDIS_URL"}, name, "a new fallback: name it in docs/lock-command.md and docs/configuration.md")
		}
	}
}

func TestIsVariable(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"COORDINATOR_LOG_LEVEL":      true,
		"COORDINATOR_ADMIN_TOKEN":    true,
		"DATABASE_URL":               true,
		"REDIS_URL":                  true,
		"PGPASSWORD":                 true,
		"PGPASSFILE":                 true,
		"OTEL_EXPORTER_OTLP_HEADERS": true,
		"PATH":                       false,
		"HOME":                       false,
		"REDIS_PASSWORD":             false,
		"DATABASE_URL_FILE":          false,
		"MY_DATABASE_URL":            false,
	} {
		require.Equal(t, want, IsVariable(name), name)
	}
}
