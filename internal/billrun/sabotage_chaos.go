//go:build chaos_sabotage

package billrun

// DELIBERATELY UNSAFE: built only for the chaos verifier's sabotage pass
// (`go build -tags chaos_sabotage`, see internal/chaos). A bill run ignores
// the loss of its lease, and the batch statement's "fence check" returns the
// caller's own fence without looking at bill_runs, so a paused, stale owner keeps
// committing batches after a newer owner claimed the period; and a run is
// COMPLETED without reconciling (a batch PostgreSQL lost stays unbilled).
// The marker chaos_sabotage_build in the SQL lets tests find this build in a
// binary.
const (
	sabotaged     = true
	batchFenceSQL = `/* chaos_sabotage_build: no fence check */
with fenced as materialized (select $2::bigint as fence)`
	// reconcileSkipped: a run is COMPLETED without reconciling its period's
	// invoices with its population (complete.go); the sabotage pass's
	// postgres-lost-commits then leaves COMPLETED periods missing invoices,
	// which its invoice_missing check must report.
	reconcileSkipped = true
)
