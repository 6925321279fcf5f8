package consoledb

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPrefixEnd(t *testing.T) {
	for prefix, want := range map[string]string{
		"billrun:":       "billrun;",
		"billrun:2026-1": "billrun:2026-2",
		"a\U0010FFFF":    "b",
		"\U0010FFFF":     "",
		"k\uD7FF":        "k\uE000",
	} {
		require.Equal(t, want, prefixEnd(prefix), "%q", prefix)
	}
}
