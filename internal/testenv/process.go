package testenv

import (
	"testing"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// freeLoopbackPort returns a loopback port nothing listens on right now,
// below the kernel's ephemeral range (localsvc.FreePort), for a server a
// test starts.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	port, err := localsvc.FreePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return port
}
