package base10_test

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/base10"
)

func TestParseReadsBase10Only(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]int64{"0": 0, "8": 8, "10": 10, "447200000000": 447200000000, "-3": -3} {
		n, err := base10.Parse(s)
		require.NoError(t, err, s)
		require.Equal(t, want, n, s)
	}
	for _, s := range []string{"010", "0x10", "0X10", "0b11", "0o17", "+5", "1_000", "", "-", " 5", "5 ", "1e3", "-010", "00"} {
		_, err := base10.Parse(s)
		require.ErrorIs(t, err, base10.ErrSyntax, "%q", s)
	}
	_, err := base10.Parse("99999999999999999999")
	require.ErrorContains(t, err, "out of range")
}

// Go's flag.Int reads 010 as 8: these flags refuse it.
func TestFlagsRefuseOtherBases(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := base10.Int(fs, "n", 1, "an int")
	m := base10.Int64(fs, "m", 2, "an int64")
	require.NoError(t, fs.Parse([]string{"--n", "10", "--m", "447200000000"}))
	require.Equal(t, 10, *n)
	require.Equal(t, int64(447200000000), *m)
	for _, args := range [][]string{{"--n", "010"}, {"--m", "0x10"}, {"--m", "0b11"}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		base10.Int(fs, "n", 1, "")
		base10.Int64(fs, "m", 1, "")
		err := fs.Parse(args)
		require.ErrorContains(t, err, "invalid value", "%v", args)
		require.ErrorContains(t, err, args[0][1:], "names the flag")
	}
	// -h shows a flag.Getter's value type (cmd/coordinator's printFlags).
	require.IsType(t, 0, fs.Lookup("n").Value.(flag.Getter).Get())
	require.IsType(t, int64(0), fs.Lookup("m").Value.(flag.Getter).Get())
}
