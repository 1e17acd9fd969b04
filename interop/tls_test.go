package interop

import (
	"strings"
	"testing"
	"time"
)

// TestTLS: the daemon serves gRPC over TLS (--grpc-tls-cert, -key) with a
// self-signed certificate, which each client is given as its CA. C-core,
// grpc-js and curl negotiate h2 by ALPN and get the same answers as in
// clear text; h2load sends interleaved large requests over TLS.
func TestTLS(t *testing.T) {
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, client := range grpcClients {
			t.Run(client, func(t *testing.T) {
				reqs, wants := answerCases("tls-" + client + "-")
				var cs []call
				for _, r := range reqs {
					cs = append(cs, one(r))
				}
				p := plan{Target: "localhost:" + port(d.grpcAddr), CA: d.tls.cert, Steps: []step{calls(false, cs...)}}
				expect(t, client, runPlan(t, client, p, time.Minute).results(t, 0), wants)
			})
		}
		t.Run(curl, func(t *testing.T) {
			url := "https://localhost:" + port(d.grpcAddr) + rlsPath
			resolve := "localhost:" + port(d.grpcAddr) + ":127.0.0.1"
			r := rq(ds("user", "tls-curl"))
			got := curlCall(t, url, r, "--cacert", d.tls.cert, "--resolve", resolve)
			if m := answered(codeOK, okRemaining(9, perDay(10))).mismatch(got); m != "" {
				t.Errorf("curl over TLS: %s", m)
			}
			// ALPN: curl says what the server chose.
			_, stderr, err := runTool(t, stall, nil, "curl", "-sS", "-v", "-o", "/dev/null", "--http2",
				"--cacert", d.tls.cert, "--resolve", resolve, "--data-binary", "@"+writeBody(t, r.body()),
				"-H", "content-type: application/grpc", "-H", "te: trailers", url)
			if err != nil {
				t.Fatalf("curl -v: %v\n%s", err, stderr)
			}
			if !strings.Contains(stderr, "ALPN: server accepted h2") {
				t.Errorf("curl did not negotiate h2 by ALPN:\n%s", clip(stderr, 3000))
			}
		})
		t.Run(h2load, func(t *testing.T) {
			r20k, _ := largeRequest(5)
			before := d.decided()
			run := runH2load(t, stall, r20k.body(), "-n", "200", "-c", "1", "-m", "100",
				"https://localhost:"+port(d.grpcAddr)+rlsPath)
			run.allSucceeded(t, 200)
			if !strings.Contains(run.out, "Application protocol: h2") {
				t.Errorf("h2load did not negotiate h2:\n%s", run.out)
			}
			if got := d.decided() - before; got != 200 {
				t.Errorf("the daemon decided %d requests, want 200", got)
			}
		})
	}, withTLS())
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
