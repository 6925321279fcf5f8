package chaos

import (
	"debug/buildinfo"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// SabotageTag is the build tag of the deliberately unsafe coordinator the
// sabotage pass runs (internal/billrun/sabotage_chaos.go).
const SabotageTag = "chaos_sabotage"

// IsSabotaged reports whether the Go binary at path was built with
// -tags chaos_sabotage (read from its embedded build information).
func IsSabotaged(path string) (bool, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read build info of %s: %w", path, err)
	}
	for _, s := range bi.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), SabotageTag) {
			return true, nil
		}
	}
	return false, nil
}

// RepoRoot walks up from dir to the directory holding go.mod ("" if none).
func RepoRoot(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	for d := abs; ; d = filepath.Dir(d) {
		if fileExists(filepath.Join(d, "go.mod")) {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// CheckBuild refuses a coordinator binary whose build does not match the
// mode: the normal pass must never run the sabotaged build (its anomalies
// would be blamed on the product), and the sabotage pass must run it (or it
// proves nothing).
func CheckBuild(path string, sabotage bool) error {
	got, err := IsSabotaged(path)
	if err != nil {
		return err
	}
	switch {
	case sabotage && !got:
		return fmt.Errorf("%s was not built with -tags %s, but CHAOS_SABOTAGE is set", path, SabotageTag)
	case !sabotage && got:
		return fmt.Errorf("%s is the sabotaged build (-tags %s), but CHAOS_SABOTAGE is not set", path, SabotageTag)
	}
	return nil
}
