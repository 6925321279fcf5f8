package migrate_test

import (
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/migrations"
)

// released are the migration versions on main so far: databases have
// applied them, so none may change number or go, and no new one may come
// below the highest (goose refuses a migration numbered below what a
// database has applied: a gap filled later breaks every database past it).
// Add a version here when its migration is merged (migrations/README.md).
var released = []int64{1, 2, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}

// never are the numbers skipped long ago: they stay unused.
var never = []int64{3, 4, 6}

func TestMigrationNumbersAreNeverReused(t *testing.T) {
	t.Parallel()
	name := regexp.MustCompile(`^(\d{5})_[a-z0-9_]+\.sql$`)
	var versions []int64
	entries, err := fs.ReadDir(migrations.FS, ".")
	require.NoError(t, err)
	for _, e := range entries {
		m := name.FindStringSubmatch(e.Name())
		require.NotNil(t, m, "%s: name a migration NNNNN_what_it_does.sql", e.Name())
		v, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		require.NotContains(t, versions, v, "%s: version %d used twice", e.Name(), v)
		versions = append(versions, v)
	}
	for _, v := range released {
		require.Contains(t, versions, v, "released migration %05d is gone or renumbered", v)
	}
	highest := slices.Max(released)
	for _, v := range versions {
		if slices.Contains(released, v) {
			continue
		}
		require.Greater(t, v, highest, "migration %05d is numbered below %05d, the highest released: take the next number after it (migrations/README.md)", v, highest)
		require.NotContains(t, never, v, "%05d stays unused", v)
	}
}
