package deploy_test

import (
	"os"
	"testing"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// TestMain removes the coordinator binary the live-scrape test built.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinaries()
	os.Exit(code)
}
