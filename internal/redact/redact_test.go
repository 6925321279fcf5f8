package redact_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://:hunter2@h:6379/0", "redis://:REDACTED@h:6379/0"},
		{"rediss://app:hunter2@h:6380/1?db=1&dial_timeout=1s", "rediss://app:REDACTED@h:6380/1?db=1&dial_timeout=REDACTED"},
		// url.Parse rejects these; they are the ones that used to be echoed whole.
		{"postgres://app:p%zz@db:5432/x?sslmode=verify-full", "postgres://app:REDACTED@db:5432/x?sslmode=verify-full"},
		{"postgres://app:a@b@db/x", "postgres://app:REDACTED@db/x"},
		{"postgres://app:p%zz#w@db:5432/x", "postgres://REDACTED"},
		{"postgres://app:a/b?c@db/x", "postgres://REDACTED"},
		// go-redis' failover URL: user info is the sentinel's, password= the master's.
		{"redis://s:sentpw@h:26379/0?master_name=m&password=masterpw&addr=h2:26379",
			"redis://s:REDACTED@h:26379/0?master_name=m&password=REDACTED"},
		// Unknown options and bare tokens are hidden, fragments too.
		{"redis://h:1/0?frobnicate=hunter2&hunter3", "redis://h:1/0?frobnicate=REDACTED"},
		{"redis://h:1/0?db=1&hunter3&addr=h:2", "redis://h:1/0?db=1&REDACTED"},
		{"redis://h:1/0#hunter2", "redis://h:1/0#REDACTED"},
		// An '@' after a '/', '?' or '#': everything is hidden.
		{"redis://h:1/0?client_name=a@b", "redis://REDACTED"},
		// Not a URL: hidden whole.
		{"host=db user=app password='x y'", "REDACTED"},
		{"hunter2", "REDACTED"},
		{"app:hunter2@db:5432", "REDACTED"},
	} {
		got := redact.URL(tc.in)
		require.Equal(t, tc.want, got, tc.in)
		for _, secret := range []string{"hunter", "sentpw", "masterpw", "p%zz", "a#b", "a/b", "a@b"} {
			require.NotContains(t, got, secret, tc.in)
		}
	}
}

func TestHasPassword(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"postgres://app@db/x":                        false,
		"postgres://app:pw@db/x":                     true,
		"postgres://app:@db/x":                       false,
		"postgres://app:p%zz#w@db/x":                 true,
		"redis://h:1/0?master_name=m&password=pw":    true,
		"redis://h:1/0?sentinel_password=pw":         true,
		"redis://h:1/0?master_name=m":                false,
		"host=db user=app password=x":                true,
		"host=db user=app":                           false,
		"postgres://db/x?sslmode=verify-full&user=a": false,
	} {
		require.Equal(t, want, redact.HasPassword(in), in)
	}
}

// FuzzURL: whatever the password holds, the redacted form shows none of it.
// The password is framed by markers that appear nowhere else, so a leak of
// its start or end is caught even when the middle is mangled.
func FuzzURL(f *testing.F) {
	for _, s := range []string{"hunter2", "p%zz", "a#b", "a@b", "a/b?c", ":", "", "%", "#@", "x&y=z"} {
		f.Add(s, "sslmode=disable")
	}
	f.Fuzz(func(t *testing.T, password, query string) {
		secret := "S3CR" + password + "T0P"
		for _, raw := range []string{
			"postgres://app:" + secret + "@db:5432/x?" + query,
			"redis://:" + secret + "@h:6379/0",
			"redis://s@h:26379/0?master_name=m&password=" + secret + "&" + query,
			"redis://h:6379/0?" + query + "&sentinel_password=" + secret,
			"host=db password=" + secret,
		} {
			got := redact.URL(raw)
			if strings.Contains(got, "S3CR") || strings.Contains(got, "T0P") {
				t.Fatalf("URL(%q) = %q shows the password", raw, got)
			}
			if got != redact.URL(raw) {
				t.Fatalf("URL(%q) is not deterministic", raw)
			}
		}
	})
}
