package billrun

import (
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
)

// Period is a billing month. The zero value is not a valid period; get one
// from ParsePeriod or PeriodOf.
type Period struct {
	Year  int
	Month time.Month
}

// Bounds of a valid period (inclusive).
const (
	MinYear = 2000
	MaxYear = 2999
)

// ParsePeriod reads "YYYY-MM" (2000-01 to 2999-12). Anything else is an error
// wrapping job.ErrBadInput that names the value.
func ParsePeriod(s string) (Period, error) {
	if len(s) != 7 || s[4] != '-' || !digits(s[:4]) || !digits(s[5:]) {
		return Period{}, job.BadInput("period %q: want YYYY-MM, e.g. 2026-11", s)
	}
	year := atoi(s[:4])
	month := atoi(s[5:])
	if month < 1 || month > 12 {
		return Period{}, job.BadInput("period %q: month %02d is not 01-12", s, month)
	}
	if year < MinYear || year > MaxYear {
		return Period{}, job.BadInput("period %q: year %d is outside %d-%d", s, year, MinYear, MaxYear)
	}
	return Period{Year: year, Month: time.Month(month)}, nil
}

// PeriodOf returns the period t falls in (in t's location).
func PeriodOf(t time.Time) Period { return Period{Year: t.Year(), Month: t.Month()} }

// String is "YYYY-MM".
func (p Period) String() string { return fmt.Sprintf("%04d-%02d", p.Year, int(p.Month)) }

// Previous is the month before p (the cron job bills the previous month).
// 2000-01's previous month, 1999-12, is outside the valid range; Valid says so.
func (p Period) Previous() Period {
	if p.Month == time.January {
		return Period{Year: p.Year - 1, Month: time.December}
	}
	return Period{Year: p.Year, Month: p.Month - 1}
}

// Valid reports whether p is within 2000-01..2999-12.
func (p Period) Valid() bool {
	return p.Year >= MinYear && p.Year <= MaxYear && p.Month >= time.January && p.Month <= time.December
}

// MarshalText encodes p as "YYYY-MM".
func (p Period) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText is ParsePeriod.
func (p *Period) UnmarshalText(b []byte) error {
	v, err := ParsePeriod(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// JobName is the job's name in results and events.
const JobName = "billrun"

// LockKey is the ownership key of p's run: "billrun:2026-11".
func LockKey(p Period) string { return JobName + ":" + p.String() }

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func atoi(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n
}
