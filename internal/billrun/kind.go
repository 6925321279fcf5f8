package billrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// kind is the bill-run kind: its configuration, the calendar Decode admits
// periods by, and the functions Define gets.
type kind struct {
	cfg Config // withDefaults
}

// New returns the bill-run kind of owned run: `coordinator run billrun`,
// billing.billrun.requested, POST /v1/billruns (202 once claimed) and GET
// /v1/billruns/{period}. Its Params are a Request. Zero fields of cfg take
// the defaults named on Config; internal/kinds maps the process's
// configuration onto it.
func New(cfg Config) owned.Kind {
	k := &kind{cfg: cfg.withDefaults()}
	return owned.Define(owned.Def[Request]{
		Spec: owned.Spec{
			Name: JobName, Summary: "bill a closed period's subscribers (prorated) in fenced batches",
			Usage: "--period YYYY-MM [--force] [--adjust]", Topic: Topic, HTTPPath: "/v1/billruns", HTTPAsync: true,
		},
		Decode:        k.decode,
		RejectReasons: []string{ReasonMissingPeriod, ReasonBadPeriod, ReasonKeyMismatch, ReasonPeriodNotClosed, ReasonPeriodTooOld},
		Encode:        encode,
		Flags:         flags,
		LockKey:       func(r Request) string { return LockKey(r.Period) },
		RecordLockKey: recordLockKey,
		StatusID:      func(r Request) string { return r.Period.String() },
		Open:          k.open,
	})
}

// maxPeriodLen bounds what a rejection echoes of a period.
const maxPeriodLen = 32

// Request is the Params of a bill run: its period and whether it is forced
// (bill a period older than the age limit) or an adjustment run (invoice
// the late usage of a COMPLETED period).
type Request struct {
	Period Period
	// Force admits a period older than COORDINATOR_BILLRUN_MAX_AGE_MONTHS.
	// It never admits a period that is not closed.
	Force bool
	// Adjust runs the period's adjustment run instead of its bill run.
	Adjust bool
}

// decode reads {"period":"YYYY-MM","force":false,"adjust":false}, from
// every source, the CLI's flags included. The value is authoritative; an
// empty Kafka key is accepted, but a key naming another period is rejected
// (key_mismatch) rather than guessed at: the producer is confused, and
// records keyed by one period but meaning another would break per-period
// ordering on the partition. A period that is not closed in the billing
// zone is rejected (period_not_closed), forced or not; one older than the
// age limit needs "force": true (period_too_old).
func (k *kind) decode(in owned.Input) (Request, error) {
	var w struct {
		Period *string `json:"period"`
		Force  *bool   `json:"force"`
		Adjust *bool   `json:"adjust"`
	}
	if err := in.Decode(&w); err != nil {
		return Request{}, err
	}
	if w.Period == nil || *w.Period == "" {
		return Request{}, owned.Reject(ReasonMissingPeriod, "period is required (YYYY-MM, e.g. 2026-11)")
	}
	if len(*w.Period) > maxPeriodLen {
		return Request{}, owned.Reject(ReasonBadPeriod, "period is %d bytes: want YYYY-MM, e.g. 2026-11", len(*w.Period))
	}
	p, err := ParsePeriod(*w.Period)
	if err != nil {
		return Request{}, owned.Reject(ReasonBadPeriod, "%s", owned.RejectionOf(err).Detail)
	}
	if len(in.Key) > 0 && string(in.Key) != p.String() {
		return Request{}, owned.Reject(ReasonKeyMismatch, "record key %q does not match period %q", clip(in.Key), p.String())
	}
	r := Request{Period: p, Force: w.Force != nil && *w.Force, Adjust: w.Adjust != nil && *w.Adjust}
	// The resumer decodes a request admitted when it arrived: months passing
	// since must not make it too old (closed is still checked).
	if err := k.cfg.Calendar.Admit(p, r.Force || in.Source == job.SourceResume); err != nil {
		return Request{}, err
	}
	return r, nil
}

// encode is the record keyed by the period.
func encode(r Request) ([]byte, map[string]any) {
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

// flags: --period, --force, --adjust, as the trigger's fields.
func flags(fs *flag.FlagSet) func([]string) (map[string]any, error) {
	period := fs.String("period", "", "billing period YYYY-MM, closed in the billing zone (required)")
	force := fs.Bool("force", false, "bill a period older than COORDINATOR_BILLRUN_MAX_AGE_MONTHS (never one that is not closed)")
	adjust := fs.Bool("adjust", false, "invoice the late usage of a COMPLETED period as adjustments")
	return func(args []string) (map[string]any, error) {
		if len(args) > 0 {
			return nil, job.BadInput("unexpected arguments %q", args)
		}
		fields := map[string]any{"force": *force, "adjust": *adjust}
		if *period != "" {
			fields["period"] = *period
		}
		return fields, nil
	}
}

// recordLockKey reads the period a record is keyed by.
func recordLockKey(key []byte) (string, bool) {
	p, err := ParsePeriod(string(key))
	if err != nil {
		return "", false
	}
	return LockKey(p), true
}

// open builds the Worker. The pool needs Workers+2 connections.
func (k *kind) open(d owned.Deps) (owned.Worker[Request], error) {
	cfg := k.cfg
	if err := cfg.validate(); err != nil {
		return owned.Worker[Request]{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Log
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(d.Registerer)
	}
	w := &Worker{pool: d.DB, cfg: cfg}
	return owned.Worker[Request]{
		Run: w.Run, Claim: w.Claim, AlreadyCompleted: w.AlreadyCompleted, Schedule: w.Schedule(), Tick: w.Tick, Status: w.Status, Observe: w.Observe,
		Incomplete: w.Incomplete,
		Completions: &owned.Completions[Request]{
			Records: w.RecordsCompletion, Published: w.CompletionPublished, Unpublished: w.UnpublishedCompletions,
		},
	}, nil
}

// Worker runs bill runs: one owner per period, fenced batch transactions,
// resume from committed batches. See the package doc.
type Worker struct {
	pool *pgxpool.Pool
	cfg  Config
}

// Schedule is Config.Schedule (empty: off). A spec that names no zone
// (CRON_TZ= or TZ=) fires in the billing zone.
func (w *Worker) Schedule() string {
	s := w.cfg.Schedule
	if s == "" || strings.HasPrefix(s, "CRON_TZ=") || strings.HasPrefix(s, "TZ=") {
		return s
	}
	return "CRON_TZ=" + w.cfg.Calendar.Zone.String() + " " + s
}

// Tick bills the latest closed month at the tick: the month before the
// tick's, in the billing zone.
func (w *Worker) Tick(at time.Time) (Request, error) {
	p := PeriodOf(at.In(w.cfg.Calendar.Zone)).Previous()
	if !p.Valid() {
		return Request{}, job.BadInput("the month before %s is outside %d-01..%d-12", at.Format("2006-01"), MinYear, MaxYear)
	}
	return Request{Period: p}, nil
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
