package msisdnreaper

import (
	"cmp"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

const (
	// JobName is the sweep kind's name in results and events.
	JobName = "msisdn-reaper"
	// SweepKey is the lock every replica's sweep contends for.
	SweepKey = "msisdn-reaper:sweep"
	// SweepTopic is the contract's Kafka trigger topic: value
	// {"request_id":"...","requested_by":"..."}.
	SweepTopic = "subscription.msisdn-reaper.requested"
)

// Defaults of Config.
const (
	DefaultLease     = 20 * time.Second
	DefaultBatchSize = 1000
	// DefaultWorkers is the number of concurrent batch transactions; 2 was
	// the best on a 2-core machine (bench/notes/reaper.md).
	DefaultWorkers = 2
)

// Config configures the sweep kind. Zero fields take the defaults named
// here; internal/kinds maps the process's configuration (the
// COORDINATOR_REAPER_* variables) onto it.
type Config struct {
	// Schedule is the robfig/cron spec every replica sweeps on
	// (COORDINATOR_REAPER_SCHEDULE). Empty: not scheduled.
	Schedule string
	// Lease is the explicit lease of one sweep: the lock hard-expires after
	// it (or a little after MinHold, if longer) and no batch starts after
	// Lease - SafetyMargin. Default 20s.
	Lease time.Duration
	// BatchSize is the most reservations freed per transaction. Default 1000,
	// at most 100000.
	BatchSize int
	// Workers is the number of batch transactions in flight at once.
	// Default 2, at most 64.
	Workers int
	// MinHold keeps the lock at least this long after it was taken, even
	// when the sweep finished sooner (ShedLock's lockAtLeastFor), so that
	// replicas whose ticks are skewed by less than MinHold do not sweep in
	// turn. The run then returns at once and the template deletes the lock
	// by timer at acquired + MinHold (or it expires, if the process ends
	// first). Zero: DefaultMinHold(Schedule), half the interval of an
	// @every schedule, else none. Negative: none (release at once).
	MinHold time.Duration
	// SafetyMargin is kept free at the end of the lease: no batch starts
	// after acquired + Lease - SafetyMargin. It must cover one batch and the
	// clock drift between this process and Redis. Default Lease/10.
	SafetyMargin time.Duration
	// Logger receives one line per owned sweep. Default: Deps.Log.
	Logger *slog.Logger
	// Metrics may be nil. Default: new ones on Deps.Registerer.
	Metrics *Metrics

	// scan forces the batch statement (benchmark comparisons only): "" lets
	// each sweep choose its walk (see chooseWalk); "expiry" and "msisdn"
	// force one; "unordered" and "ordered" (by reserved_until, no cursor)
	// are measured alternatives.
	scan string
}

// Limits of Config's fields (and of their COORDINATOR_REAPER_* variables).
const (
	MaxBatchSize = 100_000
	MaxWorkers   = 64
)

// DefaultMinHold is Config.MinHold's default for schedule: half the
// interval of an @every schedule (replicas' ticks of one interval then
// fall within one hold), else none.
func DefaultMinHold(schedule string) time.Duration {
	if d, ok := cronspec.Every(schedule); ok {
		return d / 2
	}
	return 0
}

func (c Config) withDefaults() Config {
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.SafetyMargin = cmp.Or(c.SafetyMargin, c.Lease/10)
	switch {
	case c.MinHold == 0:
		c.MinHold = DefaultMinHold(c.Schedule)
	case c.MinHold < 0:
		c.MinHold = 0
	}
	return c
}

// Validate reports the first field out of range, naming it and its value.
// Zero values are valid (they take the defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Lease < 0:
		return fmt.Errorf("msisdnreaper: Config.Lease = %s: must be positive", c.Lease)
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return fmt.Errorf("msisdnreaper: Config.BatchSize = %d: must be 1..%d", c.BatchSize, MaxBatchSize)
	case c.Workers < 1 || c.Workers > MaxWorkers:
		return fmt.Errorf("msisdnreaper: Config.Workers = %d: must be 1..%d", c.Workers, MaxWorkers)
	case c.SafetyMargin < 0 || c.SafetyMargin >= c.Lease:
		return fmt.Errorf("msisdnreaper: Config.SafetyMargin = %s: must be in [0, Lease=%s)", c.SafetyMargin, c.Lease)
	}
	if c.Schedule != "" {
		if _, err := cronspec.Parse(c.Schedule); err != nil {
			return fmt.Errorf("msisdnreaper: Config.Schedule = %q: %w", c.Schedule, err)
		}
	}
	return nil
}

// sweepParams are a sweep's: nothing but the CLI's --workers override.
type sweepParams struct {
	Workers int `json:"workers,omitempty"`
}

// NewSweepKind returns the reaper's kind of owned run: `coordinator run
// reaper`, subscription.msisdn-reaper.requested, POST
// /v1/msisdn-reaper/sweeps (synchronous), and Config.Schedule on every
// replica. Zero fields of cfg take the defaults named on Config.
func NewSweepKind(cfg Config) owned.Kind {
	return owned.Define(owned.Def[sweepParams]{
		Spec: owned.Spec{Name: JobName, Command: "reaper", Summary: "free expired MSISDN reservations in batches",
			Usage: "[--workers N]", Topic: SweepTopic, HTTPPath: "/v1/msisdn-reaper/sweeps"},
		Decode: decodeSweep,
		Encode: func(sweepParams) ([]byte, map[string]any) { return nil, map[string]any{} },
		Flags: func(fs *flag.FlagSet) func([]string) (map[string]any, error) {
			workers := base10.Int(fs, "workers", DefaultWorkers, fmt.Sprintf("concurrent batch transactions (1..%d)", MaxWorkers))
			return func(args []string) (map[string]any, error) {
				if len(args) > 0 {
					return nil, job.BadInput("unexpected arguments %q", args)
				}
				return map[string]any{"workers": *workers}, nil
			}
		},
		LockKey: func(sweepParams) string { return SweepKey },
		// Every sweep record asks for the one sweep.
		RecordLockKey: func([]byte) (string, bool) { return SweepKey, true },
		Open:          func(d owned.Deps) (owned.Worker[sweepParams], error) { return openSweeper(cfg, d) },
	})
}

// decodeSweep accepts an object with no fields of its own (request_id and
// requested_by are the transport's; an HTTP body may be empty). The CLI's
// --workers is the one field, and only the CLI's: a trigger from Kafka or
// HTTP has none.
func decodeSweep(in owned.Input) (sweepParams, error) {
	var p sweepParams
	if in.Source != job.SourceCLI {
		var none struct{}
		return p, in.Decode(&none)
	}
	if err := in.Decode(&p); err != nil {
		return p, err
	}
	if p.Workers < 1 || p.Workers > MaxWorkers {
		return p, owned.Reject("bad_workers", "--workers = %d: must be 1..%d", p.Workers, MaxWorkers)
	}
	return p, nil
}

// openSweeper checks the configuration (an error names the field and value).
func openSweeper(cfg Config, d owned.Deps) (owned.Worker[sweepParams], error) {
	if cfg.Logger == nil {
		cfg.Logger = d.Log
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(d.Registerer)
	}
	if err := cfg.Validate(); err != nil {
		return owned.Worker[sweepParams]{}, err
	}
	s := &Sweeper{db: d.DB, cfg: cfg.withDefaults()}
	switch cfg.scan {
	case "expiry":
		s.sql = sqlSweepBatch
	case "msisdn":
		s.sql = sqlSweepBatchMsisdn
	case "unordered":
		s.sql = sqlSweepBatchUnordered
	case "ordered":
		s.sql = sqlSweepBatchOrdered
	}
	return owned.Worker[sweepParams]{
		Run: s.Run,
		// Explicit (Config.Lease) with the minimum hold (Config.MinHold).
		Lease:    func(sweepParams) owned.Lease { return owned.Lease{TTL: s.cfg.Lease, MinHold: s.cfg.MinHold} },
		Schedule: s.cfg.Schedule,
		// A tick has no parameters.
		Tick: func(time.Time) (sweepParams, error) { return sweepParams{}, nil },
		// coordinator_reaper_sweeps_total.
		Observe: func(res job.Result) { s.cfg.Metrics.sweep(string(res.Outcome)) },
	}, nil
}
