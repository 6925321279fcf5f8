package trigger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// widgetTopic is ownedtest.Widget's trigger topic: transport is tested
// with a kind of the tests' own.
var widgetTopic = (&ownedtest.Widget{}).Topic()

// testNow is the bill-run kind's clock in these tests: 2026-11 is the latest
// closed period, 2026-12 the open one.
var testNow = time.Date(2026, time.December, 3, 7, 0, 0, 0, time.UTC)

// testBills is the real bill-run kind at testNow.
func testBills() owned.Kind {
	return billrun.New(billrun.Config{Calendar: billrun.Calendar{Now: func() time.Time { return testNow }}})
}

// registry is the kinds the consumer tests decode: the real bill-run kind
// (its decoding is the contract's) and the widget.
func registry(t testing.TB, w *ownedtest.Widget) *owned.Registry {
	t.Helper()
	reg, err := owned.NewRegistry(testBills(), w.Kind())
	require.NoError(t, err)
	return reg
}

// widgetRunner is the template with the widget alone.
func widgetRunner(t testing.TB, w *ownedtest.Widget, l ownership.Locker, emit events.Emitter) *owned.Runner {
	t.Helper()
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}, Emit: emit})
	require.NoError(t, err)
	return r
}
