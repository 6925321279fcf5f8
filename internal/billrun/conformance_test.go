package billrun_test

import (
	"testing"
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
)

// The bill-run kind against the kinds' conformance check: every source
// decodes a trigger alike, Encode and Decode round-trip, its lock keys are
// billrun:PERIOD, and its status and record keys name the same run.
func TestBillrunConformance(t *testing.T) {
	t.Parallel()
	k := kindAt(time.Date(2026, time.December, 3, 7, 0, 0, 0, time.UTC), nil)
	ownedtest.CheckKind(t, k,
		ownedtest.Case{Name: "period", Fields: map[string]any{"period": "2026-11"}, Key: []byte("2026-11"),
			Args: []string{"--period", "2026-11"}},
		ownedtest.Case{Name: "no key", Fields: map[string]any{"period": "2026-10"}, Args: []string{"--period", "2026-10"}},
		ownedtest.Case{Name: "forced", Fields: map[string]any{"period": "2020-01", "force": true},
			Args: []string{"--period", "2020-01", "--force"}},
		ownedtest.Case{Name: "adjustment", Fields: map[string]any{"period": "2026-11", "adjust": true},
			Args: []string{"--period", "2026-11", "--adjust"}},
		ownedtest.Case{Name: "missing period", Fields: map[string]any{}, Args: []string{}, Reason: billrun.ReasonMissingPeriod},
		ownedtest.Case{Name: "bad period", Fields: map[string]any{"period": "2026-13"}, Args: []string{"--period", "2026-13"},
			Reason: billrun.ReasonBadPeriod},
		ownedtest.Case{Name: "open period", Fields: map[string]any{"period": "2026-12", "force": true},
			Args: []string{"--period", "2026-12", "--force"}, Reason: billrun.ReasonPeriodNotClosed},
		ownedtest.Case{Name: "too old", Fields: map[string]any{"period": "2020-01"}, Args: []string{"--period", "2020-01"},
			Reason: billrun.ReasonPeriodTooOld},
		ownedtest.Case{Name: "key mismatch", Fields: map[string]any{"period": "2026-11"}, Key: []byte("2026-10"),
			Reason: billrun.ReasonKeyMismatch},
	)
}
