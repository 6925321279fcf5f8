package billrun

import (
	"context"
	"errors"
	"fmt"
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
// already_invoiced.
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
}

// ReadStatus reads p's bill run; ErrNotFound when there is none.
func ReadStatus(ctx context.Context, pool *pgxpool.Pool, p Period) (Status, error) {
	var (
		s                               Status
		lockFence                       *int64
		batches, subs, created, already int64
	)
	err := pool.QueryRow(ctx, sqlStatus, p.String()).Scan(&s.Period, &s.Status, &s.Owner, &s.Fence, &lockFence,
		&s.Attempts, &s.StartedAt, &s.FinishedAt, &s.UpdatedAt, &s.LastError,
		&s.RequestedBy, &s.Principal, &s.RequestID, &s.Trigger, &batches, &subs, &created, &already)
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
		CountSubscribers:      subs,
		CountInvoicesCreated:  created,
		CountAlreadyInvoiced:  already,
	}
	return s, nil
}
