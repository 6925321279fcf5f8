package billrun

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bill_runs.status values.
const (
	StatusRunning     = "RUNNING"
	StatusCompleted   = "COMPLETED"
	StatusFailed      = "FAILED"
	StatusInterrupted = "INTERRUPTED"
)

// ErrNotFound: no bill run exists for the period.
var ErrNotFound = errors.New("billrun: no bill run for the period")

// Status is a period's bill_runs row (GET /v1/billruns/{period}). Counts
// are the period's totals over its committed batches, so they are live while
// the run is RUNNING: batches_committed, subscribers, invoices_created,
// already_invoiced; and what the completion's reconcile found: repaired
// (subscribers it billed, also in subscribers and invoices_created; 0
// until COMPLETED) and, once COMPLETED, population (the population at the
// cutoff, every one of them invoiced).
type Status struct {
	Period     string           `json:"period"`
	Status     string           `json:"status"`
	Owner      string           `json:"owner,omitempty"`
	Fence      int64            `json:"fence"`
	LockFence  int64            `json:"lock_fence,omitempty"`
	Attempts   int64            `json:"attempts"`
	Counts     map[string]int64 `json:"counts"`
	StartedAt  *time.Time       `json:"started_at,omitempty"`
	FinishedAt *time.Time       `json:"finished_at,omitempty"`
	UpdatedAt  time.Time        `json:"updated_at"`
	LastError  string           `json:"last_error,omitempty"`
	// RequestedBy, Principal, RequestID and Trigger are the latest claim's
	// trigger: who asked, which admin token (HTTP), its request id and
	// source.
	RequestedBy string `json:"requested_by,omitempty"`
	Principal   string `json:"principal,omitempty"`
	RequestID   string `json:"request_id,omitempty"`
	Trigger     string `json:"trigger,omitempty"`
	// Progress is how far the period's bill run has come.
	Progress Progress `json:"progress"`
	// Cutoff is the population the run bills, fixed by its first claim.
	// Absent for a row claimed before it was recorded.
	Cutoff *Cutoff `json:"cutoff,omitempty"`
	// Adjustments are the period's adjustment runs (late usage), if any.
	Adjustments *Adjustments `json:"adjustments,omitempty"`
}

// Cutoff of GET /v1/billruns/{period}: the period's instants in the
// billing zone and the first claim's time (subscribers created after it are
// not billed by the run).
type Cutoff struct {
	Zone        string    `json:"zone"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	At          time.Time `json:"at"`
}

// Adjustments of GET /v1/billruns/{period}: the latest adjustment run's
// status and fence, and what every adjustment run invoiced: late usage
// (adjustments_created, amount_cents) and subscribers the bill run had not
// billed (invoices_created).
type Adjustments struct {
	Status          string     `json:"status"`
	Fence           int64      `json:"fence"`
	Created         int64      `json:"adjustments_created"`
	AmountCents     int64      `json:"amount_cents"`
	InvoicesCreated int64      `json:"invoices_created"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
}

// Progress of GET /v1/billruns/{period}: every figure comes from Postgres,
// so any replica answers alike.
type Progress struct {
	// BatchesCommitted counts the period's committed batches, every run's.
	BatchesCommitted int64 `json:"batches_committed"`
	// BatchesTotal is the run's count of batches in all (bill_runs.
	// batches_total): an estimate as it starts (committed batches plus the
	// population left, in batches), exact once its plan is complete,
	// the committed count once COMPLETED. Null while not known.
	BatchesTotal *int64 `json:"batches_total"`
	// Percent is BatchesCommitted of BatchesTotal (one decimal); 100 once
	// COMPLETED; null while the total is not known.
	Percent *float64 `json:"percent"`
	// RowsPerSecond is the latest claim's subscribers per second, from its
	// start to now (RUNNING) or to its end.
	RowsPerSecond float64 `json:"rows_per_s"`
	// ETASeconds is the time left at the latest claim's batch rate, for a
	// RUNNING run with a known total and a committed batch; else null.
	ETASeconds *int64 `json:"eta_s"`
}

// progressOf computes a status's progress from its row.
func progressOf(status string, committed int64, total *int64, fenceBatches, fenceRows int64, elapsed float64) Progress {
	p := Progress{BatchesCommitted: committed}
	if elapsed > 0 {
		p.RowsPerSecond = math.Round(float64(fenceRows)/elapsed*10) / 10
	}
	if status == StatusCompleted {
		all, hundred := committed, 100.0
		p.BatchesTotal, p.Percent = &all, &hundred
		return p
	}
	if total == nil || *total <= 0 {
		return p
	}
	all := max(*total, committed)
	pct := math.Floor(1000*float64(committed)/float64(all)) / 10
	p.BatchesTotal, p.Percent = &all, &pct
	if status == StatusRunning && fenceBatches > 0 && elapsed > 0 {
		eta := int64(math.Ceil(elapsed / float64(fenceBatches) * float64(all-committed)))
		p.ETASeconds = &eta
	}
	return p
}

// ReadStatus reads p's bill run; ErrNotFound when there is none.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool, p Period) (Status, error) {
	var (
		s                               Status
		lockFence, total                *int64
		batches, subs, created, already int64
		fenceBatches, fenceRows         int64
		elapsed                         float64
		cStart, cEnd, cAt, aFinished    *time.Time
		cZone, aStatus                  *string
		aFence, aCreated, aCents        *int64
		aInvoices                       *int64
		repaired                        int64
		population                      *int64
	)
	err := pool.QueryRow(ctx, sqlStatus, p.String()).Scan(&s.Period, &s.Status, &s.Owner, &s.Fence, &lockFence,
		&s.Attempts, &s.StartedAt, &s.FinishedAt, &s.UpdatedAt, &s.LastError,
		&s.RequestedBy, &s.Principal, &s.RequestID, &s.Trigger, &batches, &subs, &created, &already,
		&total, &fenceBatches, &fenceRows, &elapsed,
		&cStart, &cEnd, &cZone, &cAt, &aStatus, &aFence, &aCreated, &aCents, &aFinished, &aInvoices, &repaired, &population)
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, fmt.Errorf("%w %s", ErrNotFound, p)
	}
	if err != nil {
		return Status{}, fmt.Errorf("billrun: status %s: %w", p, err)
	}
	if lockFence != nil {
		s.LockFence = *lockFence
	}
	s.Counts = map[string]int64{
		CountBatchesCommitted: batches,
		CountSubscribers:      subs + repaired,
		CountInvoicesCreated:  created + repaired,
		CountAlreadyInvoiced:  already,
		CountRepaired:         repaired,
	}
	if population != nil {
		s.Counts[CountPopulation] = *population
	}
	s.Progress = progressOf(s.Status, batches, total, fenceBatches, fenceRows, elapsed)
	if cStart != nil && cEnd != nil && cZone != nil && cAt != nil {
		s.Cutoff = &Cutoff{Zone: *cZone, PeriodStart: *cStart, PeriodEnd: *cEnd, At: *cAt}
	}
	if aStatus != nil {
		s.Adjustments = &Adjustments{Status: *aStatus, Fence: *aFence, Created: *aCreated, AmountCents: *aCents,
			InvoicesCreated: *aInvoices, FinishedAt: aFinished}
	}
	return s, nil
}
