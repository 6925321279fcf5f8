package msisdnreaper_test

import (
	"testing"

	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
)

// The sweep kind against the kinds' conformance check. A trigger has no
// fields of its own; --workers is the CLI's alone.
func TestSweepConformance(t *testing.T) {
	t.Parallel()
	ownedtest.CheckKind(t, msisdnreaper.NewSweepKind(msisdnreaper.Config{Schedule: "@every 30s"}),
		ownedtest.Case{Name: "sweep", Fields: map[string]any{}, Key: []byte("any"), Args: []string{}},
		ownedtest.Case{Name: "workers", Fields: map[string]any{}, Args: []string{"--workers", "3"}},
		ownedtest.Case{Name: "workers out of range", Args: []string{"--workers", "65"}, Reason: "bad_workers"},
	)
}
