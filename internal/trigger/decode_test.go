package trigger_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/trigger"
)

var (
	bills = testBills()
	nov   = billParams(billrun.Request{Period: billrun.Period{Year: 2026, Month: time.November}})
)

// billParams are the Params of a bill run of bills.
func billParams(r billrun.Request) owned.Params {
	p, err := owned.NewParams(bills, r)
	if err != nil {
		panic(err)
	}
	return p
}

func TestDecodeRecord(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, key, value string
		want             trigger.Request
		reason           string
	}{
		{name: "full", key: "2026-11", value: `{"period":"2026-11","request_id":"r-1","requested_by":"ops"}`,
			want: trigger.Request{Params: nov, RequestID: "r-1", RequestedBy: "ops"}},
		{name: "no key", value: `{"period":"2026-11"}`, want: trigger.Request{Params: nov}},
		{name: "unknown fields ignored", value: ` {"period":"2026-11","priority":3} `, want: trigger.Request{Params: nov}},
		{name: "not json", value: `period=2026-11`, reason: owned.ReasonMalformedJSON},
		{name: "truncated", value: `{"period":"2026-11"`, reason: owned.ReasonMalformedJSON},
		{name: "array", value: `["2026-11"]`, reason: owned.ReasonMalformedJSON},
		{name: "empty", value: ``, reason: owned.ReasonMalformedJSON},
		{name: "null", value: `null`, reason: owned.ReasonMalformedJSON},
		{name: "trailing", value: `{"period":"2026-11"}{}`, reason: owned.ReasonMalformedJSON},
		{name: "wrong type", value: `{"period":202611}`, reason: owned.ReasonMalformedJSON},
		{name: "bad utf8", value: "{\"period\":\"2026-11\",\"requested_by\":\"\xff\"}", reason: owned.ReasonMalformedJSON},
		{name: "missing period", value: `{"request_id":"x"}`, reason: billrun.ReasonMissingPeriod},
		{name: "empty period", value: `{"period":""}`, reason: billrun.ReasonMissingPeriod},
		{name: "month 13", value: `{"period":"2026-13"}`, reason: billrun.ReasonBadPeriod},
		{name: "year 1999", value: `{"period":"1999-12"}`, reason: billrun.ReasonBadPeriod},
		{name: "format", value: `{"period":"2026/11"}`, reason: billrun.ReasonBadPeriod},
		{name: "key mismatch", key: "2026-10", value: `{"period":"2026-11"}`, reason: billrun.ReasonKeyMismatch},
		{name: "duplicate member", value: `{"period":"2026-11","period":"2026-10"}`, reason: owned.ReasonDuplicateKey},
		{name: "duplicate envelope member", value: `{"period":"2026-11","requested_by":"a","requested_by":"b"}`, reason: owned.ReasonDuplicateKey},
		{name: "duplicate nested member", value: `{"period":"2026-11","meta":{"a":1,"a":2}}`, reason: owned.ReasonDuplicateKey},
		{name: "same name in two objects", value: `{"period":"2026-11","x":{"a":1},"y":{"a":1}}`, want: trigger.Request{Params: nov}},
		{name: "open period", key: "2026-12", value: `{"period":"2026-12"}`, reason: billrun.ReasonPeriodNotClosed},
		{name: "open period forced", value: `{"period":"2026-12","force":true}`, reason: billrun.ReasonPeriodNotClosed},
		{name: "future period", value: `{"period":"2999-12"}`, reason: billrun.ReasonPeriodNotClosed},
		{name: "too old", value: `{"period":"2020-01"}`, reason: billrun.ReasonPeriodTooOld},
		{name: "forced", value: `{"period":"2020-01","force":true}`, want: trigger.Request{Params: billParams(billrun.Request{Period: billrun.Period{Year: 2020, Month: time.January}, Force: true})}},
		{name: "empty request id", value: `{"period":"2026-11","request_id":""}`, reason: owned.ReasonBadRequestID},
		{name: "request id spaces", value: `{"period":"2026-11","request_id":"a b"}`, reason: owned.ReasonBadRequestID},
		{name: "request id long", value: `{"period":"2026-11","request_id":"` + strings.Repeat("a", 129) + `"}`, reason: owned.ReasonBadRequestID},
		{name: "requester control char", value: `{"period":"2026-11","requested_by":"a\u0007"}`, reason: owned.ReasonBadRequester},
		{name: "too large", value: `{"period":"2026-11","pad":"` + strings.Repeat("x", 64<<10) + `"}`, reason: owned.ReasonTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := trigger.DecodeRecord(bills, []byte(tc.key), []byte(tc.value), 0)
			if tc.reason == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			var re *owned.RejectError
			require.ErrorAs(t, err, &re)
			require.Equal(t, tc.reason, re.Reason, re.Detail)
			require.NotEmpty(t, re.Detail)
			require.ErrorIs(t, err, job.ErrBadInput)
			// Listed, so its DLQ counter exists at 0 before the first rejection.
			require.Contains(t, append(owned.SharedRejectReasons(), bills.RejectReasons()...), re.Reason)
		})
	}
}

func TestDecodeRecordEnvelopeOfAnotherKind(t *testing.T) {
	t.Parallel()
	wd := &ownedtest.Widget{}
	w := wd.Kind()
	got, err := trigger.DecodeRecord(w, nil, []byte(`{"n":2,"request_id":"s-1","requested_by":"cron-ops","other":1}`), 0)
	require.NoError(t, err)
	require.Equal(t, trigger.Request{Params: wd.Params(2), RequestID: "s-1", RequestedBy: "cron-ops"}, got)
	got, err = trigger.DecodeRecord(w, nil, []byte(`{"n":1,"request_id":null}`), 0)
	require.NoError(t, err)
	require.Equal(t, trigger.Request{Params: wd.Params(1)}, got, "null is absent")
	for value, reason := range map[string]string{
		`sweep please`:           owned.ReasonMalformedJSON,
		`{"n":0}`:                "bad_n",
		`{"n":1,"request_id":7}`: owned.ReasonMalformedJSON,
		`{"n":"x"}`:              owned.ReasonMalformedJSON,
	} {
		_, err = trigger.DecodeRecord(w, nil, []byte(value), 0)
		require.ErrorIs(t, err, job.ErrBadInput, value)
		require.Equal(t, reason, owned.RejectionOf(err).Reason, value)
	}
	_, err = trigger.DecodeRecord(w, nil, []byte(`{"n":1}`), 5)
	require.Equal(t, owned.ReasonTooLarge, owned.RejectionOf(err).Reason)
}

var fuzzSeeds = []struct{ key, value string }{
	{"2026-11", `{"period":"2026-11","request_id":"r-1","requested_by":"ops"}`},
	{"", `{"period":"2026-11"}`},
	{"2026-10", `{"period":"2026-11"}`},
	{"", `{"period":"2026-13"}`},
	{"", `{"period":"0000-00"}`},
	{"", `{"period":null,"request_id":null}`},
	{"", `{"period":"2026-11","request_id":""}`},
	{"", `{"period":"2026-11"`},
	{"", `[]`},
	{"", ``},
	{"", `{"request_id":"\u0000"}`},
	{"", "{\"requested_by\":\"\xc3\x28\"}"},
	{"x", `{"period":"2026-11"} trailing`},
	{"", `{"period":"٢٠٢٦-١١"}`},
}

// checkDecoded is what every fuzz input must satisfy: no panic (the fuzzer
// checks), and either a valid request or a rejection with a reason.
func checkDecoded(t *testing.T, req trigger.Request, err error) {
	if err != nil {
		var re *owned.RejectError
		if !errors.As(err, &re) || re.Reason == "" || re.Detail == "" {
			t.Fatalf("rejection without a reason: %v", err)
		}
		if !errors.Is(err, job.ErrBadInput) {
			t.Fatalf("rejection does not match job.ErrBadInput: %v", err)
		}
		return
	}
	_, id, _ := strings.Cut(bills.LockKey(req.Params), ":")
	if p, err := billrun.ParsePeriod(id); err != nil || !p.Valid() {
		t.Fatalf("accepted params locking %q", bills.LockKey(req.Params))
	}
	if len(req.RequestID) > 128 || len(req.RequestedBy) > 128 {
		t.Fatalf("accepted oversized ids: %+v", req)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.key), []byte(s.value))
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		req, err := trigger.DecodeRecord(bills, key, value, 1024)
		checkDecoded(t, req, err)
		if err == nil && len(key) > 0 && "billrun:"+string(key) != bills.LockKey(req.Params) {
			t.Fatalf("accepted key %q for period %v", key, req.Params)
		}
	})
}
