package adminauth_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/adminauth"
)

var (
	secretA = strings.Repeat("a", 32)
	secretB = strings.Repeat("b", 40)
	secretC = "c:" + strings.Repeat("c", 40) // a colon inside the token is kept
)

func TestParseFile(t *testing.T) {
	t.Parallel()
	got, err := adminauth.ParseFile("# comment\n\nops:read,mutate:" + secretA + "\r\n  grafana : read : " + secretB + "\nci:mutate:" + secretC + "\n")
	require.NoError(t, err)
	require.Equal(t, []adminauth.Token{
		{Name: "ops", Scopes: adminauth.All, Secret: secretA},
		{Name: "grafana", Scopes: adminauth.Read, Secret: secretB},
		{Name: "ci", Scopes: adminauth.Mutate, Secret: secretC},
	}, got)
}

func TestParseFileErrorsNameTheLineNeverTheToken(t *testing.T) {
	t.Parallel()
	secret := "TOPSECRET" + strings.Repeat("x", 30)
	cases := []struct{ name, content, want string }{
		{"no fields", secret, "line 1: want name:scopes:token"},
		{"two fields", "ops:" + secret, "line 1: want name:scopes:token"},
		{"short token", "# c\nops:read:short", "line 2 (ops): the token must be at least 32 bytes, it has 5"},
		{"unknown scope", "ops:admin:" + secret, "line 1 (ops): unknown scope"},
		{"fields swapped", "ops:" + secret + ":read", "line 1 (ops): unknown scope"},
		{"token as name", secret + ":read:" + secret, "line 1: the name has a disallowed character at byte 0"},
		{"bad name", "Ops Team:read:" + secret, "line 1: the name has a disallowed character"},
		{"space in token", "ops:read:" + secret + " x", "line 1 (ops): the token has a disallowed character"},
		{"empty", "# only comments\n", "no tokens"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adminauth.ParseFile(c.content)
			require.ErrorContains(t, err, c.want)
			require.NotContains(t, err.Error(), "TOPSECRET")
		})
	}
}

func TestCheckRefusesSharedNamesAndSecrets(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, adminauth.Check([]adminauth.Token{{Name: "a", Secret: secretA}, {Name: "a", Secret: secretB}}), `two tokens are named "a"`)
	err := adminauth.Check([]adminauth.Token{{Name: "a", Secret: secretA}, {Name: "b", Secret: secretA}})
	require.ErrorContains(t, err, `tokens "a" and "b" are the same token`)
	require.NotContains(t, err.Error(), secretA)
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	set, err := adminauth.NewSet([]adminauth.Token{
		{Name: "ops", Scopes: adminauth.All, Secret: secretA},
		{Name: "grafana", Scopes: adminauth.Read, Secret: secretB},
	})
	require.NoError(t, err)
	p, ok := set.Authenticate(secretB)
	require.True(t, ok)
	require.Equal(t, adminauth.Principal{Name: "grafana", Scopes: adminauth.Read}, p)
	require.True(t, p.Scopes.Has(adminauth.Read))
	require.False(t, p.Scopes.Has(adminauth.Mutate))
	p, ok = set.Authenticate(secretA)
	require.True(t, ok)
	require.Equal(t, "ops", p.Name)
	require.True(t, p.Scopes.Has(adminauth.All))
	for _, wrong := range []string{"", secretA[:31], secretA + "a", strings.ToUpper(secretA)} {
		_, ok := set.Authenticate(wrong)
		require.False(t, ok, "%q", wrong)
	}
	var empty *adminauth.Set
	require.True(t, empty.Empty())
	_, ok = empty.Authenticate(secretA)
	require.False(t, ok)

	_, err = adminauth.NewSet([]adminauth.Token{{Name: "ops", Scopes: adminauth.All, Secret: "CHANGE-ME"}})
	require.ErrorContains(t, err, "at least 32 bytes")
	require.NotContains(t, err.Error(), "CHANGE-ME")
}

func TestTokenNeverPrintsItsSecret(t *testing.T) {
	t.Parallel()
	tok := adminauth.Token{Name: "ops", Scopes: adminauth.All, Secret: secretA}
	for _, s := range []string{fmt.Sprint(tok), fmt.Sprintf("%v %+v %#v %s %q", tok, tok, tok, tok, tok), fmt.Sprint([]adminauth.Token{tok})} {
		require.NotContains(t, s, secretA)
		require.Contains(t, s, "ops(read,mutate)")
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("x", "token", tok)
	require.NotContains(t, b.String(), secretA)
}

func TestScopes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]adminauth.Scope{"read": adminauth.Read, "mutate": adminauth.Mutate, "read,mutate": adminauth.All, "mutate, read": adminauth.All} {
		got, err := adminauth.ParseScopes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "write", "read,", "READ"} {
		_, err := adminauth.ParseScopes(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, "none", adminauth.Scope(0).String())
}

func FuzzParseFile(f *testing.F) {
	f.Add("ops:read,mutate:" + secretA + "\n")
	f.Add("ops:" + secretA)
	f.Add("a:b:c\n#x\n\n")
	f.Fuzz(func(t *testing.T, content string) {
		toks, err := adminauth.ParseFile(content)
		if err != nil {
			// An error quotes no part of any line past its name.
			for _, line := range strings.Split(content, "\n") {
				_, rest, ok := strings.Cut(line, ":")
				if ok && len(strings.TrimSpace(rest)) >= 8 && strings.Contains(err.Error(), strings.TrimSpace(rest)) {
					t.Fatalf("error %q shows part of line %q", err, line)
				}
			}
			return
		}
		for _, tok := range toks {
			require.NoError(t, adminauth.CheckSecret(tok.Secret))
			require.NoError(t, adminauth.CheckName(tok.Name))
			require.NotZero(t, tok.Scopes)
		}
	})
}
