package replica_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.RemoveBinaries() }))
}
