package billrun

import "testing"

// The default build must carry the safe batch path: the chaos verifier's
// sabotage (sabotage_chaos.go) exists only under -tags chaos_sabotage. This
// test fails if that file is ever compiled into a normal build.
func TestNotSabotaged(t *testing.T) {
	if sabotaged || batchFenceSQL != sqlBatchFence || reconcileSkipped {
		t.Fatal("billrun is built with the chaos_sabotage variant: the batch fence check is disabled")
	}
}
