package membership

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// FuzzDecodeHealth feeds arbitrary bodies and X-Consul-Index headers through
// the real path of one poll: the api client's decoding, the counting and
// weighing, and the publishing of a view. Nothing may panic, and any view published must make
// sense.
func FuzzDecodeHealth(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds in testdata (%v)", err)
	}
	for _, file := range files {
		if st, err := os.Stat(file); err != nil || st.IsDir() {
			continue // testdata/fuzz holds the fuzzer's own corpus
		}
		body, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body, "10")
	}
	f.Add([]byte("[]"), "0")
	f.Add([]byte("[]"), "-1")
	f.Add([]byte("[]"), "18446744073709551616")

	type answer struct {
		body  []byte
		index string
	}
	var current atomic.Pointer[answer]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := current.Load()
		w.Header().Set("X-Consul-Index", a.index)
		w.Write(a.body)
	}))
	f.Cleanup(srv.Close)
	tr := &http.Transport{}
	f.Cleanup(tr.CloseIdleConnections)
	client, err := api.NewClient(&api.Config{
		Address:    strings.TrimPrefix(srv.URL, "http://"),
		Scheme:     "http",
		HttpClient: &http.Client{Transport: tr},
	})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, body []byte, index string) {
		if strings.ContainsAny(index, "\r\n\x00") {
			return // not a header value net/http would send
		}
		current.Store(&answer{body: body, index: index})
		c, err := NewConsul(ConsulConfig{Service: "web", Node: "node-a", Replicas: 3, MaxInstances: 1 << 30}, client)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := c.poll(ctx, "node-a", true)
		if err != nil {
			c.fail(ctx, err, 0)
			if v := c.View(); v.Total != 3 || v.Errors != 1 || v.LastError == "" {
				t.Fatalf("after an error the view is %+v; want the --replicas view with the error", v)
			}
			return
		}
		c.observe("node-a", a)
		v := c.View()
		if v.Total < 0 || v.Local < 0 || v.Local > v.Total || v.Weight <= 0 || v.Weight > 1 ||
			v.LocalWeight < v.Local || v.TotalWeight < v.Total || v.LocalWeight > v.TotalWeight {
			t.Fatalf("nonsensical view %+v from body %q", v, body)
		}
	})
}
