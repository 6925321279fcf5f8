package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// CoordinatorBinary builds cmd/coordinator once per test process, with
// -tags testhooks (so COORDINATOR_TEST_* hooks work), and with -race when
// the tests are, and returns its path.
// Call RemoveBinaries when the tests are done (goleak.Cleanup in TestMain).
func CoordinatorBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "coordinator-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "coordinator")
		args := []string{"build", "-tags", "testhooks", "-o", binPath}
		if RaceEnabled { // the race detector watches the processes too
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "github.com/telco-platform/coordinator/cmd/coordinator")...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("testenv: go build ./cmd/coordinator: %v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// RemoveBinaries deletes what CoordinatorBinary built.
func RemoveBinaries() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

// EnvChromium names the Chromium binary of the browser tests (scripts/services
// install chromium; `scripts/services env` exports it).
const EnvChromium = "COORDINATOR_TEST_CHROMIUM_BIN"

// Chromium returns the headless browser the console's tests drive; it
// fails the test (never skips it) when none is installed.
func Chromium(t testing.TB) string {
	t.Helper()
	return Binary(t, EnvChromium, "/usr/bin/chromium")
}
