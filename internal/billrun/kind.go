package billrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Topic is the contract's Kafka trigger topic: key = period, value
// {"period":"2026-11","request_id":"...","requested_by":"..."}.
const Topic = "billing.billrun.requested"

// Reasons a bill-run trigger is rejected (besides owned's shared ones).
const (
	ReasonMissingPeriod = "missing_period"
	ReasonBadPeriod     = "bad_period"
	ReasonKeyMismatch   = "key_mismatch"
)

// Kind is the bill-run kind of owned run. Params are a Period, or a
// Request (force, adjust).
type Kind struct {
	cfg Config
	cal atomic.Pointer[Calendar] // set by Configure
}

// New returns the bill-run kind. Zero fields of cfg are taken from the
// deployment's configuration at Open (batch size, workers), then from the
// defaults named on Config.
func New(cfg Config) *Kind { return &Kind{cfg: cfg} }

var (
	_ owned.Kind        = (*Kind)(nil)
	_ owned.StatusKind  = (*Kind)(nil)
	_ owned.RecordKeyed = (*Kind)(nil)
	_ owned.Configurer  = (*Kind)(nil)
)

// Spec: `coordinator run billrun`, billing.billrun.requested, POST
// /v1/billruns (202 once claimed) and GET /v1/billruns/{period}.
func (*Kind) Spec() owned.Spec {
	return owned.Spec{
		Name: JobName, Summary: "bill a closed period's subscribers (prorated) in fenced batches",
		Usage: "--period YYYY-MM [--force] [--adjust]", Topic: Topic, HTTPPath: "/v1/billruns", HTTPAsync: true,
	}
}

// maxPeriodLen bounds what a rejection echoes of a period.
const maxPeriodLen = 32

// Request is the Params of a run that asks for more than a period: force
// (bill a period older than the age limit) or adjust (invoice the late
// usage of a COMPLETED period). A plain run's Params are a Period.
type Request struct {
	Period Period
	// Force admits a period older than COORDINATOR_BILLRUN_MAX_AGE_MONTHS.
	// It never admits a period that is not closed.
	Force bool
	// Adjust runs the period's adjustment run instead of its bill run.
	Adjust bool
}

// requestOf reads Params: a Period or a Request.
func requestOf(p owned.Params) Request {
	switch v := p.(type) {
	case Period:
		return Request{Period: v}
	case Request:
		return v
	case *Request:
		return *v
	}
	panic(fmt.Sprintf("billrun: params of type %T", p))
}

// params is r as Params: a plain Period when it asks for nothing more.
func (r Request) params() owned.Params {
	if !r.Force && !r.Adjust {
		return r.Period
	}
	return r
}

// Configure takes the billing zone and age limit from the deployment's
// configuration (owned.Configurer), where New's Config left them unset.
func (k *Kind) Configure(cfg config.Config) {
	c := calendarOf(k.cfg.Calendar, cfg)
	k.cal.Store(&c)
}

// calendarOf fills cal's unset fields from the deployment's configuration.
func calendarOf(cal Calendar, cfg config.Config) Calendar {
	if cal.Zone == nil {
		cal.Zone = cfg.BillingZone
	}
	if cal.MaxAgeMonths == 0 {
		cal.MaxAgeMonths = cfg.BillrunMaxAgeMonths
	}
	return cal.withDefaults()
}

// calendar is the configured calendar, else New's with defaults.
func (k *Kind) calendar() Calendar {
	if c := k.cal.Load(); c != nil {
		return *c
	}
	return k.cfg.Calendar.withDefaults()
}

// Decode reads {"period":"YYYY-MM","force":false,"adjust":false}. The
// value is authoritative; an empty Kafka key is accepted, but a key naming
// another period is rejected (key_mismatch) rather than guessed at: the
// producer is confused, and records keyed by one period but meaning another
// would break per-period ordering on the partition. A period that is not
// closed in the billing zone is rejected (period_not_closed), forced or
// not; one older than the age limit needs "force": true (period_too_old).
func (k *Kind) Decode(in owned.Input) (owned.Params, error) {
	var w struct {
		Period *string `json:"period"`
		Force  *bool   `json:"force"`
		Adjust *bool   `json:"adjust"`
	}
	if err := in.Decode(&w); err != nil {
		return nil, err
	}
	if w.Period == nil || *w.Period == "" {
		return nil, owned.Reject(ReasonMissingPeriod, `"period" is required (want {"period":"YYYY-MM"})`)
	}
	if len(*w.Period) > maxPeriodLen {
		return nil, owned.Reject(ReasonBadPeriod, "period is %d bytes: want YYYY-MM, e.g. 2026-11", len(*w.Period))
	}
	p, err := ParsePeriod(*w.Period)
	if err != nil {
		return nil, owned.Reject(ReasonBadPeriod, "%s", owned.RejectionOf(err).Detail)
	}
	if len(in.Key) > 0 && string(in.Key) != p.String() {
		return nil, owned.Reject(ReasonKeyMismatch, "record key %q does not match period %q", clip(in.Key), p.String())
	}
	r := Request{Period: p, Force: w.Force != nil && *w.Force, Adjust: w.Adjust != nil && *w.Adjust}
	// The resumer decodes a request admitted when it arrived: months passing
	// since must not make it too old (closed is still checked).
	if err := k.calendar().Admit(p, r.Force || in.Source == job.SourceResume); err != nil {
		return nil, err
	}
	return r.params(), nil
}

// Encode is the record keyed by the period.
func (*Kind) Encode(p owned.Params) ([]byte, map[string]any) {
	r := requestOf(p)
	s := r.Period.String()
	fields := map[string]any{"period": s}
	if r.Force {
		fields["force"] = true
	}
	if r.Adjust {
		fields["adjust"] = true
	}
	return []byte(s), fields
}

// Flags: --period, required; --force; --adjust.
func (k *Kind) Flags(fs *flag.FlagSet) func([]string) (owned.Params, error) {
	period := fs.String("period", "", "billing period YYYY-MM, closed in the billing zone (required)")
	force := fs.Bool("force", false, "bill a period older than COORDINATOR_BILLRUN_MAX_AGE_MONTHS (never one that is not closed)")
	adjust := fs.Bool("adjust", false, "invoice the late usage of a COMPLETED period as adjustments")
	return func(args []string) (owned.Params, error) {
		if len(args) > 0 {
			return nil, job.BadInput("unexpected arguments %q", args)
		}
		if *period == "" {
			return nil, job.BadInput("--period is required (YYYY-MM, e.g. 2026-11)")
		}
		p, err := ParsePeriod(*period)
		if err != nil {
			return nil, err
		}
		r := Request{Period: p, Force: *force, Adjust: *adjust}
		if err := k.calendar().Admit(p, r.Force); err != nil {
			return nil, err
		}
		return r.params(), nil
	}
}

// LockKey is billrun:P, for the bill run and the adjustment run alike (they
// never run at once).
func (*Kind) LockKey(p owned.Params) string { return LockKey(requestOf(p).Period) }

// StatusID is the period: GET /v1/billruns/2026-11.
func (*Kind) StatusID(p owned.Params) string { return requestOf(p).Period.String() }

// LockKeyOfRecord reads the period a record is keyed by.
func (*Kind) LockKeyOfRecord(key []byte) (string, bool) {
	p, err := ParsePeriod(string(key))
	if err != nil {
		return "", false
	}
	return LockKey(p), true
}

// Open builds the Worker. The pool needs Workers+2 connections.
func (k *Kind) Open(d owned.Deps) (owned.Worker, error) {
	cfg := k.cfg
	if cfg.BatchSize == 0 {
		cfg.BatchSize = d.Config.BillrunBatchSize
	}
	if cfg.Workers == 0 {
		cfg.Workers = d.Config.BillrunWorkers
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Log
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(d.Registerer)
	}
	cfg.Calendar = calendarOf(cfg.Calendar, d.Config)
	cfg = cfg.withDefaults()
	return &Worker{pool: d.DB, cfg: cfg, schedule: d.Config.BillrunSchedule}, nil
}

// Worker runs bill runs: one owner per period, fenced batch transactions,
// resume from committed batches. See the package doc.
type Worker struct {
	pool     *pgxpool.Pool
	cfg      Config
	schedule string
}

var (
	_ owned.Claimer      = (*Worker)(nil)
	_ owned.Scheduler    = (*Worker)(nil)
	_ owned.StatusReader = (*Worker)(nil)
	_ owned.Observer     = (*Worker)(nil)
	_ owned.Resumable    = (*Worker)(nil)

	_ owned.CompletedChecker = (*Worker)(nil)
)

// Schedule is COORDINATOR_BILLRUN_SCHEDULE (empty: off). A spec that names
// no zone (CRON_TZ= or TZ=) fires in the billing zone.
func (w *Worker) Schedule() string {
	if w.schedule == "" || strings.HasPrefix(w.schedule, "CRON_TZ=") || strings.HasPrefix(w.schedule, "TZ=") {
		return w.schedule
	}
	return "CRON_TZ=" + w.cfg.Calendar.Zone.String() + " " + w.schedule
}

// Tick bills the latest closed month at the tick: the month before the
// tick's, in the billing zone.
func (w *Worker) Tick(at time.Time) (owned.Params, error) {
	p := PeriodOf(at.In(w.cfg.Calendar.Zone)).Previous()
	if !p.Valid() {
		return nil, job.BadInput("the month before %s is outside %d-01..%d-12", at.Format("2006-01"), MinYear, MaxYear)
	}
	return p, nil
}

// Status answers GET /v1/billruns/{period}.
func (w *Worker) Status(ctx context.Context, id string) (any, error) {
	p, err := ParsePeriod(id)
	if err != nil {
		return nil, err
	}
	st, err := ReadStatus(ctx, w.pool, p)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", owned.ErrNotFound, err)
	}
	return st, err
}

// Observe feeds coordinator_billrun_runs_total.
func (w *Worker) Observe(res job.Result) { w.cfg.Metrics.outcome(res.Outcome) }

// clip shortens b for an error message.
func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
