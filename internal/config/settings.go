package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/redact"
)

// setting binds one variable to its flag, its type, its default and its
// parser. The table (settings) is the one place a setting is described: the
// parsing, -h (its type and default) and docs/configuration.md (its
// section, default and meaning) all read it.
type setting struct {
	env, flag string
	// typ is what -h shows after the flag's name ("duration", "int"); a
	// "bool" flag takes no argument (--lock-enabled=false).
	typ string
	// usage is -h's line; doc is docs/configuration.md's meaning (default:
	// usage).
	usage, doc string
	// def is the value when neither the variable, its file, its flag nor
	// its fallback is set; docDefault is how the docs say it when def does
	// not (a derived default).
	def, docDefault string
	// fallback names a variable read when this one is unset, before def
	// (DATABASE_URL, REDIS_URL).
	fallback string
	// section is the docs' table the setting is listed in.
	section section
	apply   func(c *Config, v string) error
	// secret says how the value is shown in errors: not at all (opaque)
	// or with its password hidden (url).
	secret secrecy
	// file names the variable whose value is a file holding this setting
	// (ENV_FILE, flag --FLAG-file), for secrets that must not sit in the
	// environment or on the command line.
	file string
	// cmdline, when set, refuses values given as a flag: the command line
	// is readable by every local user (/proc/PID/cmdline, ps).
	cmdline func(v string) error
	// emptyIsOff: the variable set and empty is the value "" (off), not
	// unset (which takes the default). Needs Binding's lookup.
	emptyIsOff bool
}

type secrecy int

const (
	public secrecy = iota
	secretURL
	secretOpaque
)

// section is a table of docs/configuration.md.
type section int

const (
	// sectionContract: the settings of docs/contract.md.
	sectionContract section = iota
	// sectionFurther: every other tuning setting.
	sectionFurther
	// sectionTransport: TLS, SASL and the secrets.
	sectionTransport
)

// settings is every setting, in the order of -h: the process's, then each
// group's.
func settings() []setting {
	return slices.Concat(processSettings(), lockSettings(), kafkaSettings(), httpSettings(), runSettings(), consoleSettings(), logSettings())
}

// Setting is one setting as -h and docs/configuration.md show it.
type Setting struct {
	// Env is its variable, Flag its flag (without dashes), Type the kind
	// of value -h shows.
	Env, Flag, Type string
	// Usage is -h's line, Doc the documentation's meaning.
	Usage, Doc string
	// Default is its value when nothing sets it ("" for none: the
	// component's own default, or off); DocDefault is how the
	// documentation says it.
	Default, DocDefault string
	// Fallback is a variable read before Default (DATABASE_URL).
	Fallback string
	// File is the variable naming a file that holds the value.
	File string
	// Secret: the value is never shown in errors; RefusedAsFlag: nor taken
	// from the command line (a token, a password).
	Secret, RefusedAsFlag bool
	// Section is the documentation's table: "contract", "further",
	// "transport".
	Section string
}

// Settings are every setting, in the order of -h.
func Settings() []Setting {
	var out []Setting
	for _, s := range settings() {
		out = append(out, Setting{Env: s.env, Flag: s.flag, Type: s.typ, Usage: s.usage, Doc: cmpOr(s.doc, s.usage),
			Default: s.def, DocDefault: s.docDefault, Fallback: s.fallback, File: s.file, Secret: s.secret != public, RefusedAsFlag: s.secret == secretOpaque,
			Section: [...]string{"contract", "further", "transport"}[s.section]})
	}
	return out
}

// The constructors below make a setting of one type: the type -h shows
// follows from the parser, so the two cannot drift.

// text is a string setting; check (may be nil) judges the value.
func text(env, flag, typ, usage, def string, field func(*Config) *string, check func(string) error) setting {
	return setting{env: env, flag: flag, typ: typ, usage: usage, def: def, apply: func(c *Config, v string) error {
		*field(c) = v
		if check == nil {
			return nil
		}
		return check(v)
	}}
}

// path is a file name setting (a PEM file, a secret file).
func path(env, flag, usage string, field func(*Config) *string) setting {
	return text(env, flag, "path", usage, "", field, nil)
}

// enum is a string setting that takes one of values.
func enum(env, flag, usage, def string, field func(*Config) *string, values ...string) setting {
	return text(env, flag, strings.Join(values, "|"), usage, def, field, func(v string) error { return oneOf(v, values...) })
}

// boolean is a true/false setting.
func boolean(env, flag, usage, def string, field func(*Config) *bool) setting {
	return setting{env: env, flag: flag, typ: "bool", usage: usage, def: def, apply: func(c *Config, v string) (err error) {
		*field(c), err = strconv.ParseBool(v)
		return err
	}}
}

// dur is a duration setting in [lo, hi] (hi 0: no upper bound).
func dur(env, flag, usage, def string, lo, hi time.Duration, field func(*Config) *time.Duration) setting {
	return setting{env: env, flag: flag, typ: "duration", usage: usage, def: def, apply: func(c *Config, v string) (err error) {
		*field(c), err = duration(v, lo, hi)
		return err
	}}
}

// integer is an integer setting in [lo, hi]; typ is "int" or its unit
// ("bytes").
func integer(env, flag, typ, usage, def string, lo, hi int, field func(*Config) *int) setting {
	return setting{env: env, flag: flag, typ: typ, usage: usage, def: def, apply: func(c *Config, v string) (err error) {
		*field(c), err = intBetween(v, lo, hi)
		return err
	}}
}

// schedule is a robfig/cron spec setting; empty disables.
func schedule(env, flag, usage, def string, field func(*Config) *string) setting {
	return text(env, flag, "cron", usage, def, field, checkSchedule)
}

// offWhenEmpty makes the variable set and empty mean off ("").
func (s setting) offWhenEmpty() setting {
	s.emptyIsOff = true
	return s
}

// in sets where a setting is documented and how.
func (s setting) in(sec section, doc string) setting {
	s.section, s.doc = sec, doc
	return s
}

// documented says how the documentation shows a derived default.
func (s setting) documented(def string) setting {
	s.docDefault = def
	return s
}

// secretIn makes s a secret: shown hidden in errors (a URL's password, or
// all of it), read from file too, and, when opaque, refused as a flag.
func (s setting) secretIn(how secrecy, file string) setting {
	s.secret, s.file = how, file
	if how == secretOpaque {
		s.cmdline = refuseOnCommandLine(s.env)
	} else {
		s.cmdline = refusePasswordOnCommandLine(s.env)
	}
	return s
}

func refuseOnCommandLine(env string) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		return fmt.Errorf("a secret on the command line is visible to every local user (ps, /proc/PID/cmdline): set %s or %s_FILE instead", env, env)
	}
}

func refusePasswordOnCommandLine(env string) func(string) error {
	return func(v string) error {
		if !redact.HasPassword(v) {
			return nil
		}
		return fmt.Errorf("a password on the command line is visible to every local user (ps, /proc/PID/cmdline): set %s or %s_FILE instead", env, env)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// show is how the value appears in an error.
func (s setting) show(v string) string {
	switch {
	case v == "":
		return ""
	case s.secret == secretURL:
		return redact.URL(v)
	case s.secret == secretOpaque:
		return redact.Mask
	}
	return v
}

// defaultOf is s's value when neither its variable, file nor flag is set:
// its fallback variable, else its default.
func (s setting) defaultOf(getenv func(string) string) string {
	if s.fallback != "" {
		if v := getenv(s.fallback); v != "" {
			return v
		}
	}
	return s.def
}
