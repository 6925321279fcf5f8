//go:build !chaos_sabotage

package billrun

// The chaos verifier's hook (internal/chaos, `CHAOS_SABOTAGE=1 make chaos`).
// Only a binary built with `-tags chaos_sabotage` swaps in sabotage_chaos.go,
// where a bill run ignores a lost lease and its batches skip the claim-fence
// check, so the verifier can prove it notices. In every other build, the
// shipped one included, the batch statement is the safe one below
// (TestNotSabotaged here, and internal/chaos checks the built binary).
const (
	// sabotaged: the run goes on after its lease is lost.
	sabotaged = false
	// batchFenceSQL is the fence check that opens every batch statement.
	batchFenceSQL = sqlBatchFence
	// reconcileSkipped: a run is COMPLETED without reconciling its
	// period's invoices with its population (complete.go).
	reconcileSkipped = false
)
