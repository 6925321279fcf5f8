package owned_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The extension point compiles no adapter and no process configuration: a
// kind package, and its tests, build without a Redis or Kafka client
// (depguard keeps direct imports out; this catches the ones that come
// through another package, as internal/config once brought go-redis).
func TestOwnedCompilesNoAdapter(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/redis/go-redis", "github.com/twmb/franz-go",
			"github.com/telco-platform/coordinator/internal/config", "github.com/telco-platform/coordinator/internal/ownership/redislock"} {
			require.False(t, strings.HasPrefix(dep, banned), "owned depends on %s", dep)
		}
	}
}
