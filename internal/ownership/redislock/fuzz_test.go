package redislock_test

import (
	"strings"
	"testing"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// FuzzParseOptions: any URL in any mode parses or fails without a panic,
// a parsed one has somewhere to connect, and an error never shows the
// password (framed by markers that appear nowhere else).
func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{"", "hunter2", "p%zz", "a#b", "a@b", "x/y?z", ",h:1", "&addr=h:2", "%00", "[::1]"} {
		f.Add("redis://127.0.0.1:6379/0?dial_timeout=1s", s, uint8(0))
	}
	f.Add("redis://s:26379/0?master_name=m&addr=s2:26379", "pw", uint8(1))
	f.Add("rediss://n1:7000?addr=n2:7000", "pw", uint8(2))
	modes := []string{redislock.ModeSingle, redislock.ModeSentinel, redislock.ModeCluster}
	f.Fuzz(func(t *testing.T, raw, password string, mode uint8) {
		m := modes[int(mode)%len(modes)]
		if o, err := redislock.ParseOptions(raw, m); err == nil && len(o.Addrs) == 0 {
			t.Fatalf("ParseOptions(%q, %s): no address", raw, m)
		}
		secret := "S3CR" + password + "T0P"
		for _, u := range []string{
			"redis://:" + secret + "@127.0.0.1:6379/0",
			"rediss://user:" + secret + "@h:6380/1?" + password,
			"redis://s:" + secret + "@s1:26379/0?master_name=m&password=" + secret,
			"redis://h:1/0?opt_" + password + "=" + secret,
		} {
			_, err := redislock.ParseOptions(u, m)
			if err != nil && (strings.Contains(err.Error(), "S3CR") || strings.Contains(err.Error(), "T0P")) {
				t.Fatalf("ParseOptions(%q, %s): error shows the password: %v", u, m, err)
			}
		}
	})
}
