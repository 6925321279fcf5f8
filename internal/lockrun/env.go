package lockrun

import (
	"slices"
	"strconv"
	"strings"
)

// lockVars are set by `coordinator lock` for its command; inherited values
// (an outer lock's) are replaced.
var lockVars = []string{"COORDINATOR_LOCK_KEY", "COORDINATOR_LOCK_OWNER", "COORDINATOR_LOCK_FENCE"}

// commandEnv is the locked command's environment: environ without the
// variables removed reports (the coordinator's configuration: its secrets,
// and its fallbacks, are not the command's business) unless pass names
// them, without inherited lock variables, plus the lock's own.
func commandEnv(environ []string, removed func(name string) bool, pass []string, key, owner string, fence int64) []string {
	env := make([]string, 0, len(environ)+len(lockVars))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(lockVars, name) {
			continue
		}
		if removed != nil && removed(name) && !slices.Contains(pass, name) {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"COORDINATOR_LOCK_KEY="+key,
		"COORDINATOR_LOCK_OWNER="+owner,
		"COORDINATOR_LOCK_FENCE="+strconv.FormatInt(fence, 10))
}
