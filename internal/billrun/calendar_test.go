package billrun_test

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func TestMonthLengths(t *testing.T) {
	t.Parallel()
	for p, days := range map[string]int{"2026-02": 28, "2024-02": 29, "2000-02": 29, "2100-02": 28, "2026-11": 30, "2026-12": 31, "2026-04": 30, "2026-01": 31} {
		q, err := billrun.ParsePeriod(p)
		require.NoError(t, err)
		require.Equal(t, days, q.Days(), p)
	}
	dec := billrun.Period{Year: 2026, Month: time.December}
	require.Equal(t, "2027-01", dec.Next().String())
	ny := mustZone(t, "America/New_York")
	nov := billrun.Period{Year: 2026, Month: time.November}
	require.Equal(t, "2026-11-01T04:00:00Z", nov.Start(ny).UTC().Format(time.RFC3339), "EDT")
	require.Equal(t, "2026-12-01T05:00:00Z", nov.End(ny).UTC().Format(time.RFC3339), "EST")
}

// Admission: closed periods only, whatever force says; older than the age
// limit only with force; months end at midnight in the billing zone.
func TestCalendarAdmit(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cal := billrun.Calendar{Now: func() time.Time { return now }}
	open := billrun.PeriodOf(now.UTC())
	latest := open.Previous()
	reason := func(err error) string {
		var re *owned.RejectError
		if !errors.As(err, &re) {
			return ""
		}
		return re.Reason
	}
	require.NoError(t, cal.Admit(latest, false))
	for _, p := range []billrun.Period{open, open.Next(), {Year: 2999, Month: time.December}} {
		for _, force := range []bool{false, true} {
			err := cal.Admit(p, force)
			require.Equal(t, billrun.ReasonPeriodNotClosed, reason(err), "%s force=%v", p, force)
			require.ErrorIs(t, err, job.ErrBadInput)
			require.Contains(t, err.Error(), p.String())
			require.Contains(t, err.Error(), "UTC")
		}
	}
	old := latest
	for range 23 {
		old = old.Previous()
	}
	require.NoError(t, cal.Admit(old, false), "24 months back is within the default limit")
	require.Equal(t, billrun.ReasonPeriodTooOld, reason(cal.Admit(old.Previous(), false)))
	require.NoError(t, cal.Admit(old.Previous(), true))
	require.NoError(t, cal.Admit(billrun.Period{Year: 2000, Month: time.January}, true))
	short := billrun.Calendar{MaxAgeMonths: 1, Now: cal.Now}
	require.NoError(t, short.Admit(latest, false))
	require.Equal(t, billrun.ReasonPeriodTooOld, reason(short.Admit(latest.Previous(), false)))

	// At 2026-11-30T23:30Z November has ended in Berlin but not in UTC.
	at := time.Date(2026, time.November, 30, 23, 30, 0, 0, time.UTC)
	nov := billrun.Period{Year: 2026, Month: time.November}
	berlin := billrun.Calendar{Zone: mustZone(t, "Europe/Berlin"), Now: func() time.Time { return at }}
	utc := billrun.Calendar{Now: func() time.Time { return at }}
	require.NoError(t, berlin.Admit(nov, false))
	require.Equal(t, billrun.ReasonPeriodNotClosed, reason(utc.Admit(nov, false)))
	require.Equal(t, "2026-12", berlin.Current().String())
	require.Equal(t, "2026-11", utc.Current().String())
}

func kindAt(now time.Time, zone *time.Location) owned.Kind {
	return billrun.New(billrun.Config{Calendar: billrun.Calendar{Zone: zone, Now: func() time.Time { return now }}})
}

func decode(k owned.Kind, src job.Source, key, body string) (owned.Params, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &fields); err != nil {
		panic(err)
	}
	var kb []byte
	if key != "" {
		kb = []byte(key)
	}
	return k.Decode(owned.NewInput(src, kb, fields, src == job.SourceHTTP))
}

// Every transport decodes through the kind: the open month, a future one and
// an old one without force are rejected with their reasons; force and adjust
// come through as a Request.
func TestDecodeAdmitsClosedPeriodsOnly(t *testing.T) {
	t.Parallel()
	k := kindAt(time.Date(2026, time.December, 3, 7, 0, 0, 0, time.UTC), nil)
	cases := []struct {
		body   string
		reason string
		want   billrun.Request
	}{
		{`{"period":"2026-11"}`, "", billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}}},
		{`{"period":"2026-12"}`, billrun.ReasonPeriodNotClosed, billrun.Request{}},
		{`{"period":"2026-12","force":true}`, billrun.ReasonPeriodNotClosed, billrun.Request{}},
		{`{"period":"2999-12"}`, billrun.ReasonPeriodNotClosed, billrun.Request{}},
		{`{"period":"2024-12"}`, "", billrun.Request{Period: billrun.Period{Year: 2024, Month: time.December}}},
		{`{"period":"2024-11"}`, billrun.ReasonPeriodTooOld, billrun.Request{}},
		{`{"period":"2000-01","force":true}`, "", billrun.Request{Period: billrun.Period{Year: 2000, Month: time.January}, Force: true}},
		{`{"period":"2026-10","adjust":true}`, "", billrun.Request{Period: billrun.Period{Year: 2026, Month: time.October}, Adjust: true}},
		{`{"period":"2026-11","force":false}`, "", billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}}},
		{`{"period":"2026-11","force":"yes"}`, owned.ReasonMalformedJSON, billrun.Request{}},
	}
	for _, src := range []job.Source{job.SourceKafka, job.SourceHTTP} {
		for _, c := range cases {
			p, err := decode(k, src, "", c.body)
			if c.reason == "" {
				require.NoError(t, err, c.body)
				require.Equal(t, params(k, c.want), p, c.body)
				continue
			}
			require.Equal(t, c.reason, owned.RejectionOf(err).Reason, "%s %s: %v", src, c.body, err)
		}
	}
	key, fields, err := k.Encode(params(k, billrun.Request{Period: billrun.Period{Year: 2000, Month: time.January}, Force: true}))
	require.NoError(t, err)
	require.Equal(t, "2000-01", string(key))
	require.Equal(t, map[string]any{"period": "2000-01", "force": true}, fields)
	require.Equal(t, "billrun:2026-10", k.LockKey(params(k, billrun.Request{Period: billrun.Period{Year: 2026, Month: time.October}, Adjust: true})))
}

// The CLI's flags: the same rules (Decode's), errors that exit 64.
func TestFlagsAdmitClosedPeriodsOnly(t *testing.T) {
	t.Parallel()
	k := kindAt(time.Date(2026, time.December, 3, 7, 0, 0, 0, time.UTC), nil)
	parse := func(args ...string) (owned.Params, error) {
		fs := flag.NewFlagSet("run billrun", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		build := k.Flags(fs)
		require.NoError(t, fs.Parse(args))
		in, err := build(fs.Args())
		if err != nil {
			return owned.Params{}, err
		}
		return k.Decode(in)
	}
	p, err := parse("--period", "2026-11")
	require.NoError(t, err)
	require.Equal(t, params(k, billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}}), p)
	_, err = parse()
	require.Equal(t, billrun.ReasonMissingPeriod, owned.RejectionOf(err).Reason)
	for _, args := range [][]string{{"--period", "2026-12"}, {"--period", "2026-12", "--force"}, {"--period", "2999-12"}, {"--period", "2020-01"}} {
		_, err := parse(args...)
		require.ErrorIs(t, err, job.ErrBadInput, "%v", args)
	}
	p, err = parse("--period", "2020-01", "--force")
	require.NoError(t, err)
	require.Equal(t, params(k, billrun.Request{Period: billrun.Period{Year: 2020, Month: time.January}, Force: true}), p)
	p, err = parse("--period", "2026-11", "--adjust")
	require.NoError(t, err)
	require.Equal(t, params(k, billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}, Adjust: true}), p)
}

// The kind admits periods by its Config's calendar: its zone and age
// limit (internal/kinds maps COORDINATOR_BILLING_TZ and
// COORDINATOR_BILLRUN_MAX_AGE_MONTHS onto them).
func TestTheConfiguredZoneAndLimitDecide(t *testing.T) {
	t.Parallel()
	// 2026-11-30T23:30Z: closed in Berlin, open in UTC.
	now := time.Date(2026, time.November, 30, 23, 30, 0, 0, time.UTC)
	k := kindAt(now, nil)
	_, err := decode(k, job.SourceKafka, "", `{"period":"2026-11"}`)
	require.Equal(t, billrun.ReasonPeriodNotClosed, owned.RejectionOf(err).Reason)
	k = billrun.New(billrun.Config{Calendar: billrun.Calendar{Zone: mustZone(t, "Europe/Berlin"), MaxAgeMonths: 1,
		Now: func() time.Time { return now }}})
	_, err = decode(k, job.SourceKafka, "", `{"period":"2026-11"}`)
	require.NoError(t, err)
	_, err = decode(k, job.SourceKafka, "", `{"period":"2026-10"}`)
	require.Equal(t, billrun.ReasonPeriodTooOld, owned.RejectionOf(err).Reason)
}

// schedule opens k as a replica does and returns its schedule.
func schedule(t *testing.T, k owned.Kind) owned.Schedule {
	t.Helper()
	reg, err := owned.NewRegistry(k)
	require.NoError(t, err)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "r"})
	t.Cleanup(func() { _ = l.Close() })
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}})
	require.NoError(t, err)
	s := r.Schedules()
	require.Len(t, s, 1)
	return s[0]
}

// The schedule fires in the billing zone unless it names one, and a tick
// bills the month before the tick's, in the billing zone.
func TestScheduleAndTickUseTheBillingZone(t *testing.T) {
	t.Parallel()
	tokyo := mustZone(t, "Asia/Tokyo")
	k := billrun.New(billrun.Config{Schedule: "0 5 0 1 * *", Calendar: billrun.Calendar{Zone: tokyo}})
	s := schedule(t, k)
	require.Equal(t, "CRON_TZ=Asia/Tokyo 0 5 0 1 * *", s.Spec)
	// 00:05 on 1 December in Tokyo is still 30 November in UTC.
	p, err := s.Tick(time.Date(2026, time.November, 30, 15, 5, 0, 0, time.UTC))
	require.NoError(t, err)
	require.Equal(t, params(k, billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}}), p)

	s = schedule(t, billrun.New(billrun.Config{Schedule: "CRON_TZ=UTC 0 5 0 1 * *", Calendar: billrun.Calendar{Zone: tokyo}}))
	require.Equal(t, "CRON_TZ=UTC 0 5 0 1 * *", s.Spec, "a spec naming its zone is kept")
}
