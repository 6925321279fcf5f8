package config_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/config"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's tables from the settings")

// docsPath is docs/configuration.md from this package's directory.
var docsPath = filepath.Join("..", "..", "docs", "configuration.md")

// The tables of docs/configuration.md are generated from the settings
// (their section, default and meaning are part of each setting): a setting
// added, removed or changed without the documentation following fails here.
// Regenerate with
//
//	go test ./internal/config -run TestConfigurationDocIsGenerated -update
func TestConfigurationDocIsGenerated(t *testing.T) {
	b, err := os.ReadFile(docsPath)
	require.NoError(t, err)
	out := string(b)
	for _, section := range []string{"contract", "further", "transport"} {
		re := regexp.MustCompile(`(?s)(<!-- generated: settings ` + section + ` .*?-->\n).*?(<!-- end of generated table -->)`)
		loc := re.FindStringSubmatchIndex(out)
		require.NotNil(t, loc, "docs/configuration.md has no generated %s table", section)
		out = out[:loc[3]] + table(section) + out[loc[4]:]
	}
	if *update {
		require.NoError(t, os.WriteFile(docsPath, []byte(out), 0o644))
		return
	}
	require.Equal(t, out, string(b), "docs/configuration.md is not what the settings say: go test ./internal/config -run TestConfigurationDocIsGenerated -update")
}

// table is the markdown table of one section's settings.
func table(section string) string {
	var sb strings.Builder
	sb.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|\n")
	row := func(env, flg, def, meaning string) {
		fmt.Fprintf(&sb, "| `%s` | %s | %s | %s |\n", env, flg, def, meaning)
	}
	all := config.Settings()
	if section == "transport" { // the files of the secrets documented in other tables come first
		for _, s := range all {
			if s.File != "" && s.Section != section {
				row(s.File, "`--"+s.Flag+"-file`", "unset", "file holding `"+s.Env+"`")
			}
		}
	}
	for _, s := range all {
		if s.Section != section {
			continue
		}
		flg := "`--" + s.Flag + "`"
		if s.RefusedAsFlag {
			flg = "(refused as a flag)"
		}
		row(s.Env, flg, defaultOf(s), s.Doc)
		if s.File != "" && section == "transport" {
			row(s.File, "`--"+s.Flag+"-file`", "unset", "file holding `"+s.Env+"`")
		}
	}
	return sb.String()
}

// defaultOf says what a setting is when nothing sets it: its file, its
// fallback variable, its default.
func defaultOf(s config.Setting) string {
	if s.DocDefault != "" {
		return s.DocDefault
	}
	var parts []string
	if s.File != "" {
		parts = append(parts, "`"+s.File+"`")
	}
	if s.Fallback != "" {
		parts = append(parts, "`"+s.Fallback+"`")
	}
	if s.Default != "" {
		parts = append(parts, "`"+s.Default+"`")
	} else {
		parts = append(parts, "unset")
	}
	return strings.Join(parts, ", else ")
}
