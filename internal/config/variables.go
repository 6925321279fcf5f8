package config

import (
	"slices"
	"strings"
	"sync"
)

// Variables are the environment variables the configuration reads, derived
// from the settings table: each setting's variable, its *_FILE form, and
// the variables its default falls back to (DATABASE_URL, REDIS_URL),
// sorted. A new setting adds its names here by itself.
func Variables() []string { return slices.Clone(variables()) }

var variables = sync.OnceValue(func() []string {
	seen := map[string]bool{}
	for _, s := range settings() {
		seen[s.env] = true
		if s.file != "" {
			seen[s.file] = true
		}
		if s.fallback != "" { // a default that falls back to another variable reads it
			seen[s.fallback] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
})

// VariablePrefixes are the families of variables the coordinator reads as
// configuration by prefix: its own namespace, and what its client
// libraries read from the process environment by themselves.
var VariablePrefixes = []string{
	"COORDINATOR_", // every setting, and any other version's
	"PG",           // pgx, as libpq: PGPASSWORD, PGPASSFILE, PGSSLKEY, PGSERVICEFILE, ...
	"OTEL_",        // the OpenTelemetry SDK: OTEL_EXPORTER_OTLP_HEADERS, ... (internal/telemetry)
}

// IsVariable reports whether the coordinator reads the environment variable
// name as configuration: one of Variables, or of a VariablePrefixes family.
// `coordinator lock` keeps these from its command.
func IsVariable(name string) bool {
	for _, p := range VariablePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	_, found := slices.BinarySearch(variables(), name)
	return found
}
