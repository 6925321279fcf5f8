package replica

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/architecture.md lists the replica's components in their start order:
// the list is held to the code (it had gone stale).
func TestArchitectureListsTheComponents(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/architecture.md")
	require.NoError(t, err)
	doc := string(b)
	doc = doc[strings.Index(doc, "## One replica: components"):]
	doc = doc[:strings.Index(doc, "Start brings them up")]
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(doc, -1) {
		if m[1] != "components" {
			listed = append(listed, m[1])
		}
	}
	var names []string
	for _, c := range (&Replica{}).components() {
		names = append(names, c.name)
	}
	require.Equal(t, names, listed)
}
