// Package base10 reads the integers of the configuration and of the
// command line in base 10 only. Go's own flag.Int and strconv.ParseInt(s,
// 0, ...) read "010" as 8, "0x10" as 16 and "0b11" as 3, so that `--count
// 010` silently asked for 8 numbers; here a leading zero, a sign '+', an
// underscore or a base prefix is refused, naming what was wrong.
package base10

import (
	"errors"
	"flag"
	"strconv"
)

// ErrSyntax is the error of a value that is not a plain base-10 integer.
var ErrSyntax = errors.New("not a base-10 integer (digits only, no leading zero, sign '+' or 0x/0o/0b prefix)")

// Parse reads s: digits, after an optional '-', without a leading zero
// ("0" itself is fine).
func Parse(s string) (int64, error) {
	digits := s
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, ErrSyntax
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, ErrSyntax
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.New("out of range")
	}
	return n, nil
}

// Int defines a flag like fs.Int whose value Parse reads.
func Int(fs *flag.FlagSet, name string, value int, usage string) *int {
	p := new(int)
	*p = value
	fs.Var((*intValue)(p), name, usage)
	return p
}

// Int64 defines a flag like fs.Int64 whose value Parse reads.
func Int64(fs *flag.FlagSet, name string, value int64, usage string) *int64 {
	p := new(int64)
	*p = value
	fs.Var((*int64Value)(p), name, usage)
	return p
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }

func (v *intValue) Set(s string) error {
	n, err := Parse(s)
	if err == nil && int64(int(n)) != n {
		err = errors.New("out of range")
	}
	if err != nil {
		return err
	}
	*v = intValue(n)
	return nil
}

// Get is the value (flag.Getter): -h shows its type.
func (v *intValue) Get() any { return int(*v) }

type int64Value int64

func (v *int64Value) String() string { return strconv.FormatInt(int64(*v), 10) }

func (v *int64Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v = int64Value(n)
	return nil
}

func (v *int64Value) Get() any { return int64(*v) }
