//go:build chaos_sabotage

package billrun

// DELIBERATELY UNSAFE: built only for the chaos verifier's sabotage pass
// (`go build -tags chaos_sabotage`, see internal/chaos). A bill run ignores
// the loss of its lease, and the batch statement's "fence check" returns the
// caller's own fence without looking at bill_runs, so a paused, stale owner keeps
// committing batches after a newer owner claimed the period. The marker
// chaos_sabotage_build in the SQL lets tests find this build in a binary.
const (
	sabotaged     = true
	batchFenceSQL = `/* chaos_sabotage_build: no fence check */
with fenced as materialized (select $2::bigint as fence)`
	// reconcileSkipped stays false here until the verifier's sabotage pass
	// has a check for it (a COMPLETED period missing invoices).
	reconcileSkipped = false
)
