package billrun_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
)

// The deployment's defaults (COORDINATOR_BILLRUN_*) are the package's.
func TestConfigDefaultsAreThePackagesDefaults(t *testing.T) {
	cfg, _, err := config.Load("coordinator", nil, func(string) string { return "" })
	require.NoError(t, err)
	require.Equal(t, billrun.DefaultBatchSize, cfg.BillrunBatchSize, "COORDINATOR_BILLRUN_BATCH_SIZE")
	require.Equal(t, billrun.DefaultWorkers, cfg.BillrunWorkers, "COORDINATOR_BILLRUN_WORKERS")
}
