package replenish_test

import (
	"testing"

	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/replenish"
)

// The replenishment kind against the kinds' conformance check: a range or
// a list, from every source alike.
func TestReplenishConformance(t *testing.T) {
	t.Parallel()
	ownedtest.CheckKind(t, replenish.New(),
		ownedtest.Case{Name: "range", Fields: map[string]any{"first": "447700000000", "count": 1000},
			Args: []string{"--first", "447700000000", "--count", "1000"}},
		ownedtest.Case{Name: "list", Fields: map[string]any{"msisdns": []string{"447700000001", "447700000002"}},
			Args: []string{"447700000001", "447700000002"}},
		ownedtest.Case{Name: "both", Fields: map[string]any{"first": "447700000000", "count": 1, "msisdns": []string{"447700000001"}},
			Args: []string{"--first", "447700000000", "--count", "1", "447700000001"}, Reason: replenish.ReasonConflictingNumbers},
		ownedtest.Case{Name: "no count", Fields: map[string]any{"first": "447700000000"}, Args: []string{"--first", "447700000000"},
			Reason: replenish.ReasonBadCount},
		ownedtest.Case{Name: "bad number", Fields: map[string]any{"msisdns": []string{"12"}}, Args: []string{"12"},
			Reason: replenish.ReasonBadMSISDN},
	)
}
