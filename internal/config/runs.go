package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/cronspec"
)

// Reaper is the MSISDN reaper's sweep; internal/kinds maps it onto
// msisdnreaper.Config.
type Reaper struct {
	// Schedule is a robfig/cron spec (seconds field optional). Default
	// "@every 30s"; empty disables.
	Schedule string
	// Lease is the reaper's explicit lease. Default 20s.
	Lease time.Duration
	// BatchSize is rows freed per transaction. Default 1000.
	BatchSize int
	// MinHold keeps the sweep lock at least this long (ShedLock's
	// lockAtLeastFor). Nil: the reaper's default
	// (msisdnreaper.DefaultMinHold: half the schedule interval for @every
	// specs, else 0).
	MinHold *time.Duration
}

// Billrun is the bill-run kind; internal/kinds maps it onto billrun.Config.
type Billrun struct {
	// Schedule bills the previous month when it fires. Default empty (off).
	Schedule string
	// BatchSize is subscribers per batch transaction. Default 2500.
	BatchSize int
	// Workers is the batch worker pool size. Default 4.
	Workers int
	// Zone is the IANA zone billing months start and end in (at midnight
	// there); the schedule fires there unless its spec names a CRON_TZ.
	// COORDINATOR_BILLING_TZ, default UTC. Nil (a Config built by hand) is
	// UTC.
	Zone *time.Location
	// MaxAgeMonths is how many months back a period may be billed without
	// --force ("force": true). Default 24.
	MaxAgeMonths int
}

// Cron is how every replica's schedules tick.
type Cron struct {
	// CatchUpWindow: on start, each schedule's most recent tick that fell
	// within this window before the start is run once (a tick missed while
	// the replica was down); the lock and the kind's claim answer if
	// another replica already ran it. Default 6h; 0 disables.
	CatchUpWindow time.Duration
	// Jitter delays each cron tick (and catch-up) by a random duration in
	// [0, Jitter), so replicas do not all hit Redis at once. Default 0
	// (off), at most 10m.
	Jitter time.Duration
}

// Resume is the resumer of accepted runs that did not complete.
type Resume struct {
	// Interval is how often every replica's resumer looks for accepted runs
	// that did not complete and resumes the due ones. Default 15s, 100ms..1h.
	Interval time.Duration
	// MaxAttempts bounds the resumer's attempts of one run that run and do
	// not complete; then it is permanent and pages. Default 10.
	MaxAttempts int
	// RepublishAfter is how long a COMPLETED bill run's run.completed may
	// stay unacknowledged by Kafka before the resumers publish it again
	// (same event id). COORDINATOR_EVENTS_REPUBLISH_AFTER, default 2m,
	// 1s..24h.
	RepublishAfter time.Duration
}

func runSettings() []setting {
	return []setting{
		schedule("COORDINATOR_REAPER_SCHEDULE", "reaper-schedule", "robfig/cron spec of the MSISDN reaper; empty disables", "@every 30s",
			func(c *Config) *string { return &c.Reaper.Schedule }).offWhenEmpty().in(sectionContract, "robfig/cron spec (seconds field optional, `CRON_TZ=` honoured); empty (`COORDINATOR_REAPER_SCHEDULE=` set and empty, or `--reaper-schedule=`) disables"),
		dur("COORDINATOR_REAPER_LEASE", "reaper-lease", "explicit lease of one sweep", "20s", 100*time.Millisecond, 0,
			func(c *Config) *time.Duration { return &c.Reaper.Lease }).in(sectionFurther, "explicit lease of one sweep (hard-expires, no renewal; min 100ms)"),
		integer("COORDINATOR_REAPER_BATCH_SIZE", "reaper-batch-size", "int", "reservations freed per transaction", "1000", 1, 100000,
			func(c *Config) *int { return &c.Reaper.BatchSize }).in(sectionFurther, "reservations freed per transaction (1..100000)"),
		{env: "COORDINATOR_REAPER_MIN_HOLD", flag: "reaper-min-hold", typ: "duration",
			usage: "minimum time a sweep keeps its lock (default half the @every interval)", section: sectionFurther,
			doc: "least time a sweep keeps its lock (ShedLock's lockAtLeastFor), so clock-skewed replicas do not sweep twice per tick", docDefault: "half the `@every` interval, else 0",
			apply: func(c *Config, v string) error {
				if v == "" {
					return nil
				}
				d, err := duration(v, 0, 0)
				c.Reaper.MinHold = &d
				return err
			}},
		dur("COORDINATOR_CRON_CATCHUP_WINDOW", "cron-catchup-window", "on start, run each schedule's latest tick missed within this window (0 disables)",
			"6h", 0, 31*24*time.Hour, func(c *Config) *time.Duration { return &c.Cron.CatchUpWindow }).
			in(sectionFurther, "at start, each schedule's most recent tick that fell within this window before the start is run once (a tick missed while the replica was down), through the usual lock and claim, so a tick another replica ran answers `already_completed` or `already_owned`; `@every` schedules have no fixed ticks and are not caught up; `0` disables (at most 744h)"),
		dur("COORDINATOR_CRON_JITTER", "cron-jitter", "random delay in [0, jitter) before each cron tick (0 disables)", "0s", 0, 10*time.Minute,
			func(c *Config) *time.Duration { return &c.Cron.Jitter }).in(sectionFurther, "each cron tick, and a catch-up, waits a random time in [0, jitter) first, so replicas with aligned clocks do not all reach Redis at once (at most 10m)").documented("`0s` (off)"),
		schedule("COORDINATOR_BILLRUN_SCHEDULE", "billrun-schedule", "cron spec that bills the previous month; empty disables", "",
			func(c *Config) *string { return &c.Billrun.Schedule }).offWhenEmpty().documented("empty").in(sectionContract, "e.g. `0 2 1 * *` bills the previous month (in the billing zone) when it fires; a spec without `CRON_TZ=` fires in `COORDINATOR_BILLING_TZ`; empty disables"),
		integer("COORDINATOR_BILLRUN_BATCH_SIZE", "billrun-batch-size", "int", "subscribers per batch (one statement)", "2500", 1, 100000,
			func(c *Config) *int { return &c.Billrun.BatchSize }).in(sectionFurther, "subscribers per batch (one statement) (1..100000)"),
		integer("COORDINATOR_BILLRUN_WORKERS", "billrun-workers", "int", "concurrent batch transactions", "4", 1, 256,
			func(c *Config) *int { return &c.Billrun.Workers }).in(sectionFurther, "concurrent batch transactions of one run (1..256)"),
		{env: "COORDINATOR_BILLING_TZ", flag: "billing-tz", typ: "zone", usage: "IANA time zone billing months start and end in (at midnight)",
			def: "UTC", section: sectionContract, doc: "IANA time zone billing months start and end in, at midnight: which periods are closed, the bill-run schedule's default zone, and the days of proration ([billing periods](#billing-periods)); `Local` and unknown names: exit 64",
			apply: func(c *Config, v string) (err error) { c.Billrun.Zone, err = zone(v); return err }},
		integer("COORDINATOR_BILLRUN_MAX_AGE_MONTHS", "billrun-max-age-months", "int", "months back a period may be billed without --force", "24", 1, 12000,
			func(c *Config) *int { return &c.Billrun.MaxAgeMonths }).in(sectionContract, "a period more months before the current one is billed only with `--force` (`\"force\": true`), else refused `period_too_old` (1..12000)"),
		dur("COORDINATOR_RESUME_INTERVAL", "resume-interval", "how often the resumer looks for accepted runs that did not complete", "15s",
			100*time.Millisecond, time.Hour, func(c *Config) *time.Duration { return &c.Resume.Interval }).
			in(sectionFurther, "how often every replica's resumer looks for accepted runs that did not complete (`run_requests`, and each resumable kind's own store: bill runs RUNNING with a free lock, INTERRUPTED, FAILED) and resumes the due ones; sooner when a due run's lock was held and its TTL ends first (a dead owner's run is resumed about the lock's TTL after it died); later attempts of one run back off from it, doubling, up to 1h (100ms..1h)"),
		integer("COORDINATOR_RESUME_MAX_ATTEMPTS", "resume-max-attempts", "int", "resume attempts of one run before it is permanent and pages", "10", 1, 1000,
			func(c *Config) *int { return &c.Resume.MaxAttempts }).in(sectionFurther, "resume attempts of one run that run and do not complete (lost, a transient failure) before it is permanent and pages (CoordinatorRunFailedPermanently); attempts that find the lock owned or unavailable, or that a shutdown cuts short, do not count (1..1000)"),
		dur("COORDINATOR_EVENTS_REPUBLISH_AFTER", "events-republish-after",
			"how long a completed bill run's run.completed may stay unacknowledged by Kafka before the resumers publish it again (same id)",
			"2m", time.Second, 24*time.Hour, func(c *Config) *time.Duration { return &c.Resume.RepublishAfter }).
			in(sectionFurther, "how long a COMPLETED bill run's `run.completed` may stay unacknowledged by Kafka (`bill_runs.completed_event_at` NULL) before every replica's resumer publishes it again, with the same event id ([events.md](events.md#delivery)); far above a live sink's delivery time, so it nearly always means the owner died with the event in its buffer or the buffer dropped it (1s..24h)"),
	}
}

// zone loads an IANA time zone name ("Europe/Berlin", "UTC"). "Local"
// and the empty name are refused: billing must not depend on the host.
func zone(v string) (*time.Location, error) {
	if v == "" || v == "Local" {
		return nil, errors.New("want an IANA time zone name, e.g. UTC or Europe/Berlin")
	}
	loc, err := time.LoadLocation(v)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone (want an IANA name, e.g. Europe/Berlin): %w", err)
	}
	return loc, nil
}

func checkSchedule(v string) error {
	if v == "" {
		return nil
	}
	if _, err := cronspec.Parse(v); err != nil {
		return fmt.Errorf("not a cron spec: %v", err)
	}
	return nil
}
