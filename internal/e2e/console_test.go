package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// EnvScreenshots names a directory the console test writes a PNG of each
// page into (docs/console.md's screenshots: COORDINATOR_CONSOLE_SCREENSHOTS=docs/console).
const EnvScreenshots = "COORDINATOR_CONSOLE_SCREENSHOTS"

// browser starts headless Chromium (Debian's chromium, which
// scripts/services installs; the test fails, never skips, without it) with
// a fresh profile, and returns a context for its first tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	bin := testenv.Chromium(t)
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // CI runs as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		// Nothing of its own on the network (a closed network refuses it).
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		// Background tabs keep running (the live tail is in one).
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// shot writes a screenshot of the tab's page as name.png when
// COORDINATOR_CONSOLE_SCREENSHOTS is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		return
	}
	png := get(t, ctx, 20*time.Second, chromedp.CaptureScreenshot())
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// tab runs steps in a tab under a bound.
func tab(t *testing.T, ctx context.Context, within time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	require.NoError(t, chromedp.Do(c, steps...))
}

// eventuallyPage loads url until predicate (JavaScript) holds on it: the
// page is rendered on the server from tables other replicas write.
func eventuallyPage(t *testing.T, ctx context.Context, url, predicate string, within time.Duration) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(c, chromedp.Do(cctx, chromedp.Navigate(url)))
		v, err := chromedp.Run(cctx, chromedp.Evaluate[bool](predicate))
		require.NoError(c, err)
		if !v {
			text, _ := chromedp.Run(cctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
			require.True(c, v, "%s: %s; the page:\n%s", url, predicate, text)
		}
	}, within, 500*time.Millisecond)
}

// get runs one action in a tab under a bound and returns its value.
func get[T any](t *testing.T, ctx context.Context, within time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	v, err := chromedp.Run(c, a)
	require.NoError(t, err)
	return v
}

func location(t *testing.T, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, 10*time.Second, chromedp.Location())
}

// poll waits for a JavaScript predicate.
func poll(expr string, opts ...chromedp.PollOption) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, opts...)
}

// TestConsoleInABrowser drives the console in headless Chromium against
// two replicas (processes of the built binary) on the real Redis, Postgres
// and Kafka: log in, start a slowed bill run from the console, see its
// ownership.acquired on the other replica's live tail within 2 s, watch its
// progress bar advance, start it again from the other replica and read
// already_owned naming the owner, open the run's page after completion
// with the events of both replicas, log out and be refused.
func TestConsoleInABrowser(t *testing.T) {
	d := newDeployment(t, "")
	const subscribers = 4000 // 40 batches of 100
	period := monthsAgo(1)
	key := "billrun:" + period
	d.seedSubscribers(subscribers, period)
	extra := map[string]string{
		// 40 batches, 2 workers, 400 ms each: about 8 s of run to watch.
		"COORDINATOR_TEST_BILLRUN_BATCH_DELAY":   "400ms",
		"COORDINATOR_BILLRUN_WORKERS":            "2",
		"COORDINATOR_CONSOLE_HEARTBEAT_INTERVAL": "500ms",
		"COORDINATOR_REAPER_SCHEDULE":            "",
	}
	r1 := d.start("r1", extra)
	r2 := d.start("r2", extra)
	ui1, ui2 := "http://"+r1.addr, "http://"+r2.addr

	tabA := browser(t)
	// Without a session: the login form, nothing else.
	tab(t, tabA, 20*time.Second, chromedp.Navigate(ui1+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#token`)))
	require.Equal(t, ui1+"/ui/login", location(t, tabA))
	shot(t, tabA, "login")
	tab(t, tabA, 20*time.Second,
		chromedp.SendKeys(chromedp.CSS(`#token`), d.token),
		chromedp.Click(chromedp.CSS(`#login`)),
		chromedp.WaitVisible(chromedp.CSS(`#replicas`)))
	require.Equal(t, ui1+"/ui/", location(t, tabA))
	// Both replicas' heartbeats, up.
	eventuallyPage(t, tabA, ui1+"/ui/", `document.querySelectorAll('#replicas tbody tr.up').length === 2`, 20*time.Second)

	// The other replica's live tail, in a second tab of the same browser
	// (the session is in Postgres: any replica knows it).
	tabB, cancelB := chromedp.NewContext(tabA)
	defer cancelB()
	require.NoError(t, chromedp.Do(tabB), "open a second tab") // its first run has no timeout: the tab lives with it
	tab(t, tabB, 20*time.Second, chromedp.Navigate(ui2+"/ui/events"),
		chromedp.WaitVisible(chromedp.CSS(`#events`)),
		poll(`document.getElementById('live-state').textContent.indexOf('Live') === 0`))

	// The other replica's overview, loaded before the run starts: the run
	// gets its row and bar there live, without a reload.
	tabC, cancelC := chromedp.NewContext(tabA)
	defer cancelC()
	require.NoError(t, chromedp.Do(tabC), "open a third tab")
	tab(t, tabC, 20*time.Second, chromedp.Navigate(ui2+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#inflight`)))
	require.True(t, get(t, tabC, 5*time.Second, chromedp.Evaluate[bool](`(window.loadedBeforeTheRun = true)`)))
	newRow := fmt.Sprintf(`document.querySelector('#inflight tr[data-key="%s"] progress')`, key)
	require.False(t, get(t, tabC, 5*time.Second, chromedp.Evaluate[bool](newRow+` !== null`)))

	// Start the bill run from replica r1's console.
	tab(t, tabA, 10*time.Second, chromedp.SendKeys(chromedp.CSS(`#action-field`), period))
	start := time.Now()
	tab(t, tabA, 20*time.Second, chromedp.Click(chromedp.CSS(`#trigger`)), chromedp.WaitVisible(chromedp.CSS(`#answer`)))
	status := get(t, tabA, 5*time.Second, chromedp.AttributeValue(chromedp.CSS(`#answer`), "data-status"))
	require.Equal(t, "202", status.Value, "the API's answer to the first trigger")
	// Its ownership.acquired, emitted by r1, on r2's live tail within 2 s
	// of the click (this bound is the behaviour under test).
	acquired := fmt.Sprintf(`tr[data-type="ownership.acquired"] a[href="/ui/runs/billrun/%s"]`, period)
	tab(t, tabB, 2*time.Second-time.Since(start), chromedp.WaitVisible(chromedp.CSS(acquired)))
	t.Logf("ownership.acquired on the other replica's tail %s after the click", time.Since(start).Round(time.Millisecond))
	owner := get(t, tabB, 5*time.Second, chromedp.Text(chromedp.CSS(`#events tbody tr[data-type="ownership.acquired"] td:nth-child(4)`)))
	require.Equal(t, "r1", owner)
	shot(t, tabB, "events")
	tab(t, tabC, 20*time.Second, poll(newRow+` !== null && window.loadedBeforeTheRun === true`))
	runLink := get(t, tabC, 5*time.Second, chromedp.AttributeValue(chromedp.CSS(fmt.Sprintf(`#inflight tr[data-key="%s"] a`, key)), "href"))
	require.Equal(t, "/ui/runs/billrun/"+period, runLink.Value, "the new row links to the run's page")
	cancelC()

	// The progress bar of the run in flight advances, live.
	tab(t, tabA, 10*time.Second, chromedp.Navigate(ui1+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#inflight`)))
	bar := fmt.Sprintf(`document.querySelector('#inflight tr[data-key="%s"] progress')`, key)
	tab(t, tabA, 20*time.Second, poll(bar+` !== null && `+bar+`.value > 0`))
	first := get(t, tabA, 5*time.Second, chromedp.Evaluate[float64](bar+`.value`))
	tab(t, tabA, 20*time.Second, poll(bar+`.value > `+strconv.FormatFloat(first+5, 'f', 1, 64)))
	later := get(t, tabA, 5*time.Second, chromedp.Evaluate[float64](bar+`.value`))
	require.Greater(t, later, first, "the progress bar advances without a reload")
	require.Less(t, first, 100.0)
	t.Logf("progress bar: %.1f%% then %.1f%%", first, later)
	shot(t, tabA, "overview")
	tab(t, tabA, 10*time.Second, chromedp.Navigate(ui1+"/ui/locks?kind=billrun"), chromedp.WaitVisible(chromedp.CSS(`#locks`)))
	locks := get(t, tabA, 5*time.Second, chromedp.Text(chromedp.CSS(`#locks tbody`)))
	require.Contains(t, locks, key)
	require.Contains(t, locks, "r1")
	shot(t, tabA, "locks")

	// The same period again, from the other replica's console: the API's
	// already_owned, naming the owner.
	tab(t, tabB, 20*time.Second, chromedp.Navigate(ui2+"/ui/"),
		chromedp.SendKeys(chromedp.CSS(`#action-field`), period),
		chromedp.Click(chromedp.CSS(`#trigger`)),
		chromedp.WaitVisible(chromedp.CSS(`#answer`)))
	status = get(t, tabB, 5*time.Second, chromedp.AttributeValue(chromedp.CSS(`#answer`), "data-status"))
	answer := get(t, tabB, 5*time.Second, chromedp.Text(chromedp.CSS(`#answer-owner`)))
	require.Equal(t, "409", status.Value)
	require.Equal(t, "already_owned: owner r1", answer)
	shot(t, tabB, "answer")

	// After completion: the run's page, with its batches over time and
	// every event about it, of both replicas, in order.
	require.Eventually(t, func() bool {
		code, body := r1.get(t, d.token, "/v1/billruns/"+period)
		return code == http.StatusOK && strings.Contains(string(body), `"status":"COMPLETED"`)
	}, 60*time.Second, 200*time.Millisecond)
	eventuallyPage(t, tabB, ui2+"/ui/runs/billrun/"+period, `!!document.querySelector('article.attempt .completed') &&
		Array.prototype.some.call(document.querySelectorAll('#run-events td:nth-child(2)'), function(td){ return td.textContent === 'ownership.released'; })`,
		30*time.Second)
	types := get(t, tabB, 5*time.Second, chromedp.Evaluate[[]string](
		`Array.prototype.map.call(document.querySelectorAll('#run-events tbody tr td:nth-child(2)'), function(td){return td.textContent})`))
	replicas := get(t, tabB, 5*time.Second, chromedp.Evaluate[[]string](
		`Array.prototype.map.call(document.querySelectorAll('#run-events tbody tr td:nth-child(3)'), function(td){return td.textContent})`))
	require.Equal(t, "ownership.acquired", types[0])
	require.Contains(t, types, "run.completed")
	require.Contains(t, types, "ownership.already_owned")
	require.Equal(t, "ownership.released", types[len(types)-1])
	require.Contains(t, replicas, "r2", "the other replica's already_owned is on the page")
	points := get(t, tabB, 5*time.Second, chromedp.AttributeValue(chromedp.CSS(`svg.timeline polyline`), "points"))
	require.Greater(t, strings.Count(points.Value, ","), 3, "a timeline of batches")
	shot(t, tabB, "run")
	tab(t, tabB, 10*time.Second, chromedp.Navigate(ui2+"/ui/runs/billrun"), chromedp.WaitVisible(chromedp.CSS(`#runs`)))
	history := get(t, tabB, 5*time.Second, chromedp.Text(chromedp.CSS(`#runs tbody`)))
	require.Contains(t, history, period)
	require.Contains(t, history, "completed")
	shot(t, tabB, "runs")

	// Log out: the session is gone on every replica.
	tab(t, tabA, 10*time.Second, chromedp.Navigate(ui1+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#logout`)),
		chromedp.Click(chromedp.CSS(`#logout`)), chromedp.WaitVisible(chromedp.CSS(`#token`)))
	for _, ui := range []string{ui1, ui2} {
		tab(t, tabA, 10*time.Second, chromedp.Navigate(ui+"/ui/runs/billrun/"+period), chromedp.WaitVisible(chromedp.CSS(`#token`)))
		require.Equal(t, ui+"/ui/login", location(t, tabA), "refused after logout")
	}
	streamStatus := get(t, tabA, 10*time.Second, chromedp.Evaluate[int](`fetch('/ui/stream').then(function(r){return r.status})`,
		chromedp.EvalAwaitPromise))
	require.Equal(t, http.StatusUnauthorized, streamStatus)
	// The token typed into the login form is in no replica's log.
	require.Contains(t, strings.Join(r1.logLines(), "\n"), `"msg":"console_login"`)
	for _, r := range []*replica{r1, r2} {
		require.NotContains(t, strings.Join(r.logLines(), "\n"), d.token)
	}
}
