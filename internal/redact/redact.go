// Package redact hides the secrets in connection strings (Postgres DSNs,
// Redis URLs) before they reach an error message or a log line.
//
// It works by position, never by parsing: a URL that url.Parse rejects (a
// password with a raw '%' or '#') is exactly the one that must not be echoed,
// so the parser cannot be the thing that finds the password. Everything
// between "://" and the last '@' is user info; its password part, every
// query value whose key is not on a short list of known harmless options,
// bare query tokens and any fragment are replaced by REDACTED. When in doubt
// it hides more, not less.
package redact

import "strings"

// Mask replaces a secret.
const Mask = "REDACTED"

// harmlessOptions are query keys whose values say where to connect and how
// to verify, never a secret. Other values are hidden: an error must not echo
// what an operator typed into an option.
var harmlessOptions = map[string]bool{
	"addr": true, "master_name": true, "db": true,
	"sslmode": true, "sslrootcert": true, "search_path": true, "target_session_attrs": true,
}

// URL returns raw with its secrets replaced: the password of the user info,
// query values other than harmless options, bare query tokens and the
// fragment. A string without "://" (a key=value DSN, a token) is replaced
// whole.
func URL(raw string) string {
	if raw == "" {
		return ""
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !isScheme(scheme) {
		return Mask
	}
	var b strings.Builder
	b.WriteString(scheme)
	b.WriteString("://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if end := strings.IndexAny(rest, "/?#"); end >= 0 && end < at {
			// Either the password holds a raw '/', '?' or '#', or a path
			// or query value holds an '@': no position can tell which, so
			// nothing after the scheme is shown.
			return b.String() + Mask
		}
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + Mask)
		}
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	rest, fragment, hasFragment := strings.Cut(rest, "#")
	hostPath, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(hostPath)
	if hasQuery {
		b.WriteByte('?')
		pairs := strings.Split(query, "&")
		for i, pair := range pairs {
			if i > 0 {
				b.WriteByte('&')
			}
			key, _, hasValue := strings.Cut(pair, "=")
			if hasValue && harmlessOptions[key] {
				b.WriteString(pair)
				continue
			}
			if hasValue {
				b.WriteString(key + "=")
			}
			// A secret value with a raw '&' in it runs on into what looks
			// like further options: hide everything after it too.
			b.WriteString(Mask)
			break
		}
	}
	if hasFragment && fragment != "" {
		b.WriteString("#" + Mask)
	}
	return b.String()
}

// HasPassword reports whether raw carries a password: in the user info of a
// URL, in a query option whose name contains "password", or as a password=
// keyword of a key=value DSN.
func HasPassword(raw string) bool {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !isScheme(scheme) {
		return strings.Contains(strings.ToLower(raw), "password")
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if _, pw, has := strings.Cut(rest[:at], ":"); has && pw != "" {
			return true
		}
	}
	_, query, _ := strings.Cut(rest, "?")
	for _, pair := range strings.Split(query, "&") {
		key, value, _ := strings.Cut(pair, "=")
		if strings.Contains(strings.ToLower(key), "password") && value != "" {
			return true
		}
	}
	return false
}

// isScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-', '.').
func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return true
}
