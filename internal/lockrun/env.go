package lockrun

import (
	"strconv"
	"strings"
)

// secretWords mark a COORDINATOR_* variable as a secret, or as a pointer to
// one, that the locked command must not see: the coordinator's own
// credentials are not the command's business. Today that removes
// COORDINATOR_DATABASE_URL, COORDINATOR_LOCK_REDIS_URL,
// COORDINATOR_ADMIN_TOKEN, COORDINATOR_KAFKA_SASL_PASSWORD and every
// *_PASSWORD_FILE, *_TOKEN_FILE, *_URL_FILE and TLS *_KEY_FILE beside them,
// and whatever future variable follows the same naming.
var secretWords = []string{"URL", "DSN", "PASSWORD", "TOKEN", "SECRET", "CREDENTIAL"}

// isSecretVar reports whether the environment variable name is one of the
// coordinator's secrets (see secretWords) or a private key file.
func isSecretVar(name string) bool {
	rest, ok := strings.CutPrefix(name, "COORDINATOR_")
	if !ok {
		return false
	}
	for _, w := range secretWords {
		if strings.Contains(rest, w) {
			return true
		}
	}
	return strings.HasSuffix(rest, "_KEY_FILE")
}

// lockVars are set by `coordinator lock` for its command; inherited values
// (an outer lock's) are replaced.
var lockVars = []string{"COORDINATOR_LOCK_KEY", "COORDINATOR_LOCK_OWNER", "COORDINATOR_LOCK_FENCE"}

// commandEnv is the locked command's environment: environ without the
// coordinator's secrets and without inherited lock variables, plus the
// lock's own.
func commandEnv(environ []string, key, owner string, fence int64) []string {
	env := make([]string, 0, len(environ)+len(lockVars))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if isSecretVar(name) || isLockVar(name) {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"COORDINATOR_LOCK_KEY="+key,
		"COORDINATOR_LOCK_OWNER="+owner,
		"COORDINATOR_LOCK_FENCE="+strconv.FormatInt(fence, 10))
}

func isLockVar(name string) bool {
	for _, v := range lockVars {
		if name == v {
			return true
		}
	}
	return false
}
