package chaos

// Finding the programs the verifier runs (Binaries, FindBinaries).

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// -------------------------------------------------------------- binaries

// Binaries are the external programs the verifier runs.
type Binaries struct {
	Coordinator string // the coordinator binary under test
	Helper      string // the verifier's own binary, run as the critical-section helper
	RedisServer string
	PGBinDir    string
	Java        string
	KafkaLibs   string // directory of the Kafka jars
	KafkaLog4j  string // optional log4j2 config for the broker
}

// ErrMissing marks a program or file the verifier needs that is not there.
var ErrMissing = errors.New("chaos: missing prerequisite")

// FindBinaries fills the empty fields of b from the environment, PATH and the
// Debian locations, and says in one error what is missing and how to get it.
func FindBinaries(b Binaries, repoRoot string) (Binaries, error) {
	var missing []string
	exe := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
	}
	if b.Coordinator == "" || !exe(b.Coordinator) {
		missing = append(missing, fmt.Sprintf("the coordinator binary %q (make build, or set CHAOS_COORDINATOR)", b.Coordinator))
	}
	if b.RedisServer == "" {
		b.RedisServer = os.Getenv("COORDINATOR_TEST_REDIS_SERVER_BIN")
	}
	if b.RedisServer == "" {
		b.RedisServer, _ = localsvc.RedisServer("") // PATH's, else Debian's
	}
	if !exe(b.RedisServer) {
		missing = append(missing, "redis-server (scripts/services install redis)")
	}
	if b.PGBinDir == "" {
		b.PGBinDir = os.Getenv("COORDINATOR_TEST_PG_BIN_DIR")
	}
	if b.PGBinDir == "" {
		b.PGBinDir, _ = localsvc.PostgresBinDir("") // the newest Debian one, else PATH's
	}
	if !exe(filepath.Join(b.PGBinDir, "initdb")) || !exe(filepath.Join(b.PGBinDir, "postgres")) {
		missing = append(missing, "PostgreSQL's initdb and postgres (scripts/services install postgres, or set COORDINATOR_TEST_PG_BIN_DIR)")
	}
	if b.Java == "" {
		if p, err := exec.LookPath("java"); err == nil {
			b.Java = p
		}
	}
	if !exe(b.Java) {
		missing = append(missing, "java (scripts/services install kafka)")
	}
	if b.KafkaLibs == "" {
		b.KafkaLibs = findKafkaLibs(repoRoot)
	}
	if b.KafkaLibs == "" {
		missing = append(missing, "the Kafka jars (scripts/services install kafka fetches them into .cache/kafka/<version>/libs; or set CHAOS_KAFKA_LIBS or SERVICES_CACHE_DIR)")
	}
	if b.KafkaLog4j == "" && repoRoot != "" {
		if p := filepath.Join(repoRoot, "scripts", "kafka", "log4j2.yaml"); fileExists(p) {
			b.KafkaLog4j = p
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("%w: %s", ErrMissing, strings.Join(missing, "; "))
	}
	return b, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// findKafkaLibs looks for CACHE/kafka/<version>/libs/.complete (what
// scripts/services install kafka leaves), CACHE being SERVICES_CACHE_DIR or
// the repository's .cache; the newest version wins.
func findKafkaLibs(repoRoot string) string {
	var caches []string
	if c := os.Getenv("SERVICES_CACHE_DIR"); c != "" {
		caches = append(caches, c)
	}
	if repoRoot != "" {
		caches = append(caches, filepath.Join(repoRoot, ".cache"))
	}
	for _, c := range caches {
		dirs, _ := filepath.Glob(filepath.Join(c, "kafka", "*", "libs"))
		sort.Slice(dirs, func(i, j int) bool {
			return versionLess(filepath.Base(filepath.Dir(dirs[j])), filepath.Base(filepath.Dir(dirs[i])))
		})
		for _, d := range dirs {
			if fileExists(filepath.Join(d, ".complete")) {
				return d
			}
		}
	}
	return ""
}

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}
