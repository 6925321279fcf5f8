// Package migrations embeds the SQL migrations into the binary. They are
// applied by `coordinator migrate up` (goose, see internal/migrate).
package migrations

import "embed"

// FS holds every migration, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
