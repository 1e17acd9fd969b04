package xds

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
)

// Defaults for the zero fields of Config. The back-off defaults are upstream's
// XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, _MAX_INTERVAL and _RANDOM_FACTOR.
// (Upstream hands its random factor to its back-off library as the growth
// factor, so in practice it retries every 10 s; here the delay doubles from
// Initial to Max, and the random factor is the jitter.)
const (
	DefaultNodeID         = "default"
	DefaultBackoffInitial = 10 * time.Second
	DefaultBackoffMax     = 60 * time.Second
	DefaultBackoffJitter  = 0.5
)

// Config configures a Source. ServerURL and Apply are required; every other
// zero field means its default.
type Config struct {
	// ServerURL is the management server's address, host:port or any gRPC
	// target (CONFIG_GRPC_XDS_SERVER_URL).
	ServerURL string
	// NodeID is the node's id; the management server picks the snapshot by it
	// (CONFIG_GRPC_XDS_NODE_ID). Default DefaultNodeID.
	NodeID string
	// NodeMetadata is the node's metadata, string values only
	// (CONFIG_GRPC_XDS_NODE_METADATA, read by ParseNodeMetadata).
	NodeMetadata map[string]string
	// TLS secures the connection; nil means plaintext
	// (CONFIG_GRPC_XDS_SERVER_USE_TLS and the certificates beside it).
	TLS *tls.Config
	// Headers are extra gRPC metadata sent on the stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// MaxMessageBytes caps a response's size; 0 means gRPC's default of 4 MiB
	// (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES).
	MaxMessageBytes int
	// Backoff paces reconnection, and the answer to a response sent again
	// after its NACK.
	Backoff Backoff
	// Apply installs a compiled set. Returning an error refuses it: the update
	// is NACKed with the error's text, and the rules in force must stay.
	Apply func(*descriptors.Set) error
	// Compile joins the resources of an update, as files are joined: with
	// MergeDomains (MERGE_DOMAIN_CONFIG), resources naming one domain are
	// merged, as upstream merges them.
	Compile descriptors.CompileOptions
	// Log receives connection changes and refused updates; nil discards.
	Log *slog.Logger
}

// Backoff shapes the wait before reconnecting: after the n-th consecutive
// failure, min(Initial·2ⁿ, Max), scaled by a random factor in [1−Jitter,
// 1+Jitter] and capped at Max. A stream that received a response resets n.
type Backoff struct {
	Initial time.Duration // default DefaultBackoffInitial
	Max     time.Duration // default DefaultBackoffMax; less than Initial means Initial
	// Jitter is the random factor, at most 1. 0 means DefaultBackoffJitter;
	// a negative value turns jitter off (upstream's XDS_CLIENT_BACKOFF_JITTER=false).
	Jitter float64
}

// delay is the wait before retry number attempt (0 for the first), r a
// uniform random number in [0, 1).
func (b Backoff) delay(attempt int, r float64) time.Duration {
	d := b.Initial
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter > 0 {
		d = time.Duration(float64(d) * (1 + b.Jitter*(2*r-1)))
	}
	return min(d, b.Max)
}

// normalize fills in defaults and refuses what cannot work.
func (c *Config) normalize() error {
	var errs []error
	if c.ServerURL == "" {
		errs = append(errs, errors.New("no server URL"))
	}
	if c.Apply == nil {
		errs = append(errs, errors.New("no Apply function"))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max message bytes %d is negative", c.MaxMessageBytes))
	}
	b := &c.Backoff
	if b.Initial < 0 || b.Max < 0 {
		errs = append(errs, fmt.Errorf("back-off intervals %s, %s must not be negative", b.Initial, b.Max))
	}
	if b.Jitter > 1 {
		errs = append(errs, fmt.Errorf("back-off jitter %g is more than 1", b.Jitter))
	}
	if c.NodeID == "" {
		c.NodeID = DefaultNodeID
	}
	if b.Initial == 0 {
		b.Initial = DefaultBackoffInitial
	}
	if b.Max == 0 {
		b.Max = DefaultBackoffMax
	}
	b.Max = max(b.Max, b.Initial)
	if b.Jitter == 0 {
		b.Jitter = DefaultBackoffJitter
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return errors.Join(errs...)
}

// ParseNodeMetadata reads CONFIG_GRPC_XDS_NODE_METADATA: comma-separated
// key=value entries. Upstream documents key:value too ("key1:val1,key2=val2")
// but reads only '='; both are accepted here. An entry is split at its first
// '=' if it has one, else at its first ':', so a value may hold either. Space
// around keys and values is trimmed, empty entries are skipped and a later
// key wins, as upstream's; an entry with neither separator, or with an empty
// key, is an error (upstream drops it silently).
func ParseNodeMetadata(s string) (map[string]string, error) {
	var out map[string]string
	var errs []error
	for entry := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		k, v, ok := strings.Cut(entry, "=")
		if !ok {
			k, v, ok = strings.Cut(entry, ":")
		}
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("node metadata entry %q: want key=value or key:value", entry))
			continue
		case k == "":
			errs = append(errs, fmt.Errorf("node metadata entry %q: empty key", entry))
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = strings.TrimSpace(v)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("parse node metadata: %w", errors.Join(errs...))
	}
	return out, nil
}
