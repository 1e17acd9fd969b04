package main

import (
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

// screenshot is where TestStatusPageInBrowser also writes its screenshot:
// `go test ./cmd/sharelimit -run TestStatusPageInBrowser -screenshot
// ../../docs/status-page.png` refreshes the README's.
var screenshot = flag.String("screenshot", "", "also write the status page's screenshot to this file")

// chromium is the browser the test drives: Debian's chromium, which `make
// test` installs, or SHARELIMIT_CHROMIUM. A machine without it fails the
// test rather than skipping it, so CI never passes without the browser.
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv("SHARELIMIT_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := exec.LookPath(path); err != nil {
		t.Fatalf("no Chromium at %s (make deps installs Debian's chromium; SHARELIMIT_CHROMIUM names another): %v", path, err)
	}
	return path
}

// TestStatusPageInBrowser starts the real binary, drives some traffic and
// some over-limit traffic over gRPC, and loads the status page in headless
// Chromium: the rules show human units, every rule has a sparkline, the
// rejected rule's over-limit series is not zero, a descriptor value with
// markup shows as text, nothing is loaded from anywhere but the daemon, and
// the console has no error (a CSP violation would be one).
func TestStatusPageInBrowser(t *testing.T) {
	exe := chromium(t)
	config := t.TempDir()
	for _, f := range []string{"edge.yaml", "messaging.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../examples/config", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(config, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, "--config-dir", config, "--replicas", "3", "--join-ramp", "0")
	r := dial(t, d)
	if *screenshot != "" {
		// For the README: some minutes' worth of history, with a reload.
		traffic(t, r, config, 45*time.Second)
	}
	for i := range 40 {
		r.ask("10.0.0." + strconv.Itoa(i%4)) // 50 a second over 3: mostly OK
	}
	// 5 a day over 3 replicas: one each, then over limit. One value is
	// markup, as a hostile client would send it.
	for _, v := range []string{"+15550001", "+15550002", "<script>document.title='pwned'</script>"} {
		for range 9 {
			if _, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*commonv3.RateLimitDescriptor{{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: v}}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	origin := "http://" + d.httpAddr
	resp, err := http.Get(origin + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}

	start := time.Now()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	// Subscribe before the navigation: the subscriptions queue what comes
	// before the loops below read it.
	var mu sync.Mutex
	var requests, problems []string
	var readers sync.WaitGroup
	sent := chromedp.Events(ctx, network.RequestWillBeSent)
	console := chromedp.Console(ctx)
	readers.Add(2)
	go func() {
		defer readers.Done()
		for ev, err := range sent {
			if err != nil {
				return
			}
			mu.Lock()
			requests = append(requests, ev.Request.URL)
			mu.Unlock()
		}
	}()
	go func() {
		defer readers.Done()
		for m, err := range console {
			if err != nil {
				return
			}
			// A CSP violation is a console error; so is a resource that
			// failed to load.
			if m.Type == chromedp.ConsoleException || m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.Type == "assert" {
				mu.Lock()
				problems = append(problems, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(origin+"/"), chromedp.WaitVisible(chromedp.ID("rules"))); err != nil {
		t.Fatalf("chromium: %v\n%s", err, d.logs.String())
	}
	title := browse(t, ctx, chromedp.Title())
	rules := browse(t, ctx, chromedp.Text(chromedp.ID("rules")))
	overlimit := browse(t, ctx, chromedp.Text(chromedp.ID("overlimit")))
	sparks := browse(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("svg.spark").length`))
	scripts := browse(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("script").length`))
	svgRules := browse(t, ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("svg.spark")).map(s => s.dataset.rule).join(" ")`))
	over := browse(t, ctx, chromedp.AttributeValue(chromedp.CSS(`svg.spark[data-rule="messaging.message_type_marketing.to_number"] path.over`), "data-total"))
	overTotal := over.Value
	png := browse(t, ctx, chromedp.FullScreenshot(100))
	// Let the page settle, so that a late request or error is seen too.
	time.Sleep(500 * time.Millisecond)
	cancel()
	readers.Wait()
	t.Logf("Chromium loaded, read and photographed the page in %.1f s", time.Since(start).Seconds())

	// The artefact stays after the test: in SHARELIMIT_ARTEFACTS, or in
	// the repository's bin/ (ignored by git).
	dir := os.Getenv("SHARELIMIT_ARTEFACTS")
	if dir == "" {
		dir = "../../bin/artefacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status-page.png")
	for _, p := range []string{shot, *screenshot} {
		if p == "" {
			continue
		}
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}

	if title != "sharelimit status" {
		t.Errorf("title %q: a descriptor value ran as script?", title)
	}
	for _, want := range []string{"16.7 per second", "1.67 per day", "33.3 per day", "333 per second"} {
		if !strings.Contains(rules, want) {
			t.Errorf("the rules table lacks %q:\n%s", want, rules)
		}
	}
	// Every rule has one, the unlimited one too: as many as /rlconfig has.
	var c server.RLConfig
	if err := json.Unmarshal([]byte(testutil.GetText(t, origin+"/rlconfig?format=json")), &c); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range c.Rules {
		want = append(want, r.Rule)
	}
	if sparks != len(c.Rules) || svgRules != strings.Join(want, " ") {
		t.Errorf("%d sparklines for rules %s, want one for each of %v", sparks, svgRules, want)
	}
	if n, err := strconv.Atoi(overTotal); err != nil || n < 20 {
		t.Errorf("over-limit series of the rejected rule totals %q, want the 24 rejections", overTotal)
	}
	if scripts != 0 {
		t.Errorf("%d script elements on the page", scripts)
	}
	if !strings.Contains(overlimit, "<script>document.title='pwned'</script>") {
		t.Errorf("the over-limit samples do not show the value as text:\n%s", overlimit)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(requests) == 0 {
		t.Error("no network request recorded: the listener saw nothing")
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, origin+"/") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the page loaded %s, not from the daemon", u)
		}
	}
	for _, p := range problems {
		t.Errorf("browser console: %s", p)
	}
	t.Logf("requests: %v", requests)
}

// browse runs one chromedp action and fails the test on an error.
func browse[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return v
}

// traffic sends a steady load for a while, with bursts past the limits, and
// reloads the config half-way, so the sparklines have something to show.
func traffic(t *testing.T, r *rls, config string, d time.Duration) {
	t.Helper()
	start := time.Now()
	reloaded := false
	for i := 0; time.Since(start) < d; i++ {
		n := 2 // 10 a second for each address, under its share of 16.7
		if (i/50)%3 == 2 {
			n = 8 // 5 s of 40 a second in every 15 s: over it
		}
		for j := range n {
			r.ask("10.0.1." + strconv.Itoa(j%2))
		}
		if !reloaded && time.Since(start) > d/2 {
			f, err := os.OpenFile(filepath.Join(config, "edge.yaml"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("# touched\n")
			f.Close()
			reloaded = true
		}
		time.Sleep(100 * time.Millisecond)
	}
}
