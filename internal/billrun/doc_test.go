package billrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The package doc's list of files names every file of the package, and
// only those: a list that is not checked goes stale (it had).
func TestDocListsEveryFile(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := string(doc)
	text = text[strings.Index(text, "// Files:"):strings.Index(text, "(TestDocListsEveryFile")]
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "doc.go" {
			continue
		}
		require.Contains(t, text, f, "doc.go's file list")
	}
	for _, word := range strings.Fields(strings.NewReplacer("//", " ", ",", " ", "(", " ", ")", " ").Replace(text)) {
		if strings.HasSuffix(word, ".go") {
			require.FileExists(t, word, "doc.go lists a file that is gone")
		}
	}
}
