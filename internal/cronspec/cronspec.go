// Package cronspec is the one reading of a schedule's cron spec: the
// configuration checks COORDINATOR_*_SCHEDULE with it, cron (internal/trigger)
// fires by it, and a kind's schedule names its time zone in it.
package cronspec

import (
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Parser accepts an optional seconds field, descriptors (@every 30s,
// @hourly) and CRON_TZ=/TZ= prefixes.
var Parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse reads spec with Parser.
func Parse(spec string) (cron.Schedule, error) { return Parser.Parse(spec) }

// Location is the zone a spec's CRON_TZ= or TZ= prefix names, else
// time.Local (robfig/cron's own default).
func Location(spec string) *time.Location {
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if rest, ok := strings.CutPrefix(spec, p); ok {
			name, _, _ := strings.Cut(rest, " ")
			if loc, err := time.LoadLocation(name); err == nil {
				return loc
			}
		}
	}
	return time.Local
}

// Every is the interval of an "@every D" spec; ok false for any other.
func Every(spec string) (d time.Duration, ok bool) {
	rest, found := strings.CutPrefix(spec, "@every ")
	if !found {
		return 0, false
	}
	d, err := time.ParseDuration(rest)
	return d, err == nil
}
