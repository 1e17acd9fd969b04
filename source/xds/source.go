package xds

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrRunning is returned by a second call of Run.
var ErrRunning = errors.New("run xds source: already running")

// Status is what the source knows of its management server and the updates
// it got, for the status page and metrics. Times are wall-clock times.
type Status struct {
	Server    string
	Connected bool
	// ConnectedSince is when the current stream opened; zero while
	// disconnected.
	ConnectedSince time.Time
	// LastError is why the last stream ended or could not open, and
	// LastErrorAt when; empty if none has.
	LastError   string
	LastErrorAt time.Time
	// Version is the version_info last ACKed; "" before the first.
	Version string
	// LastChange is when Apply last installed a set.
	LastChange time.Time
	// Updates counts sets installed. An update identical to the rules in
	// force is ACKed without calling Apply, and not counted.
	Updates uint64
	// Nacks counts updates refused. A response sent again after its NACK is
	// not counted again.
	Nacks    uint64
	LastNack Nack // zero if no update has been refused
}

// Nack is a refused update.
type Nack struct {
	Version string
	Error   string
	At      time.Time
}

// Source subscribes to RateLimitConfig resources and installs every update
// through Config.Apply.
//
// Status and First are safe for concurrent use. Run must be called once, by
// the owner of the source; it starts every goroutine the source has and ends
// them before it returns. Source has no useful zero value; use New.
type Source struct {
	cfg     Config
	log     *slog.Logger
	node    *corev3.Node
	md      metadata.MD
	dial    []grpc.DialOption
	running atomic.Bool

	first     chan struct{}
	firstOnce sync.Once

	mu     sync.Mutex
	status Status

	// Only Run's goroutine touches these.
	applied    [32]byte // digest of the resources last installed
	hasApplied bool
	refused    *refusal // the last update refused, until one is installed
}

// refusal is an update that was NACKed: its version, the digest of its
// resources, and why.
type refusal struct {
	version string
	digest  [32]byte
	err     error
}

// New returns a Source for cfg. It connects to nothing until Run.
func New(cfg Config) (*Source, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("new xds source: %w", err)
	}
	s := &Source{cfg: cfg, log: cfg.Log, first: make(chan struct{}), status: Status{Server: cfg.ServerURL}}
	s.node = &corev3.Node{Id: cfg.NodeID, UserAgentName: "sharelimit"}
	if len(cfg.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(cfg.NodeMetadata))
		for k, v := range cfg.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		s.node.Metadata = &structpb.Struct{Fields: fields}
	}
	if len(cfg.Headers) > 0 {
		s.md = metadata.New(cfg.Headers)
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	s.dial = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if cfg.MaxMessageBytes > 0 {
		s.dial = append(s.dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxMessageBytes)))
	}
	return s, nil
}

// Status returns the source's state now.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// First is closed once the first update has been installed: the daemon waits
// on it before serving, unless told to start without a config
// (FORCE_START_WITHOUT_INITIAL_CONFIG).
func (s *Source) First() <-chan struct{} { return s.first }

// Run holds a stream to the management server until ctx is done, then
// returns nil. Errors never end it: the rules in force stand while it
// reconnects with back-off. It returns ErrRunning if called again while, or
// after, it runs.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	failures := 0
	for {
		received, err := s.stream(ctx)
		if ctx.Err() != nil {
			s.update(func(st *Status) { st.Connected, st.ConnectedSince = false, time.Time{} })
			return nil
		}
		if received {
			failures = 0
		}
		if err == nil {
			err = errors.New("stream ended")
		}
		d := s.cfg.Backoff.delay(failures, rand.Float64())
		failures++
		s.update(func(st *Status) {
			st.Connected, st.ConnectedSince = false, time.Time{}
			st.LastError, st.LastErrorAt = err.Error(), time.Now()
		})
		s.log.Warn("xds: no stream to the management server; the rules in force stand", "server", s.cfg.ServerURL, "err", err, "retry_in", d)
		if !sleep(ctx, d) {
			return nil
		}
	}
}

// stream runs one ADS stream until it fails or ctx is done, and reports
// whether it received any response. It always returns an error, unless ctx
// ended.
func (s *Source) stream(ctx context.Context) (received bool, err error) {
	conn, err := grpc.NewClient(s.cfg.ServerURL, s.dial...)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", s.cfg.ServerURL, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.md != nil {
		ctx = metadata.NewOutgoingContext(ctx, s.md)
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open ADS stream: %w", err)
	}
	// The first request carries the version last ACKed, as Envoy's does: a
	// server that still has it may answer only when something changes.
	sess := &session{acked: s.Status().Version}
	if err := send(st, s.request(TypeURL, sess.acked, "", nil)); err != nil {
		return false, fmt.Errorf("send subscription: %w", err)
	}
	s.update(func(st *Status) { st.Connected, st.ConnectedSince = true, time.Now() })
	s.log.Info("xds: subscribed", "server", s.cfg.ServerURL, "node", s.cfg.NodeID, "version", sess.acked)
	for {
		resp, err := st.Recv()
		if err != nil {
			return received, fmt.Errorf("receive: %w", err)
		}
		received = true
		req := s.handle(ctx, sess, resp)
		if req == nil {
			return received, ctx.Err()
		}
		if err := send(st, req); err != nil {
			return received, fmt.Errorf("send: %w", err)
		}
	}
}

// send sends req. When the stream has failed, Send reports only io.EOF; the
// reason comes from Recv.
func send(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, req *discoveryv3.DiscoveryRequest) error {
	err := st.Send(req)
	if errors.Is(err, io.EOF) {
		_, err = st.Recv()
	}
	return err
}

// session is the state of one stream.
type session struct {
	acked   string // version_info last ACKed on this stream (or sent first)
	nacked  bool   // the last response on this stream was NACKed
	repeats int    // identical responses answered since, for the pause
}

// handle installs or refuses one response and returns the ACK or NACK to
// send, or nil if ctx ended while it paused.
func (s *Source) handle(ctx context.Context, sess *session, resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	digest := digestOf(resp)
	var err error
	if r := s.refused; r != nil && r.digest == digest && r.version == resp.GetVersionInfo() {
		// Sent again after we refused it: the answer is the same. A snapshot
		// cache sends it again in reply to every NACK, so the NACK waits.
		err = r.err
		if sess.nacked {
			d := s.cfg.Backoff.delay(sess.repeats, rand.Float64())
			sess.repeats++
			s.log.Debug("xds: update sent again after its NACK; pausing the NACK", "version", r.version, "pause", d)
			if !sleep(ctx, d) {
				return nil
			}
		}
	} else if err = s.install(resp, digest); err != nil {
		s.refused = &refusal{version: resp.GetVersionInfo(), digest: digest, err: err}
		s.update(func(st *Status) {
			st.Nacks++
			st.LastNack = Nack{Version: resp.GetVersionInfo(), Error: err.Error(), At: time.Now()}
		})
		s.log.Warn("xds: update refused; the rules in force stand", "version", resp.GetVersionInfo(), "err", err)
	}
	if err != nil {
		sess.nacked = true
		// A NACK names the version last accepted, and answers the response's
		// own type: a response of a foreign type is refused in its own terms.
		version := sess.acked
		if resp.GetTypeUrl() != TypeURL {
			version = ""
		}
		return s.request(resp.GetTypeUrl(), version, resp.GetNonce(),
			&statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()})
	}
	sess.nacked, sess.repeats, sess.acked = false, 0, resp.GetVersionInfo()
	s.refused = nil
	s.update(func(st *Status) { st.Version = resp.GetVersionInfo() })
	return s.request(TypeURL, resp.GetVersionInfo(), resp.GetNonce(), nil)
}

// install compiles a response and hands the set to Apply, unless its
// resources are those installed last.
func (s *Source) install(resp *discoveryv3.DiscoveryResponse, digest [32]byte) error {
	if resp.GetTypeUrl() != TypeURL {
		return fmt.Errorf("response of type %q, want %q", resp.GetTypeUrl(), TypeURL)
	}
	if s.hasApplied && digest == s.applied {
		s.log.Info("xds: update has the rules in force", "version", resp.GetVersionInfo())
		return nil
	}
	set, err := compile(resp.GetResources(), s.cfg.Compile)
	if err != nil {
		return err
	}
	if err := s.cfg.Apply(set); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	s.applied, s.hasApplied = digest, true
	s.update(func(st *Status) {
		st.Updates++
		st.LastChange = time.Now()
	})
	s.firstOnce.Do(func() { close(s.first) })
	s.log.Info("xds: update installed", "version", resp.GetVersionInfo(), "resources", len(resp.GetResources()), "rules", set.Len())
	return nil
}

func (s *Source) request(typeURL, version, nonce string, detail *statuspb.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail}
}

func (s *Source) update(f func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.status)
}

// digestOf fingerprints a response's type and resources, each part prefixed
// with its length so that no two lists fingerprint alike.
func digestOf(resp *discoveryv3.DiscoveryResponse) [32]byte {
	h := sha256.New()
	part := func(b []byte) {
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	part([]byte(resp.GetTypeUrl()))
	for _, r := range resp.GetResources() {
		part([]byte(r.GetTypeUrl()))
		part(r.GetValue())
	}
	return [32]byte(h.Sum(nil))
}

// sleep waits for d or until ctx is done, and reports whether the full wait
// elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
