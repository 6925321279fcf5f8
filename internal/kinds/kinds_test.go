package kinds_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/kinds"
)

func TestBuiltinRegistryHasNoClashes(t *testing.T) {
	t.Parallel()
	reg, err := kinds.Config{}.Registry()
	require.NoError(t, err)
	require.Len(t, reg.Kinds(), len(kinds.Config{}.Kinds()))
	for _, k := range reg.Kinds() {
		s := k.Spec()
		require.NotEmpty(t, s.Summary, s.Name)
		require.NotEmpty(t, s.Topic, "%s: every built-in kind has a Kafka trigger", s.Name)
		require.NotEmpty(t, s.HTTPPath, "%s: every built-in kind has an HTTP trigger", s.Name)
	}
}
