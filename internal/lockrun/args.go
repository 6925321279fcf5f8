package lockrun

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Usage is the synopsis `coordinator lock` prints with a usage error.
const Usage = `usage: coordinator lock --key KEY [--lease D] [--wait D] [--grace D] [--pass-env NAME]... [config flags] -- CMD [ARGS...]

Runs CMD while holding the ownership lock on KEY (a distributed flock), and
releases the lock only when CMD and every process it started are gone.
  --key    lock key (required; 1-200 of A-Z a-z 0-9 . _ : / -)
  --lease  explicit lease (the lock hard-expires after it); default 0 = watchdog lease
           (TTL COORDINATOR_LOCK_WATCHDOG_TIMEOUT, renewed while CMD runs)
  --wait   max time to wait for the lock (0: one try, as flock -n); default COORDINATOR_LOCK_WAIT_TIME
  --grace  time between SIGTERM and SIGKILL when CMD must stop; default 10s, or the
           most that fits: CMD is always dead before the lock can expire, so
           SIGTERM goes out grace + a kill margin before the lease's trust deadline
           (explicit: lease - lease/20; watchdog: when the last confirmed expiry is
           a third of the TTL away). A --grace that cannot fit is refused (64).
  --pass-env  hand the variable NAME, which CMD would not get, on to it (repeatable)
The process tree: CMD runs in a process group of its own (on a terminal: the
foreground group). coordinator is a child subreaper, so processes that leave
the group (setsid, double fork) stay its descendants. When CMD exits, whatever
it left behind gets SIGTERM, then SIGKILL after the grace; then the lock is
released. If the lock is found gone or taken over, the tree gets SIGKILL at once.
Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT are forwarded once to CMD's group, and
SIGKILL follows after the grace; a second one kills the tree at once. SIGTSTP
and SIGCONT are forwarded. On a terminal, Ctrl-Z stops CMD and then coordinator;
nothing renews the lock while stopped, and on fg/bg CMD is continued only if
the lease can still be trusted for a whole termination, else it is killed (76).
CMD sees COORDINATOR_LOCK_KEY, COORDINATOR_LOCK_OWNER, COORDINATOR_LOCK_FENCE and
the environment without what coordinator reads as its configuration (every
COORDINATOR_* variable, DATABASE_URL, REDIS_URL, PG*, OTEL_*), but for the
variables --pass-env names.
Exit: CMD's own code (128+N if killed by signal N); 75 already owned; 69 lock
backend unavailable; 76 lease lost or ending while CMD ran; 64 bad usage
(CMD not found included); 1 CMD could not be started; 128+N signal N while waiting for the lock (CMD
did not run).`

// defaultGrace is --grace when not given, if the lease leaves room for it.
const defaultGrace = 10 * time.Second

// Args are lock's own flags and the command to run.
type Args struct {
	Key string
	// Lease is --lease: an explicit lease; 0 is a watchdog lease.
	Lease time.Duration
	// Grace is --grace (defaultGrace unless GraceSet).
	Grace    time.Duration
	GraceSet bool
	// Wait is --wait, when WaitSet: it replaces COORDINATOR_LOCK_WAIT_TIME.
	Wait    time.Duration
	WaitSet bool
	// PassEnv are the variables --pass-env names: the command gets them
	// although they are the coordinator's configuration.
	PassEnv []string
	// Config are the other flags: the coordinator's configuration flags,
	// for the caller to parse.
	Config []string
	// Argv is the command and its arguments (after "--").
	Argv []string
}

// ParseArgs takes lock's own flags out of args; the others are
// configuration flags (Args.Config). The command follows "--".
func ParseArgs(args []string) (Args, error) {
	a := Args{Grace: defaultGrace}
	i := 0
	for ; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			a.Argv = args[i+1:]
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") {
			return a, fmt.Errorf("unexpected argument %q (the command goes after --)", arg)
		}
		switch name {
		case "key", "lease", "wait", "grace", "pass-env":
		default:
			a.Config = append(a.Config, arg)
			if !hasVal && i+1 < len(args) && args[i+1] != "--" && !strings.HasPrefix(args[i+1], "-") {
				i++
				a.Config = append(a.Config, args[i])
			}
			continue
		}
		if !hasVal {
			if i+1 >= len(args) || args[i+1] == "--" {
				return a, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "key":
			a.Key = val
			continue
		case "pass-env":
			if err := checkPassEnv(val); err != nil {
				return a, err
			}
			a.PassEnv = append(a.PassEnv, val)
			continue
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 {
			return a, fmt.Errorf("--%s %q is not a non-negative duration", name, val)
		}
		switch name {
		case "lease":
			a.Lease = d
		case "wait":
			a.Wait, a.WaitSet = d, true
		case "grace":
			a.Grace, a.GraceSet = d, true
		}
	}
	switch {
	case a.Key == "":
		return a, errors.New("--key is required")
	case len(a.Argv) == 0:
		return a, errors.New("no command after --")
	}
	if err := ownership.ValidateKey(a.Key); err != nil {
		return a, err
	}
	return a, nil
}

// killMargin is how long before the lease's trust deadline SIGKILL goes out:
// time for the kernel to end the processes and for us to reap them.
func killMargin(ttl time.Duration) time.Duration { return min(500*time.Millisecond, ttl/10) }

// maxGrace is the longest grace that still has the command dead before the
// lock can expire. An explicit lease gives the whole lease (less the safety
// margin and the kill margin). A watchdog lease gives a third of its TTL: the
// termination starts when the lock's confirmed expiry is that close, which
// in normal operation it never is (a renewal every third of the TTL moves
// it), so one late renewal is tolerated and a failing one is not waited out.
func maxGrace(ttl time.Duration, watchdog bool) time.Duration {
	window := ttl
	if watchdog {
		window = ttl / 3
	}
	return window - ownership.SafetyMargin(ttl) - killMargin(ttl)
}

// fitGrace returns the grace to use, or an error naming why it cannot fit.
// Without --grace: 10s, or less if the lease needs it: the most that fits a
// watchdog lease (its termination does not start in normal operation), half
// of what fits an explicit lease (whose end the termination always
// precedes, so the command keeps the other half to run).
func fitGrace(a Args, ttl time.Duration, watchdog bool) (time.Duration, error) {
	most := maxGrace(ttl, watchdog)
	what := fmt.Sprintf("--lease %s", ttl)
	if watchdog {
		what = fmt.Sprintf("COORDINATOR_LOCK_WATCHDOG_TIMEOUT=%s (a watchdog lease: termination starts when its renewals are a third of it late)", ttl)
	}
	tooLong := a.Grace > most
	if !watchdog {
		tooLong = a.Grace >= most // an explicit lease must leave the command time to run
	}
	switch {
	case most <= 0:
		return 0, fmt.Errorf("%s is too short to stop the command before the lock can expire: no --grace fits", what)
	case !a.GraceSet && watchdog:
		return min(a.Grace, most), nil
	case !a.GraceSet:
		return min(a.Grace, most/2), nil
	case tooLong:
		return 0, fmt.Errorf("--grace %s does not fit %s: the command must be dead %s before the lease's trust deadline, so --grace must stay below %s (use a longer lease or a shorter grace)",
			a.Grace, what, killMargin(ttl), most.Round(time.Millisecond))
	}
	return a.Grace, nil
}

// checkPassEnv refuses a --pass-env that cannot name a variable to hand on.
func checkPassEnv(name string) error {
	if slices.Contains(lockVars, name) {
		return fmt.Errorf("--pass-env %s: coordinator lock sets it for the command itself", name)
	}
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("--pass-env %q is not an environment variable name (A-Z a-z 0-9 _, not starting with a digit)", name)
		}
	}
	if name == "" {
		return errors.New("--pass-env needs a variable name")
	}
	return nil
}
