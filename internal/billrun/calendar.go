package billrun

import (
	"time"

	"github.com/telco-platform/coordinator/internal/owned"
)

// Reasons a period is not admitted (owned.Reject: a Kafka trigger goes to
// the dead-letter topic with the reason, HTTP answers a problem, the CLI
// exits 64).
const (
	// ReasonPeriodNotClosed: the period has not ended yet in the billing
	// zone (the open month, or a future one). Never billable, even forced:
	// billing it would complete it with partial usage. HTTP 422.
	ReasonPeriodNotClosed = "period_not_closed"
	// ReasonPeriodTooOld: the period is more than MaxAgeMonths old; --force
	// ("force": true) bills it anyway. HTTP 400.
	ReasonPeriodTooOld = "period_too_old"
)

// DefaultMaxAgeMonths is how many months back a period may be billed
// without force (COORDINATOR_BILLRUN_MAX_AGE_MONTHS).
const DefaultMaxAgeMonths = 24

// Calendar says when billing months start and end and which periods may be
// billed now. The zero value is UTC, DefaultMaxAgeMonths and the wall clock.
type Calendar struct {
	// Zone is where months start and end, at midnight.
	// COORDINATOR_BILLING_TZ, default UTC.
	Zone *time.Location
	// MaxAgeMonths: a period more months before the current one needs
	// force. COORDINATOR_BILLRUN_MAX_AGE_MONTHS, default 24.
	MaxAgeMonths int
	// Now is the clock (tests set it). Default time.Now.
	Now func() time.Time
}

func (c Calendar) withDefaults() Calendar {
	if c.Zone == nil {
		c.Zone = time.UTC
	}
	if c.MaxAgeMonths <= 0 {
		c.MaxAgeMonths = DefaultMaxAgeMonths
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Start is p's first instant in loc: midnight of its first day.
func (p Period) Start(loc *time.Location) time.Time {
	return time.Date(p.Year, p.Month, 1, 0, 0, 0, 0, loc)
}

// End is the instant p ends in loc: midnight of the next month's first day
// (not part of p).
func (p Period) End(loc *time.Location) time.Time { return p.Next().Start(loc) }

// Next is the month after p.
func (p Period) Next() Period {
	if p.Month == time.December {
		return Period{Year: p.Year + 1, Month: time.January}
	}
	return Period{Year: p.Year, Month: p.Month + 1}
}

// Days is the number of days in p (28 to 31).
func (p Period) Days() int { return time.Date(p.Year, p.Month+1, 0, 0, 0, 0, 0, time.UTC).Day() }

// months counts months since year 0, for month arithmetic.
func (p Period) months() int { return p.Year*12 + int(p.Month) - 1 }

// Current is the period now falls in, in the billing zone (the open month).
func (c Calendar) Current() Period {
	c = c.withDefaults()
	return PeriodOf(c.Now().In(c.Zone))
}

// Closed reports whether p has ended in the billing zone.
func (c Calendar) Closed(p Period) bool {
	c = c.withDefaults()
	return !c.Now().Before(p.End(c.Zone))
}

// Admit says whether p may be billed now: closed in the billing zone
// (never overridable), and no more than MaxAgeMonths before the current
// month unless force. A refusal is an *owned.RejectError naming the
// period and the zone.
func (c Calendar) Admit(p Period, force bool) error {
	c = c.withDefaults()
	if !c.Closed(p) {
		re := owned.Reject(ReasonPeriodNotClosed,
			"period %s is not closed in the billing zone %s: it ends at %s; a period is billable once it has ended (not even --force bills it earlier)",
			p, c.Zone, p.End(c.Zone).Format(time.RFC3339))
		re.Unprocessable = true
		re.Fields = map[string]string{"period": p.String(), "zone": c.Zone.String(), "period_end": p.End(c.Zone).Format(time.RFC3339)}
		return re
	}
	if age := c.Current().months() - p.months(); age > c.MaxAgeMonths && !force {
		return owned.Reject(ReasonPeriodTooOld,
			"period %s is %d months old, more than COORDINATOR_BILLRUN_MAX_AGE_MONTHS=%d: pass --force (\"force\": true) to bill it",
			p, age, c.MaxAgeMonths)
	}
	return nil
}
