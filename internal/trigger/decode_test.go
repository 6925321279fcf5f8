package trigger_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/trigger"
)

func TestDecodeBillRun(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, key, value string
		want             trigger.Request
		reason           string
	}{
		{name: "full", key: "2026-11", value: `{"period":"2026-11","request_id":"r-1","requested_by":"ops"}`,
			want: trigger.Request{Period: "2026-11", RequestID: "r-1", RequestedBy: "ops"}},
		{name: "no key", value: `{"period":"2026-11"}`, want: trigger.Request{Period: "2026-11"}},
		{name: "unknown fields ignored", value: ` {"period":"2026-11","priority":3} `, want: trigger.Request{Period: "2026-11"}},
		{name: "not json", value: `period=2026-11`, reason: trigger.ReasonMalformedJSON},
		{name: "truncated", value: `{"period":"2026-11"`, reason: trigger.ReasonMalformedJSON},
		{name: "array", value: `["2026-11"]`, reason: trigger.ReasonMalformedJSON},
		{name: "empty", value: ``, reason: trigger.ReasonMalformedJSON},
		{name: "null", value: `null`, reason: trigger.ReasonMalformedJSON},
		{name: "trailing", value: `{"period":"2026-11"}{}`, reason: trigger.ReasonMalformedJSON},
		{name: "wrong type", value: `{"period":202611}`, reason: trigger.ReasonMalformedJSON},
		{name: "bad utf8", value: "{\"period\":\"2026-11\",\"requested_by\":\"\xff\"}", reason: trigger.ReasonMalformedJSON},
		{name: "missing period", value: `{"request_id":"x"}`, reason: trigger.ReasonMissingPeriod},
		{name: "empty period", value: `{"period":""}`, reason: trigger.ReasonMissingPeriod},
		{name: "month 13", value: `{"period":"2026-13"}`, reason: trigger.ReasonBadPeriod},
		{name: "year 1999", value: `{"period":"1999-12"}`, reason: trigger.ReasonBadPeriod},
		{name: "format", value: `{"period":"2026/11"}`, reason: trigger.ReasonBadPeriod},
		{name: "key mismatch", key: "2026-10", value: `{"period":"2026-11"}`, reason: trigger.ReasonKeyMismatch},
		{name: "empty request id", value: `{"period":"2026-11","request_id":""}`, reason: trigger.ReasonBadRequestID},
		{name: "request id spaces", value: `{"period":"2026-11","request_id":"a b"}`, reason: trigger.ReasonBadRequestID},
		{name: "request id long", value: `{"period":"2026-11","request_id":"` + strings.Repeat("a", 129) + `"}`, reason: trigger.ReasonBadRequestID},
		{name: "requester control char", value: `{"period":"2026-11","requested_by":"a\u0007"}`, reason: trigger.ReasonBadRequester},
		{name: "too large", value: `{"period":"2026-11","pad":"` + strings.Repeat("x", 64<<10) + `"}`, reason: trigger.ReasonTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := trigger.DecodeBillRun([]byte(tc.key), []byte(tc.value), 0)
			if tc.reason == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			var re *trigger.RejectError
			require.ErrorAs(t, err, &re)
			require.Equal(t, tc.reason, re.Reason, re.Detail)
			require.NotEmpty(t, re.Detail)
			require.ErrorIs(t, err, job.ErrBadInput)
		})
	}
}

func TestDecodeReaper(t *testing.T) {
	t.Parallel()
	got, err := trigger.DecodeReaper([]byte(`{"request_id":"s-1","requested_by":"cron-ops"}`), 0)
	require.NoError(t, err)
	require.Equal(t, trigger.Request{RequestID: "s-1", RequestedBy: "cron-ops"}, got)
	got, err = trigger.DecodeReaper([]byte(`{}`), 0)
	require.NoError(t, err)
	require.Equal(t, trigger.Request{}, got)
	_, err = trigger.DecodeReaper([]byte(`sweep please`), 0)
	require.ErrorIs(t, err, job.ErrBadInput)
	_, err = trigger.DecodeReaper([]byte(`{"request_id":"s-1"}`), 5)
	var re *trigger.RejectError
	require.ErrorAs(t, err, &re)
	require.Equal(t, trigger.ReasonTooLarge, re.Reason)
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
func checkDecoded(t *testing.T, req trigger.Request, err error, billRun bool) {
	if err != nil {
		var re *trigger.RejectError
		if !errors.As(err, &re) || re.Reason == "" || re.Detail == "" {
			t.Fatalf("rejection without a reason: %v", err)
		}
		if !errors.Is(err, job.ErrBadInput) {
			t.Fatalf("rejection does not match job.ErrBadInput: %v", err)
		}
		return
	}
	if billRun && (len(req.Period) != 7 || req.Period < "2000-01" || req.Period > "2999-12") {
		t.Fatalf("accepted period %q", req.Period)
	}
	if len(req.RequestID) > 128 || len(req.RequestedBy) > 128 {
		t.Fatalf("accepted oversized ids: %+v", req)
	}
}

func FuzzDecodeBillRun(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.key), []byte(s.value))
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		req, err := trigger.DecodeBillRun(key, value, 1024)
		checkDecoded(t, req, err, true)
		if err == nil && len(key) > 0 && string(key) != req.Period {
			t.Fatalf("accepted key %q for period %q", key, req.Period)
		}
	})
}

func FuzzDecodeReaper(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.value))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		req, err := trigger.DecodeReaper(value, 1024)
		checkDecoded(t, req, err, false)
	})
}
